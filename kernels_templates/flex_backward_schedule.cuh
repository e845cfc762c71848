// The tile scheduler of the KV-major backward kernels' CTAs over their query tiles (flex_backward.cuh, the Hopper
// kernel's flex_bwd_sm90::KvBlock picks the CTA's KV block).
#pragma once
#include "flex_backward_params.cuh"

namespace flex_bwd {

// The (head of the GQA group, query tile) positions a KV-major CTA visits, in order, with the class of each
// for its KV tile: 0 skip, 1 full, 2 partial. The classes of the CTA's column are computed once into shared
// memory (in parallel) when they fit, so the main loop never waits on global loads for them. Shared by the
// mma.sync and the Hopper main kernels.
template <int kBlockM, int kBlockN, int kNThreads, int kMaxSched>
struct ColumnSchedule {
  const FlexBackwardParams& p;
  int b, hkv, group, num_m, n0, kv_hi, total;  // KV rows n0 .. kv_hi
  float inv_num_m;       // 1 / num_m, rounded: split()'s quotient
  unsigned char* cache;  // kMaxSched bytes of shared memory
  bool cached;

  // Every thread of the CTA constructs it (the cache fill synchronises). kv_hi_: the last KV row of the range
  // the CTA's rows lie in (default n0 + kBlockN - 1; spread rows span 512).
  __device__ __forceinline__ ColumnSchedule(const FlexBackwardParams& params, int b_, int hkv_, int n0_, unsigned char* cache_, int tid,
                                            int kv_hi_ = -1)
      : p(params), b(b_), hkv(hkv_), group(params.heads / params.kv_heads), num_m((params.seqlen_q + kBlockM - 1) / kBlockM), n0(n0_),
        kv_hi(kv_hi_ >= 0 ? kv_hi_ : n0_ + kBlockN - 1), cache(cache_) {
    total = group * num_m;
    inv_num_m = 1.f / (float)num_m;
    cached = total <= kMaxSched;
    if (cached) {
      for (int i = tid; i < total; i += kNThreads) cache[i] = (unsigned char)tile_class(hkv * group + i / num_m, i % num_m);
      __syncthreads();
    }
  }
  // The forward block mask's classes (at its q_tile x kv_tile granularity) merged over this backward tile.
  __device__ __forceinline__ int tile_class(int h, int m) const {
    if (p.tile_state == nullptr) return 1;
    const unsigned char* st = p.tile_state + b * p.ts_stride_b + h * p.ts_stride_h;
    const int mf = (m * kBlockM) / p.ts_q_tile;
    const int f0 = n0 / p.ts_kv_tile;
    const int f1 = min(kv_hi / p.ts_kv_tile, p.ts_nkv - 1);
    bool any_full = false, any_skip = false, any_partial = false;
    for (int f = f0; f <= f1; ++f) {
      const int c = st[(long long)mf * p.ts_nkv + f];
      any_full |= c == 1;
      any_partial |= c == 2;
      any_skip |= c == 0;
    }
    if (any_partial || (any_full && any_skip)) return 2;
    return any_full ? 1 : 0;
  }
  __device__ __forceinline__ int class_at(int pos) const {
    return cached ? cache[pos] : tile_class(hkv * group + pos / num_m, pos % num_m);
  }
  // The first position at or after pos that is not skipped (total when none).
  __device__ __forceinline__ int next_pos(int pos) const {
    while (pos < total && class_at(pos) == 0) ++pos;
    return pos;
  }
  // pos = head_in_group * num_m + m_block. One float multiply instead of the ~20-instruction integer division
  // per query tile: (pos + 0.5) / num_m lies at least 0.5 / num_m from an integer, and the float product's error
  // (a few 2^-24 relative) stays below that while total < 2^21; longer schedules take the integer division.
  __device__ __forceinline__ void split(int pos, int& head_in_group, int& m_block) const {
    if (total < (1 << 21)) head_in_group = (int)((pos + 0.5f) * inv_num_m);
    else head_in_group = pos / num_m;
    m_block = pos - head_in_group * num_m;
  }
};

}  // namespace flex_bwd
