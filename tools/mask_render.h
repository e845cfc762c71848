// Pictures of a MaskPicture (tools/mask_picture.h): a compact Unicode form for the terminal,
// and an RGB image of three panels (mask, score_mod colour-mapped, block-mask tiles) for PNG.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "tools/mask_picture.h"

namespace flexjit::tools {

struct Rgb {
  uint8_t r, g, b;
  bool operator==(const Rgb& o) const { return r == o.r && g == o.g && b == o.b; }
};
// The image's colours (the legend `flexjit viz` prints).
inline constexpr Rgb kKeptColour{31, 119, 180};     // a pair the mask keeps
inline constexpr Rgb kMaskedColour{238, 238, 238};  // a masked pair, an empty tile
inline constexpr Rgb kFullTileColour{44, 160, 44};
inline constexpr Rgb kPartialTileColour{255, 187, 60};
inline constexpr Rgb kBackgroundColour{255, 255, 255};

// The text picture: the mask, score_mod levels when the spec has one, and the block mask's
// tiles, each at most `width` characters wide (larger grids are shown downsampled).
std::string render_mask_text(const MaskPicture& p, int width);

struct RgbImage {
  int width = 0, height = 0;
  std::vector<uint8_t> rgb;  // row-major, 3 bytes per pixel
  Rgb at(int x, int y) const;
};

// Where the image puts each pair: `zoom` pixels per pair, or one pixel per `stride` x `stride`
// pairs for grids over 1024 wide; panels `panel_width` x `panel_height` at x = `panel_x[i]`,
// y = kImageMargin.
struct ImageLayout {
  int zoom = 1, stride = 1, panel_width = 0, panel_height = 0;
  std::vector<int> panel_x;  // mask, [score_mod,] tiles
  int width = 0, height = 0;
};
inline constexpr int kImageMargin = 8;
ImageLayout image_layout(const MaskPicture& p);
RgbImage render_mask_image(const MaskPicture& p);

// The colour of t in [0, 1] on the score colour map (dark violet through teal to yellow).
Rgb score_colour(double t);

// Writes an 8-bit RGB PNG with libpng. Throws flexjit::Error naming the file on failure.
void write_png(const std::string& path, const RgbImage& image);

}  // namespace flexjit::tools
