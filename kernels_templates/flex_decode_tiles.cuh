// Per-sequence lists of the KV tiles the decode kernel visits (FlexDecodeTiles), computed on the device from each
// sequence's KV length (so a run stays graph-safe while sequences grow) by classifying the mask over every tile:
// by interval arithmetic over the tile's box of indices when the mask reads no buffers, else by evaluating
// mask_mod on each element. The kept set may be any union of ranges (sinks + window, dilated windows) or data
// dependent (documents): only kept tiles are listed, so only they are read.
#pragma once
#include "flex_decode_params.cuh"
#include "flex_interval.cuh"

namespace flex_decode_tiles {

enum : int { kEmpty = 0, kFull = 1, kPartial = 2 };

// The rows a list serves: this sequence's query rows [kv_len - q_len, kv_len - 1] for the query heads of one KV head
// (per_head) or for head 0 standing for every head (a mask that does not read h).
struct ListRows {
  int b, kv_len, q_len, h0, n_heads, hkv;
};

// Lists the kept tiles of one (sequence, list) in ascending order, kFlexDecodeTileListThreads tiles per pass: prepare(base) (all
// threads, then a barrier) may stage the pass's classes, then thread i classifies tile base + i by classify(t, base)
// and the kept ones are compacted.
template <class Prepare, class Classify>
__device__ __forceinline__ void list_tiles(int n_tiles, int* list, int* count, Prepare prepare, Classify classify) {
  constexpr int kWarps = kFlexDecodeTileListThreads / 32;
  __shared__ int s_warp_kept[kWarps];
  __shared__ int s_listed;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  if (tid == 0) s_listed = 0;
  for (int base = 0; base < n_tiles; base += kFlexDecodeTileListThreads) {
    prepare(base);
    __syncthreads();
    const int t = base + tid;
    const int c = t < n_tiles ? classify(t, base) : kEmpty;
    const unsigned kept = __ballot_sync(0xffffffffu, c != kEmpty);
    if (lane == 0) s_warp_kept[warp] = __popc(kept);
    __syncthreads();
    int before = s_listed;
    for (int w = 0; w < warp; ++w) before += s_warp_kept[w];
    if (c != kEmpty) list[before + __popc(kept & ((1u << lane) - 1u))] = c == kFull ? (t | kFlexDecodeFullTile) : t;
    __syncthreads();
    if (tid == 0) {
      int total = 0;
      for (int w = 0; w < kWarps; ++w) total += s_warp_kept[w];
      s_listed += total;
    }
    __syncthreads();
  }
  if (tid == 0) *count = s_listed;
}

// One block per (list, sequence): grid (lists per sequence, B). A KV length past the plan's bound is listed only up to
// the list's capacity, so the block never writes past its list.
template <class F>
__device__ __forceinline__ void run(const FlexDecodeTileListParams& p, F body) {
  const int w = blockIdx.x;
  const int b = blockIdx.y;
  // A sequence outside its bounds lists no tile (flex_decode_lengths): the decode kernel reports it.
  const FlexDecodeLengths len = flex_decode_lengths(p.kv_lens, p.q_lens, b, p.kv_len, p.max_q_len, p.max_kv_len);
  const int kv_len = len.kv_len, q_len = len.q_len;
  const int group = p.heads / p.kv_heads;
  const int n_tiles = min((kv_len + kFlexDecodeBlockN - 1) / kFlexDecodeBlockN, p.capacity);
  const long long off = (long long)b * gridDim.x + w;
  const ListRows win{b, kv_len, q_len, p.per_head ? w * group : 0, p.per_head ? group : 1, p.per_head ? w : 0};
  body(win, n_tiles, p.list + off * p.capacity, p.count + off);
}

}  // namespace flex_decode_tiles

// Masks without buffer reads: Box::classify(vp, b, h, hkv, q, kv) -> 0 empty, 1 full, 2 partial over a box of
// indices (generated from the mask_mod, see compiler/codegen/codegen_cuda_interval.h). The box of tile t is: this
// sequence, the query heads of the list, query positions [kv_len - q_len, kv_len - 1], kv in
// [64 t, min(kv_len, 64 t + 64) - 1].
template <class Variant, class Box>
__device__ void flex_decode_tiles_interval(const FlexDecodeTileListParams& p, const typename Variant::Params& vp) {
  flex_decode_tiles::run(p, [&](const flex_decode_tiles::ListRows& win, int n_tiles, int* list, int* count) {
    const fji::I bi = fji::pt((long long)win.b);
    const fji::I hi = p.per_head ? fji::I{(long long)win.h0, (long long)win.h0 + win.n_heads - 1} : fji::I{0, p.heads - 1ll};
    const fji::I hkv = p.per_head ? fji::pt((long long)win.hkv) : fji::I{0, p.kv_heads - 1ll};
    const fji::I qi{(long long)win.kv_len - win.q_len, (long long)win.kv_len - 1};
    flex_decode_tiles::list_tiles(n_tiles, list, count, [](int) {}, [&](int t, int) {
      const long long k0 = (long long)t * kFlexDecodeBlockN;
      const long long k1 = min((long long)win.kv_len, k0 + kFlexDecodeBlockN) - 1;
      return Box::classify(vp, bi, hi, hkv, qi, fji::I{k0, k1});
    });
  });
}

// Masks that read buffers (documents): a warp classifies a tile with its lanes on consecutive columns (coalesced
// buffer reads), kUnroll tiles at a time (their loads in flight together), for every row of the list, with the state
// the decode kernel hoists for them (row, col, tile); the classes are staged in shared memory for the compaction.
// Lists serving more than kFlexDecodeDenseMaxRows rows keep every tile below the KV length, as partial.
template <class Variant>
__device__ void flex_decode_tiles_dense(const FlexDecodeTileListParams& p, const typename Variant::Params& vp) {
  constexpr int kWarps = kFlexDecodeTileListThreads / 32;
  constexpr int kUnroll = 4;
  __shared__ unsigned char s_cls[kFlexDecodeTileListThreads];
  flex_decode_tiles::run(p, [&](const flex_decode_tiles::ListRows& win, int n_tiles, int* list, int* count) {
    const bool dense = win.n_heads * win.q_len <= kFlexDecodeDenseMaxRows;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int hkv = p.per_head ? win.hkv : 0;
    auto prepare = [&](int base) {
      if (!dense) return;
      const int n = min(n_tiles - base, kFlexDecodeTileListThreads);
      // Tiles base + i0 + u * kWarps (u < kUnroll) of this warp; bounds are warp-uniform.
      for (int i0 = warp; i0 < n; i0 += kWarps * kUnroll) {
        bool any_true[kUnroll], any_false[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) any_true[u] = any_false[u] = false;
        for (int g = 0; g < win.n_heads; ++g)
          for (int i = 0; i < win.q_len; ++i) {
            const int h = win.h0 + g, q = win.kv_len - win.q_len + i;
            typename Variant::Row row;
            Variant::row(vp, row, win.b, h, hkv, q);
            // No branch around the loads, so all of them are in flight together: a tile past the pass evaluates the
            // pass's last tile (its result is dropped) and a column past the KV length the last position, which
            // lies in the same (last) tile and so changes neither "any" nor "all".
#pragma unroll
            for (int u = 0; u < kUnroll; ++u) {
              const int k0 = (base + min(i0 + u * kWarps, n - 1)) * kFlexDecodeBlockN;
              typename Variant::Tile tile;
              Variant::tile(vp, row, tile, win.b, h, hkv, q, k0);
#pragma unroll
              for (int half = 0; half < 2; ++half) {
                const int j = min(lane + 32 * half, win.kv_len - 1 - k0);
                typename Variant::Col col;
                Variant::col(vp, row, col, win.b, h, hkv, q, j);
                const bool keep = Variant::mask_mod(vp, row, col, tile, win.b, h, hkv, q, k0, j);
                any_true[u] |= keep;
                any_false[u] |= !keep;
              }
            }
          }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const bool some_true = __any_sync(0xffffffffu, any_true[u]), some_false = __any_sync(0xffffffffu, any_false[u]);
          if (lane == 0 && i0 + u * kWarps < n)
            s_cls[i0 + u * kWarps] = !some_true ? flex_decode_tiles::kEmpty : !some_false ? flex_decode_tiles::kFull : flex_decode_tiles::kPartial;
        }
      }
    };
    flex_decode_tiles::list_tiles(n_tiles, list, count, prepare,
                                  [&](int t, int base) { return dense ? (int)s_cls[t - base] : (int)flex_decode_tiles::kPartial; });
  });
}
