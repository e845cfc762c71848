#include "compiler/bindings.h"

#include <fmt/format.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "dsl/error.h"

namespace flexjit {

std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (size_t i = shape.size(); i-- > 1;)
    if (__builtin_mul_overflow(s[i], shape[i], &s[i - 1]))
      throw Error(fmt::format("a tensor of shape [{}] has more elements than 64-bit strides can address; check its dimensions",
                              fmt::join(shape, ", ")));
  return s;
}

Value parse_param_value(const dsl::ParamDecl& p, const std::string& text) {
  Value v;
  const char* s = text.c_str();
  char* end = nullptr;
  errno = 0;
  switch (p.type) {
    case dsl::ValueType::Int: {
      long long x = std::strtoll(s, &end, 10);
      if (end == s || *end != '\0' || errno == ERANGE)
        throw Error(fmt::format("parameter `{}` is an int, but got '{}'; give a whole number, e.g. {}=1024", p.name, text, p.name));
      v.type = ir::Type::Int;
      v.i = x;
      return v;
    }
    case dsl::ValueType::Float: {
      float x = std::strtof(s, &end);
      if (end == s || *end != '\0')
        throw Error(fmt::format("parameter `{}` is a float, but got '{}'; give a number, e.g. {}=30.0", p.name, text, p.name));
      v.type = ir::Type::Float;
      v.f = x;
      return v;
    }
    case dsl::ValueType::Bool:
      if (text != "true" && text != "false" && text != "1" && text != "0")
        throw Error(fmt::format("parameter `{}` is a bool, but got '{}'; give true or false", p.name, text));
      v.type = ir::Type::Bool;
      v.b = text == "true" || text == "1";
      return v;
    case dsl::ValueType::Error: break;
  }
  throw Error(fmt::format("parameter `{}` has no valid type", p.name));
}

namespace {
Value const_value(const dsl::ParamDecl& p) {
  Value v;
  if (p.type == dsl::ValueType::Int) {
    v.type = ir::Type::Int;
    v.i = p.int_value;
  } else if (p.type == dsl::ValueType::Float) {
    v.type = ir::Type::Float;
    v.f = static_cast<float>(p.float_value);
  } else {
    v.type = ir::Type::Bool;
    v.b = p.bool_value;
  }
  return v;
}
}  // namespace

BoundValues bind_values(const dsl::CheckedSpec& cs, const std::map<std::string, std::string>& values,
                        const std::vector<std::optional<std::vector<int64_t>>>& buffer_shapes, bool require_all) {
  BindingInputs in;
  in.symbols.resize(cs.symbols.size());
  in.params.resize(cs.spec.params.size());
  in.buffer_shapes = buffer_shapes;
  for (const auto& [name, text] : values) {
    int si = cs.symbol_index(name);
    if (si >= 0) {
      char* end = nullptr;
      errno = 0;
      long long x = std::strtoll(text.c_str(), &end, 10);
      if (end == text.c_str() || *end != '\0' || errno == ERANGE || x < 1 || x > INT32_MAX)
        throw Error(fmt::format("symbol `{}` must be a positive int below 2^31, but got '{}'", name, text));
      in.symbols[si] = x;
      continue;
    }
    const dsl::ParamDecl* p = cs.spec.find_param(name);
    if (!p) {
      std::vector<std::string> names = cs.symbols;
      for (const dsl::ParamDecl& q : cs.spec.params) names.push_back(q.name);
      auto guess = dsl::closest_name(name, names);
      throw Error(fmt::format("`{}` is neither a parameter nor a shape symbol of this spec{}", name,
                              guess ? fmt::format("; did you mean `{}`?", *guess) : ""));
    }
    in.params[static_cast<size_t>(p - cs.spec.params.data())] = parse_param_value(*p, text);
  }
  return bind_typed(cs, in, require_all);
}

BoundValues bind_typed(const dsl::CheckedSpec& cs, const BindingInputs& in, bool require_all) {
  const dsl::Spec& spec = cs.spec;
  BoundValues out;
  out.symbols.assign(cs.symbols.size(), 0);
  out.symbol_bound.assign(cs.symbols.size(), false);
  // Where each symbol's value came from, for messages: -1 explicit, else a buffer index.
  std::vector<int> bound_by(cs.symbols.size(), -1);
  std::vector<size_t> bound_dim(cs.symbols.size(), 0);
  for (size_t si = 0; si < in.symbols.size() && si < cs.symbols.size(); ++si) {
    if (!in.symbols[si]) continue;
    out.symbols[si] = *in.symbols[si];
    out.symbol_bound[si] = true;
  }
  auto source = [&](size_t si) {
    return bound_by[si] < 0 ? fmt::format("{}={}", cs.symbols[si], out.symbols[si])
                            : fmt::format("buffer `{}` dimension {}", spec.buffers[bound_by[si]].name, bound_dim[si]);
  };
  for (size_t bi = 0; bi < spec.buffers.size() && bi < in.buffer_shapes.size(); ++bi) {
    if (!in.buffer_shapes[bi]) continue;
    const dsl::BufferDecl& b = spec.buffers[bi];
    const std::vector<int64_t>& shape = *in.buffer_shapes[bi];
    if (shape.size() != b.shape.size())
      throw Error(fmt::format("buffer `{}` is declared with {} dimensions ({}) but the given tensor has {} ({})", b.name, b.shape.size(),
                              b.str(), shape.size(), fmt::join(shape, ", ")));
    for (size_t d = 0; d < shape.size(); ++d) {
      const dsl::Dim& dim = b.shape[d];
      if (!dim.is_symbol) {
        if (shape[d] != dim.value)
          throw Error(fmt::format("buffer `{}` dimension {} must be {} (declared {}), but the given tensor has {}", b.name, d, dim.value,
                                  b.str(), shape[d]));
        continue;
      }
      size_t si = static_cast<size_t>(cs.symbol_index(dim.symbol));
      if (shape[d] < 1 || shape[d] > INT32_MAX)
        throw Error(fmt::format("buffer `{}` dimension {} ({}) is {}; symbols must be in [1, 2^31)", b.name, d, dim.symbol, shape[d]));
      if (out.symbol_bound[si] && out.symbols[si] != shape[d])
        throw Error(fmt::format("buffer `{}` dimension {} is {} = {}, but {} is already {} (from {})", b.name, d, dim.symbol, shape[d],
                                dim.symbol, out.symbols[si], source(si)));
      if (!out.symbol_bound[si]) {
        out.symbols[si] = shape[d];
        out.symbol_bound[si] = true;
        bound_by[si] = static_cast<int>(bi);
        bound_dim[si] = d;
      }
    }
  }
  out.params.resize(spec.params.size());
  for (size_t i = 0; i < spec.params.size(); ++i) {
    const dsl::ParamDecl& p = spec.params[i];
    bool given = i < in.params.size() && in.params[i];
    if (p.is_const) {
      if (given)
        throw Error(fmt::format("`{}` is a const parameter baked into the kernel; it cannot be set at launch (declare it `{}: {}` to make it a "
                                "runtime parameter)",
                                p.name, p.name, dsl::value_type_name(p.type)));
      out.params[i] = const_value(p);
    } else if (given) {
      out.params[i] = *in.params[i];
    } else if (p.has_value) {
      out.params[i] = const_value(p);
    } else if (require_all) {
      throw Error(fmt::format("runtime parameter `{}` ({}) has no value; give it, e.g. --set {}=...", p.name, dsl::value_type_name(p.type), p.name));
    } else {
      out.params[i].type = p.type == dsl::ValueType::Float ? ir::Type::Float : p.type == dsl::ValueType::Bool ? ir::Type::Bool : ir::Type::Int;
    }
  }
  if (require_all)
    for (size_t si = 0; si < cs.symbols.size(); ++si)
      if (!out.symbol_bound[si])
        throw Error(fmt::format("shape symbol `{}` has no value; give it with --set {}=N or through a buffer that has it", cs.symbols[si],
                                cs.symbols[si]));
  return out;
}

}  // namespace flexjit
