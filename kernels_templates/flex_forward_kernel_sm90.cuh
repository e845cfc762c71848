// The Hopper (sm_90a) forward kernel: a persistent, warp-specialised CTA built from the tile scheduler, the mainloop
// (producer load(), consumer mma()), the softmax and the epilogue.
#pragma once
#include "flex_epilogue_sm90.cuh"
#include "flex_mainloop_sm90.cuh"

// One CTA per SM walks the launch's work tiles (flex::TileScheduler's order, taken dynamically: flex::WorkQueue).
// Warpgroup 0 is the producer: it gives up registers, and one of its warps fetches the work indices and issues the TMA
// copies of every work tile's Q and KV tiles. The other warpgroups are consumers with the registers: each owns 64 query rows
// of the work tile, runs the GEMMs and the softmax, and stores its rows of O and LSE. The producer runs ahead into
// the next work tile while the consumers finish the current one.
// Grid: min(work tiles, SMs) x 1 x 1; block: Traits::kNThreads; dynamic shared memory: Traits::kSmemBytes.
// tma: q, k and v as tensor maps (runtime/tensor_maps.cpp) with boxes of [kBlockM or kBlockN rows][one swizzle region].
// kVarlen: a ragged batch (p.cu_seqlens_*), whose maps describe the packed tensors with a batch dimension of 1.
// MaskBox: a ragged batch's mask classifier (flex::TileScheduler), or void.
// Fully masked rows (and work tiles that visit no KV tile) produce O = 0 and LSE = -inf.
template <class Traits, bool kVarlen = false, class MaskBox = void>
__device__ __forceinline__ void flex_forward_sm90(const FlexForwardParams& p, const typename Traits::Variant::Params& vp,
                                                  const FlexForwardTmaMaps& tma) {
  using Variant = typename Traits::Variant;
  using Mainloop = flex::MainloopSm90<Traits, kVarlen>;
  using Scheduler = flex::TileScheduler<Traits::kBlockM, Traits::kBlockN, Variant::kHasMaskMod, kVarlen, MaskBox>;
  using Epilogue = flex::EpilogueSm90<Traits>;

  extern __shared__ __align__(1024) unsigned char flex_smem_raw[];
  const unsigned raw = flex::smem_addr(flex_smem_raw);
  const unsigned base = raw + ((1024u - (raw & 1023u)) & 1023u);
  const Mainloop mainloop(base);
  flex::WorkQueue queue(base + Traits::kWorkQueueOffset);

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  if (tid == 0) {
    mainloop.init_barriers();
    queue.init(Traits::kConsumerWarps);
    flex::fence_mbarrier_init();
  }
  __syncthreads();
  const int num_work = Scheduler::num_work(p);

  if (warp < 4) {
    // ============================================ Producer ============================================
    flex::setmaxnreg_dec<Traits::kPolicy.producer_regs>();
    if (warp == 0) {
      const bool leader = flex::elect_one();
      const int leader_lane = __ffs(__ballot_sync(0xffffffffu, leader)) - 1;
      if (leader) {
        flex::prefetch_tensor_map(&tma.q);
        flex::prefetch_tensor_map(&tma.k);
        flex::prefetch_tensor_map(&tma.v);
      }
      typename Mainloop::State k_st, v_st;
      for (int t = blockIdx.x;;) {
        flex::ForwardTiles w;
        bool has_work = false;
        if constexpr (Scheduler::kClassifies) {
          // The tile ranges travel with the index: classify before publishing.
          has_work = t < num_work && Scheduler::work(p, t, w);
          if (has_work) w.set_ranges(Scheduler::classify(vp, w));
          if (leader) queue.publish<true>(t, w.ranges());
        } else if (leader) {
          queue.publish<false>(t, flex::TileRanges{});
        }
        if (t >= num_work) break;
        const int next = leader ? flex::WorkQueue::fetch(p) : 0;  // in flight while this work tile's copies are issued
        if constexpr (!Scheduler::kClassifies) has_work = Scheduler::work(p, t, w);
        if (has_work) mainloop.load(tma, w, k_st, v_st, leader);
        t = __shfl_sync(0xffffffffu, next, leader_lane);
      }
      if (leader) flex::WorkQueue::finish(p);
    }
  } else {
    // ============================================ Consumers ============================================
    flex::setmaxnreg_inc<Traits::kPolicy.consumer_regs>();
    const int ctid = tid - 128;
    // Through a shuffle the compiler knows wg is warp-uniform, so the Q descriptors of the S GEMM live in uniform
    // registers, computed once; from ctid / 128 it rebuilt each in vector registers (seven instructions per wgmma).
    const int wg = __shfl_sync(0xffffffffu, ctid / 128, 0);
    const int cwarp = ctid / 32;
    mainloop.consumer_init(wg);
    const flex::ScoreFactors f = flex::ScoreFactors::of<Variant>(vp, p.scale);
    typename Mainloop::State k_st, v_st;
    unsigned q_phase = 0;
    constexpr bool kRanges = Scheduler::kClassifies;
    flex::TileRanges ranges;
    for (int t = queue.next<kRanges>(lane, ranges); t < num_work; t = queue.next<kRanges>(lane, ranges)) {
      flex::ForwardTiles w;
      if (!Scheduler::work(p, t, w)) continue;
      if constexpr (kRanges) w.set_ranges(ranges);  // the producer's classification
      float o[1][Traits::kDTiles][4];
#pragma unroll
      for (int dt = 0; dt < Traits::kDTiles; ++dt)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[0][dt][e] = 0.f;
      typename Mainloop::SoftmaxT softmax(f.mult);
      if (w.count() > 0) mainloop.mma(vp, w, f, k_st, v_st, q_phase, o, softmax, wg, cwarp, lane);
      // ============================================ Epilogue ============================================
      float lse[2];
      softmax.finalize(o, f.score_unit, lse);
      Epilogue::store(p, w, o, lse, cwarp, lane);
    }
  }
}
