// The Hopper (sm_90a) backward main kernel: flex_backward_main's algorithm with warpgroup MMA (wgmma) on swizzled tiles.
#pragma once
#include "flex_backward.cuh"
#include "flex_backward_epilogue_sm90.cuh"
#include "flex_backward_loads_sm90.cuh"
#include "flex_backward_staged.cuh"
#include "flex_backward_tile_sm90.cuh"
#include "flex_sm90_pipeline.cuh"
#include "flex_type_traits.cuh"
#include "flex_wgmma.cuh"
#include "flex_backward_scheduler_sm90.cuh"
#include "flex_backward_smem_sm90.cuh"

// Drop-in replacement of flex_backward_main on sm_90a (docs/notes/BACKWARD_SM90.md): the same FlexBackwardParams,
// variant contract, grid (ceil(Skv / block_n), Hkv, B; spread rows: see the kernel), 256 threads (384
// warp-specialised: see kProducer), tile classes, schedule and preprocess / dQ-conversion kernels; shared memory
// flex_bwd_sm90::Smem<...>::kAllocBytes.
//
// The parts, as FlashAttention-3's hopper/ backward has them: the tile scheduler (flex_backward_scheduler_sm90.cuh
// KvBlock: the KV block a CTA owns; flex_bwd::ColumnSchedule: its query tiles), the shared-memory layout
// (flex_backward_smem_sm90.cuh), the producer's loads and the dQ writer warp, or the 256-thread form's cp.async
// (flex_backward_loads_sm90.cuh), the consumers' steps of one tile between their GEMMs (flex_backward_tile_sm90.cuh),
// the dK / dV epilogue (flex_backward_epilogue_sm90.cuh); this file holds the kernel: the warps' roles and the
// consumers' loop over the query tiles.
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
//
// The head-dim split form (kSplitD, head dims 192 and 256, warp-specialised): dK and dV of 128 rows x D would not fit
// the registers, so a CTA owns 64 KV rows, which both warpgroups share (warp w: rows 16 (w % 4)..+15), and warpgroup
// w keeps dK and dV columns [w D/2, (w + 1) D/2). As FlashAttention-3's hopper/ backward splits its 64 x 64 tiles
// at these head dims, warpgroup w computes S^T and dP^T (over all of D) for query columns [32 w, 32 w + 32) only
// (m64n32), runs the P and dS steps on them, and stores its half of P^T and of dS^T into shared memory; behind a
// named barrier each then runs dV += P^T dO and dK += dS^T Q with A from those tiles (ss) and dQ = dS K over the
// warpgroup's D / 2 columns (B operands from column w D / 2).

// The main backward kernel for sm_90a. grid = (BackwardConfig::main_grid_x(Skv): ceil(Skv / 128), or 4 per started
// 512 rows with spread rows; Hkv, B), block = 256 (384 with kProducer),
// dynamic shared memory = flex_bwd_sm90::Smem<Traits, Variant, kDqBulk, kGradGemm, kDqBulk && kDeterministic, kProducer, kTwoDs>::kAllocBytes.
// Traits = FlexBackwardTraits<D, Element>.
// kDq = false: dQ is left to another pass (no dQ GEMM, no dQ atomics; no dS^T store except in the split form, whose
// dK GEMM reads it).
// kDqBulk: dQ partials are added to dq_accum by bulk reductions (cp.reduce.async.bulk, one per query tile, issued
// by the dQ writer warp, or by thread 0 after the next tile's first barrier) instead of atomics from the
// accumulators, so that no warp waits for its reductions' registers to drain. Deterministic launches reduce 64-bit
// fixed point (one bulk integer reduction per tile instead of one 64-bit atomic per element): the same bits whatever
// the order.
// kGradGemm: spread rows' staged gradients by selector GEMMs on the dS^T tile (flex_backward_staged.cuh); needs bf16
// and d_score = 1, where that tile holds the terms' gradient, and a gradient of both terms (one GEMM per warpgroup).
// kProducer: warp-specialised, block = 384. Warpgroups 0 and 1 compute as above; warpgroup 2 gives its registers
// to them (setmaxnreg) and holds the producer warp (flex_bwd_sm90::load: K, V, Q, dO by TMA from `tma`, lse2 and
// delta by its lanes, through a two-slot mbarrier ring), with kDqBulk the dQ writer warp (write_dq) and with staged
// diagonal band the band warp (load_bands, into the same ring slots). The consumers then wait at no CTA-wide barrier
// inside the loop: they meet at named barriers for dS^T and the scatters' reductions. Col / Tile staged terms are
// the consumers' own cp.async copies, a tile ahead (and K and V once, as no single TMA box describes spread rows or
// K's selector regions); their gradients only by selector GEMMs (kGradGemm): the planes' and slabs' reductions rely on
// the 256-thread form's loop-top barrier.
// kTwoDs (warp-specialised, head dims up to 128): dS^T goes to two tiles in turn, so that a warpgroup stores a query
// tile's dS^T while the other may still run the previous tile's dQ GEMM on the other tile; with one tile both meet at
// a barrier (kBarDsFree) first. The last readers of a tile, two query tiles back, retired before either warpgroup
// reached the previous tile's dQ barrier.
template <class Traits, class Variant, bool kDeterministic, bool kDq = true, bool kDqBulk = false, bool kGradGemm = false,
          bool kProducer = false, bool kTwoDs = false>
__device__ __forceinline__ void flex_backward_main_sm90(const FlexBackwardParams& p, const typename Variant::Params& vp,
                                                        const FlexBackwardTmaMaps* tma = nullptr) {
  using Element = typename Traits::Element;
  using Mods = flex_bwd::BackwardMods<Variant>;
  using S = flex_bwd_sm90::Smem<Traits, Variant, kDqBulk, kGradGemm, kDqBulk && kDeterministic, kProducer, kTwoDs>;
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
  // The head-dim split form (see above): each warpgroup's dK / dV columns and k-steps of S^T and dP^T.
  constexpr bool kSplitD = S::kSplitD;
  constexpr int kAccD = kSplitD ? kHeadDim / 2 : kHeadDim;
  constexpr int kMTw = kSplitD ? kMT / 2 : kMT;  // n8 query-column tiles of the warpgroup's S^T and dP^T
  constexpr float kLog2e = 1.4426950408889634f;
  constexpr int kNumScatters = Variant::kNumScatters;
  // Without scatters, d_score is folded into P before dS (no score kept across the dP wait).
  constexpr bool kFoldDScore = !Variant::kDScoreIsOne && kNumScatters == 0;
  // A single tile-reduced scatter (q-only or diagonal, e.g. the learnable bias[h, q - kv + S - 1]) is split
  // around the GEMMs: its per-element sums right after dS, its warp shuffles while dK runs, its cross-warp sums
  // and atomics while dQ runs, behind the barrier dQ needs anyway (scatter_one would add two barriers and keep
  // the tensor cores idle through all of it).
  using TileScatter0 = flex_bwd::TileScatter<Traits, Variant, kDeterministic, 0, kSplitD>;
  constexpr bool kSplitScatter = kDq && kNumScatters == 1 && TileScatter0::kReduced;
  // The diagonal class's warp sums through planes, where shared memory has them (not in the split form).
  constexpr bool kPlanes = kSplitScatter && TileScatter0::kClass == flex_bwd::kScatterDiagonal && !kSplitD;
  // The split scatter's cross-warp sums of one tile (during dQ) read the slots the next tile's warp sums write: only
  // the dS^T barrier of one tile orders them.
  static_assert(!kTwoDs || !kSplitScatter, "flex_backward_main_sm90: two dS^T tiles with a split scatter");
  // Staged terms reduce their gradients behind the dQ barrier: only modules with the KV-major dQ stage them.
  static_assert(kDq || !Staged::kAny, "flex_backward_main_sm90: staged terms need kDq");
  // The scatter code assumes contiguous KV rows: spread rows only when every scatter is a staged term's.
  static_assert(!Staged::kSpread || flex_bwd_staged::all_scatters_staged<Variant>(), "flex_backward_main_sm90: spread rows with other scatters");
  // Warp-specialised staged terms: their gradients by selector GEMMs only (the planes' and slabs' reductions are ordered by
  // the 256-thread form's loop-top barrier).
  static_assert(!kProducer || ((kDq || kSplitD) && (!Staged::kGrad || kGradGemm)),
                "flex_backward_main_sm90: the warp-specialised form reduces staged gradients by selector GEMMs only");
  static_assert(!Staged::kDiag || kProducer, "flex_backward_main_sm90: a diagonal band is the producer warp's load");

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
  const flex_bwd::ColumnSchedule<kBlockM, kBlockN, kNThreads, S::kSchedBytes> sched(
      p, b, hkv, range0, smem + S::kOffSched, tid < kNThreads ? tid : 1 << 30, range0 + (kSpread ? flex_bwd_staged::kSpreadRange : kBlockN) - 1);
  const int total = sched.total;
  // The selectors, by the consumer threads only (warp-specialised: their fence before the dQ barrier publishes them).
  if (!kProducer || tid < kNThreads) {
    if constexpr (S::kSelectorsInK) flex_bwd_staged::build_selectors<TileK, Element>(smem + S::kOffK, tid, kNThreads);
    else if constexpr (kGradGemm) flex_bwd_staged::build_selectors<flex_bwd_staged::SelectorTiles, Element>(smem + S::kOffSelectors, tid, kNThreads);
  }

  int pos = sched.next_pos(0);
  int head_in_group, m_block;  // of pos
  sched.split(pos, head_in_group, m_block);
  const auto ring = flex_bwd_sm90::ring<S>(s_base);  // kProducer
  if constexpr (kProducer) {
    static_assert(kNThreads == flex_bwd_sm90::kConsumerThreads, "flex_backward_main_sm90: two consumer warpgroups");
    if (tid == 0) flex_bwd_sm90::init_barriers<S>(s_base);
    if constexpr (!S::kKvByTma) {
      // K and V once per CTA by the consumers' cp.async (spread rows, or K with spare regions for the selectors, which
      // one TMA box does not describe), complete and fenced for the tensor cores before the barrier; the first
      // tile's staged values with them.
      if (tid < kNThreads) {
        loads.load_kv();
        if (pos < total) loads.load_staged(hkv * group + head_in_group, m_block * kBlockM, 0);
      }
      flex::cp_async_commit();
      flex::cp_async_wait<0>();
      flex::fence_proxy_async();
    }
    __syncthreads();
    if (tid >= kNThreads) {
      flex::setmaxnreg_dec<flex_bwd_sm90::kProducerRegs>();
      if (warp == kNThreads / 32) flex_bwd_sm90::load<S>(p, *tma, sched, s_base, b, hkv, n0, lane);
      else if (kDqBulk && warp == kNThreads / 32 + 1 && pos < total) flex_bwd_sm90::write_dq<S, kDqBulk && kDeterministic>(p.dq_accum, s_base, lane);
      else if constexpr (Staged::kDiag) {
        if (warp == kNThreads / 32 + 2) flex_bwd_sm90::load_bands<S, Variant>(vp, sched, s_base, b, hkv, n0, group, lane);
      }
      return;
    }
    flex::setmaxnreg_inc<flex_bwd_sm90::kConsumerRegs>();
    if (S::kKvByTma && pos < total) flex::mbarrier_wait(flex_bwd_sm90::kv_barrier<S>(s_base), 0);
  } else {
    loads.load_kv();
    if (pos < total) loads.load_q_tile(head_in_group, m_block, 0);
    flex::cp_async_commit();
  }

  // dK, dV: this warp's 16 KV rows x D (kSplitD: x the warpgroup's D / 2 columns from column wg D / 2), in the wgmma
  // accumulator layout (d[4i + e]: row g + 8 (e / 2), column 8i + 2t + e % 2).
  float acc_dk[kAccD / 2];
  float acc_dv[kAccD / 2];
#pragma unroll
  for (int i = 0; i < kAccD / 2; ++i) acc_dk[i] = acc_dv[i] = 0.f;
  const int kv_row_w = kSplitD ? (warp % 4) * 16 : warp * 16;  // the warp's first local KV row

  float acc_uniform[kNumScatters > 0 ? kNumScatters : 1];
  float acc_kvrow[kNumScatters > 0 ? kNumScatters : 1][2];
#pragma unroll
  for (int i = 0; i < (kNumScatters > 0 ? kNumScatters : 1); ++i) acc_uniform[i] = acc_kvrow[i][0] = acc_kvrow[i][1] = 0.f;

  static_assert(kSplitD || TileScatter0::kPlaneFloats * 4 == S::kOffSched - S::kOffPlanes, "flex_backward_main_sm90: plane region size");
  if constexpr (kPlanes) TileScatter0::zero_planes(sh_planes, tid);  // ordered by the loop's first barrier

  const float scale_log2 = p.scale * kLog2e;
  int stage = 0;
  int tile_parity = 0;  // which of two tiles this query tile uses: kSplitD's P^T tiles, kTwoDs's dS^T tiles
  flex::PipelineState<S::kStages> st;  // kProducer: the ring slot of this tile
  unsigned dq_phase = 0;                // kProducer, kDqBulk: the parity of this tile's dq_full phase
  // S::kStagedBlocks: the query tile (and head) whose blocked sums wait in stage blocks_stage ^ 1 for the next dQ
  // barrier (-1: none), and whether this warpgroup's term sends blocks (warpgroup 0 the Col term's, 1 the Tile term's).
  int blocks_m0 = -1, blocks_h = 0, blocks_stage = 0;
  const bool wg_blocks = S::kStagedBlocks && ((p.staged_blocks >> wg) & 1);
  const unsigned s_blocks = s_base + S::kOffStBlocks;
  // S^T = K Q^T of the Q tile at sq (K at s_k) into acc_s, as one wgmma group. kSplitD: all 64 KV rows, the
  // warpgroup's 32 query columns.
  const int a_row0 = kSplitD ? 0 : wg * 64;
  const int q_col0 = kSplitD ? wg * 32 : 0;  // the warpgroup's first query column of S^T / dP^T
  float acc_s[kMTw][4];
  auto issue_s = [&](unsigned sq, unsigned s_k) {
    flex::wgmma_fence();
#pragma unroll
    for (int i = 0; i < kD16; ++i)
      flex::Wgmma<kMTw * 8>::template ss<Element, 0, 0>(flex_bwd_sm90::flat(acc_s), flex::desc_k_major<TileK>(s_k, a_row0, i * 16),
                                                        flex::desc_k_major<TileQ>(sq, q_col0, i * 16), i > 0 ? 1 : 0);
    flex::wgmma_commit();
  };
  // dK's GEMM: right after dS without dQ; with dQ, behind dQ's GEMM (dq_block), so that dQ's atomics go out while it
  // runs, or, warp-specialised with bulk dQ rows (whose stores are quick), before the dS^T barriers, so that the
  // tensor cores have it while the warpgroups meet there.
  constexpr bool kDkFirst = kProducer && kDqBulk && !kSplitD;
  // With dK first, the group issued behind dQ's is the next tile's S^T GEMM (its slot already full: two stages), so
  // that the tensor cores have work while the warpgroups store dQ's rows and start the next tile, where both would
  // otherwise leave them idle at once. acc_s is dead from dS on. The GEMM is retired at the end of the tile, and
  // issued on every path, for a next tile or not (then on this tile's slot, the result unused), so that no wgmma is
  // in flight across the loop's back edge and only wgmma defines acc_s there: otherwise ptxas serialises every wgmma
  // of the kernel (C7514, C7515).
  // Not beside scatter_one's reductions, whose registers would then spill, nor with fixed-point rows, where it does
  // not pay (docs/notes/BACKWARD_SM90.md has the measurements).
  constexpr bool kPrefetchS =
      kDkFirst && !kDeterministic && !Staged::kAny && S::kStages >= 2 && (kNumScatters == 0 || kSplitScatter);
  if constexpr (kPrefetchS) {
    if (pos < total) ring.consumer_wait(st);
    issue_s(s_q0, flex_bwd_sm90::opaque(s_k0));
    flex::wgmma_wait<0>();
  }
  while (pos < total) {
    const int h = hkv * group + head_in_group;
    const int m0 = m_block * kBlockM;
    const int cls = sched.class_at(pos);
    const int pos_next = sched.next_pos(pos + 1);
    int head_next, m_next;
    sched.split(pos_next, head_next, m_next);

    if constexpr (kProducer) {
      stage = st.index;
      // The producer's Q, dO, lse2 and delta of this tile have landed (kPrefetchS: waited for before its S^T GEMM).
      if constexpr (!kPrefetchS) ring.consumer_wait(st);
      // The next tile's staged values into the other slot's regions (whose last readers, the previous tile's P step,
      // all passed that tile's dQ barrier before this thread did), completed before this tile's dQ barrier publishes them.
      if constexpr (Staged::kAny) {
        if (pos_next < total) loads.load_staged(hkv * group + head_next, m_next * kBlockM, stage ^ 1);
        flex::cp_async_commit();
      }
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
    const int kv_r0 = blk.kv_of(kv_row_w + g);  // the thread's KV rows: kv_r0, kv_r0 + 8
    const unsigned s_k = flex_bwd_sm90::opaque(s_k0), s_v = flex_bwd_sm90::opaque(s_v0);
    const unsigned s_ds = flex_bwd_sm90::opaque(s_base + S::kOffDS) + (kTwoDs ? tile_parity * TileDS::kBytes : 0);
    const unsigned sq = flex_bwd_sm90::opaque(s_q0) + stage * TileQ::kBytes;
    const unsigned sdo = flex_bwd_sm90::opaque(s_do0) + stage * TileQ::kBytes;
    const float* lse_st = sh_lse + stage * kBlockM;
    const float* delta_st = sh_delta + stage * kBlockM;

    // S^T = K Q^T (kPrefetchS: issued during the previous tile's dQ GEMM), then dP^T = V dO^T, as two groups: P is
    // computed while dP^T is still running.
    const int k_col0 = kSplitD ? wg * kAccD : 0;  // the warpgroup's first dK / dV column
    float acc_dp[kMTw][4];
    float2 lse2[kMTw];  // in registers before dP^T's GEMM is issued (load_pairs)
    flex_bwd_sm90::load_pairs(lse2, lse_st + q_col0, t4);
    if constexpr (!kPrefetchS) issue_s(sq, s_k);
    if constexpr (kPrefetchS) flex::wgmma_fence();  // else issue_s's fence serves both groups
#pragma unroll
    for (int i = 0; i < kD16; ++i)
      flex::Wgmma<kMTw * 8>::template ss<Element, 0, 0>(flex_bwd_sm90::flat(acc_dp), flex::desc_k_major<TileKV>(s_v, a_row0, i * 16),
                                                        flex::desc_k_major<TileQ>(sdo, q_col0, i * 16), i > 0 ? 1 : 0);
    flex::wgmma_commit();
    flex::wgmma_wait<1>();
    flex::fence_operands(flex_bwd_sm90::flat(acc_s));

    // P^T (or P^T d_score) into acc_s and the A fragments of dV's GEMM, from S^T: flex_bwd_sm90::recompute_p, with
    // every element tested on partial tiles and tiles crossing Sq or Skv, and none tested on interior full tiles
    // (most of them), which takes the per-element predicates and branches out of the common path.
    const bool check_elements = cls == 2 || kv_tail || m0 + kBlockM > seqlen_q;
    const flex_bwd_sm90::ElementCoords at{b, h, hkv, m0 + q_col0, kv_r0, t4, warp, wg, cls, seqlen_q, seqlen_kv};
    float score_v[kMTw][4];  // kept only for the scatters / a late d_score (dead code otherwise)
    unsigned pa[kMTw / 2][4];
    // Staged terms of this query tile (flex_backward_staged.cuh): Col values per element, Tile per query column.
    unsigned st_col[kMTw][2];
    if constexpr (Staged::kCol)
      flex_bwd_staged::read_col(st_col, s_base + S::kOffStCol + stage * flex_bwd_staged::kColBytes, kSpread ? spread_col0 / 8 : 2 * (warp % 4), ln);
    const unsigned char* st_tile = smem + S::kOffStTile + stage * Staged::kTileStageBytes;
    // The Diag band's entry of the thread's query column 2 t4 and KV row 16 warp + g (flex_backward_staged.cuh).
    const float* st_diag = reinterpret_cast<const float*>(smem + S::kOffStDiag + stage * flex_bwd_staged::kDiagBytes) + (kBlockN - 1) + 2 * t4 - (warp * 16 + g);
    if (check_elements)
      flex_bwd_sm90::recompute_p<true, Variant, Element, kFoldDScore>(p, vp, at, scale_log2, lse2, st_col, st_tile, st_diag, acc_s, score_v, pa);
    else
      flex_bwd_sm90::recompute_p<false, Variant, Element, kFoldDScore>(p, vp, at, scale_log2, lse2, st_col, st_tile, st_diag, acc_s, score_v, pa);

    // dV += P^T dO (A = P^T from registers, B = dO MN-major), running while dS is computed. kSplitD: A = the P^T tile
    // both warpgroups stored, one of two in turn: the other warpgroup's last reader of this one, its dV GEMM of two
    // tiles back, retired at the end of that tile, before it reached the previous tile's dQ barrier.
    const unsigned s_pt = flex_bwd_sm90::opaque(s_base + S::kOffPt) + tile_parity * TileDS::kBytes;
    float2 delta[kMTw];  // in registers before dV's GEMM is issued
    flex_bwd_sm90::load_pairs(delta, delta_st + q_col0, t4);
    if constexpr (kSplitD) {
      flex_bwd_sm90::store_transposed_tile<S>(s_pt, pa, kv_row_w, ln, q_col0 / 8);
      flex::fence_proxy_async();
      flex::named_barrier_sync(flex_bwd_sm90::kBarPt, kNThreads);
    }
    flex::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBlockM / 16; ++kk) {
      if constexpr (kSplitD)
        flex::Wgmma<kAccD>::template ss<Element, 0, 1>(acc_dv, flex::desc_k_major<TileDS>(s_pt, 0, kk * 16), flex::desc_mn_major<TileQ>(sdo, kk * 16, k_col0), 1);
      else
        flex::Wgmma<kAccD>::template rs<Element, 1>(acc_dv, pa[kk], flex::desc_mn_major<TileQ>(sdo, kk * 16, k_col0), 1);
    }
    flex::wgmma_commit();

    // dS = P (dP - delta) in place of dP^T (the dS_pre directly when d_score was folded in).
    flex::wgmma_wait<1>();
    flex::fence_operands(flex_bwd_sm90::flat(acc_dp));
    if (check_elements) flex_bwd_sm90::compute_ds<true, Variant>(acc_s, acc_dp, delta);
    else flex_bwd_sm90::compute_ds<false, Variant>(acc_s, acc_dp, delta);

    // Scatters (buffer gradients) from dS, then dS_pre = dS * d_score; the staged terms' dS^T into their planes.
    if constexpr (kGradGemm) {
      // Nothing here: the selector GEMMs read the dS^T tile that dQ needs anyway.
    } else if constexpr (Staged::kGrad && kSpread) flex_bwd_staged::write_slab<(Variant::kStagedTileScatter >= 0)>(sh_st_grad, acc_dp, warp, ln);
    else if constexpr (Staged::kGrad) flex_bwd_staged::write_plane(sh_st_grad, acc_dp, wg, warp, ln);
    TileScatter0 split_scatter;
    if constexpr (kSplitScatter) {
      if (check_elements) split_scatter.template thread_sum<true>(vp, acc_dp, score_v, b, h, hkv, m0 + q_col0, kv_r0, t4, true);
      else split_scatter.template thread_sum<false>(vp, acc_dp, score_v, b, h, hkv, m0 + q_col0, kv_r0, t4, true);
    } else if constexpr (kNumScatters > 0)
      flex_bwd::scatter_one<Traits, Variant, kDeterministic, 0, kProducer, kSplitD>(p, vp, acc_dp, score_v, acc_uniform, acc_kvrow, sh_red, b,
                                                                                    h, hkv, m0, n0, kv_r0, warp, lane, true);
    if constexpr (!kFoldDScore) Mods::ds_pre(vp, b, h, hkv, flex_bwd::KvMajorFragment{m0 + q_col0, kv_r0, t4}, acc_dp, score_v);

    // dK += dS^T Q (A = dS^T from registers, B = Q MN-major; kSplitD: from the dS^T tile, behind the dQ barrier);
    // dS^T into shared memory for dQ.
    unsigned da[kMTw / 2][4];
    flex_bwd_sm90::pack_a<Element>(acc_dp, da);
    auto issue_dk = [&] {
      flex::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBlockM / 16; ++kk) {
        if constexpr (kSplitD)
          flex::Wgmma<kAccD>::template ss<Element, 0, 1>(acc_dk, flex::desc_k_major<TileDS>(s_ds, 0, kk * 16), flex::desc_mn_major<TileQ>(sq, kk * 16, k_col0), 1);
        else
          flex::Wgmma<kAccD>::template rs<Element, 1>(acc_dk, da[kk], flex::desc_mn_major<TileQ>(sq, kk * 16, k_col0), 1);
      }
      flex::wgmma_commit();
    };
    // dS^T goes through shared memory for dQ and, in the split form, for dK (each warpgroup holds half its columns).
    constexpr bool kDsTile = kDq || kSplitD;
    if constexpr (kDkFirst) issue_dk();
    if constexpr (kDsTile) {
      // Without the loop-top barrier, the other warpgroup may still be in the previous tile's dQ (or split dK) GEMM
      // (kTwoDs: on the other tile).
      if constexpr (kProducer && !kTwoDs) flex::named_barrier_sync(flex_bwd_sm90::kBarDsFree, kNThreads);
      flex_bwd_sm90::store_transposed_tile<S>(s_ds, da, kv_row_w, ln, q_col0 / 8);
    }
    if constexpr (!kDsTile && !kDkFirst) issue_dk();
    if constexpr (kSplitScatter) {
      if constexpr (kPlanes) split_scatter.warp_sum_planes(sh_red, sh_planes, warp, ln);
      else split_scatter.warp_sum(sh_red, warp, ln);
    }

    if constexpr (kDq) {
      // dQ needs the dS^T rows of both warpgroups (and the split scatter every warp's slots). kDqBulk: the bulk
      // reductions issued at the top of this tile have read sh_dq before anyone writes it again.
      if constexpr (kProducer) {
        flex::fence_proxy_async();
        // With bulk rows, the writer warp must have read the previous tile's (a fresh barrier reads as released).
        if constexpr (kDqBulk) flex::mbarrier_wait(flex_bwd_sm90::dq_empty_barrier<S>(s_base), dq_phase ^ 1u);
        if constexpr (Staged::kAny) flex::cp_async_wait<0>();  // the next tile's staged values, for every consumer
        // The blocks sent after the last barrier have been read: their stage may be stored again after this one.
        if (wg_blocks && tid % 128 == 0) flex::bulk_wait_read();
        flex::named_barrier_sync(flex_bwd_sm90::kBarDq, kNThreads);
        // The previous tile's blocks, stored and fenced by every thread of the warpgroup before the barrier.
        if constexpr (S::kStagedBlocks) {
          if (wg_blocks && tid % 128 == 0 && blocks_m0 >= 0)
            flex_bwd_staged::send_block<Variant>(p, vp, s_blocks + (blocks_stage ^ 1) * S::kStBlocksStageBytes, b, blocks_h, hkv, blocks_m0,
                                                 wg == 0, wg == 0 ? spread_col0 : spread_j0);
        }
      } else {
        if constexpr (kDqBulk) {
          if (tid == 0) flex::bulk_wait_read();  // the thread that issued them (PendingDqRows)
        }
        flex::fence_proxy_async();
        __syncthreads();
      }
      const long long row_base = ((long long)b * p.heads + h) * seqlen_q;
      const int q_row0 = m0 + (warp % 4) * 16 + g;
      // Selector sums (kGradGemm): warpgroup 0 the Col sums, warpgroup 1 the Tile sums, as 16 more columns of its
      // dQ GEMM, or by a selector GEMM in its own wgmma group ahead of dQ's (dq_block waits for both; behind dQ's,
      // during the dQ atomics, it measured no better: docs/notes/BACKWARD_SM90.md).
      float sel_acc[8];
      if constexpr (kGradGemm && !S::kSelectorsInK)
        flex_bwd_staged::issue_selector_gemm<TileDS, Element>(sel_acc, s_ds, s_base + S::kOffSelectors, wg);
      // dq_block waits for all but the group issued after dQ's: dK's, or when dK went first the next tile's S^T
      // (kPrefetchS) or an empty one.
      auto issue_after_dq = [&] {
        if constexpr (kPrefetchS) {
          flex::PipelineState<S::kStages> next = st;
          next.advance();
          if (pos_next < total) ring.consumer_wait(next);
          else next = st;  // the CTA's last tile: this slot, released after the GEMM below
          // dK's GEMM (issued before the dS^T barriers) retired first: its A fragments are then free for acc_s
          // (at D128 ptxas serialises the wgmmas otherwise, C7512).
          flex::wgmma_wait<1>();
          issue_s(flex_bwd_sm90::opaque(s_q0) + next.index * TileQ::kBytes, flex_bwd_sm90::opaque(s_k0));
        } else if constexpr (kDkFirst) {
          flex::wgmma_commit();
        } else {
          issue_dk();
        }
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
        const unsigned s_block = wg_blocks ? s_blocks + blocks_stage * S::kStBlocksStageBytes : 0u;
        if (wg == 0)
          flex_bwd_staged::flush_selected_col<Variant, kDeterministic>(p, vp, sel_acc, b, h, hkv, q_row0, spread_col0, t4, m0, s_block);
        else
          flex_bwd_staged::flush_selected_tile<Variant, kDeterministic>(p, vp, sel_acc, b, h, hkv, q_row0, spread_j0, t4, m0, s_block);
        if constexpr (S::kStagedBlocks) {
          blocks_m0 = m0;
          blocks_h = h;
          blocks_stage ^= 1;
        }
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
    } else if constexpr (kSplitD) {
      // dQ by the query-major pass: dK's GEMM still needs both warpgroups' dS^T columns (the same barrier, which also
      // orders the P^T tiles as above).
      flex::fence_proxy_async();
      flex::named_barrier_sync(flex_bwd_sm90::kBarDq, kNThreads);
      issue_dk();
    }
    // dK's GEMM reads this stage's Q, which the next tile's loads (behind its first barrier) overwrite (kPrefetchS:
    // dq_block retired it; this retires the next tile's S^T).
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
      if (head_done)
        flex_bwd::flush_one<Traits, Variant, kDeterministic, 0, kProducer>(p, vp, acc_uniform, acc_kvrow, sh_red, b, h, hkv, kv_r0, warp, lane,
                                                                           true);
    }
    pos = pos_next;
    head_in_group = head_next;
    m_block = m_next;
    stage ^= 1;
    tile_parity ^= 1;
  }
  flex::cp_async_wait<0>();
  if constexpr (S::kStagedBlocks) {
    // The last tile's blocks (the consumers alone: the producer warpgroup has returned), complete before the CTA's
    // shared memory goes away.
    if (blocks_m0 >= 0) {
      flex::fence_proxy_async();
      flex::named_barrier_sync(flex_bwd_sm90::kBarDq, kNThreads);
      if (wg_blocks && tid % 128 == 0) {
        flex_bwd_staged::send_block<Variant>(p, vp, s_blocks + (blocks_stage ^ 1) * S::kStBlocksStageBytes, b, blocks_h, hkv, blocks_m0, wg == 0,
                                             wg == 0 ? spread_col0 : spread_j0);
        flex::bulk_wait();
      }
    }
  }
  if constexpr (kDqBulk && !kProducer) {
    // The last tile's dQ rows, then every reduction complete before the CTA's shared memory goes away.
    flex::fence_proxy_async();
    __syncthreads();
    pending.send(p.dq_accum, s_base, tid);
    if (tid == 0) flex::bulk_wait();
  }

  const int g = lane / 4, t4 = lane % 4;
  flex_bwd_sm90::store_dk_dv<Element, kAccD>(p, acc_dk, acc_dv, b, hkv, blk.kv_of(kv_row_w + g), kSplitD ? wg * kAccD : 0, t4, seqlen_kv);
}
