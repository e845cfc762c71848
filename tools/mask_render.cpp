#include "tools/mask_render.h"

#include <fmt/format.h>
#include <png.h>

#include <algorithm>
#include <cmath>

#include "dsl/error.h"

namespace flexjit::tools {

namespace {

// A cell of a downsampled grid: the rows [r0, r1) and columns [c0, c1) it covers.
struct Cell {
  int64_t r0, r1, c0, c1;
};
Cell cell(int64_t row, int64_t col, int64_t stride, int64_t rows, int64_t cols) {
  return {row * stride, std::min(rows, (row + 1) * stride), col * stride, std::min(cols, (col + 1) * stride)};
}

struct CellStats {
  int64_t kept = 0, total = 0;
  double score_sum = 0;
};
CellStats stats(const MaskPicture& p, const Cell& c) {
  CellStats s;
  for (int64_t q = c.r0; q < c.r1; ++q)
    for (int64_t kv = c.c0; kv < c.c1; ++kv) {
      const size_t i = static_cast<size_t>(q * p.skv + kv);
      ++s.total;
      if (!p.attend[i]) continue;
      ++s.kept;
      if (p.has_score_mod) s.score_sum += p.score[i];
    }
  return s;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

const char* tile_char(TileClass c) {
  switch (c) {
    case TileClass::Full: return "█";
    case TileClass::Partial: return "▒";
    case TileClass::Empty: break;
  }
  return "·";
}

}  // namespace

std::string render_mask_text(const MaskPicture& p, int width) {
  const int64_t w = std::max(width, 1);
  std::string out;
  const int64_t stride = ceil_div(std::max(p.sq, p.skv), w);
  const int64_t rows = ceil_div(p.sq, stride), cols = ceil_div(p.skv, stride);
  const std::string per_char = stride > 1 ? fmt::format("; one character per {0} x {0} pairs, ▒ some kept", stride) : "";
  out += fmt::format("mask (q 0..{} down, kv 0..{} across; █ kept, · masked{}):\n", p.sq - 1, p.skv - 1, per_char);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      CellStats s = stats(p, cell(r, c, stride, p.sq, p.skv));
      out += s.kept == 0 ? "·" : s.kept == s.total ? "█" : "▒";
    }
    out += "\n";
  }
  if (p.has_score_mod) {
    const double range = double(p.score_max) - double(p.score_min);
    out += fmt::format("score_mod (kept pairs; 0..9 from {:g} to {:g}, · masked{}):\n", p.score_min, p.score_max,
                       stride > 1 ? fmt::format("; the mean of {0} x {0} pairs", stride) : "");
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        CellStats s = stats(p, cell(r, c, stride, p.sq, p.skv));
        if (s.kept == 0) {
          out += "·";
          continue;
        }
        const double mean = s.score_sum / double(s.kept);
        const int level = range > 0 ? static_cast<int>(std::lround(9.0 * (mean - p.score_min) / range)) : 0;
        out += std::isnan(mean) ? '?' : static_cast<char>('0' + std::clamp(level, 0, 9));
      }
      out += "\n";
    }
  }
  const int64_t tstride = ceil_div(std::max(p.tiles_q, p.tiles_kv), w);
  const int64_t trows = ceil_div(p.tiles_q, tstride), tcols = ceil_div(p.tiles_kv, tstride);
  out += fmt::format("block mask, {} x {} tiles of {} x {} (█ full, ▒ partial, · empty{}):\n", p.tiles_q, p.tiles_kv, p.tile_q, p.tile_kv,
                     tstride > 1 ? fmt::format("; one character per {0} x {0} tiles, ▒ when they differ", tstride) : "");
  for (int64_t r = 0; r < trows; ++r) {
    for (int64_t c = 0; c < tcols; ++c) {
      Cell t = cell(r, c, tstride, p.tiles_q, p.tiles_kv);
      TileClass first = p.tile(t.r0, t.c0);
      bool same = true;
      for (int64_t i = t.r0; i < t.r1; ++i)
        for (int64_t j = t.c0; j < t.c1; ++j) same &= p.tile(i, j) == first;
      out += same ? tile_char(first) : "▒";
    }
    out += "\n";
  }
  return out;
}

Rgb RgbImage::at(int x, int y) const {
  const size_t i = (static_cast<size_t>(y) * width + x) * 3;
  return {rgb[i], rgb[i + 1], rgb[i + 2]};
}

Rgb score_colour(double t) {
  // Five anchors of a perceptually ordered map, linearly interpolated.
  static constexpr Rgb anchors[] = {{68, 1, 84}, {59, 82, 139}, {33, 145, 140}, {94, 201, 98}, {253, 231, 37}};
  t = std::clamp(std::isnan(t) ? 0.0 : t, 0.0, 1.0) * 4.0;
  const int i = std::min(3, static_cast<int>(t));
  const double f = t - i;
  auto mix = [&](uint8_t a, uint8_t b) { return static_cast<uint8_t>(std::lround(a + (b - a) * f)); };
  return {mix(anchors[i].r, anchors[i + 1].r), mix(anchors[i].g, anchors[i + 1].g), mix(anchors[i].b, anchors[i + 1].b)};
}

ImageLayout image_layout(const MaskPicture& p) {
  ImageLayout l;
  const int64_t longest = std::max<int64_t>({p.sq, p.skv, 1});
  l.stride = static_cast<int>(ceil_div(longest, 1024));
  l.zoom = l.stride > 1 ? 1 : static_cast<int>(std::clamp<int64_t>(512 / longest, 1, 16));
  l.panel_width = static_cast<int>(ceil_div(p.skv, l.stride) * l.zoom);
  l.panel_height = static_cast<int>(ceil_div(p.sq, l.stride) * l.zoom);
  const int panels = p.has_score_mod ? 3 : 2, gap = 2 * kImageMargin;
  for (int i = 0; i < panels; ++i) l.panel_x.push_back(kImageMargin + i * (l.panel_width + gap));
  l.width = 2 * kImageMargin + panels * l.panel_width + (panels - 1) * gap;
  l.height = 2 * kImageMargin + l.panel_height;
  return l;
}

RgbImage render_mask_image(const MaskPicture& p) {
  const ImageLayout l = image_layout(p);
  RgbImage img;
  img.width = l.width;
  img.height = l.height;
  img.rgb.resize(static_cast<size_t>(l.width) * l.height * 3);
  auto put = [&](int x, int y, Rgb c) {
    const size_t i = (static_cast<size_t>(y) * l.width + x) * 3;
    img.rgb[i] = c.r, img.rgb[i + 1] = c.g, img.rgb[i + 2] = c.b;
  };
  for (int y = 0; y < l.height; ++y)
    for (int x = 0; x < l.width; ++x) put(x, y, kBackgroundColour);
  auto fill = [&](int panel, int64_t r, int64_t c, Rgb colour) {
    for (int dy = 0; dy < l.zoom; ++dy)
      for (int dx = 0; dx < l.zoom; ++dx) put(l.panel_x[panel] + static_cast<int>(c) * l.zoom + dx, kImageMargin + static_cast<int>(r) * l.zoom + dy, colour);
  };
  const double range = double(p.score_max) - double(p.score_min);
  const int64_t rows = ceil_div(p.sq, l.stride), cols = ceil_div(p.skv, l.stride);
  const int64_t tile_q = p.tile_q, tile_kv = p.tile_kv;
  const int tiles_panel = p.has_score_mod ? 2 : 1;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const Cell cl = cell(r, c, l.stride, p.sq, p.skv);
      const CellStats s = stats(p, cl);
      const double t = double(s.kept) / double(s.total);
      auto lerp = [&](uint8_t a, uint8_t b) { return static_cast<uint8_t>(std::lround(a + (b - a) * t)); };
      fill(0, r, c, {lerp(kMaskedColour.r, kKeptColour.r), lerp(kMaskedColour.g, kKeptColour.g), lerp(kMaskedColour.b, kKeptColour.b)});
      if (p.has_score_mod)
        fill(1, r, c, s.kept ? score_colour(range > 0 ? (s.score_sum / double(s.kept) - p.score_min) / range : 0.0) : kMaskedColour);
      const TileClass tc = p.tile(cl.r0 / tile_q, cl.c0 / tile_kv);
      fill(tiles_panel, r, c, tc == TileClass::Full ? kFullTileColour : tc == TileClass::Partial ? kPartialTileColour : kMaskedColour);
    }
  // Tile borders, where tiles are at least four pixels wide.
  const double px_per_pair = double(l.zoom) / l.stride;
  if (tile_q * px_per_pair >= 4 && tile_kv * px_per_pair >= 4) {
    const int x0 = l.panel_x[tiles_panel];
    for (int64_t i = 1; i < p.tiles_q; ++i)
      for (int x = 0; x < l.panel_width; ++x) put(x0 + x, kImageMargin + static_cast<int>(i * tile_q * px_per_pair), kBackgroundColour);
    for (int64_t j = 1; j < p.tiles_kv; ++j)
      for (int y = 0; y < l.panel_height; ++y) put(x0 + static_cast<int>(j * tile_kv * px_per_pair), kImageMargin + y, kBackgroundColour);
  }
  return img;
}

void write_png(const std::string& path, const RgbImage& image) {
  png_image png{};
  png.version = PNG_IMAGE_VERSION;
  png.width = static_cast<png_uint_32>(image.width);
  png.height = static_cast<png_uint_32>(image.height);
  png.format = PNG_FORMAT_RGB;
  if (!png_image_write_to_file(&png, path.c_str(), 0, image.rgb.data(), 0, nullptr))
    throw Error(fmt::format("cannot write the PNG '{}': {}", path, png.message));
  png_image_free(&png);
}

}  // namespace flexjit::tools
