// The positions a shard launch's backward hooks see: a launch that computes one (query shard, KV shard) block of a
// longer sequence (context parallelism; BackwardArgs::q_offset, kv_offset) runs the generated gradient variant
// through ShardPositions, which adds the shard's first positions to every q and KV position before the hooks see
// them. The kernels keep indexing their tensors, bounds and tiles by the launch's own rows; only the mods and the
// buffer-gradient targets see global positions, so `doc[q]`, `rel[q - kv + Skv - 1]` and causal masks mean the same
// in every shard. (The forward adds the offsets in its FragmentMods instead, where the hoisted state is formed.)
//
// One wrapper instead of an offset at each of the backward kernels' call sites: every hook the backward kernels
// call passes through here, so a kernel added later cannot forget one. Whole-sequence modules do not use it and
// carry no offsets at all.
#pragma once

namespace flex {

// V: the generated variant (unhoisted or hoisted; no staged terms, whose loaders index rows by launch row).
// Params: V's, then the two offsets in two more 8-byte slots, which the host appends to V's ParamsLayout.
template <class V>
struct ShardPositions : V {
  static_assert(!V::kStagedCol && !V::kStagedTile && !V::kStagedDiag && !V::kStagedSpread,
                "ShardPositions: staged terms are loaded by launch row; a shard module must not stage them");
  struct Params : V::Params {
    long long shard_q_offset;   // the position of the launch's query row 0 in the whole sequence
    long long shard_kv_offset;  // the position of its KV row 0
  };
  static __device__ __forceinline__ int gq(const Params& p, int q) { return q + static_cast<int>(p.shard_q_offset); }
  static __device__ __forceinline__ int gkv(const Params& p, int kv) { return kv + static_cast<int>(p.shard_kv_offset); }

  // Hoisted state: j is a column of a kTileCols-wide part, the same in every tile, so it takes no offset (the host
  // requires KV offsets at multiples of kTileCols for a kTileAligned variant).
  template <class R>
  __device__ static __forceinline__ void row(const Params& p, R& r, int b, int h, int hkv, int q) {
    V::row(p, r, b, h, hkv, gq(p, q));
  }
  template <class R, class C>
  __device__ static __forceinline__ void col(const Params& p, const R& r, C& c, int b, int h, int hkv, int q, int j) {
    V::col(p, r, c, b, h, hkv, gq(p, q), j);
  }
  template <class R, class T>
  __device__ static __forceinline__ void tile(const Params& p, const R& r, T& t, int b, int h, int hkv, int q, int k0) {
    V::tile(p, r, t, b, h, hkv, gq(p, q), gkv(p, k0));
  }
  template <class R, class C, class T>
  __device__ static __forceinline__ float score_mod(const Params& p, const R& r, const C& c, const T& t, int b, int h, int hkv, int q, int k0,
                                                    int j, float score) {
    return V::score_mod(p, r, c, t, b, h, hkv, gq(p, q), gkv(p, k0), j, score);
  }
  template <class R, class C, class T>
  __device__ static __forceinline__ bool mask_mod(const Params& p, const R& r, const C& c, const T& t, int b, int h, int hkv, int q, int k0,
                                                  int j) {
    return V::mask_mod(p, r, c, t, b, h, hkv, gq(p, q), gkv(p, k0), j);
  }
  __device__ static __forceinline__ float d_score(const Params& p, int b, int h, int hkv, int q, int kv, float score) {
    return V::d_score(p, b, h, hkv, gq(p, q), gkv(p, kv), score);
  }
  template <int I>
  __device__ static __forceinline__ void scatter(const Params& p, int b, int h, int hkv, int q, int kv, float score, long long& off,
                                                 float& coef) {
    V::template scatter<I>(p, b, h, hkv, gq(p, q), gkv(p, kv), score, off, coef);
  }
  template <int I>
  __device__ static __forceinline__ float scatter_coef(const Params& p, int b, int h, int hkv, int q, int kv, float score) {
    return V::template scatter_coef<I>(p, b, h, hkv, gq(p, q), gkv(p, kv), score);
  }
  template <int I>
  __device__ static __forceinline__ long long scatter_offset(const Params& p, int b, int h, int hkv, int q, int kv) {
    return V::template scatter_offset<I>(p, b, h, hkv, gq(p, q), gkv(p, kv));
  }
};

}  // namespace flex
