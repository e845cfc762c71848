// The buffer-gradient reductions of the KV-major backward kernels (flex_backward.cuh, flex_backward_sm90.cuh): each
// scatter's class (what its target index depends on) decides where its dS * coefficient terms are summed before
// they leave the tile (registers, warp shuffles, shared-memory slots) and how many atomics that leaves; fp32, or 64-bit
// fixed point in deterministic launches, whose integer sums do not depend on the order.
#pragma once
#include "flex_backward_mods.cuh"
#include "flex_backward_params.cuh"

namespace flex_bwd {

// Scatter classes (what the target index depends on), chosen by the code generator.
enum : int {
  kScatterUniform = 0,   // neither q nor kv: one value per (CTA, head), one atomic
  kScatterQOnly = 1,     // q, not kv: reduced over the tile's KV rows, one atomic per query row and tile
  kScatterKvOnly = 2,    // kv, not q: reduced over all query tiles of a head, one atomic per KV row
  kScatterDiagonal = 3,  // q and kv only through q - kv: reduced per diagonal of the tile in shared memory
  kScatterGeneral = 4,   // anything else: one atomic per nonzero score element
  kScatterQMajor = 5,    // a row-owned target the query-major pass (flex_backward_qmajor.cuh) computes: skipped here
  kScatterStaged = 6,    // a staged term's (flex_backward_staged.cuh), reduced by the Hopper kernel itself: skipped here
};

// The barrier around a tile's shared-memory reductions: __syncthreads, or with kConsumersOnly (the warp-specialised
// Hopper kernel, whose producer warpgroup never reaches the reductions) named barrier kBarReduce of the
// Traits::kNThreads consumer threads (flex_backward_loads_sm90.cuh holds the kernel's other named barriers). Its
// operands are immediates, unlike flex::named_barrier_sync's registers (flex_sm90_pipeline.cuh, not for sm_80), so
// the PTX names the barrier and its thread count.
constexpr int kBarReduce = 3;
template <class Traits, bool kConsumersOnly>
__device__ __forceinline__ void reduction_barrier() {
  if constexpr (kConsumersOnly) asm volatile("bar.sync %0, %1;\n" ::"n"(kBarReduce), "n"(Traits::kNThreads) : "memory");
  else __syncthreads();
}

__device__ __forceinline__ unsigned long long to_fixed(float x) {
  return (unsigned long long)__float2ll_rn(x * 4294967296.0f);
}

// Adds v into an accumulator: fp32 atomics, or 64-bit fixed point (order-independent) when deterministic.
template <bool kDeterministic>
__device__ __forceinline__ void accumulate(void* base, long long off, float v) {
  if constexpr (kDeterministic) {
    atomicAdd(static_cast<unsigned long long*>(base) + off, to_fixed(v));
  } else {
    atomicAdd(static_cast<float*>(base) + off, v);
  }
}


// Adds a fixed-point or fp32 partial (already reduced) into a gradient element.
template <bool kDeterministic>
__device__ __forceinline__ void add_partial(void* base, long long off, float v32, unsigned long long v64) {
  if constexpr (kDeterministic) atomicAdd(static_cast<unsigned long long*>(base) + off, v64);
  else atomicAdd(static_cast<float*>(base) + off, v32);
}

// The tile-reduced scatters (q-only and diagonal) in three steps, so that a kernel can put each where it costs
// least: thread_sum (per element, into registers), warp_sum (shuffles into the warp's own shared-memory slots:
// warp-synchronous, no CTA barrier) and cta_sum (after a CTA barrier: the warps' slots summed in a fixed order,
// one atomic per target). scatter_one runs them back to back with barriers of its own; the Hopper kernel
// overlaps warp_sum with its dK GEMM and cta_sum with its dQ GEMM, and shares the barrier it has before dQ.
// Slots: q-only sh_red[warp][kBlockM], diagonal sh_red[warp][2 kBlockM] (the kNWarps * kBlockM 8-byte region).
// kColSplit (the Hopper kernel's head-dim split form): the Traits::kDSplit warps of a KV row group hold different
// query columns (warp w: rows of group w % kRowGroups, columns col0(w) .. + kCols) instead of the same values.
template <class Traits, class Variant, bool kDeterministic, int I, bool kColSplit = false>
struct TileScatter {
  static constexpr int kClass = Variant::kScatterClass[I];
  static constexpr int kBlockM = Traits::kBlockM;
  static constexpr int kBlockN = Traits::kBlockN;
  static constexpr int kCols = kColSplit ? kBlockM / Traits::kDSplit : kBlockM;  // query columns of a warp's block
  static constexpr int kMT = kCols / 8;
  static constexpr int kWarpDiags = kCols + 15;  // local diagonals of a warp's 16 x kCols block
  // warp_sum_planes: per warp, 4 planes (k parity x c) of kPlaneStride floats.
  static constexpr int kPlaneStride = kBlockM + 16;
  static constexpr int kPlaneFloats = Traits::kNWarps * 4 * kPlaneStride;
  static constexpr bool kReduced = kClass == kScatterQOnly || kClass == kScatterDiagonal;
  // The first query column (from the tile's) of warp w's block.
  static __device__ __forceinline__ int col0(int w) { return kColSplit ? (w / Traits::kRowGroups) * kCols : 0; }

  // q-only: part[nt][c] = the thread's two rows of query column nt * 8 + 2t + c (part[kMT] unused).
  // Diagonal: part[k][c] = the thread's elements on local diagonal dl = 8 (k - 1) + 2t + c - g + 15 of the
  // warp, with r the row in the warp and dl = (q - m0) - r + 15 (rows g and g + 8 meet at n-tiles nt, nt + 1).
  float part[kMT + 1][2];

  // The sum of one diagonal's partials over the lanes (g, t), (g + 2, t + 1), (g + 4, t + 2), (g + 6, t + 3) that
  // hold it, in a fixed order; complete in the chain's leader (g < 2 or t == 0).
  static __device__ __forceinline__ float diagonal_chain_sum(float x, int g, int t4) {
    const float y9 = __shfl_down_sync(0xffffffffu, x, 9);
    x += g + 2 < 8 && t4 + 1 < 4 ? y9 : 0.f;
    const float y18 = __shfl_down_sync(0xffffffffu, x, 18);
    return x + (g + 4 < 8 && t4 + 2 < 4 ? y18 : 0.f);
  }

  // q0: the warp's first query column (m0 + col0(warp)). kChecked: the tile may hold masked or out-of-range elements
  // (dS = 0 there), whose target index and coefficient must not be evaluated. Without it every element is in range
  // and unmasked, so each is added without a test (an element whose dS is exactly 0 adds d * coef = 0; the test only
  // paid off for masked elements).
  template <bool kChecked = true>
  __device__ __forceinline__ void thread_sum(const typename Variant::Params& vp, const float (&ds_v)[kMT][4],
                                             const float (&score_v)[kMT][4], int b, int h, int hkv, int q0, int kv_r0, int t4,
                                             bool active) {
#pragma unroll
    for (int k = 0; k <= kMT; ++k) part[k][0] = part[k][1] = 0.f;
    if (!active) return;
#pragma unroll
    for (int nt = 0; nt < kMT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float d = ds_v[nt][e];
        if (!kChecked || d != 0.f) {
          long long off;
          const float v = BackwardMods<Variant>::template scatter<I, /*kOffset=*/true>(vp, b, h, hkv, q0 + nt * 8 + 2 * t4 + (e % 2),
                                                                                        kv_r0 + (e / 2) * 8, score_v[nt][e], d, off);
          if constexpr (kClass == kScatterQOnly) part[nt][e % 2] += v;
          else part[nt - e / 2 + 1][e % 2] += v;
        }
      }
  }

  __device__ __forceinline__ void warp_sum(float* sh_red, int warp, int lane) const {
    const int g = lane / 4, t4 = lane % 4;
    if constexpr (kClass == kScatterQOnly) {
      // Column sums over the 8 row lanes of the warp; lanes 0..3 write them.
#pragma unroll
      for (int nt = 0; nt < kMT; ++nt)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          float s = part[nt][c];
          s += __shfl_xor_sync(0xffffffffu, s, 4);
          s += __shfl_xor_sync(0xffffffffu, s, 8);
          s += __shfl_xor_sync(0xffffffffu, s, 16);
          if (lane < 4) sh_red[warp * kBlockM + col0(warp) + nt * 8 + 2 * t4 + c] = s;
        }
    } else {
      // Lanes (g, t), (g + 2, t + 1), ... share a diagonal: shuffles in a fixed order, then one leader per
      // diagonal adds into the warp's slots (distinct addresses per instruction: no atomics).
      float* slots = sh_red + warp * 2 * kBlockM;
      for (int i = lane; i < kWarpDiags; i += 32) slots[i] = 0.f;
      __syncwarp();
      const bool leader = g < 2 || t4 == 0;
#pragma unroll
      for (int k = 0; k <= kMT; ++k)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const float x = diagonal_chain_sum(part[k][c], g, t4);
          if (leader) {
            const int dl = 8 * (k - 1) + 2 * t4 + c - g + 15;
            if (dl >= 0 && dl < kWarpDiags) slots[dl] += x;
          }
          __syncwarp();  // the next (k, c) may update the same slot from another lane
        }
    }
  }

  // warp_sum of the diagonal class for kernels with shared memory for planes (kPlaneFloats): each leader's sum
  // goes to its own entry of plane (k % 2, c) of the warp. Within a plane no two (k, lane) pairs share an entry
  // (same k: distinct 2t - g; k and k + 2: 16 apart), so there is no read-modify-write and no __syncwarp per
  // (k, c), and the 18 shuffle chains are independent: the warp_sum above serialises them on its slot updates.
  // The four planes are then added per warp diagonal into the same slots cta_sum reads. Entries no leader
  // writes must hold zero: zero_planes once per kernel (the written set is the same in every tile).
  __device__ __forceinline__ void warp_sum_planes(float* sh_red, float* planes, int warp, int lane) const {
    static_assert(kClass == kScatterDiagonal && !kColSplit, "TileScatter::warp_sum_planes: diagonal scatters of whole-tile warps only");
    const int g = lane / 4, t4 = lane % 4;
    float* pl = planes + warp * 4 * kPlaneStride;
    const bool leader = g < 2 || t4 == 0;
    float* lead = pl + 2 * t4 - g + 7;  // + 8 k + c + plane: local diagonal 8 (k - 1) + 2t + c - g + 15, in [0, kWarpDiags)
#pragma unroll
    for (int k = 0; k <= kMT; ++k)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const float x = diagonal_chain_sum(part[k][c], g, t4);
        if (leader) lead[((k % 2) * 2 + c) * kPlaneStride + 8 * k + c] = x;
      }
    __syncwarp();
    float* slots = sh_red + warp * 2 * kBlockM;
#pragma unroll
    for (int j = 0; j < (kWarpDiags + 31) / 32; ++j) {
      const int dl = lane + 32 * j;
      if (dl < kWarpDiags) slots[dl] = (pl[dl] + pl[kPlaneStride + dl]) + (pl[2 * kPlaneStride + dl] + pl[3 * kPlaneStride + dl]);
    }
  }

  __device__ static __forceinline__ void zero_planes(float* planes, int tid) {
    for (int i = tid; i < kPlaneFloats; i += Traits::kNThreads) planes[i] = 0.f;
  }

  // After a CTA barrier that follows every warp's warp_sum; the slots may be rewritten only after another one.
  __device__ static __forceinline__ void cta_sum(const FlexBackwardParams& p, const typename Variant::Params& vp, const float* sh_red, int b,
                                                 int h, int hkv, int m0, int n0, int tid) {
    void* grad = p.grad_ptr[I];
    if constexpr (kClass == kScatterQOnly) {
      if (tid < kBlockM && m0 + tid < p.seqlen_q) {
        float s = 0.f;
        for (int w = 0; w < Traits::kNWarps; ++w)
          if (!kColSplit || (tid >= col0(w) && tid < col0(w) + kCols)) s += sh_red[w * kBlockM + tid];
        if (s != 0.f) {
          long long off;
          float coef;
          Variant::template scatter<I>(vp, b, h, hkv, m0 + tid, n0, 0.f, off, coef);
          accumulate<kDeterministic>(grad, off, s);
        }
      }
    } else {
      for (int i = tid; i < kBlockM + kBlockN - 1; i += Traits::kNThreads) {
        // Tile diagonal i = (q - m0) - (kv - n0) + kBlockN - 1; warp w (row group w % kRowGroups) holds it at
        // i + 15 + 16 (w % kRowGroups) - (kBlockN - 1) - col0(w). Without kColSplit the row groups' first warps hold
        // every value.
        float sum = 0.f;
        for (int w = 0; w < (kColSplit ? Traits::kNWarps : Traits::kRowGroups); ++w) {
          const int dl = i + 15 + 16 * (w % Traits::kRowGroups) - (kBlockN - 1) - col0(w);
          if (dl >= 0 && dl < kWarpDiags) sum += sh_red[w * 2 * kBlockM + dl];
        }
        if (sum != 0.f) {
          const int q = i >= kBlockN - 1 ? m0 + i - (kBlockN - 1) : m0;
          const int kv = i >= kBlockN - 1 ? n0 : n0 + (kBlockN - 1 - i);
          long long off;
          float coef;
          Variant::template scatter<I>(vp, b, h, hkv, q, kv, 0.f, off, coef);
          accumulate<kDeterministic>(grad, off, sum);
        }
      }
    }
  }
};

// The scatters of one S^T tile (dS in ds_v, the thread's KV rows kv_r0 and kv_r0 + 8, query columns
// m0 + col0(warp) + nt * 8 + 2 * t4 + e % 2). Every thread of the CTA (kConsumersOnly: every consumer thread) calls it
// (it synchronises for the shared-memory reductions); `active` is false for the second warp of a KV row group under
// kDSplit = 2 (same values), true for every warp with kColSplit (TileScatter).
template <class Traits, class Variant, bool kDeterministic, int I, bool kConsumersOnly = false, bool kColSplit = false>
__device__ __forceinline__ void scatter_one(const FlexBackwardParams& p, const typename Variant::Params& vp,
                                            const float (&ds_v)[TileScatter<Traits, Variant, kDeterministic, I, kColSplit>::kMT][4],
                                            const float (&score_v)[TileScatter<Traits, Variant, kDeterministic, I, kColSplit>::kMT][4],
                                            float* acc_uniform, float (*acc_kvrow)[2], float* sh_red, int b, int h, int hkv, int m0,
                                            int n0, int kv_r0, int warp, int lane, bool active) {
  using TS = TileScatter<Traits, Variant, kDeterministic, I, kColSplit>;
  constexpr int kMT = TS::kMT;
  constexpr int kClass = Variant::kScatterClass[I];
  const int tid = threadIdx.x, t4 = lane % 4;
  const int q0 = m0 + TS::col0(warp);  // the warp's first query column
  void* grad = p.grad_ptr[I];
  if constexpr (kClass == kScatterUniform || kClass == kScatterKvOnly || kClass == kScatterGeneral) {
    if (active) {
#pragma unroll
      for (int nt = 0; nt < kMT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float d = ds_v[nt][e];
          if (d != 0.f) {
            const int q = q0 + nt * 8 + 2 * t4 + (e % 2);
            const int kv = kv_r0 + (e / 2) * 8;
            long long off;
            const float v = BackwardMods<Variant>::template scatter<I, /*kOffset=*/true>(vp, b, h, hkv, q, kv, score_v[nt][e], d, off);
            if constexpr (kClass == kScatterUniform) acc_uniform[I] += v;
            else if constexpr (kClass == kScatterKvOnly) acc_kvrow[I][e / 2] += v;
            else accumulate<kDeterministic>(grad, off, v);
          }
        }
    }
  } else if constexpr (TS::kReduced) {
    TS ts;
    ts.thread_sum(vp, ds_v, score_v, b, h, hkv, q0, kv_r0, t4, active);
    ts.warp_sum(sh_red, warp, lane);
    reduction_barrier<Traits, kConsumersOnly>();
    TS::cta_sum(p, vp, sh_red, b, h, hkv, m0, n0, tid);
    reduction_barrier<Traits, kConsumersOnly>();
  }
  if constexpr (I + 1 < Variant::kNumScatters)
    scatter_one<Traits, Variant, kDeterministic, I + 1, kConsumersOnly, kColSplit>(p, vp, ds_v, score_v, acc_uniform, acc_kvrow, sh_red, b,
                                                                                   h, hkv, m0, n0, kv_r0, warp, lane, active);
}

// End of a head of the group: the uniform scatters (one atomic per CTA) and the kv-only ones (one per KV row).
template <class Traits, class Variant, bool kDeterministic, int I, bool kConsumersOnly = false>
__device__ __forceinline__ void flush_one(const FlexBackwardParams& p, const typename Variant::Params& vp, float* acc_uniform,
                                          float (*acc_kvrow)[2], float* sh_red, int b, int h, int hkv, int kv_r0, int warp, int lane,
                                          bool active) {
  constexpr int kClass = Variant::kScatterClass[I];
  void* grad = p.grad_ptr[I];
  if constexpr (kClass == kScatterUniform) {
    float s = active ? acc_uniform[I] : 0.f;
#pragma unroll
    for (int x = 16; x > 0; x /= 2) s += __shfl_xor_sync(0xffffffffu, s, x);
    if (lane == 0) sh_red[warp] = s;
    reduction_barrier<Traits, kConsumersOnly>();
    if (threadIdx.x == 0) {
      float tot = 0.f;
      for (int w = 0; w < Traits::kNWarps; ++w) tot += sh_red[w];
      if (tot != 0.f) {
        long long off;
        float coef;
        Variant::template scatter<I>(vp, b, h, hkv, 0, 0, 0.f, off, coef);
        accumulate<kDeterministic>(grad, off, tot);
      }
    }
    reduction_barrier<Traits, kConsumersOnly>();
    acc_uniform[I] = 0.f;
  } else if constexpr (kClass == kScatterKvOnly) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float s = acc_kvrow[I][half];
      s += __shfl_xor_sync(0xffffffffu, s, 1);
      s += __shfl_xor_sync(0xffffffffu, s, 2);
      const int kv = kv_r0 + half * 8;
      if (active && lane % 4 == 0 && kv < p.seqlen_kv && s != 0.f) {
        long long off;
        float coef;
        Variant::template scatter<I>(vp, b, h, hkv, 0, kv, 0.f, off, coef);
        accumulate<kDeterministic>(grad, off, s);
      }
      acc_kvrow[I][half] = 0.f;
    }
  }
  if constexpr (I + 1 < Variant::kNumScatters)
    flush_one<Traits, Variant, kDeterministic, I + 1, kConsumersOnly>(p, vp, acc_uniform, acc_kvrow, sh_red, b, h, hkv, kv_r0, warp, lane, active);
}

}  // namespace flex_bwd
