// The mma.sync forward kernel (FlashAttention-2 style, sm_80 and later): one CTA per work tile, cp.async double
// buffering, ldmatrix, P in registers. On Hopper it serves head dim 32 and launches whose strides no tensor map
// describes (flex_tile_policy.cuh decides); the scheduler, the mods and the softmax are the warp-specialised kernel's.
#pragma once
#include "flex_mods.cuh"
#include "flex_params.cuh"
#include "flex_softmax.cuh"
#include "flex_tile_policy.cuh"
#include "flex_tile_scheduler.cuh"
#include "flex_traits.cuh"

// Tiles: 128 query rows x 64 KV columns, 4 warps (8 at head dims above 128), flex_forward_policy_mma_sync. A block
// mask must be built for q_tile = kBlockM and kv_tile = kBlockN.
//
// What the host must guarantee (the kernel does not check):
//   - q/k/v/o 16-byte aligned, last dim contiguous, every other stride a multiple of 8 elements;
//   - H % Hkv == 0; Sq >= 1; without score_mod, scale > 0 (the row max is taken before scaling);
//   - dynamic shared memory limit raised to Traits::kSmemBytes (all configs exceed 48 KB);
//   - a block mask built with q_tile = kBlockM, kv_tile = kBlockN, num_q_tiles >= the launch's query tiles, KV tile
//     indices in [0, ceil(Skv / kBlockN)) (a tile past Skv would only be masked out), each list without repeats.
// Fully masked rows (and query tiles whose lists are empty) produce O = 0 and LSE = -inf.

namespace flex {

// Per-thread copies and stores of one (Traits) instantiation.
template <class Traits>
struct MmaSyncTiles {
  using Element = typename Traits::Element;
  using Mma = Mma16816<Element>;
  static constexpr int kBlockM = Traits::kBlockM;
  static constexpr int kNThreads = Traits::kNThreads;
  static constexpr int kMTiles = Traits::kMTiles;
  static constexpr int kDTiles = Traits::kDTiles;
  static constexpr int kRowsPerThread = Traits::kRowsPerThread;
  static constexpr int kChunksPerRow = Traits::kChunksPerRow;
  static constexpr int kSmemStride = Traits::kSmemStride;
  using Layout = FragmentLayout<kMTiles, Traits::kNTiles>;

  // Async copy of rows [row0, row0 + kRows) of a [S, D] slice into a padded shared tile; rows at or past
  // seqlen are zero-filled without reading global memory.
  // Thread tid copies chunk tid % kChunksPerRow of rows tid / kChunksPerRow + i * kRowsPerPass: one pointer
  // advanced by a fixed step, so no per-chunk addresses stay live across the mainloop. When kNThreads is not
  // a multiple of kChunksPerRow (D = 80, 96, 192) the last few threads idle.
  static constexpr int kRowsPerPass = kNThreads / kChunksPerRow;
  template <int kRows>
  static __device__ __forceinline__ void load_rows(unsigned smem, const Element* g, long long stride_s, int row0, int seqlen, int tid) {
    constexpr int kPasses = (kRows + kRowsPerPass - 1) / kRowsPerPass;
    const int r = tid / kChunksPerRow;
    const int c = tid % kChunksPerRow;
    if (r >= kRowsPerPass) return;
    const Element* src = g + (long long)(row0 + r) * stride_s + c * 8;
    const unsigned dst = smem + (r * kSmemStride + c * 8) * 2;
#pragma unroll
    for (int i = 0; i < kPasses; ++i) {
      const int row = r + i * kRowsPerPass;
      if (kRows % kRowsPerPass == 0 || row < kRows) {
        const bool valid = row0 + row < seqlen;
        cp_async_16(dst + i * kRowsPerPass * kSmemStride * 2, valid ? src : g, valid);
      }
      src += kRowsPerPass * stride_s;
    }
  }

  // Writes the normalised O tile (staged through shared memory `stage`, at least kBlockM x kSmemStride elements and
  // free of other readers, so the global stores are 16-byte and row-contiguous) and the LSE. Every thread of the CTA
  // calls it; it synchronises.
  static __device__ __forceinline__ void store_o_lse(const FlexForwardParams& p, unsigned char* stage, const float (&acc_o)[kMTiles][kDTiles][4],
                                                     const float (&lse)[kRowsPerThread], const ForwardTiles& w, int tid, int warp, int lane) {
    unsigned* s_o = reinterpret_cast<unsigned*>(stage);
#pragma unroll
    for (int r = 0; r < kRowsPerThread; ++r) {
      const int row = warp * Traits::kRowsPerWarp + Layout::row(lane, r);
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt) {
        const int col = dt * 8 + 2 * (lane % 4);
        s_o[(row * kSmemStride + col) / 2] = Mma::pack(acc_o[r / 2][dt][2 * (r % 2)], acc_o[r / 2][dt][2 * (r % 2) + 1]);
      }
    }
    __syncthreads();
    Element* g_o = static_cast<Element*>(p.o) + w.b * p.o_stride_b + w.h * p.o_stride_h + w.q_row0 * p.o_stride_s;
#pragma unroll
    for (int i = 0; i < kBlockM * kChunksPerRow / kNThreads; ++i) {
      const int chunk = tid + i * kNThreads;
      const int row = chunk / kChunksPerRow;
      const int c = chunk % kChunksPerRow;
      if (w.m0 + row < w.seqlen_q) {
        const uint4 val = *reinterpret_cast<const uint4*>(stage + (row * kSmemStride + c * 8) * 2);
        *reinterpret_cast<uint4*>(g_o + (long long)(w.m0 + row) * p.o_stride_s + c * 8) = val;
      }
    }
    if (p.lse != nullptr && lane % 4 == 0) {
      float* g_lse = p.lse + w.b * p.lse_stride_b + w.h * p.lse_stride_h + w.q_row0;
#pragma unroll
      for (int r = 0; r < kRowsPerThread; ++r) {
        const int q = w.m0 + warp * Traits::kRowsPerWarp + Layout::row(lane, r);
        if (q < w.seqlen_q) g_lse[q] = lse[r];
      }
    }
  }
};

}  // namespace flex

// One CTA computes O and LSE of the work tile blockIdx.x (flex::TileScheduler's order). grid = (B * H * query tiles),
// block = Traits::kNThreads, dynamic shared memory = Traits::kSmemBytes.
// kVarlen: the ragged-batch instantiation (p.cu_seqlens_q / p.cu_seqlens_kv, see flex_params.cuh). It is a
// separate instantiation because per-sequence lengths held in registers cost the dense path 15% (causal D128
// spilled): without it, Sq and Skv stay in the constant bank and the dense code is unchanged.
template <class Traits, class Variant, bool kVarlen = false, class MaskBox = void>
__device__ __forceinline__ void flex_forward(const FlexForwardParams& p, const typename Variant::Params& vp) {
  using Tiles = flex::MmaSyncTiles<Traits>;
  using Element = typename Traits::Element;
  using Mma = typename Tiles::Mma;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kMTiles = Traits::kMTiles;
  constexpr int kNTiles = Traits::kNTiles;
  constexpr int kDTiles = Traits::kDTiles;
  constexpr int kRowsPerThread = Traits::kRowsPerThread;
  constexpr int kSmemStride = Traits::kSmemStride;
  using Mods = flex::FragmentMods<Variant, kMTiles, kNTiles>;
  using Softmax = flex::Softmax<Variant, Element, kMTiles, kNTiles>;
  using Scheduler = flex::TileScheduler<kBlockM, kBlockN, Variant::kHasMaskMod, kVarlen, MaskBox>;

  extern __shared__ __align__(128) unsigned char flex_smem[];

  // ============================================ Prologue ============================================
  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  flex::ForwardTiles w;
  if (!Scheduler::work(p, blockIdx.x, w)) return;
  if constexpr (Scheduler::kClassifies) {
    // A ragged batch's tiles (flex::TileScheduler::classify), by warp 0 for every warp.
    __shared__ flex::TileRanges s_ranges;
    if (warp == 0) {
      const flex::TileRanges r = Scheduler::classify(vp, w);
      if (lane == 0) s_ranges = r;
    }
    __syncthreads();
    w.set_ranges(s_ranges);
  }
  const int b = w.b, h = w.h, hkv = w.hkv, m0 = w.m0;
  const int seqlen_q = w.seqlen_q, seqlen_kv = w.seqlen_kv;

  const Element* g_q = static_cast<const Element*>(p.q) + b * p.q_stride_b + h * p.q_stride_h + w.q_row0 * p.q_stride_s;
  const Element* g_k = static_cast<const Element*>(p.k) + b * p.k_stride_b + hkv * p.k_stride_h + w.kv_row0 * p.k_stride_s;
  const Element* g_v = static_cast<const Element*>(p.v) + b * p.v_stride_b + hkv * p.v_stride_h + w.kv_row0 * p.v_stride_s;

  // Shared memory: Q [kBlockM][kSmemStride], then K[stage], V[stage] [kBlockN][kSmemStride] each.
  const unsigned s_q = flex::smem_addr(flex_smem);
  const unsigned s_k = s_q + Traits::kSmemQElems * 2;
  const unsigned s_v = s_k + Traits::kStages * Traits::kSmemKVElems * 2;
  constexpr unsigned kStageBytes = Traits::kSmemKVElems * 2;

  const int n_masked = w.n_partial;
  const int n_tiles = w.count();

  // Q and the first two K/V tiles in flight: group 0 = {Q, K0, V0}, group 1 = {K1, V1} (possibly empty).
  int idx_cur = n_tiles > 0 ? w.at(0) : 0;
  int idx_next = n_tiles > 1 ? w.at(1) : 0;
  Tiles::template load_rows<kBlockM>(s_q, g_q, p.q_stride_s, m0, seqlen_q, tid);
  if (n_tiles > 0) {
    Tiles::template load_rows<kBlockN>(s_k, g_k, p.k_stride_s, idx_cur * kBlockN, seqlen_kv, tid);
    Tiles::template load_rows<kBlockN>(s_v, g_v, p.v_stride_s, idx_cur * kBlockN, seqlen_kv, tid);
  }
  flex::cp_async_commit();
  if (n_tiles > 1) {
    Tiles::template load_rows<kBlockN>(s_k + kStageBytes, g_k, p.k_stride_s, idx_next * kBlockN, seqlen_kv, tid);
    Tiles::template load_rows<kBlockN>(s_v + kStageBytes, g_v, p.v_stride_s, idx_next * kBlockN, seqlen_kv, tid);
  }
  flex::cp_async_commit();

  // Hoisted variant state, while the copies fly.
  Mods mods;
  mods.hoist_rows(vp, b, h, hkv, m0 + warp * Traits::kRowsPerWarp, lane, seqlen_q, seqlen_kv, w.q_pos0, w.kv_pos0);
  const flex::ScoreFactors f = flex::ScoreFactors::of<Variant>(vp, p.scale);
  Softmax softmax(f.mult);
  if constexpr (Variant::kRowTerms) mods.row_terms(vp, b, h, hkv, softmax.lse_shift);

  // Per-lane ldmatrix byte offsets (see flex_mma.cuh for the fragment layouts).
  //   Q (A, 16x16): matrices (rows 0-7 | 8-15) x (k 0-7 | 8-15) -> a0..a3.
  //   K (B of S, non-trans): matrices (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15).
  //   V (B of O, trans):     matrices (kv 0-7, d 0-7), (kv 8-15, d 0-7), (kv 0-7, d 8-15), (kv 8-15, d 8-15).
  const int l8 = lane % 8;
  const int lm = lane / 8;
  const unsigned q_lane = s_q + ((warp * Traits::kRowsPerWarp + (lm & 1) * 8 + l8) * kSmemStride + (lm >> 1) * 8) * 2;
  const unsigned k_lane = ((((lm >> 1) * 8 + l8) * kSmemStride) + (lm & 1) * 8) * 2;
  const unsigned v_lane = ((((lm & 1) * 8 + l8) * kSmemStride) + (lm >> 1) * 8) * 2;

  float acc_o[kMTiles][kDTiles][4];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int dt = 0; dt < kDTiles; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_o[mt][dt][e] = 0.f;

  // ============================================ Mainloop ============================================
  for (int it = 0; it < n_tiles; ++it) {
    const unsigned stage_off = (it & 1) * kStageBytes;
    const int idx_pf = it + 2 < n_tiles ? w.at(it + 2) : 0;  // read early: latency hides behind the GEMMs
    const int k0 = idx_cur * kBlockN;
    mods.hoist_tile(vp, b, h, hkv, k0, seqlen_kv);

    flex::cp_async_wait<1>();  // this tile's K and V have landed (the next tile's may still fly)
    __syncthreads();

    // S = Q @ K^T   (per warp: [kRowsPerWarp x kBlockN], fp32)
    float acc_s[kMTiles][kNTiles][4];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_s[mt][nt][e] = 0.f;
    const unsigned k_base = s_k + stage_off + k_lane;
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      unsigned a[kMTiles][4];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) flex::ldmatrix_x4(a[mt], q_lane + (mt * 16 * kSmemStride + kk * 16) * 2);
#pragma unroll
      for (int np = 0; np < kBlockN / 16; ++np) {
        unsigned bk[4];
        flex::ldmatrix_x4(bk, k_base + (np * 16 * kSmemStride + kk * 16) * 2);
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          Mma::run(acc_s[mt][2 * np], a[mt], bk[0], bk[1]);
          Mma::run(acc_s[mt][2 * np + 1], a[mt], bk[2], bk[3]);
        }
      }
    }

    // S = mask(score_mod(scale * S)); -inf past Skv
    mods.run(acc_s, it < n_masked, k0 + kBlockN > seqlen_kv, vp, b, h, hkv, k0, lane, seqlen_kv, f.score_scale);
    float alpha[kRowsPerThread];
    const bool jumped = softmax.update_max(acc_s, alpha);
    softmax.rescale_o(acc_o, alpha, jumped);

    // O += P @ V, 16 columns of P at a time: P stays in registers, and the exponentials of one chunk
    // overlap the mmas of the previous one.
    const unsigned v_base = s_v + stage_off + v_lane;
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      unsigned pa[kMTiles][4];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        softmax.exp_kstep(acc_s, mt, kk);
        Softmax::pack_kstep(acc_s, mt, kk, pa[mt]);
      }
#pragma unroll
      for (int dp = 0; dp < kHeadDim / 16; ++dp) {
        unsigned bv[4];
        flex::ldmatrix_x4_trans(bv, v_base + (kk * 16 * kSmemStride + dp * 16) * 2);
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          Mma::run(acc_o[mt][2 * dp], pa[mt], bv[0], bv[1]);
          Mma::run(acc_o[mt][2 * dp + 1], pa[mt], bv[2], bv[3]);
        }
      }
    }

    // Every warp is done with this stage: refill it with tile it + 2.
    __syncthreads();
    if (it + 2 < n_tiles) {
      Tiles::template load_rows<kBlockN>(s_k + stage_off, g_k, p.k_stride_s, idx_pf * kBlockN, seqlen_kv, tid);
      Tiles::template load_rows<kBlockN>(s_v + stage_off, g_v, p.v_stride_s, idx_pf * kBlockN, seqlen_kv, tid);
    }
    flex::cp_async_commit();
    idx_cur = idx_next;
    idx_next = idx_pf;
  }

  // ============================================ Epilogue ============================================
  float lse[kRowsPerThread];
  softmax.finalize(acc_o, f.score_unit, lse);
  // O is staged through the Q tile's shared memory once every copy has landed and every warp is done.
  flex::cp_async_wait<0>();
  __syncthreads();
  Tiles::store_o_lse(p, flex_smem, acc_o, lse, w, tid, warp, lane);
}
