#include "compiler/interpreter.h"

#include <fmt/format.h>

#include <cstring>
#include <unordered_map>

#include "compiler/ir/ir_printer.h"
#include "compiler/ir/scalar_ops.h"
#include "dsl/error.h"

namespace flexjit {

using namespace ir;

std::string Value::str() const {
  switch (type) {
    case Type::Int: return std::to_string(i);
    case Type::Bool: return b ? "true" : "false";
    case Type::Float: return float_literal(f);
  }
  return "?";
}

namespace {

float half_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);  // inf / nan
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {
    // Subnormal half: normalise into an fp32 normal number (exact).
    int e = -1;
    do {
      ++e;
      mant <<= 1;
    } while ((mant & 0x400u) == 0);
    bits = sign | static_cast<uint32_t>(112 - e) << 23 | ((mant & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

float bf16_to_float(uint16_t v) {
  uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

template <class T>
T read_as(const void* base, int64_t offset) {
  T v;
  std::memcpy(&v, static_cast<const char*>(base) + offset * static_cast<int64_t>(sizeof(T)), sizeof v);
  return v;
}

Scalar to_scalar(const Value& v) { return {v.type, v.i, v.f, v.b}; }

class Interpreter {
 public:
  Interpreter(const EvalEnv& env, EvalFlags* flags) : env_(env), flags_(flags) {}

  Scalar eval(const Expr& e) {
    auto it = memo_.find(e.get());
    if (it != memo_.end()) return it->second;
    Scalar r = compute(e);
    memo_.emplace(e.get(), r);
    return r;
  }

 private:
  Scalar compute(const Expr& e) {
    switch (e.kind()) {
      case NodeKind::IntImm:
      case NodeKind::FloatImm:
      case NodeKind::BoolImm: return immediate_value(e);
      case NodeKind::Var: {
        VarId v = e.as<Var>()->var;
        if (v == VarId::Score) return Scalar::of_float(env_.score);
        return Scalar::of_int(env_.vars[static_cast<int>(v)]);
      }
      case NodeKind::Param: {
        const Param* p = e.as<Param>();
        if (p->index < 0 || static_cast<size_t>(p->index) >= env_.params.size())
          throw Error(fmt::format("interpreter: no value for parameter `{}` (index {}); pass every runtime parameter", p->name, p->index));
        Scalar s = to_scalar(env_.params[p->index]);
        if (s.type != e.type()) {
          if (e.type() == Type::Bool)
            throw Error(fmt::format("interpreter: parameter `{}` is a bool but was given a {}", p->name, type_name(s.type)));
          s = apply_cast(e.type(), s);
        }
        return s;
      }
      case NodeKind::Symbol: {
        const Symbol* s = e.as<Symbol>();
        if (s->index < 0 || static_cast<size_t>(s->index) >= env_.symbols.size())
          throw Error(fmt::format("interpreter: no value for shape symbol `{}` (index {})", s->name, s->index));
        return Scalar::of_int(env_.symbols[s->index]);
      }
      case NodeKind::Unary: {
        const Unary* u = e.as<Unary>();
        return apply_unary(u->op, eval(u->a));
      }
      case NodeKind::Binary: return binary(e.as<Binary>());
      case NodeKind::Select: {
        const Select* s = e.as<Select>();
        return eval(s->cond).b ? eval(s->t) : eval(s->f);
      }
      case NodeKind::Cast: return apply_cast(e.type(), eval(e.as<Cast>()->a));
      case NodeKind::Load: return load(e.as<Load>());
    }
    throw std::logic_error("flexjit internal error: unknown node kind");
  }

  Scalar binary(const Binary* b) {
    // && and || decide from the left operand when they can (so `i < n && buf[i] > 0` is a guard).
    if (b->op == BinaryOp::And || b->op == BinaryOp::Or) {
      bool l = eval(b->a).b;
      if (b->op == BinaryOp::And && !l) return Scalar::of_bool(false);
      if (b->op == BinaryOp::Or && l) return Scalar::of_bool(true);
      return eval(b->b);
    }
    Scalar x = eval(b->a), y = eval(b->b);
    bool dz = false;
    Scalar r = apply_binary(b->op, x, y, &dz);
    if (dz && flags_) {
      if (!flags_->int_div_by_zero && flags_->first_error.empty())
        flags_->first_error = fmt::format("integer {} by zero: {} {} 0", b->op == BinaryOp::Mod ? "modulo" : "division", x.i,
                                          binary_op_name(b->op));
      flags_->int_div_by_zero = true;
    }
    return r;
  }

  Scalar load(const Load* l) {
    if (l->buffer < 0 || static_cast<size_t>(l->buffer) >= env_.buffers.size())
      throw Error(fmt::format("interpreter: no data for buffer `{}` (index {}); bind every captured buffer", l->name, l->buffer));
    const BufferView& view = env_.buffers[l->buffer];
    size_t rank = l->indices.size();
    if (view.shape.size() != rank || view.strides.size() != rank)
      throw Error(fmt::format("interpreter: buffer `{}` is indexed with {} indices but its view has rank {}", l->name, rank, view.shape.size()));
    std::vector<int64_t> raw(rank);
    for (size_t d = 0; d < rank; ++d) raw[d] = eval(l->indices[d]).i;
    int64_t offset = 0;
    bool bad = false;
    for (size_t d = 0; d < rank; ++d) {
      int64_t n = view.shape[d], i = raw[d];
      if (i < 0 && i >= -n) i += n;  // PyTorch-style negative index
      if (i < 0 || i >= n) {
        bad = true;
        i = i < 0 ? 0 : n - 1;
      }
      if (n <= 0) return zero_of(l);  // nothing to read from an empty dimension
      offset += i * view.strides[d];
    }
    if (bad && flags_) {
      if (!flags_->index_out_of_range && flags_->first_error.empty()) {
        std::string idx, dims;
        for (size_t d = 0; d < rank; ++d) {
          idx += (d ? ", " : "") + std::to_string(raw[d]);
          dims += (d ? ", " : "") + std::to_string(view.shape[d]);
        }
        flags_->first_error = fmt::format("index out of range: {}[{}] with shape [{}]", l->name, idx, dims);
      }
      flags_->index_out_of_range = true;
    }
    if (!view.data) throw Error(fmt::format("interpreter: buffer `{}` has no data", l->name));
    switch (view.dtype) {
      case DType::F32: return Scalar::of_float(read_as<float>(view.data, offset));
      case DType::F16: return Scalar::of_float(half_to_float(read_as<uint16_t>(view.data, offset)));
      case DType::BF16: return Scalar::of_float(bf16_to_float(read_as<uint16_t>(view.data, offset)));
      case DType::I32: return Scalar::of_int(read_as<int32_t>(view.data, offset));
      case DType::I64: return Scalar::of_int(read_as<int64_t>(view.data, offset));
      case DType::U8: return Scalar::of_int(read_as<uint8_t>(view.data, offset));
      case DType::Bool: return Scalar::of_bool(read_as<uint8_t>(view.data, offset) != 0);
      case DType::F8E4M3:
      case DType::F8E5M2: break;  // a KV-cache type, never a buffer's
    }
    throw std::logic_error("flexjit internal error: unknown dtype");
  }

  Scalar zero_of(const Load* l) {
    if (flags_) {
      if (!flags_->index_out_of_range && flags_->first_error.empty())
        flags_->first_error = fmt::format("index out of range: buffer `{}` has an empty dimension", l->name);
      flags_->index_out_of_range = true;
    }
    return Scalar{l->type, 0, 0, false};
  }

  const EvalEnv& env_;
  EvalFlags* flags_;
  std::unordered_map<const Node*, Scalar> memo_;
};

}  // namespace

Value evaluate(const Expr& e, const EvalEnv& env, EvalFlags* flags) {
  if (!e) throw std::logic_error("flexjit internal error: evaluating a null expression");
  Scalar s = Interpreter(env, flags).eval(e);
  return {s.type, s.i, s.f, s.b};
}

}  // namespace flexjit
