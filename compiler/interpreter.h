// The reference interpreter: evaluates IR at one point (b, h, q, kv, score) exactly as
// docs/SEMANTICS.md says. It is the oracle every back end is tested against, and the host
// uses it to evaluate launch-time obligations from the range analysis.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "compiler/ir/ir.h"
#include "dsl/builtins.h"

namespace flexjit {

struct Value {
  ir::Type type = ir::Type::Int;
  int64_t i = 0;
  float f = 0;
  bool b = false;
  // Round-trips: "0.1", "30.0", "inf", "-inf", "nan", "-7", "true" / "false".
  std::string str() const;
  static Value of_int(int64_t v) { return {ir::Type::Int, v, 0, false}; }
  static Value of_float(float v) { return {ir::Type::Float, 0, v, false}; }
  static Value of_bool(bool v) { return {ir::Type::Bool, 0, 0, v}; }
  // As a double, the form launch parameters and interval environments take (ints and bools exactly).
  double as_double() const { return type == ir::Type::Float ? double(f) : type == ir::Type::Bool ? (b ? 1.0 : 0.0) : double(i); }
};

// A captured buffer as the interpreter reads it (host memory).
struct BufferView {
  dsl::DType dtype = dsl::DType::F32;
  const void* data = nullptr;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;  // in elements
};

struct EvalEnv {
  int64_t vars[dsl::kNumVars] = {};  // indexed by int(VarId); kv_head must be set consistently by the caller
  float score = 0;
  std::vector<int64_t> symbols;      // by CheckedSpec::symbols index
  std::vector<Value> params;         // by spec param index (only runtime params are read)
  std::vector<BufferView> buffers;   // by spec buffer index
};

// What checked mode would report. Loads in the untaken operand of a select, and the right
// operand of && / || when the left one decides the result, are not evaluated and raise nothing.
struct EvalFlags {
  bool index_out_of_range = false;
  bool int_div_by_zero = false;
  std::string first_error;  // names the buffer and the index values (or the division)
};

// Evaluates e at one point; shared subexpressions are evaluated once per call. Throws
// flexjit::Error when env lacks a buffer, parameter or symbol the expression uses.
Value evaluate(const ir::Expr& e, const EvalEnv& env, EvalFlags* flags = nullptr);

}  // namespace flexjit
