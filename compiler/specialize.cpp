#include "compiler/specialize.h"

#include <algorithm>

#include "compiler/ir/ir_mutator.h"
#include "compiler/passes/dependence.h"
#include "compiler/passes/pipeline.h"

namespace flexjit {

using namespace ir;

std::vector<int> divisor_params(const SpecIR& ir) {
  std::vector<Expr> roots;
  if (ir.score_mod) roots.push_back(ir.score_mod);
  if (ir.mask_mod) roots.push_back(ir.mask_mod);
  if (roots.empty()) return {};
  DependenceInfo deps(roots);
  std::vector<int> out;
  for_each_node(roots, [&](const Expr& e) {
    if (e.kind() != NodeKind::Binary || e.type() != Type::Int) return;
    const Binary* bin = e.as<Binary>();
    if (bin->op != BinaryOp::FloorDiv && bin->op != BinaryOp::Mod) return;
    const Dependence& d = deps.of(bin->b);
    if (!d.uses_params || d.vars || !d.buffers.empty() || !d.symbols.empty()) return;
    for_each_node(bin->b, [&](const Expr& leaf) {
      if (leaf.kind() != NodeKind::Param || leaf.type() != Type::Int) return;
      const int index = leaf.as<Param>()->index;
      if (std::find(out.begin(), out.end(), index) == out.end()) out.push_back(index);
    });
  });
  std::sort(out.begin(), out.end());
  return out;
}

SpecIR specialize_params(const SpecIR& ir, const std::vector<std::pair<int, int64_t>>& values) {
  dsl::CheckedSpec checked = ir.checked;
  for (const auto& [index, value] : values) {
    dsl::ParamDecl& p = checked.spec.params.at(static_cast<size_t>(index));
    p.is_const = true;
    p.has_value = true;
    p.int_value = value;
  }
  return optimize(lower_spec(checked));
}

}  // namespace flexjit
