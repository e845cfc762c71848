// Concrete interval evaluation with three-valued booleans: decides whether a mask is
// all-true, all-false or mixed over a box of (b, h, q, kv) at known shapes and parameters.
#pragma once
#include <cstdint>
#include <vector>

#include "compiler/ir/ir.h"
#include "dsl/builtins.h"

namespace flexjit {

enum class TriBool { False, True, Unknown };

struct ConcreteInterval {
  int64_t lo = 0, hi = 0;  // inclusive
};

struct IntervalEnv {
  ConcreteInterval vars[dsl::kNumVars];  // by int(VarId); score is ignored (taken as any float)
  std::vector<int64_t> symbols;          // by CheckedSpec::symbols index
  std::vector<double> params;            // by spec param index; int/bool params stored as double exactly
};

// Why: block-sparse attention skips tiles the mask rejects entirely and drops the mask code
// on tiles it accepts entirely; this decides that per tile from the IR, without evaluating
// every element. Sound: True means every point of the box evaluates to true (False: false);
// anything it cannot decide is Unknown. Loads are Unknown (their value is the full range of
// the element type). A null mask is True (plain attention attends everywhere).
TriBool classify_box(const ir::Expr& mask, const IntervalEnv& env);

}  // namespace flexjit
