// Split-KV flash-decoding template (mma.sync, sm_80+) over a paged or contiguous KV cache, and its exact LSE combine.
#pragma once
#include "flex_decode_params.cuh"
#include "flex_fp8.cuh"
#include "flex_mma.cuh"
#include "flex_softmax.cuh"

// Decode: 1..16 query rows per sequence against a long KV cache. Memory-bound (every K/V byte is used by only
// group * q_len query rows), so the design goal is DRAM bandwidth, not tensor throughput:
//
// - grid = (num_splits, Hkv * row_blocks, B), block = 128 threads (4 warps). One CTA reads the K/V tiles of one
//   split of one (sequence, KV head) once and serves every query head of that KV head: the group * max_q_len
//   query rows (row R = g * max_q_len + i for query head hkv * group + g, query row i) are packed into the M
//   dimension of the mma tile, kBlockM = 16 * kMTiles rows per CTA (row block rb holds rows
//   [rb * kBlockM, rb * kBlockM + kBlockM)). Rows past group * max_q_len or past q_len(b) are padding.
// - The KV rows of a load are split over the warps by columns: warp w owns KV rows [16 w, 16 w + 16) of every
//   64-row tile (or, alternating, [32 w, 32 w + 32) of every 128 rows), with its own running max / sum / O for
//   all kBlockM rows, so each K/V byte in shared memory is read by one warp only. The warps' states are merged
//   through shared memory at the end.
// - K/V rows stream into shared memory with 16-byte cp.async (row gather through the page table; any page size,
//   since a row's D elements are contiguous in every supported layout), either as kStages stages of 64-row K+V
//   tiles or, with kAlternate, as 128 rows of K and 128 rows of V in turn (see FlexDecodeTraits). The page ids
//   of the next load are fetched while the current one is consumed, so the dependent page-table load never
//   stalls the copy issue.
// - Split s of a (sequence, KV head) visits entries [s * n, min(count, (s + 1) * n)) of the sequence's tile list
//   (FlexDecodeTiles: the tiles its mask keeps, ascending; without a list, every tile), n = ceil(count /
//   num_splits), so the splits share the kept tiles evenly however they are spread. With num_splits == 1 the CTA
//   writes O and LSE itself; otherwise fp32 partials (O divided by the split's own sum, and its LSE) go to the
//   workspace and they are merged: by the last split CTA of each (sequence, KV head, row block) to finish when
//   p.split_counters is set (fused combine, no second launch), else by flex_decode_combine.
//
// Contract with the generated Variant: as in flex_forward.cuh (Params, kHasScoreMod, kHasMaskMod, Row, Col, Tile,
// row/col/tile/score_mod/mask_mod with the same signatures), where h is the query head, hkv = h / group,
// q = kv_len(b) - q_len(b) + i is the absolute position of query row i, k0 = 64 * tile and j the column within
// the tile (kv = k0 + j, the logical position in the sequence). The variant is called only for valid rows
// (i < q_len(b)) and kv < kv_len(b): row() once per row, col() once per row and column j < min(64, kv_len(b))
// of the columns this thread owns, tile() once per row and visited tile, mask_mod only on partial tiles.
//
// Host responsibilities besides FlexDecodeParams' list: dynamic shared memory of Traits::kSmemBytes (raise the
// limit above 48 KB), p.row_blocks = ceil(group * max_q_len / Traits::kBlockM), the workspace when
// num_splits > 1, and either zeroed split counters (once; the kernel leaves them zero) or the combine launch
// after the decode launch (same stream):
//   combine grid = ceil(B * H * max_q_len / 4), block = 128 threads, no shared memory.
// An all-masked row (or a row whose visited tiles are empty) ends with O = 0 and LSE = -inf.

// kHeadDim: D (multiple of 16, up to 256). kMTiles: 16-row mma tiles of packed query rows per CTA (1 or 2; more
// rows go to further row blocks). kStages: K/V shared-memory stages (2..4): kStages 64-row tiles of K and of V.
// kAlternate (kStages = 2 only; default: flex_decode_alternate(), the policy's choice): one K buffer and one V
//   buffer of 128 rows each, loaded alternately (V of these 128 rows while Q @ K^T runs, K of the next 128 while
//   P @ V runs), so a CTA has one contiguous 32 KB stream in flight instead of a 16 KB K and a 16 KB V stream
//   (measured 0.6-1.4% faster on the H100, docs/notes/DECODE_NOTES.md run 4); each warp owns 32 KV rows of the 128, its
//   half of one 64-row tile, so mask_mod and score_mod still see 64-wide tiles. Off: kStages stages of 64-row
//   K and V tiles, each warp owning 16 rows of every tile.
// KvElement: the cache's element type, Element or an FP8 tag (flex_fp8.cuh). FP8 rows are copied as they are into
//   the stages (rows of D + 16 bytes), and each warp widens its K and V mma fragments in registers as it reads
//   them (flex_fp8.cuh: fp8_k_fragment, fp8_v_fragments), so Q, P and the mma stay 16-bit, the softmax fp32, and
//   shared memory sees each byte once each way. Q is stored in the k order those K fragments imply, and O's n8
//   tiles come out as the even and odd columns of each 16-column block. The stage pipeline only (not kAlternate).
template <int kHeadDim_, int kMTiles_, int kStages_, class Element_,
          bool kAlternate_ = flex_decode_alternate(kHeadDim_, kMTiles_, kStages_), class KvElement_ = Element_>
struct FlexDecodeTraits {
  using Element = Element_;
  using KvElement = KvElement_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kMTiles = kMTiles_;
  static constexpr int kStages = kStages_;
  static constexpr bool kAlternate = kAlternate_;
  static constexpr bool kKvFp8 = flex::IsFp8<KvElement>::value;
  using PvElement = typename flex::FlexPvElement<KvElement, Element>::type;  // P and V of P @ V (FP8: f16)
  static constexpr int kKvBytes = (int)sizeof(KvElement);
  static constexpr int kBlockM = 16 * kMTiles;
  static constexpr int kBlockN = kFlexDecodeBlockN;
  // KV rows of one K (or V) load: one tile per stage, or the whole buffer when alternating.
  static constexpr int kLoadRows = kAlternate ? kStages * kBlockN : kBlockN;
  static constexpr int kTilesPerLoad = kLoadRows / kBlockN;
  static constexpr int kNWarps = 4;
  static constexpr int kNThreads = kNWarps * 32;
  static constexpr int kColsPerWarp = kLoadRows / kNWarps;  // KV rows of a load that one warp owns: 16 or 32
  static constexpr int kWarpsPerTile = kBlockN / kColsPerWarp;
  static constexpr int kNTiles = kColsPerWarp / 8;       // n8 tiles of the warp's S
  static constexpr int kKSteps = kColsPerWarp / 16;      // k-steps of the warp's P @ V
  static constexpr int kDTiles = kHeadDim / 8;
  static constexpr int kRowsPerThread = 2 * kMTiles;
  static constexpr int kColsPerThread = 2 * kNTiles;     // n8 tiles x 2 elements
  static constexpr int kChunksPerRow = kHeadDim / 8;     // 16-byte chunks of one Element row (Q, O, K/V tiles)
  static constexpr int kKvChunksPerRow = kHeadDim * kKvBytes / 16;  // ... of one cache row
  static constexpr int kKvElemsPerChunk = 16 / kKvBytes;
  // cp.async mapping: each thread copies kCopyChunks chunks (kThreadsPerRow apart) of kPasses rows, so an
  // alternating 128-row load needs as few page-table lookups per thread (8 at D128) as a 64-row tile.
  static constexpr int kCopyChunks = !kAlternate ? 1 : (kKvChunksPerRow % 4 == 0 && kKvChunksPerRow >= 32 ? 4 : 2);
  static constexpr int kThreadsPerRow = kKvChunksPerRow / kCopyChunks;
  static constexpr int kRowsPerPass = kNThreads / kThreadsPerRow;
  static constexpr int kPasses = (kLoadRows + kRowsPerPass - 1) / kRowsPerPass;
  // Rows padded by 16 bytes: odd number of 16-byte chunks per row, so ldmatrix and cp.async are conflict-free.
  static constexpr int kSmemStride = kHeadDim + 8;
  static constexpr int kSmemQBytes = kBlockM * kSmemStride * 2;
  static constexpr int kSmemTileBytes = kBlockN * kSmemStride * 2;
  static constexpr int kSmemLoadBytes = kLoadRows * kSmemStride * 2;
  // Bytes between the rows a load copies into: Element tiles, or FP8 staging rows padded by 16 bytes too.
  static constexpr int kKvSmemRowBytes = kKvFp8 ? kHeadDim + 16 : kSmemStride * 2;
  static constexpr int kSmemStageBytes = 2 * kBlockN * kKvSmemRowBytes;  // K then V
  // End-of-CTA merge of the warps (reuses the stages): O [kNWarps][kBlockM][kOStride] fp32, then row max and sum.
  // kOStride = D + 8 floats: the float2 stores of a half-warp (rows g, columns 2t) hit distinct banks.
  static constexpr int kOStride = kHeadDim + 8;
  static constexpr int kSmemMergeBytes = kNWarps * kBlockM * (kOStride + 2) * 4;
  static constexpr int kSmemBodyBytes =
      kStages * kSmemStageBytes > kSmemMergeBytes ? kStages * kSmemStageBytes : kSmemMergeBytes;
  static constexpr int kSmemBytes = kSmemQBytes + kSmemBodyBytes;
  static_assert(kSmemBytes == flex_decode_smem_bytes(kHeadDim, kMTiles, kStages, kKvBytes),
                "FlexDecodeTraits: the policy's shared-memory count (flex_decode_smem_bytes) disagrees with the layout");

  static_assert(sizeof(Element) == 2, "FlexDecodeTraits: Element must be __nv_bfloat16 or __half");
  static_assert(kHeadDim % 16 == 0 && kHeadDim >= 16 && kHeadDim <= 256,
                "FlexDecodeTraits: kHeadDim must be a multiple of 16 in [16, 256]");
  static_assert(kMTiles == 1 || kMTiles == 2, "FlexDecodeTraits: kMTiles must be 1 or 2 (O of more rows does not fit in registers)");
  static_assert(kHeadDim <= 128 || kMTiles == 1, "FlexDecodeTraits: D > 128 allows only kMTiles = 1 (register budget)");
  static_assert(kStages >= 2 && kStages <= 4, "FlexDecodeTraits: kStages must be in [2, 4]");
  static_assert(!kAlternate || kStages == 2, "FlexDecodeTraits: the alternating pipeline loads 128 rows (kStages = 2)");
  static_assert(!kAlternate || !kKvFp8, "FlexDecodeTraits: FP8 caches use the stage pipeline");
  static_assert(kKvFp8 || sizeof(KvElement) == sizeof(Element), "FlexDecodeTraits: KvElement must be Element or an FP8 tag");
  static_assert(kBlockN == 64 && kColsPerWarp % 16 == 0, "FlexDecodeTraits: the warp layout assumes 64-row tiles over 4 warps");
  static_assert(kRowsPerPass >= 1, "FlexDecodeTraits: need at least one thread per 16-byte chunk of a row");
  static_assert(kSmemBytes <= 232448, "FlexDecodeTraits: shared memory exceeds the 227 KB an sm_90 block may use; lower kStages");
};

namespace flex {

// KV copies: 16-byte cp.async like flex_mma.cuh's cp_async_16, with L2 hints. L2::256B: a miss fetches the whole
// 256-byte block (longer DRAM bursts; ~1% faster decode on the H100). kEvictFirst adds an evict_first cache
// policy (FlexDecodeParams::kv_evict_first): the KV stream is read once, so it should not push out other data.
// Measured on the H100 (DECODE_NOTES.md): evict_first is faster for short caches and windows, slower at 32K;
// an explicit evict_normal policy was 5% slower than no policy at all, so the default path carries none.
__device__ __forceinline__ unsigned long long kv_evict_first_policy() {
  unsigned long long policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}
template <bool kEvictFirst>
__device__ __forceinline__ void cp_async_16_kv(unsigned dst, const void* src, bool pred, unsigned long long policy) {
  const int src_size = pred ? 16 : 0;
  if constexpr (kEvictFirst) {
    asm volatile("cp.async.cg.shared.global.L2::cache_hint.L2::256B [%0], [%1], 16, %2, %3;\n" ::"r"(dst), "l"(src),
                 "r"(src_size), "l"(policy));
  } else {
    (void)policy;
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_size));
  }
}

// Per-thread helpers of one (Traits, Variant) decode instantiation.
template <class Traits, class Variant>
struct DecodeKernel {
  using Element = typename Traits::Element;
  using KvElement = typename Traits::KvElement;
  using VParams = typename Variant::Params;
  using Row = typename Variant::Row;
  using Col = typename Variant::Col;
  using Tile = typename Variant::Tile;

  static constexpr int kMTiles = Traits::kMTiles;
  static constexpr int kNTiles = Traits::kNTiles;
  static constexpr int kRowsPerThread = Traits::kRowsPerThread;
  static constexpr int kColsPerThread = Traits::kColsPerThread;
  static constexpr int kLoadRows = Traits::kLoadRows;
  static constexpr int kBlockN = Traits::kBlockN;
  static constexpr int kPasses = Traits::kPasses;
  static constexpr int kRowsPerPass = Traits::kRowsPerPass;

  static __device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000u); }

  // CTA-tile row of the thread's accumulator row r: m-tile r / 2, half r % 2 (rows g and g + 8).
  static __device__ __forceinline__ int row_in_tile(int lane, int r) { return (r / 2) * 16 + (r % 2) * 8 + lane / 4; }
  // Column within its 64-row tile (0..63) of the thread's accumulator column c: the warp's kColsPerWarp columns,
  // n8 tile c / 2, element c % 2. With 128-row loads, warps 0-1 own the first tile and warps 2-3 the second.
  static __device__ __forceinline__ int col_in_tile(int warp, int lane, int c) {
    return (warp % Traits::kWarpsPerTile) * Traits::kColsPerWarp + (c / 2) * 8 + 2 * (lane % 4) + (c % 2);
  }

  // Where the thread's KV rows of one load live: page id (or the sequence index when contiguous) and the slot
  // within it; slot < 0 marks a row past the KV length or past the split's tiles (zero-filled, nothing read).
  struct RowLoc {
    int page[kPasses];
    int slot[kPasses];
  };

  // Page lookups of the load of split entries e0, e0 + 1, ... (kBlockN rows each) for the rows this thread copies
  // (row r0 + i * kRowsPerPass); tile_of(e) is the entry's tile, or -1 past the split's entries.
  template <class TileOf>
  static __device__ __forceinline__ void locate(RowLoc& loc, const FlexDecodeParams& p, const int* page_row, int b,
                                                TileOf tile_of, int e0, int r0, int kv_len) {
#pragma unroll
    for (int i = 0; i < kPasses; ++i) {
      const int row = r0 + i * kRowsPerPass;
      const bool in_load = kLoadRows % kRowsPerPass == 0 || row < kLoadRows;
      const int t = in_load ? tile_of(e0 + row / kBlockN) : -1;
      const int pos = t * kBlockN + row % kBlockN;
      const bool valid = t >= 0 && pos < kv_len;
      if (page_row == nullptr) {
        loc.page[i] = b;
        loc.slot[i] = valid ? pos : -1;
      } else if (valid) {
        int idx, slot;
        if (p.page_shift >= 0) {
          idx = pos >> p.page_shift;
          slot = pos & (p.page_size - 1);
        } else {
          idx = pos / p.page_size;
          slot = pos - idx * p.page_size;
        }
        loc.page[i] = __ldg(page_row + idx);
        loc.slot[i] = slot;
      } else {
        loc.page[i] = 0;
        loc.slot[i] = -1;
      }
    }
  }

  static __device__ __forceinline__ long long row_offset(const RowLoc& loc, const FlexDecodeParams& p, int i) {
    return loc.slot[i] >= 0 ? (long long)loc.page[i] * p.kv_stride_page + (long long)loc.slot[i] * p.kv_stride_row : 0;
  }

  // cp.async of the thread's chunks of one load into shared memory, for kMats matrices (K and V of one tile, or
  // one of them); src[m] already points at the thread's first chunk of the KV head.
  template <bool kEvictFirst, int kMats>
  static __device__ __forceinline__ void issue_hinted(const RowLoc& loc, const FlexDecodeParams& p,
                                                      const KvElement* const (&src)[kMats], const unsigned (&dst)[kMats],
                                                      int r0, int c0, unsigned long long policy) {
#pragma unroll
    for (int i = 0; i < kPasses; ++i) {
      const int row = r0 + i * kRowsPerPass;
      if (kLoadRows % kRowsPerPass == 0 || row < kLoadRows) {
        const bool valid = loc.slot[i] >= 0;
        const long long off = row_offset(loc, p, i);
#pragma unroll
        for (int k = 0; k < Traits::kCopyChunks; ++k) {
          // In 2-byte units, as the byte offset row * kKvSmemRowBytes + chunk * 16 (kKvSmemRowBytes is even).
          const unsigned d = (row * (Traits::kKvSmemRowBytes / 2) + (c0 + k * Traits::kThreadsPerRow) * 8) * 2;
#pragma unroll
          for (int m = 0; m < kMats; ++m)
            cp_async_16_kv<kEvictFirst>(dst[m] + d, src[m] + off + k * Traits::kThreadsPerRow * Traits::kKvElemsPerChunk, valid,
                                        policy);
        }
      }
    }
  }
  // The cache policy is launch-uniform: one branch per load, not per copy.
  template <int kMats>
  static __device__ __forceinline__ void issue(const RowLoc& loc, const FlexDecodeParams& p, const KvElement* const (&src)[kMats],
                                               const unsigned (&dst)[kMats], int r0, int c0, unsigned long long policy,
                                               bool evict_first) {
    if (evict_first) issue_hinted<true, kMats>(loc, p, src, dst, r0, c0, policy);
    else issue_hinted<false, kMats>(loc, p, src, dst, r0, c0, policy);
  }

  // Score modification, masking and bounds of one warp's S tile, in place: elements of padding rows or at
  // kv >= lim (the KV length, or the end of the split's tiles) become -inf without calling the variant.
  // kPartial: run mask_mod.
  template <bool kPartial>
  static __device__ __forceinline__ void apply_mods(float (&s)[kMTiles][kNTiles][4], const VParams& vp,
                                                    const Row (&row)[kRowsPerThread],
                                                    const Col (&col)[kRowsPerThread][kColsPerThread],
                                                    const Tile (&tile)[kRowsPerThread], const bool (&row_ok)[kRowsPerThread],
                                                    const int (&head)[kRowsPerThread], const int (&qpos)[kRowsPerThread],
                                                    int b, int hkv, int warp, int lane, int k0, int lim, float scale) {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = mt * 2 + e / 2;
          const int c = nt * 2 + e % 2;
          const int j = col_in_tile(warp, lane, c);
          float x = s[mt][nt][e];
          if (row_ok[r] && k0 + j < lim) {
            if constexpr (Variant::kHasScoreMod) {
              // FUSION POINT: score_mod
              x = Variant::score_mod(vp, row[r], col[r][c], tile[r], b, head[r], hkv, qpos[r], k0, j, x * scale);
            }
            if constexpr (kPartial) {
              // FUSION POINT: mask_mod
              if (!Variant::mask_mod(vp, row[r], col[r][c], tile[r], b, head[r], hkv, qpos[r], k0, j)) x = neg_inf();
            }
          } else {
            x = neg_inf();
          }
          s[mt][nt][e] = x;
        }
      }
    }
  }
};

// Merges the num_splits partials of one output row (b, h, i), row = (b * H + h) * max_q_len + i, with one warp:
// w_s = exp(LSE_s - max LSE), O = sum w_s O_s / sum w_s, LSE = max + ln(sum w_s); splits with LSE = -inf are
// skipped (their O is never read); a row whose splits are all -inf gets O = 0 and LSE = -inf.
// kFromL2: read the workspace through L2 only (ld.cg): the partials were written by other CTAs of the running
// grid, which L1 does not track.
template <int kHeadDim, class Element, bool kFromL2>
__device__ __forceinline__ void decode_combine_row(const FlexDecodeParams& p, long long row, int b, int h, int i, int lane) {
  using Mma = Mma16816<Element>;
  constexpr int kQuads = kHeadDim / 4;  // float4 chunks of a row
  constexpr int kPerLane = (kQuads + 31) / 32;
  const float neg_inf = __int_as_float(0xff800000u);
  const int ns = p.num_splits;
  const float* lse_row = p.ws_lse + row * ns;
  const float* o_row = p.ws_o + row * ns * kHeadDim;
  auto load_lse = [&](int s) { return kFromL2 ? __ldcg(lse_row + s) : lse_row[s]; };

  constexpr int kFewSplits = 8;
  float m = neg_inf;
  if (ns > kFewSplits) {
    for (int s = lane; s < ns; s += 32) m = fmaxf(m, load_lse(s));
#pragma unroll
    for (int off = 16; off > 0; off /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
  }

  float acc[kPerLane][4];
#pragma unroll
  for (int k = 0; k < kPerLane; ++k)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[k][e] = 0.f;
  float l = 0.f;
  if (ns <= kFewSplits) {
    // Few splits (the usual plan): every LSE and this lane's O chunks of every split are loaded at once, so the
    // merge costs one L2 round trip, not one per split. Chunks of empty splits (LSE = -inf, never written) are
    // loaded but not used.
    float ls[kFewSplits];
    float4 x[kFewSplits][kPerLane];
#pragma unroll
    for (int s = 0; s < kFewSplits; ++s) {
      if (s < ns) {
        ls[s] = load_lse(s);
        const float4* src = reinterpret_cast<const float4*>(o_row + (long long)s * kHeadDim);
#pragma unroll
        for (int k = 0; k < kPerLane; ++k) {
          const int c = lane + 32 * k;
          if (kQuads % 32 == 0 || c < kQuads) x[s][k] = kFromL2 ? __ldcg(src + c) : src[c];
        }
      }
    }
    float mf = neg_inf;
#pragma unroll
    for (int s = 0; s < kFewSplits; ++s)
      if (s < ns) mf = fmaxf(mf, ls[s]);
#pragma unroll
    for (int s = 0; s < kFewSplits; ++s) {
      if (s < ns && ls[s] != neg_inf) {
        const float w = __expf(ls[s] - mf);
        l += w;
#pragma unroll
        for (int k = 0; k < kPerLane; ++k) {
          acc[k][0] += w * x[s][k].x;
          acc[k][1] += w * x[s][k].y;
          acc[k][2] += w * x[s][k].z;
          acc[k][3] += w * x[s][k].w;
        }
      }
    }
    m = mf;
  } else if (m != neg_inf) {
    for (int s0 = 0; s0 < ns; s0 += 32) {
      // Lane s holds the weight of split s0 + s; broadcast one at a time (warp-uniform skip of empty splits).
      const float ls = s0 + lane < ns ? load_lse(s0 + lane) : neg_inf;
      const float w_lane = ls == neg_inf ? 0.f : __expf(ls - m);
      const int n = min(32, ns - s0);
#pragma unroll 4
      for (int s = 0; s < n; ++s) {
        const float w = __shfl_sync(0xffffffffu, w_lane, s);
        if (w == 0.f) continue;
        l += w;
        const float4* src = reinterpret_cast<const float4*>(o_row + (long long)(s0 + s) * kHeadDim);
#pragma unroll
        for (int k = 0; k < kPerLane; ++k) {
          const int c = lane + 32 * k;
          if (kQuads % 32 == 0 || c < kQuads) {
            const float4 x = kFromL2 ? __ldcg(src + c) : src[c];
            acc[k][0] += w * x.x;
            acc[k][1] += w * x.y;
            acc[k][2] += w * x.z;
            acc[k][3] += w * x.w;
          }
        }
      }
    }
  }
  const float inv = l > 0.f ? 1.f / l : 0.f;
  Element* g_o = static_cast<Element*>(p.o) + b * p.o_stride_b + i * p.o_stride_s + h * p.o_stride_h;
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    const int c = lane + 32 * k;
    if (kQuads % 32 == 0 || c < kQuads) {
      uint2 packed;
      packed.x = Mma::pack(acc[k][0] * inv, acc[k][1] * inv);
      packed.y = Mma::pack(acc[k][2] * inv, acc[k][3] * inv);
      *reinterpret_cast<uint2*>(g_o + c * 4) = packed;
    }
  }
  if (lane == 0 && p.lse != nullptr) p.lse[b * p.lse_stride_b + h * p.lse_stride_h + i] = l > 0.f ? m + logf(l) : neg_inf;
}

// Packed row tr of a decode CTA's tile is R = rb * kBlockM + tr -> (g, i): query head hkv * group + g, query row i;
// valid while R is one of the KV head's packed rows and i one of the sequence's query rows.
template <int kBlockM>
struct DecodeRows {
  int rb, max_q, n_rows, q_len;
  __device__ __forceinline__ bool valid(int tr, int& g, int& i) const {
    const int R = rb * kBlockM + tr;
    g = R / max_q;
    i = R - g * max_q;
    return R < n_rows && i < q_len;
  }
};

// The end of a decode CTA: its 4 warps' partial rows merged (with m_w a warp's (stale) max in log2 units and l_w its
// sum, the row's total is L * 2^M with M = max_w m_w, L = sum_w l_w 2^(m_w - M); O = sum_w O_w 2^(m_w - M) / L;
// LSE = M ln 2 + ln L), then the rows out: O and LSE with one split, else the split's partials into the workspace,
// and with split counters the fused combine by the split CTA that arrives last.
template <class Traits, class Variant, class Softmax>
__device__ __forceinline__ void decode_epilogue(const FlexDecodeParams& p, unsigned char* flex_smem, const Softmax& softmax,
                                                const float (&acc_o)[Traits::kMTiles][Traits::kDTiles][4], float mult, float v_scale,
                                                const DecodeRows<Traits::kBlockM>& rows, int b, int hkv, int rb, int split, int group,
                                                int max_q, int tid, int warp, int lane) {
  using K = DecodeKernel<Traits, Variant>;
  using Element = typename Traits::Element;
  using Mma = Mma16816<Element>;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kMTiles = Traits::kMTiles;
  constexpr int kDTiles = Traits::kDTiles;
  constexpr int kRowsPerThread = Traits::kRowsPerThread;
  constexpr int kChunksPerRow = Traits::kChunksPerRow;
  constexpr int kNWarps = Traits::kNWarps;
  constexpr int kNThreads = Traits::kNThreads;
  constexpr bool kKvFp8 = Traits::kKvFp8;
  constexpr float kLn2 = 0.6931471805599453f;
  flex::cp_async_wait<0>();
  __syncthreads();
  float* s_o = reinterpret_cast<float*>(flex_smem + Traits::kSmemQBytes);  // [kNWarps][kBlockM][kOStride]
  float* s_m = s_o + kNWarps * kBlockM * Traits::kOStride;               // [kNWarps][kBlockM]
  float* s_l = s_m + kNWarps * kBlockM;                                  // [kNWarps][kBlockM]
  float m_own[kRowsPerThread];
#pragma unroll
  for (int r = 0; r < kRowsPerThread; ++r) {
    const float l = flex::quad_sum(softmax.row_sum[r]);
    m_own[r] = softmax.row_max[r] == K::neg_inf() ? K::neg_inf() : softmax.row_max[r] * mult;
    if (lane % 4 == 0) {
      const int tr = K::row_in_tile(lane, r);
      s_m[warp * kBlockM + tr] = m_own[r];
      s_l[warp * kBlockM + tr] = l;
    }
  }
  __syncthreads();
  // The row's merged max (log2 units) and sum over the warps.
  auto merged = [&](int tr, float& m_all, float& l_all) {
    m_all = K::neg_inf();
#pragma unroll
    for (int w = 0; w < kNWarps; ++w) m_all = fmaxf(m_all, s_m[w * kBlockM + tr]);
    l_all = 0.f;
#pragma unroll
    for (int w = 0; w < kNWarps; ++w) {
      const float mw = s_m[w * kBlockM + tr];
      if (mw != K::neg_inf()) l_all += s_l[w * kBlockM + tr] * flex::ex2(mw - m_all);
    }
  };
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = mt * 2 + half;
      const int tr = K::row_in_tile(lane, r);
      float m_all, l_all;
      merged(tr, m_all, l_all);
      const float factor = m_own[r] == K::neg_inf() ? 0.f : flex::ex2(m_own[r] - m_all);
      const float sc = l_all > 0.f ? factor / l_all * v_scale : 0.f;
      if constexpr (kKvFp8) {
        // n8 tiles 2dp and 2dp + 1 hold the even and odd columns of block dp: this thread's are 4t .. 4t + 3.
        float* dst = s_o + (warp * kBlockM + tr) * Traits::kOStride + 4 * (lane % 4);
#pragma unroll
        for (int dp = 0; dp < kDTiles / 2; ++dp)
          *reinterpret_cast<float4*>(dst + dp * 16) =
              make_float4(acc_o[mt][2 * dp][2 * half] * sc, acc_o[mt][2 * dp + 1][2 * half] * sc,
                          acc_o[mt][2 * dp][2 * half + 1] * sc, acc_o[mt][2 * dp + 1][2 * half + 1] * sc);
      } else {
        float* dst = s_o + (warp * kBlockM + tr) * Traits::kOStride + 2 * (lane % 4);
#pragma unroll
        for (int dt = 0; dt < kDTiles; ++dt)
          *reinterpret_cast<float2*>(dst + dt * 8) = make_float2(acc_o[mt][dt][2 * half] * sc, acc_o[mt][dt][2 * half + 1] * sc);
      }
    }
  }
  __syncthreads();

  // Rows out: 8 consecutive values per thread and step (16-byte element stores, or two float4 partial stores).
  const bool direct = p.num_splits == 1;
  const int h0 = hkv * group;
  for (int chunk = tid; chunk < kBlockM * kChunksPerRow; chunk += kNThreads) {
    const int tr = chunk / kChunksPerRow;
    const int c = chunk % kChunksPerRow;
    int g, i;
    if (!rows.valid(tr, g, i)) continue;
    float v[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] = 0.f;
#pragma unroll
    for (int w = 0; w < kNWarps; ++w) {
      const float4* src = reinterpret_cast<const float4*>(s_o + (w * kBlockM + tr) * Traits::kOStride + c * 8);
      const float4 x0 = src[0], x1 = src[1];
      v[0] += x0.x; v[1] += x0.y; v[2] += x0.z; v[3] += x0.w;
      v[4] += x1.x; v[5] += x1.y; v[6] += x1.z; v[7] += x1.w;
    }
    if (direct) {
      uint4 packed;
      packed.x = Mma::pack(v[0], v[1]);
      packed.y = Mma::pack(v[2], v[3]);
      packed.z = Mma::pack(v[4], v[5]);
      packed.w = Mma::pack(v[6], v[7]);
      Element* g_o = static_cast<Element*>(p.o) + b * p.o_stride_b + i * p.o_stride_s + (h0 + g) * p.o_stride_h;
      *reinterpret_cast<uint4*>(g_o + c * 8) = packed;
    } else {
      // A split whose row saw nothing keeps LSE = -inf and is never read by the combine: skip its O.
      bool any = false;
#pragma unroll
      for (int w = 0; w < kNWarps; ++w) any |= s_m[w * kBlockM + tr] != K::neg_inf();
      if (!any) continue;
      const long long ws_row = ((long long)(b * p.heads + h0 + g) * max_q + i) * p.num_splits + split;
      float4* dst = reinterpret_cast<float4*>(p.ws_o + ws_row * kHeadDim + c * 8);
      dst[0] = make_float4(v[0], v[1], v[2], v[3]);
      dst[1] = make_float4(v[4], v[5], v[6], v[7]);
    }
  }
  if (tid < kBlockM) {
    const int tr = tid;
    int g, i;
    if (rows.valid(tr, g, i)) {
      float m_all, l_all;
      merged(tr, m_all, l_all);
      const float lse = l_all > 0.f ? m_all * kLn2 + logf(l_all) : K::neg_inf();
      if (direct) {
        if (p.lse != nullptr) p.lse[b * p.lse_stride_b + (h0 + g) * p.lse_stride_h + i] = lse;
      } else {
        p.ws_lse[((long long)(b * p.heads + h0 + g) * max_q + i) * p.num_splits + split] = lse;
      }
    }
  }

  // Fused combine: the last split CTA of this (b, hkv, rb) to arrive merges its rows' partials (threadfence
  // reduction pattern: every thread publishes its partials, then one atomic per CTA counts the arrivals).
  if (direct || p.split_counters == nullptr) return;
  __shared__ int s_last;
  __threadfence();
  __syncthreads();
  int* counter = p.split_counters + ((long long)b * p.kv_heads + hkv) * p.row_blocks + rb;
  if (tid == 0) {
    const int arrived = atomicAdd(counter, 1);
    s_last = arrived == p.num_splits - 1;
    // Every other split has arrived: nothing increments this counter again in this launch.
    if (s_last) *counter = 0;
  }
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  for (int tr = warp; tr < kBlockM; tr += kNWarps) {
    int g, i;
    if (!rows.valid(tr, g, i)) continue;
    const long long row = (long long)(b * p.heads + h0 + g) * max_q + i;
    flex::decode_combine_row<kHeadDim, Element, true>(p, row, b, h0 + g, i, lane);
  }
}

}  // namespace flex

// One CTA: one split of the KV tiles of one (sequence b, KV head, row block). See the top of this file.
template <class Traits, class Variant>
__device__ __forceinline__ void flex_decode(const FlexDecodeParams& p, const typename Variant::Params& vp) {
  using K = flex::DecodeKernel<Traits, Variant>;
  using Element = typename Traits::Element;
  using KvElement = typename Traits::KvElement;
  using Mma = flex::Mma16816<Element>;
  using MmaPv = flex::Mma16816<typename Traits::PvElement>;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kMTiles = Traits::kMTiles;
  constexpr int kNTiles = Traits::kNTiles;
  constexpr int kKSteps = Traits::kKSteps;
  constexpr int kDTiles = Traits::kDTiles;
  constexpr int kStages = Traits::kStages;
  constexpr int kTilesPerLoad = Traits::kTilesPerLoad;
  constexpr int kRowsPerThread = Traits::kRowsPerThread;
  constexpr int kColsPerThread = Traits::kColsPerThread;
  constexpr int kSmemStride = Traits::kSmemStride;
  constexpr int kChunksPerRow = Traits::kChunksPerRow;
  constexpr int kNWarps = Traits::kNWarps;
  constexpr int kNThreads = Traits::kNThreads;
  constexpr bool kAlternate = Traits::kAlternate;
  constexpr bool kKvFp8 = Traits::kKvFp8;
  constexpr float kLog2e = 1.4426950408889634f;

  extern __shared__ __align__(128) unsigned char flex_smem[];

  // ============================================ Prologue ============================================
  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int split = blockIdx.x;
  const int hkv = blockIdx.y / p.row_blocks;
  const int rb = blockIdx.y % p.row_blocks;
  const int b = blockIdx.z;
  const int group = p.heads / p.kv_heads;
  const int max_q = p.max_q_len;
  const int n_rows = group * max_q;  // packed rows of this KV head
  const FlexDecodeLengths len = flex_decode_lengths(p.kv_lens, p.q_lens, b, p.kv_len, max_q, p.max_kv_len);
  if (!len.ok && split == 0 && blockIdx.y == 0 && tid == 0 && p.error_word != nullptr) atomicOr(p.error_word, kFlexBadLengthsFlag);
  const int kv_len = len.kv_len;
  const int q_len = len.q_len;
  const flex::DecodeRows<kBlockM> rows{rb, max_q, n_rows, q_len};
  auto row_valid = [&](int tr, int& g, int& i) { return rows.valid(tr, g, i); };

  // This split's tiles: entries [e_begin, e_begin + n_tiles) of the sequence's tile list (FlexDecodeTiles), or of
  // every tile when there is no list; the listed tiles are divided evenly between the splits.
  const int n_kv_tiles = (kv_len + kBlockN - 1) / kBlockN;
  const int* list = nullptr;
  int n_listed = n_kv_tiles;
  if (p.tiles.list != nullptr) {
    const long long off = b * p.tiles.stride_b + hkv * p.tiles.stride_h;
    list = p.tiles.list + off * p.tiles.capacity;
    n_listed = min(p.tiles.count[off], n_kv_tiles);
  }
  const int per_split = (n_listed + p.num_splits - 1) / p.num_splits;
  const int e_begin = split * per_split;
  const int n_tiles = max(0, min(n_listed - e_begin, per_split));
  // The e-th tile visited (e < n_tiles; a 128-row load may reach one entry past the split, which is not visited).
  // The split's entries are visited from its last to its first: position terms of score_mod peak next to the
  // query (ALiBi, decays, relative biases), so the running maximum is set by the first tile and O is not rescaled
  // on every tile as it would be walking towards the query.
  auto slot = [&](int e) { return e_begin + n_tiles - 1 - e; };
  auto tile_of = [&](int e) { return e < n_tiles ? (list != nullptr ? list[slot(e)] & ~kFlexDecodeFullTile : slot(e)) : -1; };
  auto full_at = [&](int e) { return list != nullptr && e < n_tiles && list[slot(e)] < 0; };
  const int n_loads = (n_tiles + kTilesPerLoad - 1) / kTilesPerLoad;

  // Shared memory: Q [kBlockM][kSmemStride], then kStages x (K, V) [kBlockN][kSmemStride] (alternating: K
  // [kLoadRows][kSmemStride], then V; FP8: [kBlockN][kKvSmemRowBytes] bytes each).
  const unsigned s_q = flex::smem_addr(flex_smem);
  const unsigned s_body = s_q + Traits::kSmemQBytes;
  auto k_buf = [&](int it) -> unsigned {
    return kAlternate ? s_body : s_body + (it % kStages) * Traits::kSmemStageBytes;
  };
  auto v_buf = [&](int it) -> unsigned {
    return kAlternate ? s_body + Traits::kSmemLoadBytes : k_buf(it) + Traits::kSmemStageBytes / 2;
  };

  // Packed rows of Q (FP8 caches: in fp8_k_fragment's k order, through registers; read after the first barrier).
  if constexpr (kKvFp8) {
    const Element* g_q = static_cast<const Element*>(p.q) + b * p.q_stride_b;
    for (int pair = tid; pair < kBlockM * kChunksPerRow / 2; pair += kNThreads) {
      const int tr = pair / (kChunksPerRow / 2);
      const int c = pair % (kChunksPerRow / 2) * 2;
      int g, i;
      uint4 a = make_uint4(0, 0, 0, 0), bq = a;
      if (row_valid(tr, g, i)) {
        const uint4* src = reinterpret_cast<const uint4*>(g_q + i * p.q_stride_s + (hkv * group + g) * p.q_stride_h + c * 8);
        a = src[0];
        bq = src[1];
      }
      uint4* dst = reinterpret_cast<uint4*>(flex_smem + (tr * kSmemStride + c * 8) * 2);
      flex::fp8_q_order(a, bq, dst[0], dst[1]);
    }
  } else {
    const Element* g_q = static_cast<const Element*>(p.q) + b * p.q_stride_b;
    for (int chunk = tid; chunk < kBlockM * kChunksPerRow; chunk += kNThreads) {
      const int tr = chunk / kChunksPerRow;
      const int c = chunk % kChunksPerRow;
      int g, i;
      const bool valid = row_valid(tr, g, i);
      const Element* src = g_q + i * p.q_stride_s + (hkv * group + g) * p.q_stride_h + c * 8;
      flex::cp_async_16(s_q + (tr * kSmemStride + c * 8) * 2, valid ? src : g_q, valid);
    }
  }

  // K/V copies: the thread copies chunks cc + k * kThreadsPerRow of rows r0 + i * kRowsPerPass of each load.
  const int r0 = tid / Traits::kThreadsPerRow;
  const int cc = tid % Traits::kThreadsPerRow;
  const bool copier = r0 < Traits::kRowsPerPass;  // D = 80, 96, ...: the last few threads copy nothing
  const int* page_row = p.page_table != nullptr ? p.page_table + b * p.page_table_stride : nullptr;
  const KvElement* k_head = static_cast<const KvElement*>(p.k) + hkv * p.kv_stride_head + cc * Traits::kKvElemsPerChunk;
  const KvElement* v_head = static_cast<const KvElement*>(p.v) + hkv * p.kv_stride_head + cc * Traits::kKvElemsPerChunk;
  typename K::RowLoc loc;
  const bool evict_first = p.kv_evict_first != 0;
  const unsigned long long policy = evict_first ? flex::kv_evict_first_policy() : 0ull;
  auto locate = [&](int load) { K::locate(loc, p, page_row, b, tile_of, load * kTilesPerLoad, r0, kv_len); };
  // One matrix (K or V) of an alternating load, as one commit group.
  auto issue_one = [&](const KvElement* head, unsigned dst) {
    if (copier) K::template issue<1>(loc, p, {head}, {dst}, r0, cc, policy, evict_first);
    flex::cp_async_commit();
  };

  if constexpr (kAlternate) {
    // K of the first load in flight (one commit group with Q); its page ids serve V too.
    if (n_loads > 0) {
      if (copier) locate(0);
      issue_one(k_head, k_buf(0));
    } else {
      flex::cp_async_commit();
    }
  } else {
    // Stages 0 .. kStages-2 in flight (one commit group each, the first one also holding Q).
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (copier && s < n_tiles) {
        locate(s);
        K::template issue<2>(loc, p, {k_head, v_head}, {k_buf(s), v_buf(s)}, r0, cc, policy, evict_first);
      }
      flex::cp_async_commit();
    }
    // Page ids of the next tile to issue (kStages - 1), fetched ahead.
    if (copier && kStages - 1 < n_tiles) locate(kStages - 1);
  }

  // Per-row state: validity, query head, absolute position, hoisted variant values.
  bool row_ok[kRowsPerThread];
  int head[kRowsPerThread];
  int qpos[kRowsPerThread];
  typename Variant::Row row_st[kRowsPerThread];
  typename Variant::Col col_st[kRowsPerThread][kColsPerThread];
#pragma unroll
  for (int r = 0; r < kRowsPerThread; ++r) {
    int g, i;
    row_ok[r] = row_valid(K::row_in_tile(lane, r), g, i);
    head[r] = hkv * group + g;
    qpos[r] = kv_len - q_len + i;
    if (row_ok[r] && len.ok) {  // a sequence outside its bounds has no valid query position to hoist for
      Variant::row(vp, row_st[r], b, head[r], hkv, qpos[r]);
#pragma unroll
      for (int c = 0; c < kColsPerThread; ++c) {
        const int j = K::col_in_tile(warp, lane, c);
        if (j < kv_len) Variant::col(vp, row_st[r], col_st[r][c], b, head[r], hkv, qpos[r], j);
      }
    }
  }

  // Per-lane ldmatrix byte offsets (fragment layouts: flex_mma.cuh; same matrices as flex_forward.cuh), from the
  // start of the K / V buffer; the warp's KV rows start at warp * kColsPerWarp.
  const int l8 = lane % 8;
  const int lm = lane / 8;
  const int warp_row = warp * Traits::kColsPerWarp;
  const unsigned q_lane = s_q + (((lm & 1) * 8 + l8) * kSmemStride + (lm >> 1) * 8) * 2;
  const unsigned k_lane = ((warp_row + (lm >> 1) * 8 + l8) * kSmemStride + (lm & 1) * 8) * 2;
  const unsigned v_lane = ((warp_row + (lm & 1) * 8 + l8) * kSmemStride + (lm >> 1) * 8) * 2;
  // FP8 stages: two 8-row matrices (rows +0 and +8) of 16-byte row pieces per x2 load, for K and V alike.
  const unsigned kv8_lane = (warp_row + (lm & 1) * 8 + l8) * Traits::kKvSmemRowBytes;

  float acc_o[kMTiles][kDTiles][4];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int dt = 0; dt < kDTiles; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_o[mt][dt][e] = 0.f;
  // exp(score - max) = exp2((x - max) * mult); without score_mod x is the raw q.k (see flex_forward.cuh). The scores
  // here are score_mod's whole value, not a split variant's core, so the fixed-maximum softmax does not apply.
  // An FP8 cache's k scale joins the softmax scale (S = scale * k_scale * q.k8), its v scale O's final scaling.
  float qk_scale = p.scale, v_scale = 1.f;
  if constexpr (kKvFp8) {
    if (p.k_scale != nullptr) qk_scale *= p.k_scale[hkv * p.kv_scale_stride];
    if (p.v_scale != nullptr) v_scale = p.v_scale[hkv * p.kv_scale_stride];
  }
  const float mult = Variant::kHasScoreMod ? kLog2e : qk_scale * kLog2e;
  flex::Softmax<Variant, typename Traits::PvElement, kMTiles, kNTiles, /*kFixedMaxAllowed=*/false> softmax(mult);

  // S = mods(Q @ K^T) over the warp's KV rows of load `it`, then the online softmax update: P (as the A
  // fragments of the warp's P @ V k-steps) into pa, O rescaled when the max jumps.
  unsigned pa[kMTiles][kKSteps][4];
  auto scores_softmax = [&](int it, unsigned k_stage) {
    const int e = it * kTilesPerLoad + warp / Traits::kWarpsPerTile;  // the warp's 64-row tile: entry e of the split
    const int t = tile_of(e);
    const bool full = full_at(e);
    // Columns at or past kv_lim are -inf: the KV length, or all of them when the entry is past the split.
    const int kv_lim = t >= 0 ? kv_len : 0;
    const int k0 = max(t, 0) * kBlockN;
    typename Variant::Tile tile_st[kRowsPerThread];
    if (t >= 0) {
#pragma unroll
      for (int r = 0; r < kRowsPerThread; ++r)
        if (row_ok[r]) Variant::tile(vp, row_st[r], tile_st[r], b, head[r], hkv, qpos[r], k0);
    }

    float acc_s[kMTiles][kNTiles][4];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_s[mt][nt][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      unsigned bk[kNTiles / 2][4];  // b0, b1 of n8 tiles 2np and 2np + 1
#pragma unroll
      for (int np = 0; np < kNTiles / 2; ++np) {
        if constexpr (kKvFp8) {
          unsigned r[2];
          flex::ldmatrix_x2(r, k_stage + kv8_lane + np * 16 * Traits::kKvSmemRowBytes + kk * 16);
          flex::fp8_k_fragment<KvElement, Element>(r[0], bk[np][0], bk[np][1]);
          flex::fp8_k_fragment<KvElement, Element>(r[1], bk[np][2], bk[np][3]);
        } else {
          flex::ldmatrix_x4(bk[np], k_stage + k_lane + (np * 16 * kSmemStride + kk * 16) * 2);
        }
      }
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        unsigned a[4];
        flex::ldmatrix_x4(a, q_lane + (mt * 16 * kSmemStride + kk * 16) * 2);
#pragma unroll
        for (int np = 0; np < kNTiles / 2; ++np) {
          Mma::run(acc_s[mt][2 * np], a, bk[np][0], bk[np][1]);
          Mma::run(acc_s[mt][2 * np + 1], a, bk[np][2], bk[np][3]);
        }
      }
    }

    // S = mask(score_mod(scale * S)); -inf for padding rows and kv >= kv_lim.
    if (Variant::kHasMaskMod && !full)
      K::template apply_mods<true>(acc_s, vp, row_st, col_st, tile_st, row_ok, head, qpos, b, hkv, warp, lane, k0,
                                   kv_lim, qk_scale);
    else
      K::template apply_mods<false>(acc_s, vp, row_st, col_st, tile_st, row_ok, head, qpos, b, hkv, warp, lane, k0,
                                    kv_lim, qk_scale);

    // Online softmax (flex::Softmax), per warp over its columns; P as the A fragments of the warp's P @ V k-steps.
    float alpha[kRowsPerThread];
    const bool jumped = softmax.update_max(acc_s, alpha);
    softmax.rescale_o(acc_o, alpha, jumped);
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks) {
        softmax.exp_kstep(acc_s, mt, ks);
        softmax.pack_kstep(acc_s, mt, ks, pa[mt][ks]);
      }
  };
  // O += P @ V over the warp's KV rows.
  auto accumulate_pv = [&](unsigned v_stage) {
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
#pragma unroll
      for (int dp = 0; dp < kHeadDim / 16; ++dp) {
        unsigned bv[4];  // b0, b1 of n8 tiles 2dp and 2dp + 1 (FP8: the 16-column block's even and odd columns)
        if constexpr (kKvFp8) {
          unsigned r[2];
          flex::ldmatrix_x2_trans(r, v_stage + kv8_lane + ks * 16 * Traits::kKvSmemRowBytes + dp * 16);
          flex::fp8_v_fragments<KvElement>(r[0], bv[0], bv[2]);
          flex::fp8_v_fragments<KvElement>(r[1], bv[1], bv[3]);
        } else {
          flex::ldmatrix_x4_trans(bv, v_stage + v_lane + (ks * 16 * kSmemStride + dp * 16) * 2);
        }
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          MmaPv::run(acc_o[mt][2 * dp], pa[mt][ks], bv[0], bv[1]);
          MmaPv::run(acc_o[mt][2 * dp + 1], pa[mt][ks], bv[2], bv[3]);
        }
      }
    }
  };

  // ============================================ Mainloop ============================================
  if constexpr (kAlternate) {
    // Per load: [K landed] V in flight during Q @ K^T and the softmax; [V landed] the next K in flight during
    // P @ V. One barrier per half: every warp is done with the buffer about to be refilled.
    for (int it = 0; it < n_loads; ++it) {
      flex::cp_async_wait<0>();
      __syncthreads();
      issue_one(v_head, v_buf(it));
      if (copier && it + 1 < n_loads) locate(it + 1);
      scores_softmax(it, k_buf(it));
      flex::cp_async_wait<0>();
      __syncthreads();
      if (it + 1 < n_loads) issue_one(k_head, k_buf(it + 1));
      accumulate_pv(v_buf(it));
    }
  } else {
    for (int it = 0; it < n_tiles; ++it) {
      flex::cp_async_wait<kStages - 2>();  // tile it has landed
      __syncthreads();                     // ... for every thread, and every warp is done with tile it - 1's stage

      // Refill the stage of tile it - 1 with tile it + kStages - 1, then fetch the page ids of the tile after it.
      if (copier && it + kStages - 1 < n_tiles) {
        const int nx = it + kStages - 1;
        K::template issue<2>(loc, p, {k_head, v_head}, {k_buf(nx), v_buf(nx)}, r0, cc, policy, evict_first);
        if (it + kStages < n_tiles) locate(it + kStages);
      }
      flex::cp_async_commit();
      scores_softmax(it, k_buf(it));
      accumulate_pv(v_buf(it));
    }
  }

  // ============================================ Epilogue ============================================
  flex::decode_epilogue<Traits, Variant>(p, flex_smem, softmax, acc_o, mult, v_scale, rows, b, hkv, rb, split, group, max_q, tid, warp, lane);
}

// Merges the splits of each output row exactly (flex::decode_combine_row). One warp per row (b, h, i),
// row = (b * H + h) * max_q_len + i; grid = ceil(B * H * max_q_len / 4), block = 128 threads. Not launched when
// p.split_counters is set (the decode kernel's last split CTA merges then).
template <int kHeadDim, class Element>
__device__ __forceinline__ void flex_decode_combine(const FlexDecodeParams& p) {
  const int lane = threadIdx.x % 32;
  const long long row = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const int max_q = p.max_q_len;
  if (row >= (long long)p.batch * p.heads * max_q) return;
  const int i = (int)(row % max_q);
  const int h = (int)((row / max_q) % p.heads);
  const int b = (int)(row / ((long long)max_q * p.heads));
  if (i >= flex_decode_lengths(p.kv_lens, p.q_lens, b, p.kv_len, max_q, p.max_kv_len).q_len) return;
  flex::decode_combine_row<kHeadDim, Element, false>(p, row, b, h, i, lane);
}
