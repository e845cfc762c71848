#include "compiler/passes/fold_constants.h"

#include "compiler/ir/ir_mutator.h"
#include "compiler/ir/scalar_ops.h"

namespace flexjit::ir {

namespace {

class Folder : public IRMutator {
 protected:
  Expr visit(const Unary*, const Expr& e) override { return fold_node(mutate_children(e)); }
  Expr visit(const Binary*, const Expr& e) override { return fold_node(mutate_children(e)); }
  Expr visit(const Select*, const Expr& e) override { return fold_node(mutate_children(e)); }
  Expr visit(const Cast*, const Expr& e) override { return fold_node(mutate_children(e)); }
};

}  // namespace

Expr fold_constants(const Expr& e) { return Folder().mutate(e); }

}  // namespace flexjit::ir
