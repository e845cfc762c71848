// The CPU attention kernel for one query tile of one head: S = Q·Kᵀ and O += P·V with Eigen,
// the JIT-compiled mods on row segments, online softmax in fp32.
//
// Compiled once per instruction set (see runtime/cpu/CMakeLists.txt) with
// -DFLEXJIT_CPU_ISA=<name> and -DEigen=flexjit_eigen_<name>: the namespace rename keeps each
// build's Eigen instantiations distinct, so the linker can never mix AVX-512 code into the
// generic build. Everything else here has internal linkage for the same reason.
#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "runtime/cpu/arch/tile_common.h"
#include "runtime/cpu/attention_tile.h"
#include "runtime/cpu/kv_tiles.h"

namespace flexjit::cpu::FLEXJIT_CAT(isa_, FLEXJIT_CPU_ISA) {

uint32_t run_query_tile(const AttentionJob& J, void* scratch_v, int64_t b, int64_t h, int64_t q_tile) {
  char* scratch = static_cast<char*>(scratch_v);
  const ScratchLayout& L = J.scratch;
  const int64_t M = J.block_m, N = J.block_n, D = J.D, Dv = J.Dv;
  const int64_t q0 = q_tile * M, m = std::min<int64_t>(M, J.Sq - q0);
  const int64_t hkv = h / (J.H / J.Hkv);
  const int64_t mb = b + J.b_offset, mq0 = q0 + J.q_offset;  // b and the first row's q as the mods see them
  float* sbuf = reinterpret_cast<float*>(scratch + L.s);
  float* row_max = reinterpret_cast<float*>(scratch + L.row_max);
  float* row_sum = reinterpret_cast<float*>(scratch + L.row_sum);
  float* alpha = reinterpret_cast<float*>(scratch + L.alpha);
  uint8_t* keep = reinterpret_cast<uint8_t*>(scratch + L.keep);
  // N zeros then N ones: `keep_all(lead)` keeps a tile's columns and none of its padding.
  uint8_t* ones = reinterpret_cast<uint8_t*>(scratch + L.ones);
  std::memset(ones, 0, static_cast<size_t>(N));
  std::memset(ones + N, 1, static_cast<size_t>(N));
  auto keep_all = [&](int64_t lead) { return ones + N - lead; };
  auto state = [&](int64_t r) { return static_cast<void*>(scratch + L.state + static_cast<size_t>(r) * J.state_bytes); };

  const ElemType kv_type = J.kv_f32 ? ElemType::F32 : J.dtype;
  ConstMatMap Q = rows_fp32(J.q, J.dtype, b, h, q0, m, D, reinterpret_cast<float*>(scratch + L.q));
  MatMap O(reinterpret_cast<float*>(scratch + L.o), m, Dv, Eigen::OuterStride<>(Dv));
  O.setZero();
  for (int64_t r = 0; r < m; ++r) {
    row_max[r] = kNegInf;
    row_sum[r] = 0;
  }

  // Prologue: the row and column stages of the mods, once per query row.
  const ModFunctions* F = J.mods;
  uint32_t errors = 0;
  if (F && J.row_stage)
    for (int64_t r = 0; r < m; ++r) F->row(J.params, mb, h, hkv, mq0 + r, state(r));
  if (F && J.col_stage)
    for (int64_t r = 0; r < m; ++r) F->col(J.params, mb, h, hkv, mq0 + r, kv_tile_columns(J.kv_offset, J.Skv, N), state(r));

  // Mainloop over chunks of consecutive non-empty KV tiles: block classes, the tile stage and
  // mask_mod work per tile, the products per chunk (up to chunk_n columns), because Eigen
  // packs both operands on every product and wider products amortise that. The mods see each
  // tile from its global k0 (kv_tiles.h): a first tile with `lead` padding columns takes the
  // chunk's first columns with its padding, which the products and the softmax skip.
  struct TileInChunk {
    KvTile kv;
    int64_t col;  // the chunk column of its first row (its padding lies just before)
    bool masked;
  };
  constexpr int kMaxTilesPerChunk = 16;
  TileInChunk chunk[kMaxTilesPerChunk];
  const int64_t CN = J.chunk_n;
  const int64_t num_kv_tiles = kv_tile_count(J.kv_offset, J.Skv, N);
  int64_t kt = 0;
  int64_t state_k0 = -1;  // the KV tile whose tile stage the row states hold
  auto tile_stage = [&](int64_t k0) {
    if (!F || !J.tile_stage || state_k0 == k0) return;
    for (int64_t r = 0; r < m; ++r) F->tile(J.params, mb, h, hkv, mq0 + r, k0, state(r));
    state_k0 = k0;
  };
  while (kt < num_kv_tiles) {
    int count = 0;
    int64_t cols = 0;
    while (kt < num_kv_tiles && count < kMaxTilesPerChunk) {
      const KvTile t = kv_tile(J.kv_offset, J.Skv, N, kt);
      if (cols + t.lead + t.n > CN) break;  // only the first tile has padding, so a chunk's rows stay contiguous
      uint8_t cls = J.classify ? J.classify(J.classify_ctx, b, h, q_tile, kt) : kTileFull;
      if (cls == kTileEmpty) {
        ++kt;
        if (count) break;  // a gap ends the chunk: its columns must be contiguous
        continue;
      }
      // mask_mod only on partial tiles, before the products: a tile it empties costs nothing more.
      const bool masked = F && cls == kTilePartial && J.has_mask_mod;
      if (masked) {
        tile_stage(t.k0);
        bool any = false;
        for (int64_t r = 0; r < m; ++r) {
          uint8_t* kr = keep + r * CN + cols;
          errors |= F->mask(J.params, mb, h, hkv, mq0 + r, t.k0, t.lead + t.n, kr, state(r));
          std::memset(kr, 0, static_cast<size_t>(t.lead));  // the padding is no part of this launch
          if (!any) any = std::memchr(kr + t.lead, 1, static_cast<size_t>(t.n)) != nullptr;
        }
        if (!any) {
          ++kt;
          if (count) break;
          continue;
        }
      }
      chunk[count++] = TileInChunk{t, cols + t.lead, masked};
      cols += t.lead + t.n;
      ++kt;
      if (t.lead + t.n < N) break;  // a short tile ends the chunk: the next one starts on the grid
    }
    if (!count) continue;
    // The chunk's rows: columns [c_first, cols) of the score rows, local KV rows from r_first.
    const int64_t c_first = chunk[0].col, r_first = chunk[0].kv.row, width = cols - c_first;

    // S = scale * Q @ K^T
    ConstMatMap K = rows_fp32(J.k, kv_type, b, hkv, r_first, width, D, reinterpret_cast<float*>(scratch + L.k));
    MatMap S(sbuf + c_first, m, width, Eigen::OuterStride<>(CN));
    S.noalias() = Q * K.transpose();
    S *= J.scale;

    // FUSION POINT: score_mod (and the mask of partial tiles: -inf where not kept), per tile.
    for (int i = 0; i < count; ++i) {
      const TileInChunk& t = chunk[i];
      if (!F || !(J.has_score_mod || t.masked)) continue;
      tile_stage(t.kv.k0);  // the row states may hold a later tile's values
      const int64_t c = t.col - t.kv.lead;  // the mods see the padding too, never kept
      for (int64_t r = 0; r < m; ++r) {
        errors |= F->score(J.params, mb, h, hkv, mq0 + r, t.kv.k0, t.kv.lead + t.kv.n, sbuf + r * CN + c,
                           t.masked ? keep + r * CN + c : keep_all(t.kv.lead), state(r));
      }
    }

    // Online softmax: P = exp(S - m_new), l = l * exp(m_old - m_new) + rowsum(P).
    for (int64_t r = 0; r < m; ++r) {
      float* sr = sbuf + r * CN + c_first;
      float mx = ConstArrMap(sr, width).maxCoeff();
      float m_new = std::max(row_max[r], mx);
      if (m_new == kNegInf) {  // nothing attended in this row yet
        alpha[r] = 1;
        std::fill(sr, sr + width, 0.0f);
        continue;
      }
      alpha[r] = std::exp(row_max[r] - m_new);
      exp_shifted(sr, width, m_new);
      row_sum[r] = row_sum[r] * alpha[r] + ConstArrMap(sr, width).sum();
      row_max[r] = m_new;
    }

    // O = diag(alpha) O + P @ V
    ConstMatMap V = rows_fp32(J.v, kv_type, b, hkv, r_first, width, Dv, reinterpret_cast<float*>(scratch + L.v));
    O.array().colwise() *= ArrMap(alpha, m);
    O.noalias() += S * V;
  }

  // Epilogue: O / l and LSE = m + log(l); rows that attended nothing get O = 0, LSE = -inf.
  for (int64_t r = 0; r < m; ++r) {
    const int64_t qi = q0 + r;
    const float l = row_sum[r];
    const bool empty = l == 0.0f;
    const float inv = empty ? 0.0f : 1.0f / l;
    int64_t base = b * J.o.stride[0] + h * J.o.stride[1] + qi * J.o.stride[2];
    const float* orow = O.data() + r * Dv;
    if (J.dtype == ElemType::F32 && J.o.stride[3] == 1) {
      float* out = static_cast<float*>(J.o.data) + base;
      for (int64_t c = 0; c < Dv; ++c) out[c] = empty ? 0.0f : orow[c] * inv;
    } else {
      for (int64_t c = 0; c < Dv; ++c) store_elem(J.o.data, J.dtype, base + c * J.o.stride[3], empty ? 0.0f : orow[c] * inv);
    }
    if (J.lse) J.lse[b * J.lse_stride[0] + h * J.lse_stride[1] + qi * J.lse_stride[2]] = empty ? kNegInf : row_max[r] + std::log(l);
  }
  return errors;
}

}  // namespace flexjit::cpu::FLEXJIT_CAT(isa_, FLEXJIT_CPU_ISA)
