#include "tools/mask_picture.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "compiler/ir/ir_mutator.h"
#include "compiler/passes/interval_eval.h"
#include "dsl/error.h"

namespace flexjit::tools {

namespace {

int64_t symbol(const SpecIR& ir, const EvalEnv& env, const char* name) {
  const int i = ir.checked.symbol_index(name);
  return i >= 0 ? env.symbols[static_cast<size_t>(i)] : 0;
}

TileClass from_tri(TriBool t) {
  switch (t) {
    case TriBool::False: return TileClass::Empty;
    case TriBool::True: return TileClass::Full;
    case TriBool::Unknown: break;
  }
  return TileClass::Partial;
}

}  // namespace

MaskPicture compute_mask_picture(const SpecIR& ir, EvalEnv env, const MaskPictureRequest& r) {
  const int64_t B = symbol(ir, env, "B"), H = symbol(ir, env, "H"), Hkv = symbol(ir, env, "Hkv");
  MaskPicture p;
  p.sq = symbol(ir, env, "Sq");
  p.skv = symbol(ir, env, "Skv");
  if (r.b < 0 || r.b >= B || r.h < 0 || r.h >= H)
    throw Error(fmt::format("--at b={},h={} is outside the shape (B={}, H={})", r.b, r.h, B, H));
  if (Hkv < 1 || H % Hkv != 0) throw Error(fmt::format("Hkv = {} must divide H = {}", Hkv, H));
  if (r.tile_q < 1 || r.tile_kv < 1) throw Error("--tile sizes must be positive");
  const int64_t kv_head = r.h / (H / Hkv);
  auto var = [&](dsl::VarId v) -> int64_t& { return env.vars[static_cast<int>(v)]; };
  var(dsl::VarId::B) = r.b;
  var(dsl::VarId::H) = r.h;
  var(dsl::VarId::KvHead) = kv_head;
  env.score = r.score;

  const size_t n = static_cast<size_t>(p.sq * p.skv);
  p.attend.assign(n, 1);
  p.has_score_mod = static_cast<bool>(ir.score_mod);
  if (p.has_score_mod) p.score.assign(n, std::numeric_limits<float>::quiet_NaN());
  p.score_min = std::numeric_limits<float>::infinity();
  p.score_max = -std::numeric_limits<float>::infinity();
  for (int64_t q = 0; q < p.sq; ++q)
    for (int64_t kv = 0; kv < p.skv; ++kv) {
      var(dsl::VarId::Q) = q;
      var(dsl::VarId::KV) = kv;
      const size_t i = static_cast<size_t>(q * p.skv + kv);
      EvalFlags flags;
      if (ir.mask_mod) p.attend[i] = evaluate(ir.mask_mod, env, &flags).b ? 1 : 0;
      if (p.attend[i] && ir.score_mod) {
        const float s = evaluate(ir.score_mod, env, &flags).f;
        p.score[i] = s;
        if (!std::isnan(s)) {
          p.score_min = std::min(p.score_min, s);
          p.score_max = std::max(p.score_max, s);
        }
      }
      p.kept += p.attend[i];
      if (flags.index_out_of_range || flags.int_div_by_zero) {
        if (p.errors++ == 0) p.first_error = fmt::format("at q={}, kv={}: {}", q, kv, flags.first_error);
      }
    }
  if (p.score_min > p.score_max) p.score_min = p.score_max = 0;

  // Tiles: interval arithmetic over each box, as the GPU's builder classifies a mask that
  // reads no buffer; a data-dependent mask it evaluates element by element.
  if (ir.mask_mod)
    ir::for_each_node(ir.mask_mod, [&](const ir::Expr& e) { p.tiles_by_element |= e.as<ir::Load>() != nullptr; });
  p.tile_q = r.tile_q;
  p.tile_kv = r.tile_kv;
  p.tiles_q = (p.sq + r.tile_q - 1) / r.tile_q;
  p.tiles_kv = (p.skv + r.tile_kv - 1) / r.tile_kv;
  IntervalEnv box;
  box.symbols = env.symbols;
  for (const Value& v : env.params) box.params.push_back(v.as_double());
  box.params.resize(ir.spec().params.size(), 0.0);
  auto set = [&](dsl::VarId v, int64_t lo, int64_t hi) { box.vars[static_cast<int>(v)] = {lo, hi}; };
  set(dsl::VarId::B, r.b, r.b);
  set(dsl::VarId::H, r.h, r.h);
  set(dsl::VarId::KvHead, kv_head, kv_head);
  for (int64_t qt = 0; qt < p.tiles_q; ++qt)
    for (int64_t kt = 0; kt < p.tiles_kv; ++kt) {
      const int64_t q0 = qt * r.tile_q, q1 = std::min(p.sq, q0 + r.tile_q) - 1;
      const int64_t k0 = kt * r.tile_kv, k1 = std::min(p.skv, k0 + r.tile_kv) - 1;
      set(dsl::VarId::Q, q0, q1);
      set(dsl::VarId::KV, k0, k1);
      TileClass c = TileClass::Partial;
      try {
        c = from_tri(classify_box(ir.mask_mod, box));
      } catch (const std::exception&) {
        // Undecidable boxes are partial, as in the kernels' builders.
      }
      int64_t kept = 0;
      for (int64_t q = q0; q <= q1; ++q)
        for (int64_t kv = k0; kv <= k1; ++kv) kept += p.attend[static_cast<size_t>(q * p.skv + kv)];
      const TileClass exact = kept == 0 ? TileClass::Empty : kept == (q1 - q0 + 1) * (k1 - k0 + 1) ? TileClass::Full : TileClass::Partial;
      p.exact_tiles.push_back(exact);
      p.tiles.push_back(p.tiles_by_element ? exact : c);
    }
  return p;
}

}  // namespace flexjit::tools
