// Where the CPU kernels' KV tiles lie in the whole sequence: the one place that turns a launch's local KV rows and
// its kv_offset (context parallelism) into the positions the mods and the block classifier see.
//
// Tiles sit on the grid of global positions: tile starts are multiples of the tile width in the whole sequence,
// because the JIT-compiled mods rely on it (staging rewrites kv // c as k0 // c and kv % c as j % c, exact only for
// aligned k0; compiler/passes/staging.h). A shard whose first KV row falls between two multiples thus has a short
// first tile: the mods see it from the multiple below, `lead` columns of padding before the shard's first row.
// Declarations only: the per-instruction-set kernels call these rather than inline copies (see attention_tile.h).
#pragma once
#include <cstdint>

namespace flexjit::cpu {

struct KvTile {
  int64_t k0 = 0;    // the global position of the tile's column 0: a multiple of the width, the k0 the mods see
  int64_t lead = 0;  // padding columns before the tile's first row (nonzero only in the first tile of an unaligned shard)
  int64_t row = 0;   // the tile's first local KV row (global position k0 + lead)
  int64_t n = 0;     // its KV rows (>= 1)
};

// Tiles covering local KV rows [0, rows) that start at global position kv_offset, `width` positions per tile.
int64_t kv_tile_count(int64_t kv_offset, int64_t rows, int64_t width);
// Tile `index` (0 <= index < kv_tile_count) of those.
KvTile kv_tile(int64_t kv_offset, int64_t rows, int64_t width, int64_t index);
// The most columns a tile has, padding included (lead + n): the columns the mods' column stage fills.
int64_t kv_tile_columns(int64_t kv_offset, int64_t rows, int64_t width);

}  // namespace flexjit::cpu
