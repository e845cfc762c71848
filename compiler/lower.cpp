#include <fmt/format.h>

#include <stdexcept>

#include "compiler/spec_ir.h"

namespace flexjit {

namespace {

using namespace ir;
using dsl::AstKind;
using dsl::AstNode;
using dsl::Tok;
using dsl::ValueType;

Type ir_type(ValueType t) {
  switch (t) {
    case ValueType::Int: return Type::Int;
    case ValueType::Float: return Type::Float;
    case ValueType::Bool: return Type::Bool;
    case ValueType::Error: break;
  }
  throw std::logic_error("flexjit internal error: lowering a program that failed type checking");
}

class Lowerer {
 public:
  explicit Lowerer(const dsl::CheckedSpec& cs) : cs_(cs) {}

  Expr program(const dsl::CheckedProgram& p) {
    lets_.clear();
    for (const dsl::LetBinding& lb : p.ast->lets) lets_.push_back(lower(*lb.value));
    Expr r = lower(*p.ast->result);
    if (p.kind == dsl::ModKind::Score) r = to_float(r);
    return r;
  }

 private:
  // Both operands converted to their common numeric type.
  std::pair<Expr, Expr> promote(Expr a, Expr b) {
    if (a.type() == Type::Float || b.type() == Type::Float) return {to_float(a), to_float(b)};
    return {a, b};
  }

  Expr lower(const AstNode& n) {
    switch (n.kind) {
      case AstKind::IntLit: return make_int(n.int_value);
      case AstKind::FloatLit: return make_float(static_cast<float>(n.float_value));
      case AstKind::BoolLit: return make_bool(n.bool_value);
      case AstKind::Name: return name(n);
      case AstKind::Unary: return unary(n);
      case AstKind::Binary: return binary(n);
      case AstKind::Ternary: {
        auto [t, f] = promote(lower(*n.args[1]), lower(*n.args[2]));
        return Select::make(lower(*n.args[0]), t, f);
      }
      case AstKind::Call: return call(n);
      case AstKind::Index: {
        const dsl::BufferDecl& b = cs_.spec.buffers.at(n.ref);
        std::vector<Expr> idx;
        for (const auto& a : n.args) idx.push_back(lower(*a));
        return Load::make(n.ref, b.name, b.dtype, std::move(idx));
      }
      case AstKind::Error: break;
    }
    throw std::logic_error("flexjit internal error: lowering an erroneous node");
  }

  Expr name(const AstNode& n) {
    switch (n.name_kind) {
      case dsl::NameKind::Variable: return Var::make(static_cast<VarId>(n.ref));
      case dsl::NameKind::Let: return lets_.at(n.ref);
      case dsl::NameKind::Symbol: return Symbol::make(n.ref, cs_.symbols.at(n.ref));
      case dsl::NameKind::Param: {
        const dsl::ParamDecl& p = cs_.spec.params.at(n.ref);
        if (p.is_const) {
          if (p.type == ValueType::Int) return make_int(p.int_value);
          if (p.type == ValueType::Float) return make_float(static_cast<float>(p.float_value));
          return make_bool(p.bool_value);
        }
        return Param::make(n.ref, p.name, ir_type(p.type));
      }
      default: break;
    }
    throw std::logic_error("flexjit internal error: unresolved name " + n.name);
  }

  Expr unary(const AstNode& n) {
    Expr a = lower(*n.args[0]);
    switch (n.op) {
      case Tok::Minus: return Unary::make(UnaryOp::Neg, a);
      case Tok::Bang:
      case Tok::KwNot: return Unary::make(UnaryOp::Not, a);
      case Tok::Tilde: return Unary::make(a.type() == Type::Bool ? UnaryOp::Not : UnaryOp::BitNot, a);
      default: break;
    }
    throw std::logic_error("flexjit internal error: unknown unary operator");
  }

  Expr binary(const AstNode& n) {
    Expr a = lower(*n.args[0]), b = lower(*n.args[1]);
    auto arith = [&](BinaryOp op) {
      auto [x, y] = promote(a, b);
      return Binary::make(op, x, y);
    };
    bool bools = a.type() == Type::Bool;
    switch (n.op) {
      case Tok::Plus: return arith(BinaryOp::Add);
      case Tok::Minus: return arith(BinaryOp::Sub);
      case Tok::Star: return arith(BinaryOp::Mul);
      case Tok::Slash: return Binary::make(BinaryOp::Div, to_float(a), to_float(b));
      case Tok::SlashSlash: return arith(BinaryOp::FloorDiv);
      case Tok::Percent: return arith(BinaryOp::Mod);
      case Tok::Shl: return Binary::make(BinaryOp::Shl, a, b);
      case Tok::Shr: return Binary::make(BinaryOp::Shr, a, b);
      case Tok::Amp: return Binary::make(bools ? BinaryOp::And : BinaryOp::BitAnd, a, b);
      case Tok::Pipe: return Binary::make(bools ? BinaryOp::Or : BinaryOp::BitOr, a, b);
      case Tok::Caret: return Binary::make(bools ? BinaryOp::Xor : BinaryOp::BitXor, a, b);
      case Tok::AmpAmp:
      case Tok::KwAnd: return Binary::make(BinaryOp::And, a, b);
      case Tok::PipePipe:
      case Tok::KwOr: return Binary::make(BinaryOp::Or, a, b);
      case Tok::EqEq: return bools ? Binary::make(BinaryOp::EQ, a, b) : arith(BinaryOp::EQ);
      case Tok::NotEq: return bools ? Binary::make(BinaryOp::NE, a, b) : arith(BinaryOp::NE);
      case Tok::Lt: return arith(BinaryOp::LT);
      case Tok::Le: return arith(BinaryOp::LE);
      case Tok::Gt: return arith(BinaryOp::GT);
      case Tok::Ge: return arith(BinaryOp::GE);
      default: break;
    }
    throw std::logic_error("flexjit internal error: unknown binary operator");
  }

  Expr call(const AstNode& n) {
    auto f = dsl::lookup_function(n.name);
    if (!f) throw std::logic_error("flexjit internal error: unknown function " + n.name);
    std::vector<Expr> a;
    for (const auto& arg : n.args) a.push_back(lower(*arg));
    auto unary_float = [&](UnaryOp op) { return Unary::make(op, to_float(a[0])); };
    auto minmax = [&](BinaryOp op, Expr x, Expr y) {
      auto [p, q] = promote(x, y);
      return Binary::make(op, p, q);
    };
    using dsl::Func;
    switch (f->func) {
      case Func::Abs: return Unary::make(UnaryOp::Abs, a[0]);
      case Func::Sign: return Unary::make(UnaryOp::Sign, a[0]);
      // floor/ceil/round of an int is the int itself.
      case Func::Floor: return a[0].type() == Type::Int ? a[0] : Unary::make(UnaryOp::Floor, a[0]);
      case Func::Ceil: return a[0].type() == Type::Int ? a[0] : Unary::make(UnaryOp::Ceil, a[0]);
      case Func::Round: return a[0].type() == Type::Int ? a[0] : Unary::make(UnaryOp::Round, a[0]);
      case Func::Min: return minmax(BinaryOp::Min, a[0], a[1]);
      case Func::Max: return minmax(BinaryOp::Max, a[0], a[1]);
      case Func::Clamp: {
        Type t = (a[0].type() == Type::Float || a[1].type() == Type::Float || a[2].type() == Type::Float) ? Type::Float : Type::Int;
        Expr x = Cast::make(t, a[0]), lo = Cast::make(t, a[1]), hi = Cast::make(t, a[2]);
        return Binary::make(BinaryOp::Min, Binary::make(BinaryOp::Max, x, lo), hi);
      }
      case Func::Exp: return unary_float(UnaryOp::Exp);
      case Func::Exp2: return unary_float(UnaryOp::Exp2);
      case Func::Log: return unary_float(UnaryOp::Log);
      case Func::Log2: return unary_float(UnaryOp::Log2);
      case Func::Log1p: return unary_float(UnaryOp::Log1p);
      case Func::Sqrt: return unary_float(UnaryOp::Sqrt);
      case Func::Rsqrt: return unary_float(UnaryOp::Rsqrt);
      case Func::Tanh: return unary_float(UnaryOp::Tanh);
      case Func::Sigmoid: return unary_float(UnaryOp::Sigmoid);
      case Func::Sin: return unary_float(UnaryOp::Sin);
      case Func::Cos: return unary_float(UnaryOp::Cos);
      case Func::Pow: return Binary::make(BinaryOp::Pow, to_float(a[0]), to_float(a[1]));
      case Func::Where: {
        auto [t, e] = a[1].type() == Type::Bool ? std::pair{a[1], a[2]} : promote(a[1], a[2]);
        return Select::make(a[0], t, e);
      }
      case Func::ToFloat: return to_float(a[0]);
      case Func::ToInt: return Cast::make(Type::Int, a[0]);
    }
    throw std::logic_error("flexjit internal error: unhandled function " + n.name);
  }

  const dsl::CheckedSpec& cs_;
  std::vector<Expr> lets_;
};

}  // namespace

SpecIR lower_spec(const dsl::CheckedSpec& checked) {
  SpecIR out{checked, {}, {}};
  Lowerer l(out.checked);
  if (out.checked.score_mod) out.score_mod = l.program(*out.checked.score_mod);
  if (out.checked.mask_mod) out.mask_mod = l.program(*out.checked.mask_mod);
  return out;
}

}  // namespace flexjit
