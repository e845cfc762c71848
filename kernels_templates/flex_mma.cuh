// Inline-PTX wrappers for the sm_80+ instructions the attention kernels use: mma.sync, ldmatrix, cp.async, ex2.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace flex {

// Shared-memory address of a generic pointer, as the 32-bit value ldmatrix and cp.async take.
__device__ __forceinline__ unsigned smem_addr(const void* p) {
  unsigned r;
  asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(r) : "l"(p));
  return r;
}

// ---- cp.async: 16-byte global -> shared copies that bypass L1 (.cg) -----------------------------------
// When !pred nothing is read and the 16 bytes are zero-filled (src-size 0), so rows past the end of a
// sequence become zeros: harmless in Q·K^T (masked anyway) and in P·V (P is 0 there, and 0 * 0 is no NaN).
__device__ __forceinline__ void cp_async_16(unsigned dst, const void* src, bool pred) {
  const int src_size = pred ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_size));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Wait until at most kPending of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// ---- ldmatrix: four 8x8 b16 matrices; lane i gives the row address of matrix i/8, row i%8 -------------
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
// Transposed: each thread receives two elements adjacent along the stored rows' index (used for V).
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// Two matrices (lanes 0-15 give the row addresses): the FP8 decode reads 8 x 16-byte rows of cache bytes this way.
__device__ __forceinline__ void ldmatrix_x2(unsigned (&r)[2], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x2_trans(unsigned (&r)[2], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
}

// ---- mma.sync m16n8k16, fp32 accumulate: D = A (16x16, row) * B (16x8, col) + D ----------------------
// Fragment ownership (g = lane / 4, t = lane % 4):
//   A: a0 (g, 2t..2t+1), a1 (g+8, 2t..), a2 (g, 2t+8..), a3 (g+8, 2t+8..)
//   B: b0 (k = 2t..2t+1, n = g), b1 (k = 2t+8.., n = g)
//   C: c0,c1 (g, 2t..2t+1), c2,c3 (g+8, 2t..2t+1)
template <class Element>
struct Mma16816;

template <>
struct Mma16816<__nv_bfloat16> {
  static __device__ __forceinline__ void run(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  // Two fp32 values rounded into one packed register; lo lands in the low half (the lower column).
  static __device__ __forceinline__ unsigned pack(float lo, float hi) {
    unsigned r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
  }
};

template <>
struct Mma16816<__half> {
  static __device__ __forceinline__ void run(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  static __device__ __forceinline__ unsigned pack(float lo, float hi) {
    unsigned r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
  }
};

// ---- math ------------------------------------------------------------------------------------------
// 2^x in one MUFU op; ex2(-inf) = +0, which is how masked scores vanish.
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// 2^x without the MUFU unit (FMA and integer pipes only): for a share of a softmax's exponentials when a
// score_mod's own MUFU ops (softcap's tanh) already keep that unit busy. floor(x) comes from adding 1.5 * 2^23
// with round-down (its low mantissa bits then hold floor(x)), 2^frac from a degree-3 minimax polynomial on [0, 1)
// (relative error below 9e-5, against bf16's 3.9e-3 in P), and the exponent is added in the integer domain.
// As ex2.approx.ftz, results below 2^-126 (x < -126, and -inf for masked scores) are exactly 0. x <= 127.
__device__ __forceinline__ float ex2_fma(float x) {
  constexpr float kMagic = 12582912.f;  // 1.5 * 2^23
  float t;
  asm("add.rm.f32 %0, %1, %2;\n" : "=f"(t) : "f"(x), "f"(kMagic));
  const float f = x - (t - kMagic);
  const float p = fmaf(fmaf(fmaf(0.07707296f, f, 0.22764768f), f, 0.69511169f), f, 1.f);
  // The magic's own bits shift out: (bits(t) << 23) is floor(x) * 2^23 modulo 2^32.
  const float r = __int_as_float(__float_as_int(p) + (__float_as_int(t) << 23));
  return x < -126.f ? 0.f : r;
}

// Reductions over the 4 lanes of a quad (the lanes that share a row of an mma accumulator).
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

}  // namespace flex
