#include "compiler/ir_report.h"

#include <fmt/format.h>

#include "compiler/ir/ir_printer.h"
#include "compiler/passes/dependence.h"
#include "compiler/passes/staging.h"

namespace flexjit {

RangeInfo analyze_ir_ranges(const SpecIR& ir) {
  std::vector<ir::Expr> roots;
  if (ir.score_mod) roots.push_back(ir.score_mod);
  if (ir.mask_mod) roots.push_back(ir.mask_mod);
  return analyze_ranges(roots, ir.checked, VarDomains::forward(ir.checked));
}

namespace {

std::string vars_text(const Dependence& d) {
  std::vector<std::string> v;
  for (dsl::VarId id : {dsl::VarId::B, dsl::VarId::H, dsl::VarId::KvHead, dsl::VarId::Q, dsl::VarId::KV, dsl::VarId::Score})
    if (d.uses(id)) v.push_back(dsl::var_name(id));
  return v.empty() ? "nothing" : fmt::format("{}", fmt::join(v, ", "));
}

}  // namespace

std::string ir_report(const SpecIR& ir, bool with_analyses, int tile_size) {
  std::vector<ir::Expr> roots;
  if (ir.score_mod) roots.push_back(ir.score_mod);
  if (ir.mask_mod) roots.push_back(ir.mask_mod);
  if (!with_analyses) {
    std::string out;
    if (ir.score_mod) out += "# score_mod\n" + ir::print_ir(ir.score_mod);
    if (ir.mask_mod) out += "# mask_mod\n" + ir::print_ir(ir.mask_mod);
    return out;
  }
  DependenceInfo deps(roots);
  RangeInfo ranges = analyze_ir_ranges(ir);
  StagingOptions so;
  so.tile_size = tile_size;
  StagedMods staged = stage_mods(ir.score_mod, ir.mask_mod, so);
  std::unordered_map<const ir::Node*, Stage> stage_of_origin;
  for (const HoistedValue& v : staged.values) {
    auto it = staged.origin.find(v.expr.get());
    if (it != staged.origin.end()) stage_of_origin[it->second.get()] = v.stage;
  }
  auto annotate = [&](const ir::Expr& e) -> std::string {
    const ir::Load* l = e.as<ir::Load>();
    if (!l) return "";
    std::vector<std::string> idx;
    for (const ir::Expr& i : l->indices) idx.push_back(fmt::format("{} <- {}", ir::print_inline(i), vars_text(deps.of(i))));
    std::string where;
    auto st = stage_of_origin.find(e.get());
    if (st != stage_of_origin.end()) {
      where = st->second == Stage::Row   ? "hoisted: once per query row"
              : st->second == Stage::Col ? fmt::format("hoisted: once per row and column of a {}-wide KV tile, reused by every tile", tile_size)
                                         : fmt::format("hoisted: once per row and {}-wide KV tile", tile_size);
    } else {
      where = "evaluated per score element";
    }
    std::string check = "checked (clamped and flagged)";
    if (const LoadCheck* c = ranges.check_of(e)) {
      if (c->status == LoadCheck::Status::Proven) check = "unchecked: every index proven in range";
      else if (c->status == LoadCheck::Status::Conditional)
        check = fmt::format("unchecked when `{}` holds for the launch's shapes (verified at launch), else checked", ir::print_inline(c->obligation));
      else check = "checked: an index is not provably in range (clamped and flagged)";
    }
    return fmt::format("load {}: depends on {}; indices [{}]; {}; {}", l->name, vars_text(deps.of(e)), fmt::join(idx, "; "), where, check);
  };
  std::string out;
  if (ir.score_mod) out += "# score_mod\n" + ir::print_ir(ir.score_mod, annotate);
  if (ir.mask_mod) out += "# mask_mod\n" + ir::print_ir(ir.mask_mod, annotate);
  std::string int32 = ranges.int32_obligation ? fmt::format("32-bit when `{}` holds at launch", ir::print_inline(ranges.int32_obligation))
                                              : "32-bit (proven)";
  out += fmt::format("# integer arithmetic: {}\n", int32);
  return out;
}

}  // namespace flexjit
