// Traversal of the IR DAG: a post-order walk that visits each distinct node once, and a
// memoizing mutator with one overridable visit per node kind (generated from the X-macro).
#pragma once
#include <functional>
#include <unordered_map>

#include "compiler/ir/ir.h"

namespace flexjit::ir {

// Calls f once per distinct node reachable from the roots, operands before users.
void for_each_node(const std::vector<Expr>& roots, const std::function<void(const Expr&)>& f);
inline void for_each_node(const Expr& root, const std::function<void(const Expr&)>& f) { for_each_node(std::vector<Expr>{root}, f); }

// Rebuilds an expression bottom-up. Shared subexpressions are mutated once (the result is
// memoized per node), so the DAG stays a DAG and the cost stays linear in its size.
class IRMutator {
 public:
  virtual ~IRMutator() = default;
  Expr mutate(const Expr& e);

 protected:
#define FLEXJIT_IR_MUTATOR_VISIT(name) virtual Expr visit(const name* op, const Expr& e);
  FLEXJIT_IR_NODE_KINDS(FLEXJIT_IR_MUTATOR_VISIT)
#undef FLEXJIT_IR_MUTATOR_VISIT

  // Mutates the operands and rebuilds e only if one changed.
  Expr mutate_children(const Expr& e);

 private:
  std::unordered_map<const Node*, Expr> memo_;
};

}  // namespace flexjit::ir
