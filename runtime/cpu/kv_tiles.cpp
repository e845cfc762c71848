#include "runtime/cpu/kv_tiles.h"

#include <algorithm>

namespace flexjit::cpu {

int64_t kv_tile_count(int64_t kv_offset, int64_t rows, int64_t width) { return (kv_offset % width + rows + width - 1) / width; }

KvTile kv_tile(int64_t kv_offset, int64_t rows, int64_t width, int64_t index) {
  KvTile t;
  t.k0 = kv_offset - kv_offset % width + index * width;
  const int64_t first = std::max(t.k0, kv_offset), end = std::min(t.k0 + width, kv_offset + rows);
  t.lead = first - t.k0;
  t.row = first - kv_offset;
  t.n = end - first;
  return t;
}

int64_t kv_tile_columns(int64_t kv_offset, int64_t rows, int64_t width) { return std::min(width, kv_offset % width + rows); }

}  // namespace flexjit::cpu
