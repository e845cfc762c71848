#include "compiler/passes/cse.h"

#include <unordered_map>

#include "compiler/ir/ir_equality.h"
#include "compiler/ir/ir_mutator.h"

namespace flexjit::ir {

namespace {

// Rebuilds bottom-up; once a node's operands are canonical, two nodes are structurally equal
// exactly when their heads match and their operands are the same pointers, so equal() on
// them costs O(operands) and the whole pass stays linear in the DAG size.
class HashConser : public IRMutator {
 protected:
#define FLEXJIT_CSE_VISIT(name) \
  Expr visit(const name*, const Expr& e) override { return intern(mutate_children(e)); }
  FLEXJIT_IR_NODE_KINDS(FLEXJIT_CSE_VISIT)
#undef FLEXJIT_CSE_VISIT

 private:
  Expr intern(const Expr& e) {
    size_t h = shallow_hash(e);
    auto range = table_.equal_range(h);
    for (auto it = range.first; it != range.second; ++it)
      if (equal(it->second, e)) return it->second;
    table_.emplace(h, e);
    return e;
  }

  // The node's kind, payload and operand identities.
  static size_t shallow_hash(const Expr& e) {
    size_t h = std::hash<int>()(static_cast<int>(e.kind()) * 8 + static_cast<int>(e.type()));
    auto mix = [&h](size_t v) { h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2); };
    switch (e.kind()) {
      case NodeKind::IntImm: mix(std::hash<int64_t>()(e.as<IntImm>()->value)); break;
      case NodeKind::FloatImm: mix(std::hash<float>()(e.as<FloatImm>()->value)); break;
      case NodeKind::BoolImm: mix(e.as<BoolImm>()->value); break;
      case NodeKind::Var: mix(static_cast<size_t>(e.as<Var>()->var)); break;
      case NodeKind::Param: mix(static_cast<size_t>(e.as<Param>()->index)); break;
      case NodeKind::Symbol: mix(static_cast<size_t>(e.as<Symbol>()->index)); break;
      case NodeKind::Unary: mix(static_cast<size_t>(e.as<Unary>()->op)); break;
      case NodeKind::Binary: mix(static_cast<size_t>(e.as<Binary>()->op)); break;
      case NodeKind::Load: mix(static_cast<size_t>(e.as<Load>()->buffer)); break;
      default: break;
    }
    for (const Expr& c : children(e)) mix(std::hash<const void*>()(c.get()));
    return h;
  }

  std::unordered_multimap<size_t, Expr> table_;
};

}  // namespace

std::vector<Expr> cse(const std::vector<Expr>& roots) {
  HashConser h;
  std::vector<Expr> out;
  out.reserve(roots.size());
  for (const Expr& r : roots) out.push_back(h.mutate(r));
  return out;
}

}  // namespace flexjit::ir
