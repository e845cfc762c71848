// What `flexjit viz` draws: a spec's mask and score_mod over every (q, kv) of one (b, h),
// evaluated by the reference interpreter, and the block mask's tile classes as the GPU's
// block-mask builder finds them (the kernels skip empty tiles and drop the mask on full ones):
// by interval arithmetic over each tile, or element by element for a mask that reads buffers.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "compiler/bindings.h"
#include "compiler/spec_ir.h"

namespace flexjit::tools {

enum class TileClass : uint8_t { Empty, Partial, Full };

struct MaskPictureRequest {
  int64_t b = 0, h = 0;                 // the (batch, head) drawn
  int64_t tile_q = 128, tile_kv = 64;   // block-mask tile (the GPU forward's by default)
  float score = 0;                      // the `score` score_mod is evaluated at
};

struct MaskPicture {
  int64_t sq = 0, skv = 0;
  std::vector<uint8_t> attend;        // [sq, skv]: 1 where the mask keeps the pair
  bool has_score_mod = false;
  std::vector<float> score;           // [sq, skv]: score_mod at the request's score (kept pairs only)
  float score_min = 0, score_max = 0;  // over the kept pairs
  int64_t kept = 0;                   // kept pairs
  int64_t tile_q = 0, tile_kv = 0;    // the tile's size in pairs
  int64_t tiles_q = 0, tiles_kv = 0;
  bool tiles_by_element = false;       // the mask reads buffers: classes come from every element
  std::vector<TileClass> tiles;        // [tiles_q, tiles_kv]: the block mask's classes
  std::vector<TileClass> exact_tiles;  // [tiles_q, tiles_kv]: from the evaluated mask
  std::string first_error;             // the first checked-load or division error met, if any
  int64_t errors = 0;                  // points that raised one

  TileClass tile(int64_t qt, int64_t kt) const { return tiles[static_cast<size_t>(qt * tiles_kv + kt)]; }
};

// Evaluates the mods at every (q, kv) of (b, h) with `env`'s symbols, parameters and buffers
// (its vars are overwritten). Throws flexjit::Error for a point outside the shapes.
MaskPicture compute_mask_picture(const SpecIR& ir, EvalEnv env, const MaskPictureRequest& request);

}  // namespace flexjit::tools
