// The Hopper (sm_90a) backward main kernel: flex_backward_main's algorithm with warpgroup MMA (wgmma) on swizzled tiles.
#pragma once
#include "flex_backward.cuh"
#include "flex_backward_staged.cuh"
#include "flex_sm90_pipeline.cuh"
#include "flex_type_traits.cuh"
#include "flex_wgmma.cuh"

// Drop-in replacement of flex_backward_main for head dims 32..128 on sm_90a (docs/notes/BACKWARD_SM90.md): the same
// FlexBackwardParams, variant contract, grid (ceil(Skv / 128), Hkv, B; spread rows: see the kernel), 256 threads (384
// warp-specialised: see kProducer),
// tile classes, schedule and preprocess / dQ-conversion kernels; shared memory flex_bwd_sm90::Smem<...>::kAllocBytes.
//
// Two warpgroups; warpgroup w owns KV rows 64w..64w+63 of the CTA's 128, so warp `warp` owns rows 16 warp..+15
// as in the mma.sync kernel, and a wgmma accumulator of a warp is the m16n8 C layout of those rows repeated per
// 8 columns (d[4i + e] is the old kernel's acc[i][e]): the elementwise code and the scatter reductions of
// flex_backward.cuh are shared unchanged. Per (head, query tile of 64 rows) and warpgroup:
//   S^T  = K Q^T     ss, A = K rows 64w.. (K-major), B = Q (K-major)         -> 64 x 64, 32 floats per thread
//   dP^T = V dO^T    the same with V and dO
//   P^T, dS^T        elementwise (mask, bounds, score_mod, lse2 / delta from shared memory)
//   dV  += P^T dO    rs, A = P^T packed from the S^T accumulator, B = dO (MN-major)
//   dK  += dS^T Q    rs, A = dS^T packed, B = Q (MN-major)
//   dQ   = dS K      ss, A = dS^T tile in shared memory (MN-major), B = K (MN-major) from column col0_w:
//                    warpgroup w computes dQ columns [col0_w, col0_w + N_w) over all 128 KV rows, then atomics.

namespace flex_bwd_sm90 {

// Shared-memory tiles and their offsets, in the policy's swizzle (flex_backward_policy.cuh: D has at least two swizzle
// regions, so the dQ column split lands on a region boundary). The variant adds the regions of its staged terms
// (flex_backward_staged.cuh) at the end. flex_backward_smem_bytes is the host's count of the same bytes.
template <class Traits, class Variant = void, bool kDqBulk = false, bool kGradGemm = false, bool kDqFixed = false, bool kProducer = false>
struct Smem {
  using Staged = flex_bwd_staged::Flags<Variant>;
  static constexpr int kHeadDim = Traits::kHeadDim;
  static constexpr int kBlockM = Traits::kBlockM;
  static constexpr int kBlockN = Traits::kBlockN;
  static constexpr int kSwizzle = Traits::kPolicy.swizzle_bytes;
  using TileKV = flex::SwizzledTile<kBlockN, kHeadDim, kSwizzle>;  // K, V: [128 kv][D]
  using TileQ = flex::SwizzledTile<kBlockM, kHeadDim, kSwizzle>;   // Q, dO: [64 q][D] per stage
  using TileDS = flex::SwizzledTile<kBlockN, kBlockM, 128>;        // dS^T: [128 kv][64 q]
  // dQ columns of each warpgroup: the first takes half of D rounded up to whole swizzle regions
  // (D128: 64 + 64, D96: 64 + 32, D80: 48 + 32, D64: 32 + 32, D32: 16 + 16).
  static constexpr int kDqN0 = (kHeadDim / 2 + TileKV::kRegionCols - 1) / TileKV::kRegionCols * TileKV::kRegionCols;
  static constexpr int kDqN1 = kHeadDim - kDqN0;
  // K as TileKV, or with a spare region after each warpgroup's dQ columns for the selectors (kGradGemm with equal
  // column counts, see flex_backward_staged.cuh), which the dQ GEMM then reads as 16 more B columns.
  static constexpr bool kSelectorsInK = kGradGemm && kDqN0 == kDqN1;
  using TileK = flex::SwizzledTile<kBlockN, kHeadDim, kSwizzle, kSelectorsInK ? kDqN0 / TileKV::kRegionCols : 0>;
  static constexpr int kSelectorCols = kSelectorsInK ? 16 : 0;
  static constexpr int kStages = 2;
  static constexpr int kOffK = 0;
  static constexpr int kOffV = kOffK + TileK::kBytes;
  static constexpr int kOffQ = kOffV + TileKV::kBytes;
  static constexpr int kOffDO = kOffQ + kStages * TileQ::kBytes;
  static constexpr int kOffDS = kOffDO + kStages * TileQ::kBytes;
  static constexpr int kOffLse = kOffDS + TileDS::kBytes;
  static constexpr int kOffDelta = kOffLse + kStages * kBlockM * 4;
  static constexpr int kOffRed = kOffDelta + kStages * kBlockM * 4;     // [kNWarps][kBlockM] 8-byte slots
  // Planes of a diagonal scatter's warp reduction (flex_bwd::TileScatter::warp_sum_planes): [warp][4][kBlockM + 16] floats.
  static constexpr int kOffPlanes = kOffRed + Traits::kNWarps * kBlockM * 8;
  static constexpr int kOffSched = kOffPlanes + Traits::kNWarps * 4 * (kBlockM + 16) * 4;  // tile classes of the CTA's column
  static constexpr int kOffStCol = kOffSched + Traits::kMaxSched;                               // [stages] Col tiles
  static constexpr int kOffStGrad = kOffStCol + (Staged::kCol ? kStages * flex_bwd_staged::kColBytes : 0);  // dS^T planes / slabs
  // kGradGemm: no slabs; the selector tiles (1 KB aligned) unless they live in K's spare regions.
  static constexpr int kGradBytes = kGradGemm ? (kSelectorsInK ? 0 : flex_bwd_staged::kSelectorRegionBytes) : Staged::kGradRegionBytes;
  static constexpr int kOffSelectors = (kOffStGrad + 1023) / 1024 * 1024;
  static constexpr int kOffStTile = kOffStGrad + (Staged::kGrad ? kGradBytes : 0);  // [stages] Tile values
  static constexpr int kOffDqBuf = kOffStTile + (Staged::kTile ? kStages * Staged::kTileStageBytes : 0);  // dQ partial rows
  // kDqBulk: the CTA's dQ partial of a query tile, sent to dq_accum by one bulk reduction per row: [64 q][D + 8] fp32
  // (rows 16-byte aligned; the 8 floats of padding make the accumulator-layout float2 stores conflict-free), or with
  // kDqFixed (deterministic launches) [64 q][D + 2] 64-bit fixed point, whose integer sums do not depend on the order
  // the CTAs' reductions arrive in. Two values of padding keep the rows 16-byte aligned; more would not fit next to
  // D128's tiles (the 16-byte stores of two rows then share banks: two cycles instead of one, once per tile).
  using DqValue = typename flex::Conditional<kDqFixed, unsigned long long, float>::type;
  static constexpr int kDqRowValues = kHeadDim + (kDqFixed ? 2 : 8);
  static constexpr int kDqRowBytes = kDqRowValues * (int)sizeof(DqValue);
  static constexpr int kBytes = kOffDqBuf + (kDqBulk ? kBlockM * kDqRowBytes : 0);
  // kProducer: the mbarriers of the Q / dO / lse2 / delta ring (full, then empty, per stage), of K and V, and the dQ
  // rows' slot (flex_bwd_sm90::DqRowsSlot), in the reduction slots, which only scatters use (a warp-specialised
  // module has none): D128's deterministic rows leave no byte of the 227 KB free.
  static constexpr int kOffBars = kOffRed;
  // What the launch must give: 1 KB of slack, so the tiles can start on a 1024-byte boundary (the swizzle
  // XOR acts on absolute address bits) whatever the base of dynamic shared memory.
  static constexpr int kAllocBytes = kBytes + 1024;

  static_assert(kHeadDim == 32 || kHeadDim == 64 || kHeadDim == 80 || kHeadDim == 96 || kHeadDim == 128,
                "flex_backward_main_sm90: head dims 32, 64, 80, 96 and 128 only (192 and 256 use flex_backward_main)");
  static_assert(kBlockM == 64 && kBlockN == 128 && Traits::kNWarps == 8, "flex_backward_main_sm90: 64 x 128 tiles, 8 warps");
  static_assert(TileK::kBytes % 1024 == 0 && TileKV::kBytes % 1024 == 0 && TileQ::kBytes % 1024 == 0 && TileDS::kBytes % 1024 == 0,
                "flex_backward_main_sm90: every tile must keep the next one 1024-byte aligned");
  static_assert(kDqN1 > 0 && kDqN0 % TileKV::kRegionCols == 0, "flex_backward_main_sm90: dQ split must land on a region boundary");
  static_assert(kOffStCol % 16 == 0 && kBlockM == flex_bwd_staged::kRows, "flex_backward_main_sm90: staged tiles need 16-byte rows of 64 queries");
  static_assert(kOffDqBuf % 16 == 0, "flex_backward_main_sm90: the dQ rows must be 16-byte aligned for the bulk reduction");
  static_assert(!kGradGemm || (Staged::kSpread && Staged::kGrad), "flex_backward_main_sm90: selector GEMMs reduce spread rows' staged gradients");
  static_assert(!kGradGemm || kSelectorsInK || kOffSelectors + 2 * flex_bwd_staged::SelectorTile::kBytes <= kOffStTile,
                "flex_backward_main_sm90: selector region");
};

// x, through an instruction the compiler cannot look through. Used at the top of the query-tile loop for the
// shared-memory bases and the lane: everything derived from them (some fifty wgmma descriptors, swizzled dS^T
// offsets, lse / delta addresses) is then recomputed per tile with a few integer ops instead of being hoisted out
// of the loop, where it would stay live across the whole loop and push the accumulators (dK, dV, S^T, dP^T: 192
// registers at D = 128) into spills.
__device__ __forceinline__ unsigned opaque(unsigned x) {
  unsigned r;
  asm volatile("mov.b32 %0, %1;\n" : "=r"(r) : "r"(x));
  return r;
}

// A [M][N] register array seen as the flat [M * N] array the wgmma wrappers take (the same registers).
template <int M, int N>
__device__ __forceinline__ float (&flat(float (&a)[M][N]))[M * N] {
  return reinterpret_cast<float(&)[M * N]>(a);
}

// dQ (unscaled) += dS K for this warpgroup's kN columns from kCol0 (the caller has fenced dS^T into the async
// proxy and synchronised the CTA); runs `overlap` while the GEMM is in flight, waits for every wgmma group of the
// warpgroup, then adds into the accumulator.
// kBulk: the partial goes into the CTA's dQ rows in shared memory (`dq_buf`, row q - m0) instead, for the bulk
// reduction at the top of the next query tile.
// Layout::kSelectorCols = 16 (kGradGemm): the GEMM runs on into K's spare region after the warpgroup's columns, whose
// first 16 columns hold its selector (flex_backward_staged.cuh); those 16 columns of the product, the staged
// gradient sums, go to `sel` (the m64n16 accumulator layout). One GEMM instead of a second one over the same dS^T
// tile: dS^T is read from shared memory once.
// `issue_next` issues one more wgmma group right behind dQ's (the dK GEMM, or an empty group when dK went first):
// dQ's partial then goes out while that group runs, which is left in flight on return.
template <int kN, class Layout, class Element, bool kDeterministic, bool kBulk, class IssueNext, class Overlap>
__device__ __forceinline__ void dq_block(const FlexBackwardParams& p, unsigned s_ds, unsigned s_k, int col0, long long row_base,
                                         int q_row0, int t4, void* dq_buf, int m0, float (&sel)[8], IssueNext&& issue_next,
                                         Overlap&& overlap) {
  constexpr int kHeadDim = Layout::kHeadDim;
  constexpr int kNSel = kN + Layout::kSelectorCols;
  float acc[kNSel / 2];
  flex::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < Layout::kBlockN / 16; ++kk)
    flex::Wgmma<kNSel>::template ss<Element, 1, 1>(acc, flex::desc_mn_major<typename Layout::TileDS>(s_ds, kk * 16, 0),
                                                   flex::desc_mn_major<typename Layout::TileK>(s_k, kk * 16, col0), kk > 0 ? 1 : 0);
  flex::wgmma_commit();
  issue_next();
  overlap();
  flex::wgmma_wait<1>();
  flex::fence_operands(acc);
  if constexpr (Layout::kSelectorCols > 0) {
#pragma unroll
    for (int i = 0; i < 8; ++i) sel[i] = acc[kN / 2 + i];
  }
  if constexpr (kBulk) {
    using Value = typename Layout::DqValue;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      Value* row = static_cast<Value*>(dq_buf) + (q_row0 + half * 8 - m0) * Layout::kDqRowValues + col0 + 2 * t4;
#pragma unroll
      for (int i = 0; i < kN / 8; ++i) {
        const float a = acc[4 * i + 2 * half], c = acc[4 * i + 2 * half + 1];
        if constexpr (kDeterministic) *reinterpret_cast<ulonglong2*>(row + i * 8) = make_ulonglong2(flex_bwd::to_fixed(a), flex_bwd::to_fixed(c));
        else *reinterpret_cast<float2*>(row + i * 8) = make_float2(a, c);
      }
    }
  } else if constexpr (!kDeterministic) {
    // Two adjacent n8 tiles per float4 atomic: partners t4 and t4 ^ 1 swap one pair, so the even thread holds
    // columns 8i + 2 t4 .. + 3 of tile i and the odd one 8 (i + 1) + 2 (t4 - 1) .. + 3 of tile i + 1. Half the
    // atomic instructions of float2 ones, the same whole sectors: SAM ViT-B backward 5.03 -> 4.82 ms, plain D64
    // 3.69 -> 3.50, SAM D80 7.89 -> 7.55 (H100, same run); D32 unchanged.
    static_assert(kN % 16 == 0, "dq_block: float4 dQ atomics pair the n8 tiles");
    const bool odd = t4 & 1;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int q = q_row0 + half * 8;
#pragma unroll
      for (int i = 0; i < kN / 8; i += 2) {
        const float a0 = acc[4 * i + 2 * half], a1 = acc[4 * i + 2 * half + 1];
        const float b0 = acc[4 * i + 4 + 2 * half], b1 = acc[4 * i + 4 + 2 * half + 1];
        const float r0 = __shfl_xor_sync(0xffffffffu, odd ? a0 : b0, 1);
        const float r1 = __shfl_xor_sync(0xffffffffu, odd ? a1 : b1, 1);
        if (q < p.seqlen_q) {
          const int col = odd ? col0 + i * 8 + 8 + 2 * (t4 - 1) : col0 + i * 8 + 2 * t4;
          const float4 v = odd ? make_float4(r0, r1, b0, b1) : make_float4(a0, a1, r0, r1);
          atomicAdd(reinterpret_cast<float4*>(static_cast<float*>(p.dq_accum) + (row_base + q) * kHeadDim + col), v);
        }
      }
    }
  } else {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int q = q_row0 + half * 8;
      if (q < p.seqlen_q) {
#pragma unroll
        for (int i = 0; i < kN / 8; ++i) {
          const long long off = (row_base + q) * kHeadDim + col0 + i * 8 + 2 * t4;
          flex_bwd::accumulate<true>(p.dq_accum, off, acc[4 * i + 2 * half]);
          flex_bwd::accumulate<true>(p.dq_accum, off + 1, acc[4 * i + 2 * half + 1]);
        }
      }
    }
  }
}

// ---- Warp specialisation (kProducer): warpgroups 0 and 1 are the consumers above, warpgroup 2 the producer ----
// Named barriers of the consumers (0 is __syncthreads): kBarDsFree, both warpgroups' dQ GEMMs of the previous tile
// have read dS^T (it may be written again); kBarDq, dS^T complete before the dQ GEMM. The bulk dQ rows pass between
// the consumers and the writer warp through two mbarriers (dq_full: rows and slot written, one arrival per consumer
// thread; dq_empty: rows and slot read, one per writer lane): a named barrier that one side only arrives at orders the
// memory as well, but compute-sanitizer's racecheck reports it as a race.
constexpr int kBarDsFree = 1;
constexpr int kBarDq = 2;
constexpr int kConsumerThreads = 256;
// The register split: 24 for the producer warpgroup, 240 for each consumer thread (the 384-thread launch caps the
// kernel at 168, and 24 * 128 + 240 * 256 is that pool).
constexpr int kProducerRegs = 24;
constexpr int kConsumerRegs = 240;
// The Q / dO / lse2 / delta ring's full barrier: the producer's expect-tx arrival (the TMA copies' bytes) and one
// arrival per producer lane after its stores of lse2 and delta (each arrival releases that lane's stores).
constexpr int kFullArrivals = 1 + 32;

template <class S>
__device__ __forceinline__ flex::TmaPipeline<S::kStages> ring(unsigned s_base) {
  return flex::TmaPipeline<S::kStages>{s_base + S::kOffBars};
}
// The mbarriers after the ring's: K and V's, the dQ rows' full and empty ones.
template <class S>
__device__ __forceinline__ unsigned kv_barrier(unsigned s_base) {
  return s_base + S::kOffBars + 16u * S::kStages;
}
template <class S>
__device__ __forceinline__ unsigned dq_full_barrier(unsigned s_base) {
  return kv_barrier<S>(s_base) + 8u;
}
template <class S>
__device__ __forceinline__ unsigned dq_empty_barrier(unsigned s_base) {
  return kv_barrier<S>(s_base) + 16u;
}

// The mbarriers, by one thread before the CTA's first barrier: the ring's (full: the producer's expect-tx arrival and its
// lanes'; empty: every consumer thread), K and V's, and the dQ rows' (full: every consumer thread; empty: the writer's lanes).
template <class S>
__device__ __forceinline__ void init_barriers(unsigned s_base) {
  const auto pipe = ring<S>(s_base);
#pragma unroll
  for (int s = 0; s < S::kStages; ++s) {
    flex::mbarrier_init(pipe.full(s), kFullArrivals);
    flex::mbarrier_init(pipe.empty(s), kConsumerThreads);
  }
  flex::mbarrier_init(kv_barrier<S>(s_base), 1);
  flex::mbarrier_init(dq_full_barrier<S>(s_base), kConsumerThreads);
  flex::mbarrier_init(dq_empty_barrier<S>(s_base), 32);
  flex::fence_mbarrier_init();
}

// The producer warp: K and V once, then for every (head, query tile) of the schedule, in the consumers' order, Q and dO
// by TMA (rows past Sq arrive as zeros) and lse2 / delta by the lanes (+inf and 0 past Sq, as the other kernels have
// them) into the ring slot both consumer warpgroups released. The lanes load lse2 and delta before waiting for the
// slot, so the load latency overlaps the wait; plain stores and an mbarrier arrival per lane publish them (cp.async
// with a no-increment arrival would save the registers but is invisible to compute-sanitizer's racecheck).
template <class S, class Sched>
__device__ __forceinline__ void load(const FlexBackwardParams& p, const FlexBackwardTmaMaps& tma, const Sched& sched, unsigned s_base, int b,
                                     int hkv, int n0, int lane) {
  using TileQ = typename S::TileQ;
  using TileKV = typename S::TileKV;
  constexpr int kBlockM = S::kBlockM;
  const auto pipe = ring<S>(s_base);
  int pos = sched.next_pos(0);
  if (pos >= sched.total) return;  // no tile: the consumers wait for nothing
  const bool leader = lane == 0;
  if (leader) {
    flex::prefetch_tensor_map(&tma.q);
    flex::prefetch_tensor_map(&tma.d_o);
    const unsigned kv_bar = kv_barrier<S>(s_base);
    flex::mbarrier_arrive_expect_tx(kv_bar, 2 * TileKV::kBytes);
    flex::tma_load_tile<TileKV>(s_base + S::kOffK, &tma.k, kv_bar, n0, hkv, b);
    flex::tma_load_tile<TileKV>(s_base + S::kOffV, &tma.v, kv_bar, n0, hkv, b);
  }
  const int group = p.heads / p.kv_heads;
  flex::PipelineState<S::kStages> st;
  for (; pos < sched.total; pos = sched.next_pos(pos + 1)) {
    int head_in_group, m_block;
    sched.split(pos, head_in_group, m_block);
    const int h = hkv * group + head_in_group, m0 = m_block * kBlockM;
    const long long row = ((long long)b * p.heads + h) * p.seqlen_q + m0;
    constexpr int kRowsPerLane = kBlockM / 32;
    float lse2[kRowsPerLane], delta[kRowsPerLane];
#pragma unroll
    for (int i = 0; i < kRowsPerLane; ++i) {
      const int r = lane + 32 * i;
      const bool valid = m0 + r < p.seqlen_q;
      lse2[i] = valid ? p.lse2[row + r] : flex_bwd::pos_inf();
      delta[i] = valid ? p.delta[row + r] : 0.f;
    }
    flex::mbarrier_wait(pipe.empty(st.index), st.phase ^ 1u);
    const unsigned full = pipe.full(st.index);
    if (leader) {
      flex::mbarrier_arrive_expect_tx(full, 2 * TileQ::kBytes);
      flex::tma_load_tile<TileQ>(s_base + S::kOffQ + st.index * TileQ::kBytes, &tma.q, full, m0, h, b);
      flex::tma_load_tile<TileQ>(s_base + S::kOffDO + st.index * TileQ::kBytes, &tma.d_o, full, m0, h, b);
    }
#pragma unroll
    for (int i = 0; i < kRowsPerLane; ++i) {
      const int r = lane + 32 * i;
      asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(s_base + S::kOffLse + (st.index * kBlockM + r) * 4), "f"(lse2[i]) : "memory");
      asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(s_base + S::kOffDelta + (st.index * kBlockM + r) * 4), "f"(delta[i]) : "memory");
    }
    flex::mbarrier_arrive(full);
    st.advance();
  }
}

// What the consumers tell the dQ writer warp with each tile's rows: where they go and how many there are.
struct DqRowsSlot {
  long long row0;  // dq_accum row of the first (b, h, q) row
  int rows;        // valid rows of the tile
  int last;        // nonzero: the CTA's last tile
};
template <class S>
constexpr int kOffDqRowsSlot = S::kOffBars + 16 * S::kStages + 32;

// The dQ writer warp (kDqBulk), started when the CTA has a tile: per tile, waits until the consumers have written the
// tile's dQ rows and their slot, sends the rows to dq_accum by one bulk reduction each, and frees them for the next
// tile once read. It reads the rows' place from the slot (by shared-memory address: nothing live across the
// producer warpgroup's register cut that the producer warp does not hold too) rather than walking the schedule.
template <class S, bool kFixed>
__device__ __forceinline__ void write_dq(void* dq_accum, unsigned s_base, int lane) {
  constexpr int kHeadDim = S::kHeadDim;
  using Value = typename S::DqValue;
  for (unsigned phase = 0;; phase ^= 1u) {
    flex::mbarrier_wait(dq_full_barrier<S>(s_base), phase);
    DqRowsSlot t;
    asm volatile("ld.shared.v2.b64 {%0, %1}, [%2];\n" : "=l"(t.row0), "=l"(*reinterpret_cast<long long*>(&t.rows)) : "r"(s_base + kOffDqRowsSlot<S>) : "memory");
#pragma unroll
    for (int i = 0; i < S::kBlockM / 32; ++i) {
      const int r = lane + 32 * i;
      if (r < t.rows) {
        Value* dst = static_cast<Value*>(dq_accum) + (t.row0 + r) * kHeadDim;
        const unsigned src = s_base + S::kOffDqBuf + r * S::kDqRowBytes;
        if constexpr (kFixed) flex::bulk_reduce_add_u64(dst, src, kHeadDim * 8);
        else flex::bulk_reduce_add_f32(dst, src, kHeadDim * 4);
      }
    }
    flex::bulk_commit();
    flex::bulk_wait_read();
    if (t.last) break;
    flex::mbarrier_arrive(dq_empty_barrier<S>(s_base));
  }
  flex::bulk_wait();  // every reduction complete before the CTA's shared memory goes away
}

// Where a thread's elements of a tile lie, for the per-element steps.
struct ElementCoords {
  int b, h, hkv, m0;
  int kv_r0, t4;  // the thread's KV rows kv_r0 and kv_r0 + 8, its query columns m0 + 8 nt + 2 t4 + e % 2
  int warp, wg;
  int cls;        // the tile's class (2: partial, mask_mod decides)
  int seqlen_q, seqlen_kv;
};

// The P step of a tile (for the kernel's thread): P^T = exp(score_mod(scale * S^T) - lse) from the S^T accumulator,
// masked and out-of-range elements 0, into acc_s (P, or P d_score when that is folded in: kFoldDScore) and packed per
// n8 tile into the A fragments of dV += P^T dO (pa[kk] = columns 16 kk .. 16 kk + 15: a0 (g, 2t..), a1 (g + 8, 2t..),
// a2 / a3 the same 8 columns on); score_v keeps the scores for the scatters and a late d_score. kChecked: the tile may
// hold masked or out-of-range elements (partial tiles, tiles crossing Sq or Skv), which are tested one by one.
// Staged terms (flex_backward_staged.cuh) join the logit: Col values per element from st_col, the Tile term per query
// column from st_tile.
template <bool kChecked, class Variant, class Element, bool kFoldDScore, int kMT>
__device__ __forceinline__ void recompute_p(const FlexBackwardParams& p, const typename Variant::Params& vp, const ElementCoords& at, float scale_log2,
                                            const float* lse_st, const unsigned (&st_col)[kMT][2], const unsigned char* st_tile,
                                            float (&acc_s)[kMT][4], float (&score_v)[kMT][4], unsigned (&pa)[kMT / 2][4]) {
  using Mma = flex::Mma16816<Element>;
  using Mods = flex_bwd::BackwardMods<Variant>;
  using Staged = flex_bwd_staged::Flags<Variant>;
  constexpr bool kSpread = Staged::kSpread;
  constexpr float kLog2e = 1.4426950408889634f;
  const int b = at.b, h = at.h, hkv = at.hkv, m0 = at.m0, kv_r0 = at.kv_r0, t4 = at.t4, warp = at.warp, wg = at.wg;
  const int cls = at.cls, seqlen_q = at.seqlen_q, seqlen_kv = at.seqlen_kv;
#pragma unroll
  for (int nt = 0; nt < kMT; ++nt) {
    const float2 lse2 = *reinterpret_cast<const float2*>(lse_st + nt * 8 + 2 * t4);
    float st_add[2] = {0.f, 0.f};  // the Tile term per query column
    if constexpr (Staged::kTile && kSpread) {
      st_add[0] = flex_bwd_staged::read_tile8<typename Variant::StagedTileElement>(st_tile, nt * 8 + 2 * t4, warp);
      st_add[1] = flex_bwd_staged::read_tile8<typename Variant::StagedTileElement>(st_tile, nt * 8 + 2 * t4 + 1, warp);
    } else if constexpr (Staged::kTile) {
      st_add[0] = flex_bwd_staged::read_tile<typename Variant::StagedTileElement>(st_tile, nt * 8 + 2 * t4, wg);
      st_add[1] = flex_bwd_staged::read_tile<typename Variant::StagedTileElement>(st_tile, nt * 8 + 2 * t4 + 1, wg);
    }
    // Without a score_mod left, the Tile term and the LSE of a query column fold into one addend per column
    // (two FFMAs per n8 block instead of an FADD per element).
    const float st_base[2] = {fmaf(st_add[0], kLog2e, -lse2.x), fmaf(st_add[1], kLog2e, -lse2.y)};
    float pv[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int q = m0 + nt * 8 + 2 * t4 + (e % 2);
      const int kv = kv_r0 + (e / 2) * 8;
      const float score = acc_s[nt][e] * p.scale;
      score_v[nt][e] = score;
      bool keep = !kChecked || (q < seqlen_q && kv < seqlen_kv);
      float z = score;
      if (keep) {
        const typename Variant::Row rs{};
        const typename Variant::Col cs{};
        const typename Variant::Tile ts{};
        z = Mods::score_mod(vp, rs, cs, ts, b, h, hkv, q, kv, 0, score);
        if constexpr (Variant::kHasMaskMod && kChecked) {
          if (cls == 2 && !Mods::mask_mod(vp, rs, cs, ts, b, h, hkv, q, kv, 0)) keep = false;
        }
      }
      float x;  // the exponent of P
      if constexpr (Staged::kAny) {
        // The staged terms join the logit: with no score_mod left, scale and log2(e) still fold into one
        // FFMA on the raw q.k, the terms into its addend.
        float col = 0.f;
        if constexpr (Staged::kCol) col = flex_bwd_staged::unpack<typename Variant::StagedColElement>(st_col[nt][e / 2], e % 2);
        if constexpr (Variant::kHasScoreMod) x = (z + (st_add[e % 2] + col)) * kLog2e - (e % 2 ? lse2.y : lse2.x);
        else if constexpr (Staged::kCol) x = fmaf(acc_s[nt][e], scale_log2, fmaf(col, kLog2e, st_base[e % 2]));
        else x = fmaf(acc_s[nt][e], scale_log2, st_base[e % 2]);
      } else {
        x = Mods::logit2(z, acc_s[nt][e], scale_log2) - (e % 2 ? lse2.y : lse2.x);
      }
      pv[e] = Mods::template prob<kChecked>(keep, x);
      // dS_pre = P d_score (dP - delta) when d_score is folded into P.
      acc_s[nt][e] = kFoldDScore ? Mods::ds_pre(vp, b, h, hkv, q, kv, score, pv[e]) : pv[e];
    }
    pa[nt / 2][(nt % 2) * 2 + 0] = Mma::pack(pv[0], pv[1]);
    pa[nt / 2][(nt % 2) * 2 + 1] = Mma::pack(pv[2], pv[3]);
  }
}

// The dS step of a tile: dS = P (dP - delta) in place of dP^T (acc_s holds P, or P d_score when that was folded in,
// which gives dS_pre directly). kChecked: exactly 0 where P is (masked and out-of-range elements); interior full
// tiles have no such element, so only the tiles that test elements pay for the select.
template <bool kChecked, class Variant, int kMT>
__device__ __forceinline__ void compute_ds(const float (&acc_s)[kMT][4], float (&acc_dp)[kMT][4], const float* delta_st, int t4) {
#pragma unroll
  for (int nt = 0; nt < kMT; ++nt) {
    const float2 dl = *reinterpret_cast<const float2*>(delta_st + nt * 8 + 2 * t4);
#pragma unroll
    for (int e = 0; e < 4; ++e) acc_dp[nt][e] = flex_bwd::BackwardMods<Variant>::template ds<kChecked>(acc_s[nt][e], acc_dp[nt][e], e % 2 ? dl.y : dl.x);
  }
}

// An accumulator tile [kMT n8 tiles][4] packed into the A fragments of an rs wgmma (a[kk]: columns 16 kk .. + 15).
template <class Element, int kMT>
__device__ __forceinline__ void pack_a(const float (&acc)[kMT][4], unsigned (&a)[kMT / 2][4]) {
  using Mma = flex::Mma16816<Element>;
#pragma unroll
  for (int kk = 0; kk < kMT / 2; ++kk) {
    a[kk][0] = Mma::pack(acc[2 * kk][0], acc[2 * kk][1]);
    a[kk][1] = Mma::pack(acc[2 * kk][2], acc[2 * kk][3]);
    a[kk][2] = Mma::pack(acc[2 * kk + 1][0], acc[2 * kk + 1][1]);
    a[kk][3] = Mma::pack(acc[2 * kk + 1][2], acc[2 * kk + 1][3]);
  }
}

// The thread's packed dS^T (rows r and r + 8 of the CTA's 128 KV rows) into the shared [128][64] tile dQ's GEMM reads:
// element (kv row r, query column c); each quad writes 4-byte pairs of one chunk.
template <class S, int kKK>
__device__ __forceinline__ void store_ds_t(unsigned char* smem, const unsigned (&da)[kKK][4], int r, int t4) {
  using TileDS = typename S::TileDS;
#pragma unroll
  for (int kk = 0; kk < kKK; ++kk) {
    *reinterpret_cast<unsigned*>(smem + S::kOffDS + TileDS::chunk_offset(r, 2 * kk) + 4 * t4) = da[kk][0];
    *reinterpret_cast<unsigned*>(smem + S::kOffDS + TileDS::chunk_offset(r + 8, 2 * kk) + 4 * t4) = da[kk][1];
    *reinterpret_cast<unsigned*>(smem + S::kOffDS + TileDS::chunk_offset(r, 2 * kk + 1) + 4 * t4) = da[kk][2];
    *reinterpret_cast<unsigned*>(smem + S::kOffDS + TileDS::chunk_offset(r + 8, 2 * kk + 1) + 4 * t4) = da[kk][3];
  }
}

// The tile scheduler: the KV block a CTA owns, from its place in the launch. Launch order: groups of kHeadGroup
// (KV head, batch) pairs, and inside a group every pair's KV block n before block n + 1. Under causal-like masks the
// low KV blocks see the most query tiles, so each group's heaviest CTAs start first and the last wave holds light
// ones (with the KV block fastest, the heavy CTAs of the last heads ran in the tail). The groups keep the Q / dO
// tiles streamed at once to about kHeadGroup heads, which L2 holds (the policy's head_group).
template <int kBlockN, int kHeadGroup, bool kSpread>
struct KvBlock {
  int b, hkv;
  // The CTA's KV rows: local row lr is KV row n0 + lr, or with spread rows (flex_backward_staged.cuh) n0 +
  // 64 (lr / 16) + lr % 16 from n0 = 512 (n / 4) + 16 (n % 4), warp w's 16 rows in kv // 64 block 8 (n / 4) + w.
  int spread_j0;    // spread rows: the CTA's first J
  int spread_col0;  // and its kv % 64 columns
  int n0;

  __device__ __forceinline__ KvBlock() {
    const int lin = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    const int pairs = gridDim.y * gridDim.z;
    const int group_ctas = kHeadGroup * gridDim.x;
    const int pair_group = lin / group_ctas;
    const int in_group = lin - pair_group * group_ctas;
    const int group_pairs = min(kHeadGroup, pairs - pair_group * kHeadGroup);
    const int pair = pair_group * kHeadGroup + in_group % group_pairs;
    const int n_block = in_group / group_pairs;
    hkv = pair % gridDim.y;
    b = pair / gridDim.y;
    spread_j0 = 8 * (n_block / flex_bwd_staged::kSpreadCtas);
    spread_col0 = 16 * (n_block % flex_bwd_staged::kSpreadCtas);
    n0 = kSpread ? 64 * spread_j0 + spread_col0 : n_block * kBlockN;
  }
  __device__ __forceinline__ int kv_of(int lr) const { return kSpread ? n0 + 64 * (lr / 16) + lr % 16 : n0 + lr; }
};

// The loads of the 256-thread form (no producer warp): every thread issues cp.async copies of K and V once and of
// each scheduled query tile's Q, dO, staged terms, lse2 and delta, a tile ahead of the one being computed.
template <class Traits, class Variant, class S>
struct CpAsyncLoads {
  using Element = typename Traits::Element;
  using Staged = flex_bwd_staged::Flags<Variant>;
  using TileQ = typename S::TileQ;
  static constexpr int kBlockM = Traits::kBlockM;
  static constexpr int kBlockN = Traits::kBlockN;
  static constexpr int kNThreads = Traits::kNThreads;
  static constexpr bool kSpread = Staged::kSpread;

  const FlexBackwardParams& p;
  const typename Variant::Params& vp;
  unsigned char* smem;
  unsigned s_base;
  int tid, b, hkv, group, n0, spread_j0, spread_col0;  // as KvBlock
  int seqlen_q, seqlen_kv;
  const Element* g_k;  // the CTA's (batch, KV head) of K and V
  const Element* g_v;
  float* sh_lse;
  float* sh_delta;

  __device__ __forceinline__ CpAsyncLoads(const FlexBackwardParams& p_, const typename Variant::Params& vp_, unsigned char* smem_,
                                          unsigned s_base_, int tid_, int b_, int hkv_, int group_, int n0_, int spread_j0_,
                                          int spread_col0_, int seqlen_q_, int seqlen_kv_)
      : p(p_), vp(vp_), smem(smem_), s_base(s_base_), tid(tid_), b(b_), hkv(hkv_), group(group_), n0(n0_), spread_j0(spread_j0_),
        spread_col0(spread_col0_), seqlen_q(seqlen_q_), seqlen_kv(seqlen_kv_),
        g_k(static_cast<const Element*>(p_.k) + b_ * p_.k_stride_b + hkv_ * p_.k_stride_h),
        g_v(static_cast<const Element*>(p_.v) + b_ * p_.v_stride_b + hkv_ * p_.v_stride_h),
        sh_lse(reinterpret_cast<float*>(smem_ + S::kOffLse)),
        sh_delta(reinterpret_cast<float*>(smem_ + S::kOffDelta)) {}

  __device__ __forceinline__ void load_kv() const {
    if constexpr (kSpread) {
      flex::load_swizzled_row_groups<typename S::TileK, kBlockN, kNThreads, 16>(s_base + S::kOffK, g_k, p.k_stride_s, n0, 64, seqlen_kv, tid);
      flex::load_swizzled_row_groups<typename S::TileKV, kBlockN, kNThreads, 16>(s_base + S::kOffV, g_v, p.v_stride_s, n0, 64, seqlen_kv, tid);
    } else {
      flex::load_swizzled_rows<typename S::TileK, kBlockN, kNThreads>(s_base + S::kOffK, g_k, p.k_stride_s, n0, seqlen_kv, tid);
      flex::load_swizzled_rows<typename S::TileKV, kBlockN, kNThreads>(s_base + S::kOffV, g_v, p.v_stride_s, n0, seqlen_kv, tid);
    }
  }

  __device__ __forceinline__ void load_q_tile(int head_in_group, int m_block, int stage) const {
    const unsigned s_q0 = s_base + S::kOffQ, s_do0 = s_base + S::kOffDO;
    const int h = hkv * group + head_in_group;
    const int m0 = m_block * kBlockM;
    const Element* g_q = static_cast<const Element*>(p.q) + b * p.q_stride_b + h * p.q_stride_h;
    const Element* g_do = static_cast<const Element*>(p.d_o) + b * p.do_stride_b + h * p.do_stride_h;
    flex::load_swizzled_rows<TileQ, kBlockM, kNThreads>(s_q0 + stage * TileQ::kBytes, g_q, p.q_stride_s, m0, seqlen_q, tid);
    flex::load_swizzled_rows<TileQ, kBlockM, kNThreads>(s_do0 + stage * TileQ::kBytes, g_do, p.do_stride_s, m0, seqlen_q, tid);
    if constexpr (Staged::kCol) {
      const int off = S::kOffStCol + stage * flex_bwd_staged::kColBytes;
      // Spread rows read only their 16 columns (2 of the 8 chunks).
      if constexpr (kSpread)
        flex::load_staged_block<kBlockM, kNThreads, 2>(smem + off, s_base + off, Variant::staged_col(vp, b, h, hkv), m0, seqlen_q, tid,
                                                       spread_col0 / 8);
      else
        flex::load_staged_block<kBlockM, kNThreads>(smem + off, s_base + off, Variant::staged_col(vp, b, h, hkv), m0, seqlen_q, tid);
    }
    if constexpr (Staged::kTile) {
      if (tid >= kBlockM && tid < 2 * kBlockM) {
        const int off = S::kOffStTile + stage * Staged::kTileStageBytes;
        if constexpr (kSpread)
          flex_bwd_staged::load_tile8(smem + off, s_base + off, Variant::staged_tile(vp, b, h, hkv), m0, seqlen_q, spread_j0, seqlen_kv,
                                      tid - kBlockM);
        else
          flex_bwd_staged::load_tile(smem + off, s_base + off, Variant::staged_tile(vp, b, h, hkv), m0, seqlen_q, n0 / 64, seqlen_kv,
                                     tid - kBlockM);
      }
    }
    if (tid < kBlockM) {
      // Rows past Sq: lse2 = +inf (P = 0) by a plain store, delta zero-filled.
      const long long row = ((long long)b * p.heads + h) * seqlen_q + m0 + tid;
      const bool valid = m0 + tid < seqlen_q;
      if (valid) flex_bwd::cp_async_4(flex::smem_addr(sh_lse + stage * kBlockM + tid), p.lse2 + row, true);
      else sh_lse[stage * kBlockM + tid] = flex_bwd::pos_inf();
      flex_bwd::cp_async_4(flex::smem_addr(sh_delta + stage * kBlockM + tid), valid ? p.delta + row : p.delta, valid);
    }
  }
};

// The 256-thread form's bulk dQ rows (kDqBulk without the writer warp): the query tile whose rows sit in shared
// memory, sent by threads 0..63 (row tid) after the next tile's first barrier, which follows the rows' stores and fences.
template <class S, bool kFixed>
struct PendingDqRows {
  long long row_base = -1;  // dq_accum row of the tile's first row; -1: none pending
  int rows = 0;
  __device__ __forceinline__ void send(void* dq_accum, unsigned s_base, int tid) {
    if (row_base >= 0 && tid < rows) {
      const unsigned src = s_base + S::kOffDqBuf + tid * S::kDqRowBytes;
      const long long row = (row_base + tid) * S::kHeadDim;
      if constexpr (kFixed) flex::bulk_reduce_add_u64(static_cast<unsigned long long*>(dq_accum) + row, src, S::kHeadDim * 8);
      else flex::bulk_reduce_add_f32(static_cast<float*>(dq_accum) + row, src, S::kHeadDim * 4);
      flex::bulk_commit();
    }
    row_base = -1;
  }
};

// The epilogue: dK = scale * acc_dk and dV = acc_dv, the accumulators of the thread's KV rows kv_r0 and kv_r0 + 8,
// to global memory (rows past Skv dropped).
template <class Element, int kHeadDim>
__device__ __forceinline__ void store_dk_dv(const FlexBackwardParams& p, const float (&acc_dk)[kHeadDim / 2], const float (&acc_dv)[kHeadDim / 2],
                                            int b, int hkv, int kv_r0, int t4, int seqlen_kv) {
  using Mma = flex::Mma16816<Element>;
  Element* g_dk = static_cast<Element*>(p.dk) + b * p.dk_stride_b + hkv * p.dk_stride_h;
  Element* g_dv = static_cast<Element*>(p.dv) + b * p.dv_stride_b + hkv * p.dv_stride_h;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int kv = kv_r0 + half * 8;
    if (kv < seqlen_kv) {
#pragma unroll
      for (int i = 0; i < kHeadDim / 8; ++i) {
        const int d = i * 8 + 2 * t4;
        *reinterpret_cast<unsigned*>(g_dk + kv * p.dk_stride_s + d) =
            Mma::pack(acc_dk[4 * i + 2 * half] * p.scale, acc_dk[4 * i + 2 * half + 1] * p.scale);
        *reinterpret_cast<unsigned*>(g_dv + kv * p.dv_stride_s + d) = Mma::pack(acc_dv[4 * i + 2 * half], acc_dv[4 * i + 2 * half + 1]);
      }
    }
  }
}

}  // namespace flex_bwd_sm90

// The main backward kernel for sm_90a. grid = (BackwardConfig::main_grid_x(Skv): ceil(Skv / 128), or 4 per started
// 512 rows with spread rows; Hkv, B), block = 256 (384 with kProducer),
// dynamic shared memory = flex_bwd_sm90::Smem<Traits, Variant, kDqBulk, kGradGemm, kDqBulk && kDeterministic, kProducer>::kAllocBytes.
// Traits = FlexBackwardTraits<D, Element>.
// kDq = false: dQ is left to another pass (no dS^T store, no dQ GEMM, no dQ atomics).
// kDqBulk: dQ partials are added to dq_accum by bulk reductions (cp.reduce.async.bulk, one per query row, issued
// by threads 0..63 after the next tile's first barrier) instead of atomics from the accumulators, so that no warp
// waits for its reductions' registers to drain. Deterministic launches reduce 64-bit fixed point (one bulk
// integer reduction per row instead of one 64-bit atomic per element): the same bits whatever the order.
// kGradGemm: spread rows' staged gradients by selector GEMMs on the dS^T tile (flex_backward_staged.cuh); needs bf16
// and d_score = 1, where that tile holds the terms' gradient, and a gradient of both terms (one GEMM per warpgroup).
// kProducer: warp-specialised, block = 384. Warpgroups 0 and 1 compute as above; warpgroup 2 gives its registers
// to them (setmaxnreg) and holds the producer warp (flex_bwd_sm90::load: K, V, Q, dO by TMA from `tma`, lse2 and
// delta by its lanes, through a two-slot mbarrier ring) and, with kDqBulk, the dQ writer warp (write_dq). The
// consumers then never issue a load or wait at a CTA-wide barrier: they meet at named barriers for dS^T only.
// Modules without scatters or staged terms (those reduce through CTA-wide barriers).
template <class Traits, class Variant, bool kDeterministic, bool kDq = true, bool kDqBulk = false, bool kGradGemm = false,
          bool kProducer = false>
__device__ __forceinline__ void flex_backward_main_sm90(const FlexBackwardParams& p, const typename Variant::Params& vp,
                                                        const FlexBackwardTmaMaps* tma = nullptr) {
  using Element = typename Traits::Element;
  using Mods = flex_bwd::BackwardMods<Variant>;
  using S = flex_bwd_sm90::Smem<Traits, Variant, kDqBulk, kGradGemm, kDqBulk && kDeterministic, kProducer>;
  static_assert(!kGradGemm || (Variant::kDScoreIsOne && flex::std_like::is_same<Element, __nv_bfloat16>::value && kDq &&
                               Variant::kStagedTileScatter >= 0),
                "flex_backward_main_sm90: selector GEMMs need bf16 dS^T equal to dS (d_score = 1) and both staged gradients");
  static_assert(!kDqBulk || kDq, "flex_backward_main_sm90: bulk dQ reductions need kDq");
  using Staged = flex_bwd_staged::Flags<Variant>;
  using TileKV = typename S::TileKV;
  using TileK = typename S::TileK;
  using TileQ = typename S::TileQ;
  using TileDS = typename S::TileDS;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kNThreads = Traits::kNThreads;
  constexpr int kD16 = kHeadDim / 16;
  constexpr int kMT = kBlockM / 8;  // n8 column tiles of S^T (query columns)
  constexpr float kLog2e = 1.4426950408889634f;
  constexpr int kNumScatters = Variant::kNumScatters;
  // Without scatters, d_score is folded into P before dS (no score kept across the dP wait).
  constexpr bool kFoldDScore = !Variant::kDScoreIsOne && kNumScatters == 0;
  // A single tile-reduced scatter (q-only or diagonal, e.g. the learnable bias[h, q - kv + S - 1]) is split
  // around the GEMMs: its per-element sums right after dS, its warp shuffles while dK runs, its cross-warp sums
  // and atomics while dQ runs, behind the barrier dQ needs anyway (scatter_one would add two barriers and keep
  // the tensor cores idle through all of it).
  using TileScatter0 = flex_bwd::TileScatter<Traits, Variant, kDeterministic, 0>;
  constexpr bool kSplitScatter = kDq && kNumScatters == 1 && TileScatter0::kReduced;
  // Staged terms reduce their gradients behind the dQ barrier: only modules with the KV-major dQ stage them.
  static_assert(kDq || !Staged::kAny, "flex_backward_main_sm90: staged terms need kDq");
  // The scatter code assumes contiguous KV rows: spread rows only when every scatter is a staged term's.
  static_assert(!Staged::kSpread || flex_bwd_staged::all_scatters_staged<Variant>(), "flex_backward_main_sm90: spread rows with other scatters");
  static_assert(!kProducer || (kDq && kNumScatters == 0 && !Staged::kAny && !kGradGemm),
                "flex_backward_main_sm90: the warp-specialised form has no scatters or staged terms (their reductions use CTA barriers)");

  extern __shared__ __align__(1024) unsigned char flex_smem_sm90[];
  const unsigned raw_base = flex::smem_addr(flex_smem_sm90);
  const unsigned pad = ((raw_base + 1023u) & ~1023u) - raw_base;
  unsigned char* smem = flex_smem_sm90 + pad;
  const unsigned s_base = raw_base + pad;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  // warpgroup: KV rows 64 wg .. 64 wg + 63. Through a shuffle the compiler knows it is warp-uniform and keeps the
  // wgmma descriptors that depend on it in uniform registers (from warp / 4 it rebuilt each in vector registers).
  const int wg = __shfl_sync(0xffffffffu, warp / 4, 0);
  constexpr bool kSpread = Staged::kSpread;
  const flex_bwd_sm90::KvBlock<kBlockN, Traits::kPolicy.head_group, kSpread> blk;
  const int b = blk.b, hkv = blk.hkv, n0 = blk.n0, spread_j0 = blk.spread_j0, spread_col0 = blk.spread_col0;
  const int seqlen_q = p.seqlen_q, seqlen_kv = p.seqlen_kv;
  const int group = p.heads / p.kv_heads;
  const bool kv_tail = blk.kv_of(kBlockN - 1) >= seqlen_kv;

  const unsigned s_k0 = s_base + S::kOffK, s_v0 = s_base + S::kOffV;
  const unsigned s_q0 = s_base + S::kOffQ, s_do0 = s_base + S::kOffDO;
  float* sh_lse = reinterpret_cast<float*>(smem + S::kOffLse);
  float* sh_delta = reinterpret_cast<float*>(smem + S::kOffDelta);
  float* sh_red = reinterpret_cast<float*>(smem + S::kOffRed);
  float* sh_planes = reinterpret_cast<float*>(smem + S::kOffPlanes);
  float* sh_st_grad = reinterpret_cast<float*>(smem + S::kOffStGrad);
  void* sh_dq = smem + S::kOffDqBuf;
  flex_bwd_sm90::PendingDqRows<S, kDeterministic> pending;  // kDqBulk without the writer warp

  const flex_bwd_sm90::CpAsyncLoads<Traits, Variant, S> loads(p, vp, smem, s_base, tid, b, hkv, group, n0, spread_j0, spread_col0, seqlen_q, seqlen_kv);

  // The schedule merges the block mask over the KV range the rows span (512 rows when spread).
  const int range0 = kSpread ? 64 * spread_j0 : n0;
  const flex_bwd::ColumnSchedule<kBlockM, kBlockN, kNThreads, Traits::kMaxSched> sched(
      p, b, hkv, range0, smem + S::kOffSched, tid < kNThreads ? tid : 1 << 30, range0 + (kSpread ? flex_bwd_staged::kSpreadRange : kBlockN) - 1);
  const int total = sched.total;
  if constexpr (S::kSelectorsInK) flex_bwd_staged::build_selectors<TileK, Element>(smem + S::kOffK, tid, kNThreads);
  else if constexpr (kGradGemm) flex_bwd_staged::build_selectors<flex_bwd_staged::SelectorTiles, Element>(smem + S::kOffSelectors, tid, kNThreads);

  int pos = sched.next_pos(0);
  int head_in_group, m_block;  // of pos
  sched.split(pos, head_in_group, m_block);
  const auto ring = flex_bwd_sm90::ring<S>(s_base);  // kProducer
  if constexpr (kProducer) {
    static_assert(kNThreads == flex_bwd_sm90::kConsumerThreads, "flex_backward_main_sm90: two consumer warpgroups");
    if (tid == 0) flex_bwd_sm90::init_barriers<S>(s_base);
    __syncthreads();
    if (tid >= kNThreads) {
      flex::setmaxnreg_dec<flex_bwd_sm90::kProducerRegs>();
      if (warp == kNThreads / 32) flex_bwd_sm90::load<S>(p, *tma, sched, s_base, b, hkv, n0, lane);
      else if (kDqBulk && warp == kNThreads / 32 + 1 && pos < total) flex_bwd_sm90::write_dq<S, kDeterministic>(p.dq_accum, s_base, lane);
      return;
    }
    flex::setmaxnreg_inc<flex_bwd_sm90::kConsumerRegs>();
    if (pos < total) flex::mbarrier_wait(flex_bwd_sm90::kv_barrier<S>(s_base), 0);
  } else {
    loads.load_kv();
    if (pos < total) loads.load_q_tile(head_in_group, m_block, 0);
    flex::cp_async_commit();
  }

  // dK, dV: this warp's 16 KV rows x D, in the wgmma accumulator layout (d[4i + e]: row g + 8 (e / 2), column 8i + 2t + e % 2).
  float acc_dk[kHeadDim / 2];
  float acc_dv[kHeadDim / 2];
#pragma unroll
  for (int i = 0; i < kHeadDim / 2; ++i) acc_dk[i] = acc_dv[i] = 0.f;

  float acc_uniform[kNumScatters > 0 ? kNumScatters : 1];
  float acc_kvrow[kNumScatters > 0 ? kNumScatters : 1][2];
#pragma unroll
  for (int i = 0; i < (kNumScatters > 0 ? kNumScatters : 1); ++i) acc_uniform[i] = acc_kvrow[i][0] = acc_kvrow[i][1] = 0.f;

  static_assert(TileScatter0::kPlaneFloats * 4 == S::kOffSched - S::kOffPlanes, "flex_backward_main_sm90: plane region size");
  if constexpr (kSplitScatter && TileScatter0::kClass == flex_bwd::kScatterDiagonal) TileScatter0::zero_planes(sh_planes, tid);  // ordered by the loop's first barrier

  const float scale_log2 = p.scale * kLog2e;
  int stage = 0;
  flex::PipelineState<S::kStages> st;  // kProducer: the ring slot of this tile
  unsigned dq_phase = 0;                // kProducer, kDqBulk: the parity of this tile's dq_full phase
  while (pos < total) {
    const int h = hkv * group + head_in_group;
    const int m0 = m_block * kBlockM;
    const int cls = sched.class_at(pos);
    const int pos_next = sched.next_pos(pos + 1);
    int head_next, m_next;
    sched.split(pos_next, head_next, m_next);

    if constexpr (kProducer) {
      stage = st.index;
      ring.consumer_wait(st);  // the producer's Q, dO, lse2 and delta of this tile have landed
    } else {
      // This stage's cp.async data visible to the tensor cores (async proxy) of every warp.
      flex::cp_async_wait<0>();
      flex::fence_proxy_async();
      __syncthreads();
      if constexpr (kDqBulk) pending.send(p.dq_accum, s_base, tid);  // the previous tile's rows (stored and fenced before the barrier)
      if (pos_next < total) loads.load_q_tile(head_next, m_next, stage ^ 1);
      flex::cp_async_commit();
    }
    const int ln = (int)flex_bwd_sm90::opaque(lane);
    const int g = ln / 4, t4 = ln % 4;
    const int kv_r0 = blk.kv_of(warp * 16 + g);  // the thread's KV rows: kv_r0, kv_r0 + 8
    const unsigned s_k = flex_bwd_sm90::opaque(s_k0), s_v = flex_bwd_sm90::opaque(s_v0);
    const unsigned s_ds = flex_bwd_sm90::opaque(s_base + S::kOffDS);
    const unsigned sq = flex_bwd_sm90::opaque(s_q0) + stage * TileQ::kBytes;
    const unsigned sdo = flex_bwd_sm90::opaque(s_do0) + stage * TileQ::kBytes;
    const float* lse_st = sh_lse + stage * kBlockM;
    const float* delta_st = sh_delta + stage * kBlockM;

    // S^T = K Q^T, then dP^T = V dO^T, as two groups: P is computed while dP^T is still running.
    float acc_s[kMT][4], acc_dp[kMT][4];
    flex::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kD16; ++kk)
      flex::Wgmma<kBlockM>::template ss<Element, 0, 0>(flex_bwd_sm90::flat(acc_s), flex::desc_k_major<TileK>(s_k, wg * 64, kk * 16),
                                                       flex::desc_k_major<TileQ>(sq, 0, kk * 16), kk > 0 ? 1 : 0);
    flex::wgmma_commit();
#pragma unroll
    for (int kk = 0; kk < kD16; ++kk)
      flex::Wgmma<kBlockM>::template ss<Element, 0, 0>(flex_bwd_sm90::flat(acc_dp), flex::desc_k_major<TileKV>(s_v, wg * 64, kk * 16),
                                                       flex::desc_k_major<TileQ>(sdo, 0, kk * 16), kk > 0 ? 1 : 0);
    flex::wgmma_commit();
    flex::wgmma_wait<1>();
    flex::fence_operands(flex_bwd_sm90::flat(acc_s));

    // P^T (or P^T d_score) into acc_s and the A fragments of dV's GEMM, from S^T: flex_bwd_sm90::recompute_p, with
    // every element tested on partial tiles and tiles crossing Sq or Skv, and none tested on interior full tiles
    // (most of them), which takes the per-element predicates and branches out of the common path.
    const bool check_elements = cls == 2 || kv_tail || m0 + kBlockM > seqlen_q;
    const flex_bwd_sm90::ElementCoords at{b, h, hkv, m0, kv_r0, t4, warp, wg, cls, seqlen_q, seqlen_kv};
    float score_v[kMT][4];  // kept only for the scatters / a late d_score (dead code otherwise)
    unsigned pa[kBlockM / 16][4];
    // Staged terms of this query tile (flex_backward_staged.cuh): Col values per element, Tile per query column.
    unsigned st_col[kMT][2];
    if constexpr (Staged::kCol)
      flex_bwd_staged::read_col(st_col, s_base + S::kOffStCol + stage * flex_bwd_staged::kColBytes, kSpread ? spread_col0 / 8 : 2 * (warp % 4), ln);
    const unsigned char* st_tile = smem + S::kOffStTile + stage * Staged::kTileStageBytes;
    if (check_elements)
      flex_bwd_sm90::recompute_p<true, Variant, Element, kFoldDScore>(p, vp, at, scale_log2, lse_st, st_col, st_tile, acc_s, score_v, pa);
    else
      flex_bwd_sm90::recompute_p<false, Variant, Element, kFoldDScore>(p, vp, at, scale_log2, lse_st, st_col, st_tile, acc_s, score_v, pa);

    // dV += P^T dO (A = P^T from registers, B = dO MN-major), running while dS is computed.
    flex::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBlockM / 16; ++kk)
      flex::Wgmma<kHeadDim>::template rs<Element, 1>(acc_dv, pa[kk], flex::desc_mn_major<TileQ>(sdo, kk * 16, 0), 1);
    flex::wgmma_commit();

    // dS = P (dP - delta) in place of dP^T (the dS_pre directly when d_score was folded in).
    flex::wgmma_wait<1>();
    flex::fence_operands(flex_bwd_sm90::flat(acc_dp));
    if (check_elements) flex_bwd_sm90::compute_ds<true, Variant>(acc_s, acc_dp, delta_st, t4);
    else flex_bwd_sm90::compute_ds<false, Variant>(acc_s, acc_dp, delta_st, t4);

    // Scatters (buffer gradients) from dS, then dS_pre = dS * d_score; the staged terms' dS^T into their planes.
    if constexpr (kGradGemm) {
      // Nothing here: the selector GEMMs read the dS^T tile that dQ needs anyway.
    } else if constexpr (Staged::kGrad && kSpread) flex_bwd_staged::write_slab<(Variant::kStagedTileScatter >= 0)>(sh_st_grad, acc_dp, warp, ln);
    else if constexpr (Staged::kGrad) flex_bwd_staged::write_plane(sh_st_grad, acc_dp, wg, warp, ln);
    TileScatter0 split_scatter;
    if constexpr (kSplitScatter) {
      if (check_elements) split_scatter.template thread_sum<true>(vp, acc_dp, score_v, b, h, hkv, m0, kv_r0, t4, true);
      else split_scatter.template thread_sum<false>(vp, acc_dp, score_v, b, h, hkv, m0, kv_r0, t4, true);
    } else if constexpr (kNumScatters > 0)
      flex_bwd::scatter_one<Traits, Variant, kDeterministic, 0>(p, vp, acc_dp, score_v, acc_uniform, acc_kvrow, sh_red, b, h, hkv, m0, n0,
                                                                kv_r0, warp, lane, true);
    if constexpr (!kFoldDScore) Mods::ds_pre(vp, b, h, hkv, flex_bwd::KvMajorFragment{m0, kv_r0, t4}, acc_dp, score_v);

    // dK += dS^T Q (A = dS^T from registers, B = Q MN-major); dS^T into shared memory for dQ.
    unsigned da[kBlockM / 16][4];
    flex_bwd_sm90::pack_a<Element>(acc_dp, da);
    // dK's GEMM: right here without dQ; with dQ, behind dQ's GEMM (dq_block), so that dQ's atomics go out while it
    // runs, or, warp-specialised with bulk dQ rows (whose stores are quick), before the dS^T barriers, so that the
    // tensor cores have it while the warpgroups meet there.
    auto issue_dk = [&] {
      flex::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBlockM / 16; ++kk)
        flex::Wgmma<kHeadDim>::template rs<Element, 1>(acc_dk, da[kk], flex::desc_mn_major<TileQ>(sq, kk * 16, 0), 1);
      flex::wgmma_commit();
    };
    constexpr bool kDkFirst = kProducer && kDqBulk;
    if constexpr (kDkFirst) issue_dk();
    if constexpr (kDq) {
      // Without the loop-top barrier, the other warpgroup may still be in the previous tile's dQ GEMM.
      if constexpr (kProducer) flex::named_barrier_sync(flex_bwd_sm90::kBarDsFree, kNThreads);
      flex_bwd_sm90::store_ds_t<S>(smem, da, warp * 16 + g, t4);
    }
    if constexpr (!kDq && !kDkFirst) issue_dk();
    if constexpr (kSplitScatter) {
      if constexpr (TileScatter0::kClass == flex_bwd::kScatterDiagonal) split_scatter.warp_sum_planes(sh_red, sh_planes, warp, ln);
      else split_scatter.warp_sum(sh_red, warp, ln);
    }

    if constexpr (kDq) {
      // dQ needs the dS^T rows of both warpgroups (and the split scatter every warp's slots). kDqBulk: the bulk
      // reductions issued at the top of this tile have read sh_dq before anyone writes it again.
      if constexpr (kProducer) {
        flex::fence_proxy_async();
        // With bulk rows, the writer warp must have read the previous tile's (a fresh barrier reads as released).
        if constexpr (kDqBulk) flex::mbarrier_wait(flex_bwd_sm90::dq_empty_barrier<S>(s_base), dq_phase ^ 1u);
        flex::named_barrier_sync(flex_bwd_sm90::kBarDq, kNThreads);
      } else {
        if constexpr (kDqBulk) {
          if (tid < kBlockM) flex::bulk_wait_read();
        }
        flex::fence_proxy_async();
        __syncthreads();
      }
      const long long row_base = ((long long)b * p.heads + h) * seqlen_q;
      const int q_row0 = m0 + (warp % 4) * 16 + g;
      // Selector sums (kGradGemm): warpgroup 0 the Col sums, warpgroup 1 the Tile sums, as 16 more columns of its
      // dQ GEMM, or by a selector GEMM in its own wgmma group ahead of dQ's (dq_block waits for both; behind dQ's,
      // during the dQ atomics: SAM D64 backward 4.59-4.64 -> 4.64-4.68 ms, D32 3.81 -> 3.77, D128 4.45 -> 4.42).
      float sel_acc[8];
      if constexpr (kGradGemm && !S::kSelectorsInK)
        flex_bwd_staged::issue_selector_gemm<TileDS, Element>(sel_acc, s_ds, s_base + S::kOffSelectors, wg);
      // dq_block waits for all but the group issued after dQ's: dK's, or an empty one when dK went first.
      auto issue_after_dq = [&] {
        if constexpr (kDkFirst) flex::wgmma_commit();
        else issue_dk();
      };
      auto while_dq = [&] {
        if constexpr (kSplitScatter) TileScatter0::cta_sum(p, vp, sh_red, b, h, hkv, m0, n0, tid);
        if constexpr (kGradGemm) {
          // The selector GEMMs' atomics follow dq_block (their accumulators are ready after its wait).
        } else if constexpr (Staged::kGrad && kSpread)
          flex_bwd_staged::flush_spread<Variant, kDeterministic>(p, vp, sh_st_grad, b, h, hkv, m0, spread_j0, spread_col0, tid);
        else if constexpr (Staged::kGrad)
          flex_bwd_staged::flush_grads<Variant, kDeterministic>(p, vp, sh_st_grad, b, h, hkv, m0, n0, tid);
      };
      if constexpr (S::kDqN0 == S::kDqN1) {
        flex_bwd_sm90::dq_block<S::kDqN0, S, Element, kDeterministic, kDqBulk>(p, s_ds, s_k, wg * S::kDqN0, row_base, q_row0, t4, sh_dq, m0,
                                                                                sel_acc, issue_after_dq, while_dq);
      } else {
        if (wg == 0)
          flex_bwd_sm90::dq_block<S::kDqN0, S, Element, kDeterministic, kDqBulk>(p, s_ds, s_k, 0, row_base, q_row0, t4, sh_dq, m0, sel_acc, issue_after_dq,
                                                                                while_dq);
        else
          flex_bwd_sm90::dq_block<S::kDqN1, S, Element, kDeterministic, kDqBulk>(p, s_ds, s_k, S::kDqN0, row_base, q_row0, t4, sh_dq, m0,
                                                                                  sel_acc, issue_after_dq, while_dq);
      }
      if constexpr (kGradGemm) {
        flex::fence_operands(sel_acc);
        if (wg == 0)
          flex_bwd_staged::flush_selected_col<Variant, kDeterministic>(p, vp, sel_acc, b, h, hkv, q_row0, spread_col0, t4);
        else
          flex_bwd_staged::flush_selected_tile<Variant, kDeterministic>(p, vp, sel_acc, b, h, hkv, q_row0, spread_j0, t4);
      }
      if constexpr (kDqBulk && kProducer) {
        if (tid == 0)
          *reinterpret_cast<flex_bwd_sm90::DqRowsSlot*>(smem + flex_bwd_sm90::kOffDqRowsSlot<S>) = flex_bwd_sm90::DqRowsSlot{row_base + m0, min(kBlockM, seqlen_q - m0), pos_next >= total};
        flex::fence_proxy_async();  // the rows, to the writer warp's bulk reductions
        flex::mbarrier_arrive(flex_bwd_sm90::dq_full_barrier<S>(s_base));
        dq_phase ^= 1u;
      } else if constexpr (kDqBulk) {
        pending.row_base = row_base + m0;
        pending.rows = min(kBlockM, seqlen_q - m0);
      }
    }
    // dK's GEMM reads this stage's Q, which the next tile's loads (behind its first barrier) overwrite.
    flex::wgmma_wait<0>();
    flex::fence_operands(acc_dk);
    flex::fence_operands(acc_dv);
    if constexpr (kProducer) {
      // Every read of the slot has retired. Each thread arrives: its own loads of lse2 and delta are then ordered
      // before the producer's next stores by the barrier itself (one arrival per warp after __syncwarp orders them
      // too, but racecheck reports it as a race).
      flex::mbarrier_arrive(ring.empty(st.index));
      st.advance();
    }

    // End of a head: flush the per-head scatter accumulators.
    if constexpr (kNumScatters > 0) {
      const bool head_done = pos_next >= total || head_next != head_in_group;
      if (head_done) flex_bwd::flush_one<Traits, Variant, kDeterministic, 0>(p, vp, acc_uniform, acc_kvrow, sh_red, b, h, hkv, kv_r0, warp, lane, true);
    }
    pos = pos_next;
    head_in_group = head_next;
    m_block = m_next;
    stage ^= 1;
  }
  flex::cp_async_wait<0>();
  if constexpr (kDqBulk && !kProducer) {
    // The last tile's dQ rows, then every reduction complete before the CTA's shared memory goes away.
    flex::fence_proxy_async();
    __syncthreads();
    pending.send(p.dq_accum, s_base, tid);
    if (tid < kBlockM) flex::bulk_wait();
  }

  const int g = lane / 4, t4 = lane % 4;
  flex_bwd_sm90::store_dk_dv<Element, kHeadDim>(p, acc_dk, acc_dv, b, hkv, blk.kv_of(warp * 16 + g), t4, seqlen_kv);
}
