// Launch parameters, workspace layout and split heuristic of the flex decode kernels (split-KV + LSE combine).
#pragma once
#include "flex_params.cuh"  // kFlexBadLengthsFlag

// Plain data only: this header is also compiled as host C++20 (no CUDA headers), so it must not use
// CUDA types, qualifiers or fixed-width integer typedefs. The split heuristic is host code and is hidden
// from NVRTC, which compiles device code only.

// KV rows per tile of the decode kernel. 64 as in the forward kernel, so the generator's staging (Col values
// per column j of a 64-wide tile, Tile values per k0) and any tile window are shared by both kernels.
constexpr int kFlexDecodeBlockN = 64;
// Upper bound of FlexDecodeParams::num_splits (the combine kernel keeps nothing per split in registers, so
// this only bounds the workspace and keeps the heuristic sane).
constexpr int kFlexDecodeMaxSplits = 256;

// Whether the decode kernel alternates 128-row K and V loads (FlexDecodeTraits::kAlternate, the template's default
// and the policy's choice) rather than streaming 64-row K+V pairs: one contiguous 32 KB stream per CTA instead of two
// 16 KB ones, for warps that hold 32 KV rows of S and P instead of 16. Only D128 with one m-tile keeps its registers
// without spills and at the resident CTAs bandwidth needs (flex_decode_bandwidth_ctas); measurements and the ptxas
// survey: docs/notes/DECODE_NOTES.md, run 4.
constexpr bool flex_decode_alternate(int head_dim, int m_tiles, int stages) {
  return head_dim == 128 && m_tiles == 1 && stages == 2;
}

// Dynamic shared memory of the decode kernel (FlexDecodeTraits::kSmemBytes): the Q tile [16 m_tiles][D + 8] of
// 16-bit elements, then the larger of the K/V stages (K then V, 64 rows each: rows of D + 8 16-bit elements, or of
// D + 16 bytes for an FP8 cache; the alternating pipeline's 128-row K and V buffers fill exactly two stages) and the
// end-of-CTA merge of the 4 warps' O [4][16 m_tiles][D + 8] fp32 with their row max and sum.
constexpr int flex_decode_smem_bytes(int head_dim, int m_tiles, int stages, int kv_bytes) {
  const int stride = head_dim + 8;
  const int row = kv_bytes == 1 ? head_dim + 16 : stride * 2;
  const int q = 16 * m_tiles * stride * 2, stage = 2 * kFlexDecodeBlockN * row;
  const int merge = 4 * 16 * m_tiles * (stride + 2) * 4;
  return q + (stages * stage > merge ? stages * stage : merge);
}

// Every per-module tuning choice of the decode kernel in one place, as flex_tile_policy.cuh is for the forward: the
// generated module (compiler/codegen decode_config), the kernel's traits and the host's launch read it. The choices
// per launch (split count, evict_first) follow below.
struct FlexDecodePolicy {
  int m_tiles;     // 16-row mma tiles of packed query rows per CTA: 2 when more than 16 rows share a KV head (D <= 128)
  int stages;      // K/V shared-memory stages
  bool alternate;  // 128-row K and V loads in turn (flex_decode_alternate)
};

// rows_per_kv_head: the packed query rows of one KV head (query heads per KV head x query rows); kv_bytes: bytes per
// cache element (1 for FP8). Two 16-bit stages keep one K/V tile in flight per CTA while the other is consumed and
// leave room for 3 CTAs per SM at D128 (DECODE_NOTES.md, optimisation run 1); an FP8 stage holds half the bytes, so
// FP8 caches take three stages (the bytes of two 16-bit ones) and the stage pipeline. The shared memory of a choice
// is flex_decode_smem_bytes.
constexpr FlexDecodePolicy flex_decode_policy(int head_dim, int rows_per_kv_head, int kv_bytes) {
  FlexDecodePolicy p{};
  p.m_tiles = rows_per_kv_head > 16 && head_dim <= 128 ? 2 : 1;
  p.stages = kv_bytes == 1 ? 3 : 2;
  p.alternate = kv_bytes != 1 && flex_decode_alternate(head_dim, p.m_tiles, p.stages);
  return p;
}

// Which KV tiles (of kFlexDecodeBlockN rows, tile t = rows [64 t, 64 t + 64)) one sequence visits: a list of
// tile indices in ascending order, each with the sign bit set when the tile is "full" (the mask keeps every element
// of it, so mask_mod is not called there); every other listed tile runs mask_mod per element. Tiles not listed are
// never read: a sliding window, attention sinks plus a window, or a document reads only its own pages, and split-KV
// divides the listed tiles, not the raw range. list == null: every tile below the KV length is visited, and all
// are partial when the variant has a mask_mod.
struct FlexDecodeTiles {
  const int* list;        // [B, Hkv][capacity] tile entries (tile | kFlexDecodeFullTile), the first count[] valid
  const int* count;       // [B, Hkv] listed tiles
  int capacity;           // entries per (sequence, KV head) list: ceil(max_seqlen_kv / 64)
  long long stride_b;     // element stride of count (and, times capacity, of list) over sequences (1 or Hkv)
  long long stride_h;     // element stride over KV heads (0 = one list for every KV head)
};

constexpr int kFlexDecodeFullTile = (int)0x80000000u;  // flag of a listed tile that needs no mask_mod

// Everything the decode kernel and its combine kernel need besides the variant's own parameters.
//
// Query rows: sequence b has q_len(b) query rows (q_lens[b], or max_q_len when q_lens is null), 1..16, the last
// q_len(b) positions of the sequence: row i sits at absolute position kv_len(b) - q_len(b) + i, which is the
// `q` the variant sees. q is [B, max_q_len, H, D] (any order of the three outer dims through the strides).
//
// KV cache (k and v share one layout; row = one (position, KV head) vector of D contiguous elements):
//   paged (page_table != null): position p of sequence b is slot p % page_size of page
//     page_table[b * page_table_stride + p / page_size]; element offset of its row for KV head hkv =
//     page * kv_stride_page + (p % page_size) * kv_stride_row + hkv * kv_stride_head.
//       [num_pages, page_size, Hkv, D]: kv_stride_page = page_size*Hkv*D, kv_stride_row = Hkv*D, kv_stride_head = D
//       [num_pages, Hkv, page_size, D]: kv_stride_page = Hkv*page_size*D, kv_stride_row = D, kv_stride_head = page_size*D
//   contiguous (page_table == null): offset = b * kv_stride_page + p * kv_stride_row + hkv * kv_stride_head,
//       e.g. [B, Hkv, Skv, D]: kv_stride_page = Hkv*Skv*D, kv_stride_row = D, kv_stride_head = Skv*D.
//
// Outputs: o like q ([B, max_q_len, H, D] through strides), lse [B, H, max_q_len] (row stride 1, may be null).
// Rows i >= q_len(b) are never written. With num_splits == 1 the decode kernel writes o and lse itself and no
// combine runs; otherwise it writes fp32 partials into the workspace and the combine kernel writes o and lse.
//
// Workspace (num_splits > 1), R = B * H * max_q_len rows indexed row = (b * H + h) * max_q_len + i:
//   ws_o   float [R][num_splits][D]  partial O of each split, already divided by its own row sum
//   ws_lse float [R][num_splits]     natural-log LSE of each split's scores, -inf for an empty/all-masked split
// flex_decode_workspace_bytes() gives the size; the two arrays may live in one allocation (ws_lse after ws_o).
//
// What the host must guarantee (the kernels do not check): q/k/v/o 16-byte aligned and every stride a multiple
// of 8 elements (16-byte vector accesses); H % Hkv == 0; 1 <= q_len(b) <= max_q_len <= 16 and
// q_len(b) <= kv_len(b); page tables hold a valid page for every position below kv_len(b) that a visited tile
// touches; without score_mod, scale > 0; num_splits in [1, kFlexDecodeMaxSplits]; grid and row blocks as in
// flex_decode.cuh.
struct FlexDecodeParams {
  const void* q;                 // element type = the kernel's Element (bf16 or fp16)
  const void* k;                 // KV cache, keys
  const void* v;                 // KV cache, values (same strides as k)
  void* o;                       // output, same element type
  float* lse;                    // [B, H, max_q_len] natural-log LSE of the modified scores (null = not written)
  float* ws_o;                   // workspace partial O (num_splits > 1)
  float* ws_lse;                 // workspace partial LSE (num_splits > 1)
  const int* kv_lens;            // [B] KV length of each sequence (null = kv_len for all)
  const int* q_lens;             // [B] query rows of each sequence (null = max_q_len for all)
  const int* page_table;         // [B, page_table_stride] page ids (null = contiguous KV)
  long long q_stride_b, q_stride_s, q_stride_h;  // element strides of q
  long long o_stride_b, o_stride_s, o_stride_h;  // element strides of o
  long long lse_stride_b, lse_stride_h;          // element strides of lse (row stride 1)
  long long kv_stride_page;      // see above (the sequence stride when page_table is null)
  long long kv_stride_row;       // between consecutive positions of one page (or sequence)
  long long kv_stride_head;      // between KV heads
  long long page_table_stride;   // element stride of page_table over sequences
  int page_size;                 // positions per page, >= 1 (ignored when contiguous)
  int page_shift;                // log2(page_size) when it is a power of two, else -1 (cheaper indexing)
  int batch;                     // B
  int heads;                     // H, query heads
  int kv_heads;                  // Hkv
  int max_q_len;                 // rows per sequence the layout of q/o/lse is built for, 1..16
  int kv_len;                    // KV length of every sequence when kv_lens is null
  int num_splits;                // KV splits per (sequence, KV head, row block): grid.x
  int row_blocks;                // ceil(group * max_q_len / kBlockM) where group = H / Hkv: grid.y = Hkv * row_blocks
  int kv_evict_first;            // nonzero: K/V loads carry an L2 evict_first policy (see flex_decode.cuh)
  float scale;                   // softmax scale applied to q.k before score_mod
  FlexDecodeTiles tiles;         // tile window / full tiles; all null = every tile, all partial
  // [B * Hkv * row_blocks] arrival counters, zero before the first launch (num_splits > 1). Non-null: the last
  // split CTA of each (sequence, KV head, row block) to finish merges the partials itself and resets its
  // counter to zero (so the next launch, or a graph replay, finds zeros again); no combine launch then.
  // Null: the separate flex_decode_combine launch merges.
  int* split_counters;
  // FP8 caches: the stored values times these scales are K and V ([Hkv] floats when kv_scale_stride is 1, one float
  // when 0; null = 1). The k scale multiplies `scale`, the v scale O; bf16/fp16 caches ignore them.
  const float* k_scale;
  const float* v_scale;
  long long kv_scale_stride;
  // The plan's bound of the KV lengths (max_seqlen_kv), and the launch's error word (flex_decode_lengths).
  int max_kv_len;
  unsigned int* error_word;
};

// Where the tile-list kernel writes FlexDecodeTiles' arrays, and what it classifies.
// grid = (lists_per_seq, B), kFlexDecodeTileListThreads threads. lists_per_seq = kv_heads when the mask depends on h
// (one list per KV head, over that KV head's query heads), else 1 (every head).
struct FlexDecodeTileListParams {
  int* list;           // [B, lists_per_seq][capacity]
  int* count;          // [B, lists_per_seq]
  int capacity;        // tiles a list holds; tiles past it (a KV length above the plan's bound) are not listed
  const int* kv_lens;  // [B] (null = kv_len)
  const int* q_lens;   // [B] (null = max_q_len)
  int kv_len;
  int max_q_len;
  int heads;
  int kv_heads;
  int per_head;        // nonzero: grid.x = kv_heads, one list per KV head
  int max_kv_len;      // the plan's bound of the KV lengths (flex_decode_lengths)
};

// Sequence b's KV length and query rows, checked: q_len in 1..max_q and kv_len in q_len..max_kv (the contract of
// DecodeArgs). Outside them the query positions kv_len - q_len + i would leave [0, Skv - 1], the domain the range
// analysis proved the mods' loads for, and a KV length past the bound would pass the sequence's pages: such a
// sequence runs with no KV positions (no mod is evaluated; its rows get O = 0, LSE = -inf) and `ok` is false, which
// the decode kernel reports in the error word (kFlexBadLengthsFlag, Kernel::check_errors). q_len stays within the rows of q / o.
struct FlexDecodeLengths {
  int kv_len, q_len;
  bool ok;
};
#ifdef __CUDACC__
__device__ __forceinline__ FlexDecodeLengths flex_decode_lengths(const int* kv_lens, const int* q_lens, int b, int kv_len_all, int max_q,
                                                                 int max_kv) {
  const int kv_len = kv_lens != nullptr ? kv_lens[b] : kv_len_all;
  const int q_len = q_lens != nullptr ? q_lens[b] : max_q;
  const bool ok = q_len >= 1 && q_len <= max_q && kv_len >= q_len && kv_len <= max_kv;
  return FlexDecodeLengths{ok ? kv_len : 0, min(max(q_len, 0), max_q), ok};
}
#endif

// Threads of the tile-list kernel: one block classifies and lists 1024 tiles (65536 positions) per pass.
constexpr int kFlexDecodeTileListThreads = 1024;
// A data-dependent mask is evaluated per element only where a list serves at most this many query rows (query
// heads x rows of the sequence); wider lists keep such tiles partial (exact, just not skipped).
constexpr int kFlexDecodeDenseMaxRows = 16;

// Bytes of workspace a launch with these sizes needs (0 when num_splits == 1).
inline long long flex_decode_workspace_bytes(int batch, int heads, int max_q_len, int head_dim, int num_splits) {
  if (num_splits <= 1) return 0;
  const long long rows = (long long)batch * heads * max_q_len * num_splits;
  return rows * head_dim * 4 + rows * 4;
}

#if !defined(__CUDACC_RTC__)
// Resident CTAs per SM worth filling with splits (the ctas_per_sm argument of flex_decode_num_splits): the
// memory system is saturated once about 64 KB of K/V copies are in flight per SM (kStages - 1 tiles of K and V per
// CTA; the alternating pipeline's one 128-row K or V load is the same bytes as its two stages' one K+V tile);
// more resident CTAs only add partials to merge. kv_bytes: bytes per cache element (1 for FP8). Measured on the H100 (docs/notes/DECODE_NOTES.md): D128 with 2
// stages, 2 of its 3 resident CTAs per SM (4 splits for B8 Hkv8): as fast as 6 splits at KV 32768, 3% faster at 8192.
inline int flex_decode_bandwidth_ctas(int ctas_per_sm, int head_dim, int stages, int kv_bytes = 2) {
  const long long in_flight = (long long)(stages - 1) * 2 * kFlexDecodeBlockN * (head_dim * kv_bytes + 16);
  const long long need = in_flight > 0 ? (65536 + in_flight - 1) / in_flight : 1;
  int n = need < ctas_per_sm ? (int)need : ctas_per_sm;
  return n < 1 ? 1 : n;
}

// Whether a launch's K/V loads carry an L2 evict_first policy (FlexDecodeParams::kv_evict_first): the stream is read
// once, so it should not push out other data, which pays for caches that L2 can partly serve and for tile windows, not
// for caches of a GB (the threshold's measurements: DECODE_NOTES.md). kv_cache_bytes: the K and V bytes the launch may
// read; tile_list: the mask lists the tiles to visit.
inline bool flex_decode_evict_first(double kv_cache_bytes, bool tile_list) { return kv_cache_bytes <= 512e6 || tile_list; }

// Split count for one decode launch. Every split of a launch is about as long, so the grid runs in waves of
// num_sms * ctas_per_sm CTAs and a last, partly filled wave leaves the memory system idle for its length.
// The count is the smallest one whose wave efficiency n / (ceil(n / slots) * slots), n = CTAs, is within 10% of
// the best reachable: fewer, longer splits amortise each CTA's pipeline fill and the combine.
//   num_sms, ctas_per_sm: the device and the kernel's occupancy (cudaOccupancyMaxActiveBlocksPerMultiprocessor);
//   ctas_without_split: batch * kv_heads * row_blocks;
//   max_tiles: the most KV tiles one (sequence, KV head) visits (ceil(kv_len / 64), or the window's tiles);
//   min_tiles_per_split: shortest split worth a CTA.
// Returns a count in [1, kFlexDecodeMaxSplits] that leaves no split empty for the longest sequence.
inline int flex_decode_num_splits(int num_sms, int ctas_per_sm, int ctas_without_split, int max_tiles,
                                  int min_tiles_per_split = 2) {
  if (ctas_without_split <= 0 || max_tiles <= 0) return 1;
  if (num_sms < 1) num_sms = 1;
  if (ctas_per_sm < 1) ctas_per_sm = 1;
  if (min_tiles_per_split < 1) min_tiles_per_split = 1;
  const long long slots = (long long)num_sms * ctas_per_sm;
  int max_splits = max_tiles / min_tiles_per_split;
  if (max_splits > kFlexDecodeMaxSplits) max_splits = kFlexDecodeMaxSplits;
  if (max_splits < 1) max_splits = 1;
  auto efficiency = [&](int s) {
    const long long n = (long long)ctas_without_split * s;
    const long long waves = (n + slots - 1) / slots;
    return (double)n / (double)(waves * slots);
  };
  double best = 0;
  for (int s = 1; s <= max_splits; ++s)
    if (efficiency(s) > best) best = efficiency(s);
  int splits = 1;
  while (splits < max_splits && efficiency(splits) < 0.9 * best) ++splits;
  // Equal tiles per split, and no trailing split left empty by the rounding.
  const int per_split = (max_tiles + splits - 1) / splits;
  return (max_tiles + per_split - 1) / per_split;
}
#endif
