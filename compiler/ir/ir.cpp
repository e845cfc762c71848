#include "compiler/ir/ir.h"

#include <fmt/format.h>

#include <stdexcept>

namespace flexjit::ir {

const char* type_name(Type t) {
  switch (t) {
    case Type::Bool: return "bool";
    case Type::Int: return "int";
    case Type::Float: return "float";
  }
  return "?";
}

const char* unary_op_name(UnaryOp op) {
  switch (op) {
#define FLEXJIT_IR_UOP_NAME(name, text) \
  case UnaryOp::name:                   \
    return text;
    FLEXJIT_IR_UNARY_OPS(FLEXJIT_IR_UOP_NAME)
#undef FLEXJIT_IR_UOP_NAME
  }
  return "?";
}

const char* binary_op_name(BinaryOp op) {
  switch (op) {
#define FLEXJIT_IR_BOP_NAME(name, text) \
  case BinaryOp::name:                  \
    return text;
    FLEXJIT_IR_BINARY_OPS(FLEXJIT_IR_BOP_NAME)
#undef FLEXJIT_IR_BOP_NAME
  }
  return "?";
}

bool unary_op_is_float_math(UnaryOp op) { return op >= UnaryOp::Exp; }

bool binary_op_is_comparison(BinaryOp op) { return op >= BinaryOp::EQ && op <= BinaryOp::GE; }

bool binary_op_is_commutative(BinaryOp op) {
  switch (op) {
    case BinaryOp::Add: case BinaryOp::Mul: case BinaryOp::Min: case BinaryOp::Max: case BinaryOp::EQ:
    case BinaryOp::NE: case BinaryOp::And: case BinaryOp::Or: case BinaryOp::Xor: case BinaryOp::BitAnd:
    case BinaryOp::BitOr: case BinaryOp::BitXor:
      return true;
    default:
      return false;
  }
}

namespace {
[[noreturn]] void malformed(const std::string& what) { throw std::logic_error("flexjit internal error: malformed IR: " + what); }
bool numeric(Type t) { return t == Type::Int || t == Type::Float; }
}  // namespace

Expr IntImm::make(int64_t v) { return Expr(std::make_shared<IntImm>(v)); }
Expr FloatImm::make(float v) { return Expr(std::make_shared<FloatImm>(v)); }
Expr BoolImm::make(bool v) { return Expr(std::make_shared<BoolImm>(v)); }
Expr Var::make(VarId v) { return Expr(std::make_shared<Var>(v)); }
Expr Param::make(int index, const std::string& name, Type t) { return Expr(std::make_shared<Param>(index, name, t)); }
Expr Symbol::make(int index, const std::string& name) { return Expr(std::make_shared<Symbol>(index, name)); }

Expr Unary::make(UnaryOp op, Expr a) {
  if (!a) malformed("null operand");
  Type t = a.type();
  switch (op) {
    case UnaryOp::Not:
      if (t != Type::Bool) malformed("! of a non-bool");
      break;
    case UnaryOp::BitNot:
      if (t != Type::Int) malformed("~ of a non-int");
      break;
    case UnaryOp::Neg: case UnaryOp::Abs: case UnaryOp::Sign: case UnaryOp::Floor: case UnaryOp::Ceil: case UnaryOp::Round:
      if (!numeric(t)) malformed(fmt::format("{} of a bool", unary_op_name(op)));
      break;
    default:
      if (t != Type::Float) malformed(fmt::format("{} of a non-float", unary_op_name(op)));
      break;
  }
  return Expr(std::make_shared<Unary>(op, std::move(a), t));
}

Expr Binary::make(BinaryOp op, Expr a, Expr b) {
  if (!a || !b) malformed("null operand");
  Type ta = a.type(), tb = b.type();
  if (ta != tb) malformed(fmt::format("{} of {} and {}", binary_op_name(op), type_name(ta), type_name(tb)));
  Type result = ta;
  switch (op) {
    case BinaryOp::Add: case BinaryOp::Sub: case BinaryOp::Mul: case BinaryOp::FloorDiv: case BinaryOp::Mod:
    case BinaryOp::Min: case BinaryOp::Max:
      if (!numeric(ta)) malformed(fmt::format("{} of bools", binary_op_name(op)));
      break;
    case BinaryOp::Div: case BinaryOp::Pow:
      if (ta != Type::Float) malformed(fmt::format("{} of non-floats", binary_op_name(op)));
      break;
    case BinaryOp::EQ: case BinaryOp::NE:
      result = Type::Bool;
      break;
    case BinaryOp::LT: case BinaryOp::LE: case BinaryOp::GT: case BinaryOp::GE:
      if (!numeric(ta)) malformed("ordering of bools");
      result = Type::Bool;
      break;
    case BinaryOp::And: case BinaryOp::Or: case BinaryOp::Xor:
      if (ta != Type::Bool) malformed(fmt::format("{} of non-bools", binary_op_name(op)));
      break;
    case BinaryOp::BitAnd: case BinaryOp::BitOr: case BinaryOp::BitXor: case BinaryOp::Shl: case BinaryOp::Shr:
      if (ta != Type::Int) malformed(fmt::format("{} of non-ints", binary_op_name(op)));
      break;
  }
  return Expr(std::make_shared<Binary>(op, std::move(a), std::move(b), result));
}

Expr Select::make(Expr cond, Expr t, Expr f) {
  if (!cond || !t || !f) malformed("null operand");
  if (cond.type() != Type::Bool) malformed("select on a non-bool");
  if (t.type() != f.type()) malformed("select of different types");
  return Expr(std::make_shared<Select>(std::move(cond), std::move(t), std::move(f)));
}

Expr Cast::make(Type to, Expr a) {
  if (!a) malformed("null operand");
  if (a.type() == to) return a;
  if (to == Type::Bool) malformed("cast to bool");
  return Expr(std::make_shared<Cast>(to, std::move(a)));
}

Expr Load::make(int buffer, const std::string& name, DType dtype, std::vector<Expr> indices) {
  for (const Expr& i : indices)
    if (!i || i.type() != Type::Int) malformed("load index that is not an int");
  Type t = dtype == DType::Bool ? Type::Bool : dsl::dtype_is_float(dtype) ? Type::Float : Type::Int;
  return Expr(std::make_shared<Load>(buffer, name, dtype, std::move(indices), t));
}

bool is_var(const Expr& e, VarId v) {
  const Var* x = e.as<Var>();
  return x && x->var == v;
}

bool is_float_const(const Expr& e, float c) {
  const FloatImm* f = e.as<FloatImm>();
  return f && f->value == c;
}

std::vector<Expr> children(const Expr& e) {
  switch (e.kind()) {
    case NodeKind::Unary: return {e.as<Unary>()->a};
    case NodeKind::Binary: return {e.as<Binary>()->a, e.as<Binary>()->b};
    case NodeKind::Select: return {e.as<Select>()->cond, e.as<Select>()->t, e.as<Select>()->f};
    case NodeKind::Cast: return {e.as<Cast>()->a};
    case NodeKind::Load: return e.as<Load>()->indices;
    default: return {};
  }
}

Expr with_children(const Expr& e, const std::vector<Expr>& k) {
  auto same = [&] {
    std::vector<Expr> old = children(e);
    for (size_t i = 0; i < old.size(); ++i)
      if (!old[i].same_as(k[i])) return false;
    return true;
  };
  if (same()) return e;
  switch (e.kind()) {
    case NodeKind::Unary: return Unary::make(e.as<Unary>()->op, k[0]);
    case NodeKind::Binary: return Binary::make(e.as<Binary>()->op, k[0], k[1]);
    case NodeKind::Select: return Select::make(k[0], k[1], k[2]);
    case NodeKind::Cast: return Cast::make(e.type(), k[0]);
    case NodeKind::Load: {
      const Load* l = e.as<Load>();
      return Load::make(l->buffer, l->name, l->dtype, k);
    }
    default: return e;
  }
}

Expr make_int(int64_t v) { return IntImm::make(v); }
Expr make_float(float v) { return FloatImm::make(v); }
Expr make_bool(bool v) { return BoolImm::make(v); }
Expr to_float(const Expr& e) { return Cast::make(Type::Float, e); }

}  // namespace flexjit::ir
