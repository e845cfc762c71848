// Declarations of captured buffers (`rel_h: bf16[B, H, Sq, 64]`) and scalar parameters
// (`window: int`, `const cap: float = 30`), parsed from spec files and CLI flags.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dsl/ast.h"
#include "dsl/builtins.h"
#include "dsl/diagnostic.h"

namespace flexjit::dsl {

// One dimension of a buffer shape: a literal extent or a symbol bound at launch.
struct Dim {
  bool is_symbol = false;
  int64_t value = 0;
  std::string symbol;
  std::string str() const { return is_symbol ? symbol : std::to_string(value); }
};

struct BufferDecl {
  std::string name;
  DType dtype = DType::F32;
  std::vector<Dim> shape;
  bool requires_grad = false;  // backward: scatter dS into an fp32 gradient of this buffer
  std::string str() const;     // canonical text: "rel_h: bf16[B, H, Sq, 64]"
};

// A scalar parameter. A runtime parameter is given at launch; a const one is baked into
// the generated code (and the cache key). A runtime parameter may carry a default value.
struct ParamDecl {
  std::string name;
  ValueType type = ValueType::Int;
  bool is_const = false;
  bool has_value = false;
  int64_t int_value = 0;
  double float_value = 0;
  bool bool_value = false;
  std::string str() const;  // canonical text: "const cap: float = 30"
};

// Parse one declaration; errors go to diags (with `source_name` as the file name) and the
// result is nullopt. `force_const` is for the CLI's --const flag.
std::optional<BufferDecl> parse_buffer_decl(const std::string& text, const std::string& source_name, Diagnostics& diags);
std::optional<ParamDecl> parse_param_decl(const std::string& text, const std::string& source_name, Diagnostics& diags,
                                          bool force_const = false);

}  // namespace flexjit::dsl
