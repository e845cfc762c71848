#include "compiler/passes/pipeline.h"

#include <algorithm>

#include "compiler/passes/cse.h"
#include "compiler/passes/fold_constants.h"
#include "compiler/passes/simplify.h"
#include "dsl/error.h"

namespace flexjit {

const std::vector<std::string>& pass_names() {
  static const std::vector<std::string> names = {"lower", "fold", "simplify", "cse"};
  return names;
}

void check_pass_name(const std::string& name) {
  const auto& names = pass_names();
  if (std::find(names.begin(), names.end(), name) != names.end()) return;
  std::string valid;
  for (const std::string& n : names) valid += (valid.empty() ? "" : ", ") + n;
  throw Error("unknown pass `" + name + "` for --dump-after; valid passes are: " + valid);
}

namespace {

// Applies a single-expression pass to both programs.
template <class Pass>
void each_program(SpecIR& ir, Pass pass) {
  if (ir.score_mod) ir.score_mod = pass(ir.score_mod);
  if (ir.mask_mod) ir.mask_mod = pass(ir.mask_mod);
}

}  // namespace

SpecIR optimize(SpecIR ir, const std::function<void(const std::string&, const SpecIR&)>& dump) {
  auto after = [&](const char* name) {
    if (dump) dump(name, ir);
  };
  after("lower");
  each_program(ir, ir::fold_constants);
  after("fold");
  each_program(ir, ir::simplify);
  after("simplify");
  std::vector<ir::Expr> roots = ir::cse({ir.score_mod, ir.mask_mod});
  ir.score_mod = roots[0];
  ir.mask_mod = roots[1];
  after("cse");
  return ir;
}

}  // namespace flexjit
