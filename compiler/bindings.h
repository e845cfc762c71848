// Binding a spec's symbols, parameters and buffer shapes to concrete values at launch or
// evaluation time, with errors that name the buffer, the dimension and both values.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "compiler/interpreter.h"
#include "dsl/sema.h"

namespace flexjit {

struct BoundValues {
  std::vector<int64_t> symbols;     // by CheckedSpec::symbols index (0 where unbound and not required)
  std::vector<bool> symbol_bound;
  std::vector<Value> params;        // by spec param index; const params hold their value
  // Launches only (runtime::bind_launch): bit i set when buffer i's last dimension has stride 1 (or extent 1), so
  // that the kernel may index it without that stride (VariantOptions::unit_inner_stride).
  uint64_t unit_inner_stride = 0;
};

// Typed inputs of a binding (the launch path fills these directly, without text).
struct BindingInputs {
  std::vector<std::optional<int64_t>> symbols;                     // by symbol index: explicit values
  std::vector<std::optional<Value>> params;                        // by param index: given values
  std::vector<std::optional<std::vector<int64_t>>> buffer_shapes;  // by buffer index: given tensors' shapes
};
BoundValues bind_typed(const dsl::CheckedSpec& spec, const BindingInputs& in, bool require_all);

// Binds symbols from explicit values (`Skv=4096`) and from the shapes of the buffers that
// are given (nullopt = not given), checking every literal and symbolic extent. Parameters
// come from `param_values` (text as typed on a command line), defaults or const values.
// Missing required values are errors when `require_all` is set. Throws flexjit::Error.
BoundValues bind_values(const dsl::CheckedSpec& spec, const std::map<std::string, std::string>& values,
                        const std::vector<std::optional<std::vector<int64_t>>>& buffer_shapes, bool require_all);

// Parses a parameter value of the declared type ("1024", "30.5", "true").
Value parse_param_value(const dsl::ParamDecl& p, const std::string& text);

// Row-major (C order) strides of a shape, in elements. Throws flexjit::Error when they overflow int64.
std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape);

}  // namespace flexjit
