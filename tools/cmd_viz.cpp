// `flexjit viz SPEC --shape B,H,Sq,Skv [--at b=0,h=0] --out mask.png | --text`: a picture of
// the mask (and of score_mod's values) over one (b, h), with the block mask's full, partial
// and empty tiles, to check a mask before training or serving with it.
#include <fmt/format.h>

#include <cstdlib>
#include <map>

#include "compiler/frontend.h"
#include "tools/commands.h"
#include "tools/mask_picture.h"
#include "tools/mask_render.h"
#include "tools/mod_inputs.h"
#include "tools/spec_options.h"

namespace flexjit::tools {

namespace {

struct VizOptions {
  SpecOptions spec;
  std::string shape, at = "b=0,h=0", out, tile = "128,64";
  std::vector<std::string> sets, loads;
  bool text = false;
  int width = 64;
  float score = 0;
};

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> items;
  size_t start = 0;
  while (true) {
    const size_t comma = s.find(',', start);
    items.push_back(s.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) return items;
    start = comma + 1;
  }
}

std::vector<int64_t> parse_ints(const std::string& s, const char* flag) {
  std::vector<int64_t> v;
  for (const std::string& item : split_commas(s)) {
    char* end = nullptr;
    const long long x = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0') throw Error(fmt::format("{} expects comma-separated integers, got '{}'", flag, s));
    v.push_back(x);
  }
  return v;
}

const char* class_counts_source(const MaskPicture& p) {
  return p.tiles_by_element ? "the mask reads buffers, so the builder evaluates every element" : "interval arithmetic, as the builder classifies them";
}

int run_viz(const VizOptions& o) {
  if (o.out.empty() && !o.text) throw Error("give --out FILE.png for an image, --text for a picture in the terminal, or both");
  dsl::Spec spec = o.spec.load();
  SpecIR ir = build_spec_ir(spec);

  const std::vector<int64_t> shape = parse_ints(o.shape, "--shape");
  if (shape.size() != 4 && shape.size() != 5) throw Error(fmt::format("--shape expects B,H,Sq,Skv or B,H,Hkv,Sq,Skv, got '{}'", o.shape));
  for (int64_t x : shape)
    if (x < 1) throw Error(fmt::format("--shape values must be positive, got '{}'", o.shape));
  const int64_t B = shape[0], H = shape[1], Hkv = shape.size() == 5 ? shape[2] : H, Sq = shape[shape.size() - 2], Skv = shape.back();
  if (Sq * Skv > (int64_t{1} << 24)) throw Error(fmt::format("--shape has {} (q, kv) pairs; viz draws at most 2^24 (e.g. 4096 x 4096)", Sq * Skv));
  const std::vector<int64_t> tile = parse_ints(o.tile, "--tile");
  if (tile.size() != 2 || tile[0] < 1 || tile[1] < 1) throw Error(fmt::format("--tile expects two positive sizes Q,KV, got '{}'", o.tile));

  MaskPictureRequest req;
  req.tile_q = tile[0];
  req.tile_kv = tile[1];
  req.score = o.score;
  for (const std::string& item : split_commas(o.at)) {
    auto [k, v] = split_assignment(item, "--at");
    const std::vector<int64_t> x = parse_ints(v, "--at");
    if (k == "b" || k == "batch") req.b = x[0];
    else if (k == "h" || k == "head") req.h = x[0];
    else throw Error(fmt::format("--at takes b and h (e.g. --at b=0,h=3), not `{}`", k));
  }

  ModInputs inputs = read_mod_inputs(spec, o.sets, o.loads);
  for (const char* sym : {"B", "H", "Hkv", "Sq", "Skv", "D"})
    if (inputs.values.count(sym)) throw Error(fmt::format("give `{}` with --shape (or the head dim with --head-dim), not --set", sym));
  const std::map<std::string, int64_t> sizes = {{"B", B}, {"H", H}, {"Hkv", Hkv}, {"Sq", Sq}, {"Skv", Skv}, {"D", spec.head_dim}};
  for (const auto& [name, value] : sizes) inputs.values[name] = std::to_string(value);
  BoundValues bound = bind_values(ir.checked, inputs.values, inputs.buffer_shapes, /*require_all=*/false);
  require_mod_inputs(ir, bound, inputs);
  EvalEnv env;
  env.symbols = bound.symbols;
  env.params = bound.params;
  env.buffers = inputs.buffer_views();
  const MaskPicture p = compute_mask_picture(ir, env, req);

  std::vector<std::string> mods;
  if (spec.mask_mod) mods.push_back(fmt::format("mask_mod `{}`", *spec.mask_mod));
  if (spec.score_mod) mods.push_back(fmt::format("score_mod `{}` at score = {:g}", *spec.score_mod, o.score));
  if (mods.empty()) mods.push_back("plain attention (no mods)");
  fmt::print("{} at b={}, h={} (B={}, H={}, Hkv={}, Sq={}, Skv={}): {}\n", spec.name, req.b, req.h, B, H, Hkv, Sq, Skv, fmt::join(mods, ", "));
  if (o.text) fmt::print("{}", render_mask_text(p, o.width));
  int64_t counts[3] = {0, 0, 0}, undecided = 0;
  for (size_t i = 0; i < p.tiles.size(); ++i) {
    ++counts[static_cast<int>(p.tiles[i])];
    undecided += p.tiles[i] == TileClass::Partial && p.exact_tiles[i] != TileClass::Partial;
  }
  fmt::print("kept {} of {} pairs ({:.1f}%); block mask: {} full, {} partial, {} empty tiles ({}", p.kept, Sq * Skv, 100.0 * double(p.kept) / double(Sq * Skv),
             counts[static_cast<int>(TileClass::Full)], counts[static_cast<int>(TileClass::Partial)], counts[static_cast<int>(TileClass::Empty)],
             class_counts_source(p));
  if (undecided) fmt::print("; {} partial tiles are in fact full or empty", undecided);
  fmt::print(")\n");
  if (p.errors) fmt::print("warning: {} pairs raised a checked-load or division error (the kernels would report it); first {}\n", p.errors, p.first_error);
  if (!o.out.empty()) {
    const RgbImage image = render_mask_image(p);
    write_png(o.out, image);
    const ImageLayout l = image_layout(p);
    fmt::print("wrote {} ({} x {}): panels of {} x {} pixels, {}; ", o.out, image.width, image.height, l.panel_width, l.panel_height,
               l.stride > 1 ? fmt::format("one pixel per {0} x {0} pairs", l.stride) : fmt::format("{0} x {0} pixels per pair", l.zoom));
    fmt::print("left to right: the mask (blue kept, grey masked), {}the block mask's tiles (green full, amber partial, grey empty)\n",
               p.has_score_mod ? fmt::format("score_mod's values on kept pairs (violet {:g} to yellow {:g}), ", p.score_min, p.score_max) : "");
  }
  return 0;
}

}  // namespace

void add_viz_command(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand("viz", "Draw the mask, score_mod's values and the block mask's tiles for one (b, h): PNG or text");
  auto o = std::make_shared<VizOptions>();
  o->spec.add_to(cmd);
  cmd->add_option("--shape", o->shape, "B,H,Sq,Skv (or B,H,Hkv,Sq,Skv)")->required();
  cmd->add_option("--at", o->at, "The batch and head drawn: b=0,h=0")->capture_default_str();
  cmd->add_option("--out", o->out, "Write a PNG: the mask, score_mod's values (colour-mapped) and the block mask's tiles");
  cmd->add_flag("--text", o->text, "Print a compact Unicode picture");
  cmd->add_option("--width", o->width, "Most characters per line of --text (larger grids are downsampled)")->capture_default_str();
  cmd->add_option("--tile", o->tile, "Block-mask tile: Q,KV (the GPU forward's 128,64; its 64-row loop uses 64,64)")->capture_default_str();
  cmd->add_option("--score-at", o->score, "The score score_mod is evaluated at (0 shows the bias it adds)")->capture_default_str();
  cmd->add_option("--set", o->sets, "A runtime parameter or custom shape symbol: NAME=VALUE (repeatable)");
  cmd->add_option("--load", o->loads, "A captured buffer's data: NAME=FILE.npy (repeatable)");
  cmd->callback([o, &action] { action = [o] { return run_viz(*o); }; });
}

}  // namespace flexjit::tools
