// Helpers for compiler tests: build a spec through the real front end (parse, check, lower)
// and bind symbols, parameters and buffers for the interpreter.
#pragma once
#include <catch2/catch.hpp>

#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "compiler/interpreter.h"
#include "compiler/spec_ir.h"
#include "dsl/error.h"
#include "dsl/sema.h"
#include "dsl/spec.h"

namespace flexjit::test {

// Parses, checks and lowers a spec; fails the test with the rendered diagnostics on error.
inline SpecIR make_spec(std::optional<std::string> score_mod, std::optional<std::string> mask_mod,
                        const std::vector<std::string>& buffers = {}, const std::vector<std::string>& params = {}) {
  dsl::Spec spec;
  spec.score_mod = std::move(score_mod);
  spec.mask_mod = std::move(mask_mod);
  dsl::Diagnostics diags;
  for (const std::string& b : buffers) dsl::add_buffer(spec, b, "test", diags);
  for (const std::string& p : params) dsl::add_param(spec, p, "test", diags);
  auto checked = dsl::check_spec(spec, diags);
  INFO(diags.render_text());
  REQUIRE(checked.has_value());
  REQUIRE(!diags.has_errors());
  return lower_spec(*checked);
}

// The int expression under the float cast lowering adds to an int-valued score_mod.
inline ir::Expr int_score(const SpecIR& s) {
  const ir::Cast* c = s.score_mod.as<ir::Cast>();
  REQUIRE(c);
  return c->a;
}

// Symbol values by name (unnamed standard symbols default to 1).
inline std::vector<int64_t> symbols(const dsl::CheckedSpec& cs, const std::map<std::string, int64_t>& values) {
  std::vector<int64_t> out(cs.symbols.size(), 1);
  for (const auto& [name, v] : values) {
    int i = cs.symbol_index(name);
    REQUIRE(i >= 0);
    out[i] = v;
  }
  return out;
}

// A dense row-major view of host data.
template <class T>
BufferView view(dsl::DType dt, const std::vector<T>& data, std::vector<int64_t> shape) {
  BufferView v;
  v.dtype = dt;
  v.data = data.data();
  v.shape = shape;
  v.strides.assign(shape.size(), 1);
  for (int d = static_cast<int>(shape.size()) - 2; d >= 0; --d) v.strides[d] = v.strides[d + 1] * shape[d + 1];
  return v;
}

inline void set_point(EvalEnv& env, int64_t b, int64_t h, int64_t q, int64_t kv, float score = 0) {
  env.vars[int(dsl::VarId::B)] = b;
  env.vars[int(dsl::VarId::H)] = h;
  env.vars[int(dsl::VarId::KvHead)] = h;
  env.vars[int(dsl::VarId::Q)] = q;
  env.vars[int(dsl::VarId::KV)] = kv;
  env.score = score;
}

// Equal as the semantics require: ints and bools exactly, floats bitwise except that any
// NaN equals any NaN.
inline bool same_value(const Value& a, const Value& b) {
  if (a.type != b.type) return false;
  switch (a.type) {
    case ir::Type::Int: return a.i == b.i;
    case ir::Type::Bool: return a.b == b.b;
    case ir::Type::Float: {
      if (a.f != a.f && b.f != b.f) return true;
      uint32_t x, y;
      std::memcpy(&x, &a.f, 4);
      std::memcpy(&y, &b.f, 4);
      return x == y;
    }
  }
  return false;
}

}  // namespace flexjit::test
