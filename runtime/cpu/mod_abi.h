// The ABI of the JIT-compiled score_mod / mask_mod functions: plain C function pointers over
// a row segment of scores, shared by the code generator, the JIT and the attention driver.
#pragma once
#include <cstdint>

namespace flexjit::cpu {

// Every function takes:
//   p      the launch's parameter slots: 8 bytes per slot in the order of the module's
//          ParamsLayout (buffer pointers, strides and extents in elements, shape symbols,
//          runtime parameters; floats in the low 4 bytes), filled by
//          runtime::fill_variant_params. The ErrorFlags slot is not read: errors are returned.
//   b, h, hkv, q   the batch, query head, KV head (h / (H / Hkv)) and query row.
//   state  the query row's scratch of ModModuleInfo::state_bytes bytes, 64-byte aligned,
//          holding the hoisted Row / Col / Tile values (and the error bits each raised).
// Row and tile stage functions fill their part of `state`; the element functions read it.
// Call order per query row: row once, col once (ncols = min(tile_size, Skv)), then per KV
// tile starting at k0 (a multiple of tile_size): tile, then mask and/or score.

// Row-invariant values (depend on b, h, hkv, q only).
using RowStageFn = void (*)(const uint64_t* p, int64_t b, int64_t h, int64_t hkv, int64_t q, void* state);
// Values per column j in [0, ncols) of a KV tile, the same in every tile (kv = k0 + j).
using ColStageFn = void (*)(const uint64_t* p, int64_t b, int64_t h, int64_t hkv, int64_t q, int64_t ncols, void* state);
// Values constant across one KV tile starting at k0.
using TileStageFn = void (*)(const uint64_t* p, int64_t b, int64_t h, int64_t hkv, int64_t q, int64_t k0, void* state);

// Element functions over the n <= tile_size columns kv = k0 + j, j in [0, n). Both return the
// error bits raised (see ModModuleInfo::loads and kZeroDivisorBit), 0 when none.
// score: scores[j] holds scale * q.k on entry; on exit score_mod(scores[j]) where keep[j] != 0
// and -inf where keep[j] == 0 (errors are raised only where keep[j] != 0). Without a
// score_mod the kept scores are unchanged.
using ScoreRowFn = uint32_t (*)(const uint64_t* p, int64_t b, int64_t h, int64_t hkv, int64_t q, int64_t k0, int64_t n, float* scores,
                                const uint8_t* keep, const void* state);
// mask: keep[j] = mask_mod(b, h, q, k0 + j) ? 1 : 0 (1 everywhere without a mask_mod).
using MaskRowFn = uint32_t (*)(const uint64_t* p, int64_t b, int64_t h, int64_t hkv, int64_t q, int64_t k0, int64_t n, uint8_t* keep,
                               const void* state);

// grad (backward modules only): for the n <= tile_size columns kv = k0 + j with pre-mod
// scores[j] (scale * q.k), writes d_score[j] = d score_mod / d score and, for each scatter s
// of differentiate_score_mod (ModModuleInfo::scatter_buffers), coef[s * tile_size + j] (the
// amount per unit dS) and offset[s * tile_size + j] (the element of the scatter's buffer, as an
// offset into a contiguous array of its shape, resolved as the forward load: wrap, then clamp).
// Raises no error bits: the forward reported any bad index.
using GradRowFn = void (*)(const uint64_t* p, int64_t b, int64_t h, int64_t hkv, int64_t q, int64_t k0, int64_t n, const float* scores,
                           const void* state, float* d_score, float* coef, int64_t* offset);

struct ModFunctions {
  RowStageFn row = nullptr;
  ColStageFn col = nullptr;
  TileStageFn tile = nullptr;
  ScoreRowFn score = nullptr;
  MaskRowFn mask = nullptr;
  GradRowFn grad = nullptr;  // backward modules only
};

// Error bits: load site i (ModModuleInfo::loads) sets bit min(i, 30); bit 31 means an integer
// division or modulo met a zero divisor (the result was 0).
inline constexpr uint32_t kZeroDivisorBit = 1u << 31;
inline constexpr int kSharedLoadBit = 30;

}  // namespace flexjit::cpu
