// The Hopper backward's data movement beside its two consumer warpgroups (flex_backward_sm90.cuh): the
// warp-specialised form's producer warp (K, V, Q and dO by TMA, lse2 and delta by its lanes) and dQ writer warp, with
// their mbarriers and register split; and the 256-thread form's cp.async loads and bulk dQ rows. Everything takes the
// kernel's shared-memory layout (flex_bwd_sm90::Smem) as S.
#pragma once
#include "flex_backward.cuh"
#include "flex_backward_staged.cuh"
#include "flex_sm90_pipeline.cuh"

namespace flex_bwd_sm90 {

// ---- Warp specialisation (kProducer): warpgroups 0 and 1 consume, warpgroup 2 holds the producer and writer warps ----
// Named barriers of the consumers (0 is __syncthreads): kBarDsFree, both warpgroups' dQ GEMMs of the previous tile
// have read dS^T (it may be written again); kBarDq, dS^T complete before the dQ GEMM. The bulk dQ rows pass between
// the consumers and the writer warp through two mbarriers (dq_full: rows and slot written, one arrival per consumer
// thread; dq_empty: rows and slot read, one per writer lane): a named barrier that one side only arrives at orders the
// memory as well, but compute-sanitizer's racecheck reports it as a race. Named barrier 3 is the scatters'
// (flex_bwd::kBarReduce); kBarPt, the head-dim split form's P^T tile complete before its dV GEMMs (each warpgroup
// writes the other of its two P^T tiles next).
constexpr int kBarDsFree = 1;
constexpr int kBarDq = 2;
constexpr int kBarPt = 4;
constexpr int kConsumerThreads = 256;
// The register split: 24 for the producer warpgroup, 240 for each consumer thread (the 384-thread launch caps the
// kernel at 168, and 24 * 128 + 240 * 256 is that pool).
constexpr int kProducerRegs = 24;
constexpr int kConsumerRegs = 240;
// The Q / dO / lse2 / delta ring's full barrier: the producer's expect-tx arrival (the TMA copies' bytes) and one
// arrival per producer lane after its stores of lse2 and delta (each arrival releases that lane's stores), and with a
// diagonal band one per lane of the band warp (load_bands).
template <class S>
constexpr int kFullArrivals = 1 + 32 + (S::Staged::kDiag ? 32 : 0);

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
    flex::mbarrier_init(pipe.full(s), kFullArrivals<S>);
    flex::mbarrier_init(pipe.empty(s), kConsumerThreads);
  }
  flex::mbarrier_init(kv_barrier<S>(s_base), 1);
  flex::mbarrier_init(dq_full_barrier<S>(s_base), kConsumerThreads);
  flex::mbarrier_init(dq_empty_barrier<S>(s_base), 32);
  flex::fence_mbarrier_init();
}

// The producer warp: K and V once, then for every (head, query tile) of the schedule, in the consumers' order, Q and dO
// by TMA (rows past Sq arrive as zeros, or in a ragged view as the next sequence's rows, which the consumers mask
// like any row past Sq) and lse2 / delta by the lanes (+inf and 0 past Sq, as the other kernels have
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
    if constexpr (S::kKvByTma) {
      const unsigned kv_bar = kv_barrier<S>(s_base);
      flex::mbarrier_arrive_expect_tx(kv_bar, 2 * TileKV::kBytes);
      flex::tma_load_tile<TileKV>(s_base + S::kOffK, &tma.k, kv_bar, p.tma_kv_row0 + n0, hkv, b * p.tma_b_scale);
      flex::tma_load_tile<TileKV>(s_base + S::kOffV, &tma.v, kv_bar, p.tma_kv_row0 + n0, hkv, b * p.tma_b_scale);
    }
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
      flex::tma_load_tile<TileQ>(s_base + S::kOffQ + st.index * TileQ::kBytes, &tma.q, full, p.tma_q_row0 + m0, h, b * p.tma_b_scale);
      flex::tma_load_tile<TileQ>(s_base + S::kOffDO + st.index * TileQ::kBytes, &tma.d_o, full, p.tma_q_row0 + m0, h, b * p.tma_b_scale);
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

// The band warp (a staged diagonal term, flex_backward_staged.cuh): for every (head, query tile) of the schedule, in
// the consumers' order, the tile's band into the ring slot the producer fills, once both consumer warpgroups released
// it. A warp of its own rather than more work for the producer's lanes: at 24 registers the band's loads beside
// lse2 and delta cost the producer 68 bytes of spills. (SAM's Col / Tile blocks went this way too and made its
// backward 12-37% slower: one warp's cp.async copies and their latency per tile; the consumers issue them instead,
// CpAsyncLoads::load_staged.)
template <class S, class Variant, class Sched>
__device__ __forceinline__ void load_bands(const typename Variant::Params& vp, const Sched& sched, unsigned s_base, int b, int hkv, int n0,
                                           int group, int lane) {
  const auto pipe = ring<S>(s_base);
  flex::PipelineState<S::kStages> st;
  for (int pos = sched.next_pos(0); pos < sched.total; pos = sched.next_pos(pos + 1)) {
    int head_in_group, m_block;
    sched.split(pos, head_in_group, m_block);
    flex::mbarrier_wait(pipe.empty(st.index), st.phase ^ 1u);
    flex_bwd_staged::load_diag<Variant>(vp, s_base + S::kOffStDiag + st.index * flex_bwd_staged::kDiagBytes, b, hkv * group + head_in_group,
                                        hkv, m_block * S::kBlockM - n0 - (S::kBlockN - 1), lane);
    flex::mbarrier_arrive(pipe.full(st.index));
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
// tile's dQ rows and their slot, sends the rows to dq_accum by one bulk reduction, and frees them for the next tile
// once read. One reduction per tile rather than per row: issuing 64 per tile made this warp the loop's bottleneck
// (docs/notes/BACKWARD_SM90.md). It reads the rows' place from the slot (by shared-memory address: nothing live
// across the producer warpgroup's register cut that the producer warp does not hold too) rather than walking the
// schedule.
template <class S, bool kFixed>
__device__ __forceinline__ void write_dq(void* dq_accum, unsigned s_base, int lane) {
  using Value = typename S::DqValue;
  for (unsigned phase = 0;; phase ^= 1u) {
    flex::mbarrier_wait(dq_full_barrier<S>(s_base), phase);
    DqRowsSlot t;
    asm volatile("ld.shared.v2.b64 {%0, %1}, [%2];\n" : "=l"(t.row0), "=l"(*reinterpret_cast<long long*>(&t.rows)) : "r"(s_base + kOffDqRowsSlot<S>) : "memory");
    if (lane == 0) {
      Value* dst = static_cast<Value*>(dq_accum) + t.row0 * S::kHeadDim;
      if constexpr (kFixed) flex::bulk_reduce_add_u64(dst, s_base + S::kOffDqBuf, t.rows * S::kDqRowBytes);
      else flex::bulk_reduce_add_f32(dst, s_base + S::kOffDqBuf, t.rows * S::kDqRowBytes);
    }
    flex::bulk_commit();
    flex::bulk_wait_read();
    if (t.last) break;
    flex::mbarrier_arrive(dq_empty_barrier<S>(s_base));
  }
  flex::bulk_wait();  // every reduction complete before the CTA's shared memory goes away
}

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
    load_staged(h, m0, stage);
    if (tid < kBlockM) {
      // Rows past Sq: lse2 = +inf (P = 0) by a plain store, delta zero-filled.
      const long long row = ((long long)b * p.heads + h) * seqlen_q + m0 + tid;
      const bool valid = m0 + tid < seqlen_q;
      if (valid) flex_bwd::cp_async_4(flex::smem_addr(sh_lse + stage * kBlockM + tid), p.lse2 + row, true);
      else sh_lse[stage * kBlockM + tid] = flex_bwd::pos_inf();
      flex_bwd::cp_async_4(flex::smem_addr(sh_delta + stage * kBlockM + tid), valid ? p.delta + row : p.delta, valid);
    }
  }

  // The staged terms' values of query tile m0 of head h (the warp-specialised form's consumers issue them for the next
  // tile and complete them before its dQ barrier).
  __device__ __forceinline__ void load_staged(int h, int m0, int stage) const {
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
  }
};

// The 256-thread form's bulk dQ rows (kDqBulk without the writer warp): the query tile whose rows sit in shared
// memory, sent by thread 0 after the next tile's first barrier, which follows the rows' stores and fences.
template <class S, bool kFixed>
struct PendingDqRows {
  long long row_base = -1;  // dq_accum row of the tile's first row; -1: none pending
  int rows = 0;
  __device__ __forceinline__ void send(void* dq_accum, unsigned s_base, int tid) {
    if (row_base >= 0 && tid == 0) {
      const long long at = row_base * S::kHeadDim;
      if constexpr (kFixed) flex::bulk_reduce_add_u64(static_cast<unsigned long long*>(dq_accum) + at, s_base + S::kOffDqBuf, rows * S::kDqRowBytes);
      else flex::bulk_reduce_add_f32(static_cast<float*>(dq_accum) + at, s_base + S::kOffDqBuf, rows * S::kDqRowBytes);
      flex::bulk_commit();
    }
    row_base = -1;
  }
};

}  // namespace flex_bwd_sm90
