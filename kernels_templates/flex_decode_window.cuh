// Per-sequence KV tile windows of the decode kernel, computed on the device from each sequence's KV length
// by interval classification of the mask over every tile (so a run stays graph-safe while sequences grow).
#pragma once
#include "flex_decode_params.cuh"
#include "flex_interval.cuh"

// Box::classify(vp, b, h, hkv, q, kv) -> 0 empty, 1 full, 2 partial over a box of indices (generated from
// the mask_mod, see compiler/codegen/codegen_cuda_interval.h). The box of tile t is: this sequence, the
// query heads of the window, query positions [kv_len - q_len, kv_len - 1], kv in [64 t, min(kv_len, 64 t + 64) - 1].
template <class Variant, class Box>
__device__ void flex_decode_window(const FlexDecodeWindowParams& p, const typename Variant::Params& vp) {
  constexpr int kNone = 0x7fffffff;
  __shared__ int s_first, s_last, s_full, s_full_end;
  const int w = blockIdx.x;
  const int b = blockIdx.y;
  const int kv_len = p.kv_lens != nullptr ? p.kv_lens[b] : p.kv_len;
  const int q_len = p.q_lens != nullptr ? p.q_lens[b] : p.max_q_len;
  const int n_tiles = (kv_len + kFlexDecodeBlockN - 1) / kFlexDecodeBlockN;
  const int group = p.heads / p.kv_heads;
  const fji::I bi = fji::pt((long long)b);
  const fji::I hi = p.per_head ? fji::I{(long long)w * group, (long long)w * group + group - 1} : fji::I{0, p.heads - 1ll};
  const fji::I hkv = p.per_head ? fji::pt((long long)w) : fji::I{0, p.kv_heads - 1ll};
  const fji::I qi{(long long)kv_len - q_len, (long long)kv_len - 1};
  auto classify = [&](int t) {
    const long long k0 = (long long)t * kFlexDecodeBlockN;
    const long long k1 = min((long long)kv_len, k0 + kFlexDecodeBlockN) - 1;
    return Box::classify(vp, bi, hi, hkv, qi, fji::I{k0, k1});
  };
  if (threadIdx.x == 0) {
    s_first = kNone;
    s_last = -1;
    s_full = kNone;
    s_full_end = kNone;
  }
  __syncthreads();
  int first = kNone, last = -1, full = kNone;
  for (int t = threadIdx.x; t < n_tiles; t += blockDim.x) {
    const int c = classify(t);
    if (c != 0) {
      first = min(first, t);
      last = max(last, t);
    }
    if (c == 1) full = min(full, t);
  }
  atomicMin(&s_first, first);
  atomicMax(&s_last, last);
  atomicMin(&s_full, full);
  __syncthreads();
  // The full run ends at the first tile after s_full that is not full (each thread's first hit is its minimum).
  const int f0 = s_full;
  if (f0 != kNone) {
    for (int t = f0 + threadIdx.x; t < n_tiles; t += blockDim.x)
      if (classify(t) != 1) {
        atomicMin(&s_full_end, t);
        break;
      }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const long long off = (long long)b * gridDim.x + w;
    const bool any = s_last >= 0;
    p.begin[off] = any ? s_first : 0;
    p.end[off] = any ? s_last + 1 : 0;
    p.full_begin[off] = f0 != kNone ? f0 : 0;
    p.full_end[off] = f0 != kNone ? min(s_full_end, n_tiles) : 0;
  }
}
