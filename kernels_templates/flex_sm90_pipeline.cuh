// Hopper (sm_90a) warp-specialisation primitives: mbarrier pipelines between a producer warp and consumer warpgroups,
// named barriers, register reallocation and lane election.
#pragma once
#include "flex_tma.cuh"

namespace flex {

// One plain arrival (no transaction bytes) on an mbarrier.
__device__ __forceinline__ void mbarrier_arrive(unsigned bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

// Named barriers 1..15 (0 is __syncthreads): `threads` threads (a multiple of 32) take part. sync waits for all of
// them; arrive counts this warp in and goes on.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Register reallocation between warpgroups: every warp of a warpgroup executes the same one. The kernel must be
// compiled with a register cap (__launch_bounds__(threads, 1)), else ptxas ignores it.
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

// True in exactly one lane of the (converged) warp.
__device__ __forceinline__ bool elect_one() {
  unsigned pred = 0;
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "elect.sync _|p, 0xffffffff;\n"
      "selp.u32 %0, 1, 0, p;\n"
      "}\n"
      : "=r"(pred));
  return pred != 0;
}

// Makes the tensor map's 128 bytes resident before the first copy that uses it.
__device__ __forceinline__ void prefetch_tensor_map(const FlexTensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<unsigned long long>(map)) : "memory");
}

// A position in a ring of kStages buffers: the slot, and the parity of the slot's current fill (it flips each time
// the ring wraps). Producer and consumers walk the same sequence of positions.
template <int kStages>
struct PipelineState {
  int index = 0;
  unsigned phase = 0;
  __device__ __forceinline__ void advance() {
    if (++index == kStages) {
      index = 0;
      phase ^= 1u;
    }
  }
};

// A ring of kStages shared-memory buffers filled by the TMA unit and drained by consumer warps. Slot s has a `full`
// mbarrier (one producer arrival that announces the bytes; the copies complete it) and an `empty` one (one arrival
// per consumer warp once the warp's wgmmas have read the slot).
// bars: 2 * kStages consecutive 8-byte mbarriers in shared memory, full ones first.
template <int kStages>
struct TmaPipeline {
  unsigned bars;

  __device__ __forceinline__ unsigned full(int s) const { return bars + 8u * (unsigned)s; }
  __device__ __forceinline__ unsigned empty(int s) const { return bars + 8u * (unsigned)(kStages + s); }

  // One thread, before the CTA's first barrier; then fence_mbarrier_init and __syncthreads.
  __device__ __forceinline__ void init(int consumer_warps) const {
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(full(s), 1);
      mbarrier_init(empty(s), (unsigned)consumer_warps);
    }
  }

  // Producer: waits until every consumer released the slot's previous fill (a fresh slot counts as released: the
  // parity before the first phase reads as complete), then announces `bytes` on its full barrier.
  __device__ __forceinline__ unsigned producer_acquire(const PipelineState<kStages>& st, unsigned bytes) const {
    mbarrier_wait(empty(st.index), st.phase ^ 1u);
    mbarrier_arrive_expect_tx(full(st.index), bytes);
    return full(st.index);
  }
  // Consumer: waits until the slot's current fill has landed.
  __device__ __forceinline__ void consumer_wait(const PipelineState<kStages>& st) const { mbarrier_wait(full(st.index), st.phase); }
  // Consumer warp: its reads of the slot are done (after the wgmma wait that retired them); st moves to the next.
  __device__ __forceinline__ void consumer_release(PipelineState<kStages>& st, int lane) const {
    __syncwarp();
    if (lane == 0) mbarrier_arrive(empty(st.index));
    st.advance();
  }
};

}  // namespace flex
