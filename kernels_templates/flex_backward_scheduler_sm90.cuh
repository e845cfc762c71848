// The Hopper backward's tile scheduler (flex_backward_sm90.cuh): which KV block a CTA owns. Its query tiles, in
// order, come from flex_bwd::ColumnSchedule (flex_backward_schedule.cuh).
#pragma once
#include "flex_backward_staged.cuh"

namespace flex_bwd_sm90 {

// The tile scheduler: the KV block a CTA owns, from its place in the launch. Launch order: groups of kHeadGroup
// (KV head, batch) pairs, and inside a group every pair's KV block n before block n + 1. Under causal-like masks the
// low KV blocks see the most query tiles, so each group's heaviest CTAs start first and the last wave holds light
// ones (with the KV block fastest, the heavy CTAs of the last heads ran in the tail). The groups keep the Q / dO
// tiles streamed at once to about kHeadGroup heads, which L2 holds (the policy's head_group).
template <int kBlockN, int kHeadGroup, bool kSpread>
struct KvBlock {
  int b, hkv;
  // The CTA's KV rows: local row lr is KV row n0 + lr, or with spread rows (flex_backward_staged.cuh) n0 +
  // 64 (lr / 16) + lr % 16 from n0 = 512 (n / 4) + 16 (n % 4), warp w's 16 rows in kv // 64 block 8 (n / 4) + w.
  int spread_j0;    // spread rows: the CTA's first J
  int spread_col0;  // and its kv % 64 columns
  int n0;

  __device__ __forceinline__ KvBlock() {
    const int lin = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    const int pairs = gridDim.y * gridDim.z;
    const int group_ctas = kHeadGroup * gridDim.x;
    const int pair_group = lin / group_ctas;
    const int in_group = lin - pair_group * group_ctas;
    const int group_pairs = min(kHeadGroup, pairs - pair_group * kHeadGroup);
    const int pair = pair_group * kHeadGroup + in_group % group_pairs;
    const int n_block = in_group / group_pairs;
    hkv = pair % gridDim.y;
    b = pair / gridDim.y;
    spread_j0 = 8 * (n_block / flex_bwd_staged::kSpreadCtas);
    spread_col0 = 16 * (n_block % flex_bwd_staged::kSpreadCtas);
    n0 = kSpread ? 64 * spread_j0 + spread_col0 : n_block * kBlockN;
  }
  __device__ __forceinline__ int kv_of(int lr) const { return kSpread ? n0 + 64 * (lr / 16) + lr % 16 : n0 + lr; }
};

}  // namespace flex_bwd_sm90
