// The element-wise steps of ring attention on the device (runtime/ring_kernels.h launches them): copies and
// conversions between strided views, the fp32 sums of the blocks' gradients, and the exact log-sum-exp merge of the
// blocks' partial outputs. They are memory-bound and small next to the attention launches they sit between, so they
// favour generality (any strides, a runtime element type) over vector accesses.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "flex_ring_params.cuh"

namespace flex_ring {

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000u); }

__device__ __forceinline__ float load(const void* base, int dtype, long long i) {
  switch (dtype) {
    case kFlexRingBf16: return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
    case kFlexRingF16: return __half2float(static_cast<const __half*>(base)[i]);
    default: return static_cast<const float*>(base)[i];
  }
}

__device__ __forceinline__ void store(void* base, int dtype, long long i, float x) {
  switch (dtype) {
    case kFlexRingBf16: static_cast<__nv_bfloat16*>(base)[i] = __float2bfloat16_rn(x); break;
    case kFlexRingF16: static_cast<__half*>(base)[i] = __float2half_rn(x); break;
    default: static_cast<float*>(base)[i] = x; break;
  }
}

template <class T>
__device__ __forceinline__ void copy_bits(const FlexRingCopyParams& p, long long s, long long d) {
  static_cast<T*>(p.dst.data)[d] = static_cast<const T*>(p.src.data)[s];
}

__device__ __forceinline__ void step(const FlexRingCopyParams& p, long long s, long long d) {
  if (p.mode == kFlexRingRaw) {
    switch (p.elem_bytes) {
      case 1: copy_bits<unsigned char>(p, s, d); break;
      case 2: copy_bits<unsigned short>(p, s, d); break;
      case 4: copy_bits<unsigned int>(p, s, d); break;
      default: copy_bits<unsigned long long>(p, s, d); break;
    }
    return;
  }
  float x = load(p.src.data, p.src.dtype, s);
  if (p.mode == kFlexRingAdd) x += static_cast<const float*>(p.dst.data)[d];
  store(p.dst.data, p.dst.dtype, d, x);
}

__device__ __forceinline__ long long offset(const FlexRingView& v, long long i0, long long i1, long long i2, long long i3) {
  return i0 * v.stride[0] + i1 * v.stride[1] + i2 * v.stride[2] + i3 * v.stride[3];
}

}  // namespace flex_ring

// Rows of at least a warp's width (the head dims of Q, K, V, O) take one warp per row, its lanes along the row, so
// the index arithmetic is per row; short rows (LSE, buffers) one thread per element.
__device__ __forceinline__ void flex_ring_copy(const FlexRingCopyParams& p) {
  const long long n1 = p.shape[1], n2 = p.shape[2], n3 = p.shape[3];
  if (n3 >= 32) {
    const int lane = threadIdx.x & 31;
    const long long rows = p.shape[0] * n1 * n2;
    const long long warps = static_cast<long long>(gridDim.x) * (blockDim.x / 32);
    for (long long w = blockIdx.x * static_cast<long long>(blockDim.x / 32) + threadIdx.x / 32; w < rows; w += warps) {
      const long long i2 = w % n2, i1 = (w / n2) % n1, i0 = w / (n2 * n1);
      const long long s = flex_ring::offset(p.src, i0, i1, i2, 0), d = flex_ring::offset(p.dst, i0, i1, i2, 0);
      for (long long i3 = lane; i3 < n3; i3 += 32) flex_ring::step(p, s + i3 * p.src.stride[3], d + i3 * p.dst.stride[3]);
    }
    return;
  }
  const long long total = p.shape[0] * n1 * n2 * n3;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    const long long i3 = i % n3, i2 = (i / n3) % n2, i1 = (i / (n3 * n2)) % n1, i0 = i / (n3 * n2 * n1);
    flex_ring::step(p, flex_ring::offset(p.src, i0, i1, i2, i3), flex_ring::offset(p.dst, i0, i1, i2, i3));
  }
}

// One warp per row. A partial row with LSE = -inf (every key of the block masked) weighs nothing; a NaN in either LSE
// makes the row's weights NaN, so it propagates. Every lane reads the running LSE before lane 0 overwrites it.
__device__ __forceinline__ void flex_ring_merge(const FlexRingMergeParams& p) {
  const int lane = threadIdx.x & 31;
  const long long total = p.batch * p.heads * p.rows;
  const long long warps = static_cast<long long>(gridDim.x) * (blockDim.x / 32);
  for (long long w = blockIdx.x * static_cast<long long>(blockDim.x / 32) + threadIdx.x / 32; w < total; w += warps) {
    const long long r = w % p.rows, h = (w / p.rows) % p.heads, b = w / (p.rows * p.heads);
    const float lp = static_cast<const float*>(p.lse_part.data)[flex_ring::offset(p.lse_part, b, h, r, 0)];
    if (lp == flex_ring::neg_inf()) continue;
    float* lse_acc = static_cast<float*>(p.lse_acc.data) + flex_ring::offset(p.lse_acc, b, h, r, 0);
    const float lm = *lse_acc;
    float wm = 0.f, wp = 1.f, l = lp;
    if (lm != flex_ring::neg_inf()) {
      const float mx = lm > lp ? lm : lp;  // NaN on either side: the weights below are NaN
      wm = expf(lm - mx);
      wp = expf(lp - mx);
      l = mx + logf(wm + wp);
    }
    const float inv = 1.f / (wm + wp);
    const long long po = flex_ring::offset(p.o_part, b, h, r, 0), ao = flex_ring::offset(p.o_acc, b, h, r, 0);
    float* acc = static_cast<float*>(p.o_acc.data);
    for (int d = lane; d < p.dv; d += 32) {
      const long long a = ao + d * p.o_acc.stride[3];
      const float part = flex_ring::load(p.o_part.data, p.o_part.dtype, po + d * p.o_part.stride[3]);
      acc[a] = (wm * acc[a] + wp * part) * inv;
    }
    __syncwarp();
    if (lane == 0) *lse_acc = l;
  }
}
