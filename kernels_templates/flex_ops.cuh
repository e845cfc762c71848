// Device implementations of the language's scalar operations and buffer loads, matching
// docs/SEMANTICS.md (the interpreter's meaning) so generated code agrees with the oracle.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "flex_int_divisor.cuh"

namespace fj {

// ---- 64-bit integer arithmetic with wrap-around (through unsigned: no signed overflow) ----
__device__ __forceinline__ long long add(long long a, long long b) { return (long long)((unsigned long long)a + (unsigned long long)b); }
__device__ __forceinline__ long long sub(long long a, long long b) { return (long long)((unsigned long long)a - (unsigned long long)b); }
__device__ __forceinline__ long long mul(long long a, long long b) { return (long long)((unsigned long long)a * (unsigned long long)b); }
__device__ __forceinline__ long long neg(long long a) { return (long long)(0ull - (unsigned long long)a); }
__device__ __forceinline__ long long abs_(long long a) { return a < 0 ? neg(a) : a; }
// 32-bit forms are used only where range analysis proved the result fits, so plain
// arithmetic cannot overflow.
__device__ __forceinline__ int add(int a, int b) { return a + b; }
__device__ __forceinline__ int sub(int a, int b) { return a - b; }
__device__ __forceinline__ int mul(int a, int b) { return a * b; }
__device__ __forceinline__ int neg(int a) { return -a; }
__device__ __forceinline__ int abs_(int a) { return a < 0 ? -a : a; }

// Python floor division and modulo; a zero divisor gives 0 (the runtime's semantics).
template <class T>
__device__ __forceinline__ T floordiv(T a, T b) {
  if (b == 0) return 0;
  if (b == -1) return neg(a);
  T q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}
template <class T>
__device__ __forceinline__ T mod(T a, T b) {
  if (b == 0 || b == -1) return 0;
  T r = a % b;
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}
// Shifts: counts outside [0, 63] give 0 (left) or the sign fill (right).
__device__ __forceinline__ long long shl(long long a, long long n) {
  return (n < 0 || n > 63) ? 0 : (long long)((unsigned long long)a << n);
}
__device__ __forceinline__ long long shr(long long a, long long n) {
  if (n < 0) return 0;
  if (n > 63) return a < 0 ? -1 : 0;
  return a >> n;
}
template <class T>
__device__ __forceinline__ T sign(T a) { return (T)((a > 0) - (a < 0)); }
__device__ __forceinline__ float sign(float a) { return a != a ? a : (a > 0.f ? 1.f : (a < 0.f ? -1.f : 0.f)); }

// ---- float ----
__device__ __forceinline__ float floordiv(float a, float b) { return floorf(a / b); }
__device__ __forceinline__ float mod(float a, float b) {
  float r = fmodf(a, b);
  if (r != 0.f && ((r < 0.f) != (b < 0.f))) r += b;
  return r;
}
__device__ __forceinline__ float sigmoid(float x) { return 1.f / (1.f + expf(-x)); }
__device__ __forceinline__ float rsqrt_(float x) { return 1.f / sqrtf(x); }
// tanh through the hardware approximation (sm_75+, max relative error about 2^-11): scores
// feed a bf16/fp16 softmax, and the precise tanhf would dominate a softcap kernel.
__device__ __forceinline__ float tanh_fast(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
// Python int(): truncation toward zero, NaN -> 0, saturating beyond the int64 range.
__device__ __forceinline__ long long float_to_int(float x) {
  if (x != x) return 0;
  if (x >= 9.2233720368547758e18f) return 9223372036854775807ll;
  if (x <= -9.2233720368547758e18f) return (-9223372036854775807ll - 1);
  return (long long)x;
}

// ---- buffer loads (read-only path) ----
__device__ __forceinline__ float load_f32(const void* p, long long off) { return __ldg((const float*)p + off); }
__device__ __forceinline__ float load_f16(const void* p, long long off) { return __half2float(__ldg((const __half*)p + off)); }
__device__ __forceinline__ float load_bf16(const void* p, long long off) { return __bfloat162float(__ldg((const __nv_bfloat16*)p + off)); }
__device__ __forceinline__ long long load_i32(const void* p, long long off) { return __ldg((const int*)p + off); }
__device__ __forceinline__ long long load_i64(const void* p, long long off) { return __ldg((const long long*)p + off); }
__device__ __forceinline__ long long load_u8(const void* p, long long off) { return ((const unsigned char*)p)[off]; }
__device__ __forceinline__ bool load_bool(const void* p, long long off) { return ((const unsigned char*)p)[off] != 0; }

// A checked index: negative indices in [-n, -1] wrap; anything still outside [0, n) is
// clamped into range (the load never leaves the buffer) and sets `bit` in the error word.
__device__ __forceinline__ long long checked_index(long long i, long long n, unsigned int* flags, unsigned int bit) {
  if (i < 0) i += n;
  if (i < 0 || i >= n) {
    if (flags) atomicOr(flags, bit);
    i = i < 0 ? 0 : n - 1;
  }
  return i;
}

}  // namespace fj
