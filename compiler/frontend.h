// The front door from a spec to optimized IR: check, lower and optimize, or throw
// CompileError with every diagnostic.
#pragma once
#include <functional>
#include <string>

#include "compiler/spec_ir.h"
#include "dsl/compile_error.h"
#include "dsl/spec.h"

namespace flexjit {

// Parses, checks, lowers and runs the pass pipeline. `dump` is called after each pass
// (see pass_names()) when given.
SpecIR build_spec_ir(const dsl::Spec& spec, const std::function<void(const std::string&, const SpecIR&)>& dump = {});

}  // namespace flexjit
