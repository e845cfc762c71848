#include "compiler/ir/ir_mutator.h"

#include <unordered_set>

namespace flexjit::ir {

void for_each_node(const std::vector<Expr>& roots, const std::function<void(const Expr&)>& f) {
  std::unordered_set<const Node*> seen;
  std::function<void(const Expr&)> walk = [&](const Expr& e) {
    if (!e || !seen.insert(e.get()).second) return;
    for (const Expr& c : children(e)) walk(c);
    f(e);
  };
  for (const Expr& r : roots) walk(r);
}

Expr IRMutator::mutate(const Expr& e) {
  if (!e) return e;
  auto it = memo_.find(e.get());
  if (it != memo_.end()) return it->second;
  Expr result;
  switch (e.kind()) {
#define FLEXJIT_IR_MUTATOR_DISPATCH(name) \
  case NodeKind::name:                    \
    result = visit(e.as<name>(), e);      \
    break;
    FLEXJIT_IR_NODE_KINDS(FLEXJIT_IR_MUTATOR_DISPATCH)
#undef FLEXJIT_IR_MUTATOR_DISPATCH
  }
  memo_.emplace(e.get(), result);
  return result;
}

Expr IRMutator::mutate_children(const Expr& e) {
  std::vector<Expr> kids = children(e);
  for (Expr& k : kids) k = mutate(k);
  return with_children(e, kids);
}

#define FLEXJIT_IR_MUTATOR_DEFAULT(name) \
  Expr IRMutator::visit(const name*, const Expr& e) { return mutate_children(e); }
FLEXJIT_IR_NODE_KINDS(FLEXJIT_IR_MUTATOR_DEFAULT)
#undef FLEXJIT_IR_MUTATOR_DEFAULT

}  // namespace flexjit::ir
