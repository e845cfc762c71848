// A generator of random well-typed IR DAGs (with shared and structurally duplicated
// subexpressions, special constants, loads and parameters) and matching random evaluation
// environments, for property tests of the passes and analyses.
#pragma once
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "compiler/interpreter.h"
#include "compiler/ir/ir.h"
#include "unit/compiler/spec_fixture.h"

namespace flexjit::test {

// The spec every random program is checked against: its buffers, params and symbols are the
// ones the generator references by index.
inline SpecIR random_ir_spec() {
  return make_spec(std::nullopt, "true", {"ti: i32[Skv]", "tf: f32[64]", "tb: bool[Sq]", "th: bf16[H, 16]", "tu: u8[Skv]"},
                   {"pi: int", "pf: float", "pb: bool"});
}

class RandomIR {
 public:
  explicit RandomIR(uint64_t seed, bool int_heavy = false) : rng_(seed), int_heavy_(int_heavy) {}

  ir::Expr gen(ir::Type t, int depth) {
    using namespace ir;
    auto& pool = pools_[static_cast<int>(t)];
    if (!pool.empty() && chance(0.15)) return pool[pick(pool.size())];
    if (!pool.empty() && chance(0.08)) return clone(pool[pick(pool.size())]);
    Expr e = depth <= 0 || chance(0.2) ? leaf(t) : node(t, depth - 1);
    pool.push_back(e);
    return e;
  }

  std::mt19937_64& rng() { return rng_; }
  bool chance(double p) { return std::uniform_real_distribution<double>(0, 1)(rng_) < p; }
  size_t pick(size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng_); }
  int64_t range(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng_); }

  float special_float() {
    static const float v[] = {0.0f, -0.0f, 1.0f, -1.0f, 0.5f, 2.5f, -2.5f, 3.0f, 1e30f, -1e-30f,
                              std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                              std::numeric_limits<float>::quiet_NaN(), 7.25f, -0.75f};
    if (chance(0.3)) return std::uniform_real_distribution<float>(-10, 10)(rng_);
    return v[pick(sizeof v / sizeof v[0])];
  }
  int64_t special_int() {
    static const int64_t v[] = {0, 1, -1, 2, 3, -7, 63, 64, 1000, std::numeric_limits<int64_t>::min(),
                                std::numeric_limits<int64_t>::max(), int64_t{1} << 32, 5};
    if (int_heavy_ || chance(0.4)) return range(-10, 70);
    return v[pick(sizeof v / sizeof v[0])];
  }

  // A deep copy with fresh nodes: structurally equal, pointer-distinct.
  static ir::Expr clone(const ir::Expr& e) {
    using namespace ir;
    std::vector<Expr> kids = children(e);
    for (Expr& k : kids) k = clone(k);
    switch (e.kind()) {
      case NodeKind::IntImm: return make_int(e.as<IntImm>()->value);
      case NodeKind::FloatImm: return make_float(e.as<FloatImm>()->value);
      case NodeKind::BoolImm: return make_bool(e.as<BoolImm>()->value);
      case NodeKind::Var: return Var::make(e.as<Var>()->var);
      case NodeKind::Param: return Param::make(e.as<Param>()->index, e.as<Param>()->name, e.type());
      case NodeKind::Symbol: return Symbol::make(e.as<Symbol>()->index, e.as<Symbol>()->name);
      case NodeKind::Unary: return Unary::make(e.as<Unary>()->op, kids[0]);
      case NodeKind::Binary: return Binary::make(e.as<Binary>()->op, kids[0], kids[1]);
      case NodeKind::Select: return Select::make(kids[0], kids[1], kids[2]);
      case NodeKind::Cast: return Cast::make(e.type(), kids[0]);
      case NodeKind::Load: {
        const Load* l = e.as<Load>();
        return Load::make(l->buffer, l->name, l->dtype, kids);
      }
    }
    return e;
  }

  // A random point and bindings for random_ir_spec() (symbols in [1, 9], vars in their domains
  // when `in_domain`, else also a little outside).
  struct Point {
    EvalEnv env;
    std::vector<int32_t> ti;
    std::vector<float> tf;
    std::vector<uint8_t> tb;
    std::vector<uint16_t> th;
    std::vector<uint8_t> tu;
  };
  void fill(Point& p, const dsl::CheckedSpec& cs, bool in_domain) {
    auto sym = [&](const char* n) { return p.env.symbols[cs.symbol_index(n)]; };
    p.env.symbols.assign(cs.symbols.size(), 1);
    for (auto& s : p.env.symbols) s = range(1, 9);
    int64_t B = sym("B"), H = sym("H"), Sq = sym("Sq"), Skv = sym("Skv");
    auto var = [&](int64_t n) { return in_domain ? range(0, n - 1) : range(-3, n + 2); };
    set_point(p.env, var(B), var(H), var(Sq), var(Skv), special_float());
    p.env.params = {Value::of_int(special_int()), Value::of_float(special_float()), Value::of_bool(chance(0.5))};
    p.ti.resize(Skv);
    for (auto& v : p.ti) v = static_cast<int32_t>(range(-12, 12));
    p.tf.resize(64);
    for (auto& v : p.tf) v = special_float();
    p.tb.resize(Sq);
    for (auto& v : p.tb) v = static_cast<uint8_t>(range(0, 2));
    p.th.resize(H * 16);
    for (auto& v : p.th) v = static_cast<uint16_t>(range(0, 0xffff));
    p.tu.resize(Skv);
    for (auto& v : p.tu) v = static_cast<uint8_t>(range(0, 255));
    p.env.buffers = {view(dsl::DType::I32, p.ti, {Skv}), view(dsl::DType::F32, p.tf, {64}), view(dsl::DType::Bool, p.tb, {Sq}),
                     view(dsl::DType::BF16, p.th, {H, 16}), view(dsl::DType::U8, p.tu, {Skv})};
  }

 private:
  ir::Expr index() { return gen(ir::Type::Int, 1); }

  ir::Expr leaf(ir::Type t) {
    using namespace ir;
    static const char* kSym[] = {"B", "H", "Hkv", "Sq", "Skv", "D"};
    switch (t) {
      case Type::Int: {
        switch (pick(6)) {
          case 0: return make_int(special_int());
          case 1: return Var::make(static_cast<VarId>(pick(5)));  // b h q kv kv_head
          case 2: {
            int s = static_cast<int>(pick(6));
            return Symbol::make(s, kSym[s]);
          }
          case 3: return Var::make(chance(0.5) ? VarId::Q : VarId::KV);
          case 4: return Param::make(0, "pi", Type::Int);
          default: return chance(0.5) ? Load::make(0, "ti", DType::I32, {index()}) : Load::make(4, "tu", DType::U8, {index()});
        }
      }
      case Type::Float: {
        switch (pick(5)) {
          case 0:
          case 1: return make_float(special_float());
          case 2: return Var::make(VarId::Score);
          case 3: return Param::make(1, "pf", Type::Float);
          default: return chance(0.5) ? Load::make(1, "tf", DType::F32, {index()}) : Load::make(3, "th", DType::BF16, {index(), index()});
        }
      }
      case Type::Bool: {
        switch (pick(4)) {
          case 0:
          case 1: return make_bool(chance(0.5));
          case 2: return Param::make(2, "pb", Type::Bool);
          default: return Load::make(2, "tb", DType::Bool, {index()});
        }
      }
    }
    return {};
  }

  ir::Expr node(ir::Type t, int d) {
    using namespace ir;
    auto sub = [&](Type st) { return gen(st, d); };
    // Operands that are often constants, so that identities and folding trigger.
    auto maybe_const = [&](Type st) {
      if (!chance(0.35)) return sub(st);
      if (st == Type::Int) return make_int(chance(0.5) ? static_cast<int64_t>(pick(3)) - 1 : special_int());
      if (st == Type::Float) return make_float(chance(0.5) ? (chance(0.5) ? 1.0f : -0.0f) : special_float());
      return make_bool(chance(0.5));
    };
    switch (t) {
      case Type::Int: {
        size_t k = pick(int_heavy_ ? 10 : 12);
        if (k < 2) {
          static const UnaryOp ops[] = {UnaryOp::Neg, UnaryOp::BitNot, UnaryOp::Abs, UnaryOp::Sign};
          return Unary::make(ops[pick(4)], sub(Type::Int));
        }
        if (k < 8) {
          static const BinaryOp ops[] = {BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::FloorDiv, BinaryOp::Mod, BinaryOp::Min,
                                         BinaryOp::Max, BinaryOp::BitAnd, BinaryOp::BitOr, BinaryOp::BitXor, BinaryOp::Shl, BinaryOp::Shr};
          BinaryOp op = ops[pick(12)];
          Expr a = sub(Type::Int), b = maybe_const(Type::Int);
          if (chance(0.2)) std::swap(a, b);
          return Binary::make(op, a, b);
        }
        if (k < 10) return Select::make(sub(Type::Bool), sub(Type::Int), maybe_const(Type::Int));
        return Cast::make(Type::Int, chance(0.7) ? sub(Type::Float) : sub(Type::Bool));
      }
      case Type::Float: {
        size_t k = pick(10);
        if (k < 3) {
          UnaryOp op = static_cast<UnaryOp>(pick(static_cast<size_t>(UnaryOp::Cos) + 1));
          if (op == UnaryOp::Not || op == UnaryOp::BitNot) op = UnaryOp::Neg;
          return Unary::make(op, sub(Type::Float));
        }
        if (k < 7) {
          static const BinaryOp ops[] = {BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div, BinaryOp::FloorDiv,
                                         BinaryOp::Mod, BinaryOp::Min, BinaryOp::Max, BinaryOp::Pow};
          Expr a = sub(Type::Float), b = maybe_const(Type::Float);
          if (chance(0.2)) std::swap(a, b);
          return Binary::make(ops[pick(9)], a, b);
        }
        if (k < 9) return Select::make(sub(Type::Bool), sub(Type::Float), maybe_const(Type::Float));
        return Cast::make(Type::Float, chance(0.8) ? sub(Type::Int) : sub(Type::Bool));
      }
      case Type::Bool: {
        size_t k = pick(10);
        if (k < 1) return Unary::make(UnaryOp::Not, sub(Type::Bool));
        if (k < 4) {
          static const BinaryOp ops[] = {BinaryOp::And, BinaryOp::Or, BinaryOp::Xor, BinaryOp::EQ, BinaryOp::NE};
          Expr a = sub(Type::Bool), b = maybe_const(Type::Bool);
          if (chance(0.2)) std::swap(a, b);
          return Binary::make(ops[pick(5)], a, b);
        }
        if (k < 9) {
          Type ct = int_heavy_ || chance(0.7) ? Type::Int : Type::Float;
          BinaryOp op = static_cast<BinaryOp>(static_cast<int>(BinaryOp::EQ) + static_cast<int>(pick(6)));
          Expr a = sub(ct), b = maybe_const(ct);
          if (chance(0.2)) std::swap(a, b);
          return Binary::make(op, a, b);
        }
        return Select::make(sub(Type::Bool), sub(Type::Bool), maybe_const(Type::Bool));
      }
    }
    return {};
  }

  std::mt19937_64 rng_;
  bool int_heavy_;
  std::vector<ir::Expr> pools_[3];
};

}  // namespace flexjit::test
