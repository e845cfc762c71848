// The pass pipeline every back end runs after lowering (and that `flexjit dump
// --dump-after=PASS` shows step by step): fold constants, simplify, CSE.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "compiler/spec_ir.h"

namespace flexjit {

// The names `--dump-after` accepts, in pipeline order: {"lower", "fold", "simplify", "cse"}.
// "lower" is the state before any pass (lowering itself happens in lower_spec).
const std::vector<std::string>& pass_names();

// Throws flexjit::Error naming the valid passes when `name` is not one of pass_names(); the
// CLI calls it before compiling anything so a typo fails fast.
void check_pass_name(const std::string& name);

// Runs the passes on score_mod and mask_mod together (so CSE shares nodes between them) and
// calls dump(pass_name, spec_ir) after each, starting with "lower" for the input.
SpecIR optimize(SpecIR ir, const std::function<void(const std::string&, const SpecIR&)>& dump = {});

}  // namespace flexjit
