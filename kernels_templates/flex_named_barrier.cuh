// Named barriers, in their own header because the mma.sync kernels (sm_80) use them too and must not pull in the
// Hopper-only primitives of flex_sm90_pipeline.cuh.
#pragma once

namespace flex {

// Named barriers 1..15 (0 is __syncthreads): `threads` threads (a multiple of 32) take part. sync waits for all of
// them; arrive counts this warp in and goes on.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

}  // namespace flex
