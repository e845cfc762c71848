// The CPU attention backward's tile kernels: per (query tile, KV tile) block they recompute
// S = scale Q·Kᵀ, the mods and P = exp(S - LSE) with Eigen products and the JIT-compiled mods,
// then dS = P ∘ (dO·Vᵀ - rowsum(dO ∘ O)) and the gradient function's d_score and scatters.
// One kernel sums dK and dV of a KV tile over every query tile and query head of its KV head;
// the other sums dQ of a query tile over every KV tile and scatters into the buffer gradients.
// Each writes only its own outputs, so no two threads ever add into the same element.
//
// Compiled once per instruction set, like attention_tile_kernel.cpp (see arch/tile_common.h).
#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "runtime/cpu/arch/tile_common.h"
#include "runtime/cpu/backward_tile.h"
#include "runtime/cpu/kv_tiles.h"

namespace flexjit::cpu::FLEXJIT_CAT(isa_, FLEXJIT_CPU_ISA) {

namespace {

template <class T>
T* at(void* scratch, size_t offset) {
  return reinterpret_cast<T*>(static_cast<char*>(scratch) + offset);
}

// A recomputed block's P and dS ∘ d_score (the gradient with respect to the pre-mod score; zero
// where P is zero), m x n with row stride block_n; null when the mask empties the block.
struct Block {
  const float* p = nullptr;
  const float* d_pre = nullptr;
};

// Recomputes block (q0 .. q0 + m, KV tile t) of head (b, h) in the scratch's `s` (P), `dp` (dS)
// and `d_score`. The mods see the tile from its global k0 (kv_tiles.h), so every row of those
// starts with t.lead padding columns, whose P is 0. With `grads`, also adds dS * coefficient of
// every wanted scatter into them.
Block recompute_block(const BackwardJob& J, void* scratch, double* const* grads, int64_t b, int64_t h, int64_t hkv, int64_t q0, int64_t m,
                      const KvTile& t, uint8_t cls, const ConstMatMap& Q, const ConstMatMap& dO, const ConstMatMap& K, const ConstMatMap& V) {
  const BackwardScratchLayout& L = J.scratch;
  const int64_t N = J.block_n;
  float* s = at<float>(scratch, L.s);
  float* pre = at<float>(scratch, L.pre);
  float* dp = at<float>(scratch, L.dp);
  float* dsc = at<float>(scratch, L.d_score);
  uint8_t* keep = at<uint8_t>(scratch, L.keep);
  const uint8_t* ones = at<uint8_t>(scratch, L.ones);
  float* coef = at<float>(scratch, L.coef);
  int64_t* offset = at<int64_t>(scratch, L.offset);
  const ModFunctions* F = J.mods;
  auto state = [&](int64_t r) { return static_cast<void*>(at<char>(scratch, L.state) + static_cast<size_t>(r) * J.state_bytes); };
  auto lse_of = [&](int64_t r) { return J.lse[b * J.lse_stride[0] + h * J.lse_stride[1] + (q0 + r) * J.lse_stride[2]]; };
  const int64_t lead = t.lead, n = t.n, w = lead + n;  // the mods' columns: padding, then the tile's rows
  const int64_t mq0 = q0 + J.q_offset;                 // the first row's q as the mods see it
  const int64_t mb = b + J.b_offset;                   // and b

  const bool masked = F && cls == kTilePartial && J.has_mask_mod;
  if (F) {
    for (int64_t r = 0; r < m; ++r) {
      if (J.row_stage) F->row(J.params, mb, h, hkv, mq0 + r, state(r));
      if (J.col_stage) F->col(J.params, mb, h, hkv, mq0 + r, kv_tile_columns(J.kv_offset, J.Skv, N), state(r));
      if (J.tile_stage) F->tile(J.params, mb, h, hkv, mq0 + r, t.k0, state(r));
    }
  }
  bool any = false;
  for (int64_t r = 0; r < m; ++r) {
    if (lse_of(r) == kNegInf) continue;  // a fully masked row: P = 0
    if (masked) {
      F->mask(J.params, mb, h, hkv, mq0 + r, t.k0, w, keep + r * N, state(r));
      std::memset(keep + r * N, 0, static_cast<size_t>(lead));  // the padding is no part of this launch
      if (std::memchr(keep + r * N + lead, 1, static_cast<size_t>(n))) any = true;
    } else {
      any = true;
    }
  }
  if (!any) return {};

  MatMap S(s + lead, m, n, Eigen::OuterStride<>(N));
  S.noalias() = Q * K.transpose();
  S *= J.scale;
  const bool need_grad_fn = F && F->grad && (J.need_d_score || (grads && J.num_scatters > 0));
  for (int64_t r = 0; r < m; ++r) {
    float* sr = s + r * N;
    const float lse = lse_of(r);
    if (lse == kNegInf) {
      std::fill(sr, sr + w, 0.0f);
      continue;
    }
    std::fill(sr, sr + lead, kNegInf);  // P = 0 on the padding, with or without mods
    if (need_grad_fn) std::memcpy(pre + r * N, sr, static_cast<size_t>(w) * 4);
    if (F && (J.has_score_mod || masked))
      F->score(J.params, mb, h, hkv, mq0 + r, t.k0, w, sr, masked ? keep + r * N : ones + N - lead, state(r));  // N zeros, N ones
    exp_shifted(sr, w, lse);  // P = exp(S - LSE): exactly 0 where masked
  }

  MatMap dP(dp + lead, m, n, Eigen::OuterStride<>(N));
  dP.noalias() = dO * V.transpose();
  const float* delta = J.delta + (b * J.H + h) * J.Sq + q0;
  for (int64_t r = 0; r < m; ++r) {
    float* dr = dp + r * N;
    const float* pr = s + r * N;
    const float di = delta[r];
    std::fill(dr, dr + lead, 0.0f);
    for (int64_t j = lead; j < w; ++j) dr[j] = pr[j] * (dr[j] - di);  // dS
  }
  if (!need_grad_fn) return {s + lead, dp + lead};

  for (int64_t r = 0; r < m; ++r) {
    float* gr = dsc + r * N;
    const float* pr = s + r * N;
    const float* dr = dp + r * N;
    if (lse_of(r) == kNegInf) {
      std::fill(gr, gr + w, 0.0f);
      continue;
    }
    F->grad(J.params, mb, h, hkv, mq0 + r, t.k0, w, pre + r * N, state(r), gr, coef, offset);
    if (grads) {
      for (int sc = 0; sc < J.num_scatters; ++sc) {
        double* g = J.scatter_target[sc] >= 0 ? grads[J.scatter_target[sc]] : nullptr;
        if (!g) continue;
        const float* cr = coef + sc * N;
        const int64_t* orow = offset + sc * N;
        for (int64_t j = lead; j < w; ++j)
          if (pr[j] != 0.0f) g[orow[j]] += static_cast<double>(dr[j]) * static_cast<double>(cr[j]);
      }
    }
    if (J.need_d_score) {
      for (int64_t j = 0; j < w; ++j) gr[j] = pr[j] != 0.0f ? dr[j] * gr[j] : 0.0f;
    } else {
      std::memcpy(gr, dr, static_cast<size_t>(w) * 4);
    }
  }
  return {s + lead, dsc + lead};
}

// Writes rows [r0, r0 + rows) of head `head` of a [B, heads, S, d] output from an fp32 matrix,
// times `mul`.
void store_rows(const OutOperand& t, ElemType et, int64_t b, int64_t head, int64_t r0, int64_t rows, int64_t d, const float* src, float mul) {
  const int64_t* st = t.stride;
  for (int64_t r = 0; r < rows; ++r) {
    int64_t base = b * st[0] + head * st[1] + (r0 + r) * st[2];
    for (int64_t c = 0; c < d; ++c) store_elem(t.data, et, base + c * st[3], src[r * d + c] * mul);
  }
}

}  // namespace

void run_delta(const BackwardJob& J, int64_t b, int64_t h) {
  float* out = J.delta + (b * J.H + h) * J.Sq;
  for (int64_t qi = 0; qi < J.Sq; ++qi) {
    int64_t ob = b * J.o.stride[0] + h * J.o.stride[1] + qi * J.o.stride[2];
    int64_t gb = b * J.d_o.stride[0] + h * J.d_o.stride[1] + qi * J.d_o.stride[2];
    double acc = 0;
    for (int64_t c = 0; c < J.Dv; ++c)
      acc += static_cast<double>(load_elem(J.o.data, J.dtype, ob + c * J.o.stride[3])) *
             static_cast<double>(load_elem(J.d_o.data, J.dtype, gb + c * J.d_o.stride[3]));
    out[qi] = static_cast<float>(acc);
  }
}

void run_backward_kv_tile(const BackwardJob& J, void* scratch, int64_t b, int64_t hkv, int64_t kt) {
  const BackwardScratchLayout& L = J.scratch;
  const int64_t M = J.block_m, N = J.block_n, D = J.D, Dv = J.Dv;
  const KvTile t = kv_tile(J.kv_offset, J.Skv, N, kt);
  const int64_t n = t.n;
  const int64_t group = J.H / J.Hkv, nqt = (J.Sq + M - 1) / M;
  ConstMatMap K = rows_fp32(J.k, J.dtype, b, hkv, t.row, n, D, at<float>(scratch, L.k));
  ConstMatMap V = rows_fp32(J.v, J.dtype, b, hkv, t.row, n, Dv, at<float>(scratch, L.v));
  MatMap dK(at<float>(scratch, L.acc_a), n, D, Eigen::OuterStride<>(D));
  MatMap dV(at<float>(scratch, L.acc_b), n, Dv, Eigen::OuterStride<>(Dv));
  dK.setZero();
  dV.setZero();
  for (int64_t h = hkv * group; h < (hkv + 1) * group; ++h) {
    for (int64_t qt = 0; qt < nqt; ++qt) {
      uint8_t cls = J.classify ? J.classify(J.classify_ctx, b, h, qt, kt) : kTileFull;
      if (cls == kTileEmpty) continue;
      const int64_t q0 = qt * M, m = std::min<int64_t>(M, J.Sq - q0);
      ConstMatMap Q = rows_fp32(J.q, J.dtype, b, h, q0, m, D, at<float>(scratch, L.q));
      ConstMatMap dO = rows_fp32(J.d_o, J.dtype, b, h, q0, m, Dv, at<float>(scratch, L.d_o));
      const Block blk = recompute_block(J, scratch, nullptr, b, h, hkv, q0, m, t, cls, Q, dO, K, V);
      if (!blk.p) continue;
      ConstMatMap P(blk.p, m, n, Eigen::OuterStride<>(N));
      ConstMatMap dS(blk.d_pre, m, n, Eigen::OuterStride<>(N));
      dV.noalias() += P.transpose() * dO;
      dK.noalias() += dS.transpose() * Q;
    }
  }
  store_rows(J.dk, J.dtype, b, hkv, t.row, n, D, dK.data(), J.scale);
  store_rows(J.dv, J.dtype, b, hkv, t.row, n, Dv, dV.data(), 1.0f);
}

void run_backward_q_tile(const BackwardJob& J, void* scratch, double* const* grads, int64_t b, int64_t h, int64_t q_tile) {
  const BackwardScratchLayout& L = J.scratch;
  const int64_t M = J.block_m, N = J.block_n, D = J.D, Dv = J.Dv;
  const int64_t q0 = q_tile * M, m = std::min<int64_t>(M, J.Sq - q0);
  const int64_t hkv = h / (J.H / J.Hkv), nkt = kv_tile_count(J.kv_offset, J.Skv, N);
  ConstMatMap Q = rows_fp32(J.q, J.dtype, b, h, q0, m, D, at<float>(scratch, L.q));
  ConstMatMap dO = rows_fp32(J.d_o, J.dtype, b, h, q0, m, Dv, at<float>(scratch, L.d_o));
  MatMap dQ(at<float>(scratch, L.acc_a), m, D, Eigen::OuterStride<>(D));
  dQ.setZero();
  for (int64_t kt = 0; kt < nkt; ++kt) {
    uint8_t cls = J.classify ? J.classify(J.classify_ctx, b, h, q_tile, kt) : kTileFull;
    if (cls == kTileEmpty) continue;
    const KvTile t = kv_tile(J.kv_offset, J.Skv, N, kt);
    ConstMatMap K = rows_fp32(J.k, J.dtype, b, hkv, t.row, t.n, D, at<float>(scratch, L.k));
    ConstMatMap V = rows_fp32(J.v, J.dtype, b, hkv, t.row, t.n, Dv, at<float>(scratch, L.v));
    const Block blk = recompute_block(J, scratch, grads, b, h, hkv, q0, m, t, cls, Q, dO, K, V);
    if (!blk.p) continue;
    ConstMatMap dS(blk.d_pre, m, t.n, Eigen::OuterStride<>(N));
    dQ.noalias() += dS * K;
  }
  store_rows(J.dq, J.dtype, b, h, q0, m, D, dQ.data(), J.scale);
}

}  // namespace flexjit::cpu::FLEXJIT_CAT(isa_, FLEXJIT_CPU_ISA)
