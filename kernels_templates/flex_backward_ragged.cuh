// The backward of a ragged batch (Kernel::backward_varlen): each CTA of the dense backward kernels works on one
// sequence through a view of the launch's parameters, so the kernels themselves are the dense ones.
//
// The view points q, o, d_o, dq, k, v, dk, dv and lse at the sequence's first rows (and the tensor maps' row
// coordinates at them) and sets seqlen_q / seqlen_kv to its lengths; the kernels then bound every row by those lengths as they do a dense launch's odd tail. The scratch
// rows the kernels index by ((b * H + h) * seqlen_q + q) (delta, lse2, dq_accum) are offset so that sequence b's
// rows land at H * cu_seqlens_q[b] + h * len + q: the sequences' [H][len] blocks packed one after another, H * total_q
// rows in all, whatever the lengths. The mods still see b (the sequence), positions within the sequence, and the
// bounds as Sq / Skv, as the ragged forward's do.
#pragma once
#include "flex_backward_params.cuh"
#include "flex_interval.cuh"
#include "flex_params.cuh"
#include "flex_type_traits.cuh"

namespace flex_bwd {

// Sequence b's view of p, or false when the CTA has no work: b's lengths are outside the launch's bounds or its rows
// outside the packed tensors (reported once, by the caller's first CTA of the sequence: report), or the CTA's first
// row (`first_q` query rows, or `first_kv` KV rows) lies past the sequence's end.
template <bool kDeterministic, int kHeadDim>
__device__ __forceinline__ bool ragged_sequence(const FlexBackwardParams& p, int b, FlexBackwardParams& s, int first_q, int first_kv,
                                                bool report) {
  const int q0 = p.cu_seqlens_q[b], q1 = p.cu_seqlens_q[b + 1], k0 = p.cu_seqlens_kv[b], k1 = p.cu_seqlens_kv[b + 1];
  const int len_q = q1 - q0, len_kv = k1 - k0;
  if (q0 < 0 || k0 < 0 || len_q < 0 || len_kv < 0 || len_q > p.seqlen_q || len_kv > p.seqlen_kv || q1 > p.total_q || k1 > p.total_kv) {
    if (report && p.error_word != nullptr) atomicOr(p.error_word, kFlexBadLengthsFlag);
    return false;
  }
  if (first_q >= len_q || first_kv >= len_kv) return false;
  s = p;
  s.seqlen_q = len_q;
  s.seqlen_kv = len_kv;
  using E = unsigned short;  // q's element (bf16 / fp16): only its size matters here
  s.q = static_cast<const E*>(p.q) + (long long)q0 * p.q_stride_s;
  s.o = static_cast<const E*>(p.o) + (long long)q0 * p.o_stride_s;
  s.d_o = static_cast<const E*>(p.d_o) + (long long)q0 * p.do_stride_s;
  s.dq = static_cast<E*>(p.dq) + (long long)q0 * p.dq_stride_s;
  s.k = static_cast<const E*>(p.k) + (long long)k0 * p.k_stride_s;
  s.v = static_cast<const E*>(p.v) + (long long)k0 * p.v_stride_s;
  s.dk = static_cast<E*>(p.dk) + (long long)k0 * p.dk_stride_s;
  s.dv = static_cast<E*>(p.dv) + (long long)k0 * p.dv_stride_s;
  s.lse = p.lse + q0;
  s.tma_q_row0 = q0;
  s.tma_kv_row0 = k0;
  // Row r = (b * H + h) * len_q + q of the kernels lands at H * q0 + h * len_q + q.
  const long long shift = (long long)p.heads * q0 - (long long)b * p.heads * len_q;
  s.delta = p.delta + shift;
  s.lse2 = p.lse2 + shift;
  if (p.dq_accum != nullptr) {
    if constexpr (kDeterministic) s.dq_accum = static_cast<unsigned long long*>(p.dq_accum) + shift * kHeadDim;
    else s.dq_accum = static_cast<float*>(p.dq_accum) + shift * kHeadDim;
  }
  return true;
}

}  // namespace flex_bwd

// The tile classes of a ragged backward (FlexRaggedTileStateParams): the mask's interval classification of each
// backward tile's box of indices at its sequence's lengths (Box: the generated FlexMaskBox; void for masks that read
// buffers, whose tiles below the lengths are all partial), 0 past them. The dense launch reads the forward's block
// mask instead, which a ragged batch has not: its lengths live on the device.
template <class Variant, class Box>
__device__ __forceinline__ void flex_backward_ragged_tile_state(const FlexRaggedTileStateParams& t, const typename Variant::Params& vp) {
  const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  const long long per_b = (long long)t.mask_heads * t.nq * t.nkv;
  if (i >= per_b * t.batch) return;
  const int b = (int)(i / per_b);
  const long long r = i - b * per_b;
  const int h = (int)(r / ((long long)t.nq * t.nkv));
  const int m = (int)(r / t.nkv % t.nq), n = (int)(r % t.nkv);
  const int q0 = t.cu_seqlens_q[b], q1 = t.cu_seqlens_q[b + 1], k0 = t.cu_seqlens_kv[b], k1 = t.cu_seqlens_kv[b + 1];
  const int len_q = q1 - q0, len_kv = k1 - k0;
  const bool valid = q0 >= 0 && k0 >= 0 && len_q >= 0 && len_kv >= 0 && len_q <= t.seqlen_q && len_kv <= t.seqlen_kv && q1 <= t.total_q &&
                     k1 <= t.total_kv;
  const int m0 = m * t.q_tile, n0 = n * t.kv_tile;
  int c = 0;
  if (valid && m0 < len_q && n0 < len_kv) {
    if constexpr (flex::IsSame<Box, void>::value) {
      c = 2;
    } else {
      const fji::I qi{m0, min(len_q, m0 + t.q_tile) - 1}, ki{n0, min(len_kv, n0 + t.kv_tile) - 1};
      c = Box::classify(vp, fji::pt((long long)b), fji::pt((long long)h), fji::pt((long long)(h / t.group)), qi, ki);
    }
  }
  t.tile_state[i] = (unsigned char)c;
}
