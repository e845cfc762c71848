// Tests of constant folding, simplification, CSE and the pipeline: specific rewrites, and
// value (and checked-mode flag) preservation on random programs.
#include <catch2/catch.hpp>

#include <unordered_set>

#include "compiler/interpreter.h"
#include "compiler/ir/ir_equality.h"
#include "compiler/ir/ir_mutator.h"
#include "compiler/ir/ir_printer.h"
#include "compiler/passes/cse.h"
#include "compiler/passes/fold_constants.h"
#include "compiler/passes/pipeline.h"
#include "compiler/passes/simplify.h"
#include "dsl/error.h"
#include "unit/compiler/random_ir.h"
#include "unit/compiler/spec_fixture.h"

using namespace flexjit;
using namespace flexjit::ir;
using flexjit::test::make_spec;

namespace {

size_t count_nodes(const std::vector<Expr>& roots) {
  size_t n = 0;
  for_each_node(roots, [&](const Expr&) { ++n; });
  return n;
}

// The simplified score_mod (or mask_mod when there is no score_mod) of a one-line program.
std::string simplified(const std::string& score, const std::vector<std::string>& buffers = {},
                       const std::vector<std::string>& params = {}) {
  SpecIR s = make_spec(score, std::nullopt, buffers, params);
  return print_inline(simplify(s.score_mod));
}
std::string simplified_mask(const std::string& mask, const std::vector<std::string>& buffers = {},
                            const std::vector<std::string>& params = {}) {
  SpecIR s = make_spec(std::nullopt, mask, buffers, params);
  return print_inline(simplify(s.mask_mod));
}

}  // namespace

TEST_CASE("fold_constants: immediate operands become immediates", "[compiler][passes]") {
  SpecIR s = make_spec("score + float(2 * 3 + 1) + cap * 2.0 + float(-7 // 2)", std::nullopt, {}, {"const cap: float = 30"});
  CHECK(print_inline(fold_constants(s.score_mod)) == "((score + 7.0) + 60.0) + -4.0");
  SpecIR m = make_spec(std::nullopt, "q >= kv && (3 > 2 || w > 0)", {}, {"const w: int = 5"});
  CHECK(print_inline(fold_constants(m.mask_mod)) == "(q >= kv) && true");
  SpecIR t = make_spec("round(2.5) + sign(-0.0) + float(int(-2.7))", std::nullopt);
  Expr f = fold_constants(t.score_mod);
  REQUIRE(f.as<FloatImm>());
  CHECK(f.as<FloatImm>()->value == 2.0f + 0.0f - 2.0f);
}

TEST_CASE("fold_constants: integer division by a constant zero is not folded", "[compiler][passes]") {
  // Sema rejects a constant zero divisor in source; passes may still meet one (e.g. after
  // folding), and it must keep its runtime meaning: 0 and the checked-mode flag.
  Expr q = Var::make(dsl::VarId::Q);
  Expr zero = Binary::make(BinaryOp::Sub, make_int(3), make_int(3));
  Expr e = Binary::make(BinaryOp::Add, Binary::make(BinaryOp::FloorDiv, q, zero), Binary::make(BinaryOp::Mod, make_int(7), zero));
  for (Expr f : {fold_constants(e), simplify(e)}) {
    std::string text = print_inline(f);
    CHECK(text.find("q // 0") != std::string::npos);
    CHECK(text.find("7 % 0") != std::string::npos);
    EvalEnv env;
    EvalFlags flags;
    CHECK(evaluate(f, env, &flags).i == 0);
    CHECK(flags.int_div_by_zero);
  }
}

TEST_CASE("simplify: integer identities and reassociation", "[compiler][passes]") {
  CHECK(simplified("float(q + 0)") == "float(q)");
  CHECK(simplified("float(0 + q)") == "float(q)");
  CHECK(simplified("float(q * 1)") == "float(q)");
  CHECK(simplified("float(q * 0)") == "0.0");
  CHECK(simplified("float(q - q)") == "0.0");
  CHECK(simplified("float((q + 1) + 2)") == "float(q + 3)");
  CHECK(simplified("float((q - 1) + 1)") == "float(q)");
  CHECK(simplified("float((q + 5) - 7)") == "float(q - 2)");
  CHECK(simplified("float(2 + q)") == "float(q + 2)");
  CHECK(simplified("float(3 * (2 * q))") == "float(q * 6)");
  CHECK(simplified("float(q // 1 + kv % 1)") == "float(q)");
  CHECK(simplified("float(min(q, q) + max(kv, kv))") == "float(q + kv)");
  CHECK(simplified("float(min(min(q, 5), 3))") == "float(min(q, 3))");
  CHECK(simplified("float((kv // 8) // 8)") == "float(kv // 64)");
}

TEST_CASE("simplify: rewrites that would drop a flagging subexpression are not done", "[compiler][passes]") {
  CHECK(simplified("float(t[q] * 0)", {"t: i32[Sq]"}) == "float(t[q] * 0)");
  CHECK(simplified("float(t[q] - t[q])", {"t: i32[Sq]"}) == "float(t[q] - t[q])");
  CHECK(simplified("float(q // kv - q // kv)") == "float((q // kv) - (q // kv))");
  CHECK(simplified("float(q // 2 - q // 2)") == "0.0");  // a nonzero constant divisor never flags
  CHECK(simplified_mask("t[q] > 0 && false", {"t: i32[Sq]"}) == "(t[q] > 0) && false");
  CHECK(simplified_mask("false && t[q] > 0", {"t: i32[Sq]"}) == "false");  // never evaluated
  CHECK(simplified("where(true, 1.0, float(t[q]))", {"t: i32[Sq]"}) == "1.0");
}

TEST_CASE("simplify: float identities are only the exact ones", "[compiler][passes]") {
  CHECK(simplified("score + 0.0") == "score + 0.0");  // -0.0 + 0.0 is +0.0
  CHECK(simplified("score + -0.0") == "score");
  CHECK(simplified("score - 0.0") == "score");
  CHECK(simplified("score * 1.0") == "score");
  CHECK(simplified("score / 1.0") == "score");
  CHECK(simplified("score - score") == "score - score");  // inf - inf is nan
  CHECK(simplified("2.0 * score") == "score * 2.0");
  CHECK(simplified("-(-score)") == "score");
  CHECK(simplified("min(1.0, score)") == "min(score, 1.0)");
}

TEST_CASE("simplify: bool and select identities", "[compiler][passes]") {
  CHECK(simplified_mask("q > kv && true") == "q > kv");
  CHECK(simplified_mask("true && q > kv") == "q > kv");
  CHECK(simplified_mask("q > kv || false") == "q > kv");
  CHECK(simplified_mask("q > kv || true") == "true");
  CHECK(simplified_mask("!!(q > kv)") == "q > kv");
  CHECK(simplified_mask("!(q > kv)") == "q <= kv");
  CHECK(simplified_mask("q == q") == "true");
  CHECK(simplified_mask("q < q") == "false");
  CHECK(simplified_mask("1 < q") == "q > 1");
  CHECK(simplified_mask("(q > kv) == true") == "q > kv");
  CHECK(simplified_mask("(q > kv) != true") == "q <= kv");
  CHECK(simplified_mask("(q > kv) ^ false") == "q > kv");
  CHECK(simplified_mask("where(true, q > kv, kv > q)") == "q > kv");
  CHECK(simplified_mask("where(false, q > kv, kv > q)") == "kv > q");
  CHECK(simplified_mask("where(q > 2, kv > q, kv > q)") == "kv > q");
  CHECK(simplified_mask("where(q > 2, true, false)") == "q > 2");
  CHECK(simplified_mask("where(q > 2, false, true)") == "q <= 2");
  CHECK(simplified("where(!(score > 0.0), 1.0, 2.0)") == "select(score > 0.0, 2.0, 1.0)");
  CHECK(simplified_mask("!(score_ == score_)", {}, {"score_: float"}) == "$score_ != $score_");
}

TEST_CASE("cse: equal subtrees become one node, shared across score_mod and mask_mod", "[compiler][passes]") {
  SpecIR s = make_spec("score + float(q - kv) + t[kv // 64] * t[kv // 64]", "q - kv >= 0 && t[kv // 64] > 0.0", {"t: f32[64]"});
  std::vector<Expr> out = cse({s.score_mod, s.mask_mod});
  REQUIRE(out.size() == 2);
  std::vector<const Node*> subs, loads;
  for_each_node(out, [&](const Expr& e) {
    if (const Binary* b = e.as<Binary>(); b && b->op == BinaryOp::Sub) subs.push_back(e.get());
    if (e.as<Load>()) loads.push_back(e.get());
  });
  CHECK(subs.size() == 1);   // q - kv once, used by both programs
  CHECK(loads.size() == 1);  // t[kv // 64] once
  CHECK(count_nodes(out) < count_nodes({s.score_mod, s.mask_mod}));
  // Every node of the result is structurally distinct.
  std::vector<Expr> all;
  for_each_node(out, [&](const Expr& e) { all.push_back(e); });
  for (size_t i = 0; i < all.size(); ++i)
    for (size_t j = i + 1; j < all.size(); ++j) CHECK_FALSE(equal(all[i], all[j]));
  // Null roots stay null; order is kept.
  std::vector<Expr> with_null = cse({Expr(), s.mask_mod});
  CHECK_FALSE(with_null[0]);
  CHECK(equal(with_null[1], s.mask_mod));
  // -0.0 and 0.0 are different constants.
  std::vector<Expr> zeros = cse({make_float(0.0f), make_float(-0.0f)});
  CHECK_FALSE(zeros[0].same_as(zeros[1]));
}

TEST_CASE("cse: a deep chain of duplicated lets stays linear", "[compiler][passes]") {
  // x_{i+1} = x_i + x_i: a DAG of 60 levels whose tree form has 2^60 nodes.
  std::string text;
  text += "let x0 = q;\n";
  for (int i = 0; i < 60; ++i) text += "let x" + std::to_string(i + 1) + " = x" + std::to_string(i) + " + x" + std::to_string(i) + ";\n";
  text += "x60 >= kv";
  SpecIR s = make_spec(std::nullopt, text);
  SpecIR o = optimize(s);
  CHECK(count_nodes({o.mask_mod}) <= 64);
  EvalEnv env;
  test::set_point(env, 0, 0, 1, 0);
  CHECK(evaluate(o.mask_mod, env).b == evaluate(s.mask_mod, env).b);
}

TEST_CASE("pipeline: pass names, dump hook and errors", "[compiler][passes]") {
  CHECK(pass_names() == std::vector<std::string>{"lower", "fold", "simplify", "cse"});
  SpecIR s = make_spec("score + float(q - kv + 0)", "q - kv >= 0");
  std::vector<std::string> seen;
  std::vector<std::string> texts;
  SpecIR o = optimize(s, [&](const std::string& pass, const SpecIR& ir) {
    seen.push_back(pass);
    texts.push_back(print_inline(ir.score_mod));
  });
  CHECK(seen == pass_names());
  CHECK(texts[0] == "score + float((q - kv) + 0)");
  CHECK(texts[2] == "score + float(q - kv)");
  // After CSE score_mod and mask_mod share q - kv.
  const Binary* in_mask = o.mask_mod.as<Binary>();
  REQUIRE(in_mask);
  std::unordered_set<const Node*> score_nodes;
  for_each_node(o.score_mod, [&](const Expr& e) { score_nodes.insert(e.get()); });
  CHECK(score_nodes.count(in_mask->a.get()) == 1);
  CHECK_NOTHROW(check_pass_name("simplify"));
  try {
    check_pass_name("simplfy");
    FAIL("no error");
  } catch (const flexjit::Error& e) {
    std::string m = e.what();
    CHECK(m.find("simplfy") != std::string::npos);
    CHECK(m.find("lower, fold, simplify, cse") != std::string::npos);
  }
}

namespace {

bool same_flags(const EvalFlags& a, const EvalFlags& b) {
  return a.index_out_of_range == b.index_out_of_range && a.int_div_by_zero == b.int_div_by_zero;
}

}  // namespace

TEST_CASE("passes preserve values and flags on random programs", "[compiler][passes][random]") {
  SpecIR spec = test::random_ir_spec();
  size_t before = 0, after = 0, cases = 0;
  for (uint64_t seed = 1; seed <= 1500; ++seed) {
    test::RandomIR gen(seed);
    Type t = static_cast<Type>(seed % 3);
    Expr e = gen.gen(t, 2 + static_cast<int>(seed % 5));
    Expr other = gen.gen(Type::Bool, 3);
    Expr folded = fold_constants(e), simple = simplify(e);
    std::vector<Expr> shared = cse({e, other});
    SpecIR whole = spec;
    whole.score_mod = t == Type::Float ? e : Expr();
    whole.mask_mod = t == Type::Bool ? e : other;
    SpecIR opt = optimize(whole);
    before += count_nodes({e});
    after += count_nodes({simple});
    for (int k = 0; k < 12; ++k) {
      test::RandomIR::Point p;
      gen.fill(p, spec.checked, k % 3 != 0);
      EvalFlags f0, f1, f2, f3, f4;
      Value v0 = evaluate(e, p.env, &f0);
      Value v1 = evaluate(folded, p.env, &f1);
      Value v2 = evaluate(simple, p.env, &f2);
      Value v3 = evaluate(shared[0], p.env, &f3);
      INFO("seed " << seed << " point " << k << "\n" << print_ir(e) << "simplified:\n" << print_ir(simple));
      INFO("values " << v0.str() << " " << v1.str() << " " << v2.str() << " " << v3.str());
      CHECK(test::same_value(v0, v1));
      CHECK(test::same_value(v0, v2));
      CHECK(test::same_value(v0, v3));
      CHECK(same_flags(f0, f1));
      CHECK(same_flags(f0, f2));
      CHECK(same_flags(f0, f3));
      CHECK(test::same_value(evaluate(other, p.env), evaluate(shared[1], p.env)));
      Expr opt_e = t == Type::Float ? opt.score_mod : opt.mask_mod;
      if (t != Type::Int) {
        Value v4 = evaluate(opt_e, p.env, &f4);
        CHECK(test::same_value(v0, v4));
        CHECK(same_flags(f0, f4));
      }
      ++cases;
    }
  }
  CHECK(cases == 1500 * 12);
  CHECK(after < before);  // the generator's constants and duplicates give simplify work to do
}

namespace {

// Random source text of the language: well-typed by construction, so it exercises the real
// parser, checker and lowering before the passes.
class RandomSource {
 public:
  explicit RandomSource(uint64_t seed) : rng_(seed) {}
  std::string num(int d) {
    if (d == 0 || chance(0.25)) return atom_num();
    switch (pick(9)) {
      case 0: return "(" + num(d - 1) + " + " + num(d - 1) + ")";
      case 1: return "(" + num(d - 1) + " - " + num(d - 1) + ")";
      case 2: return "(" + num(d - 1) + " * " + num(d - 1) + ")";
      case 3: return "(" + num(d - 1) + " // (" + num(d - 1) + "))";
      case 4: return "(" + num(d - 1) + " % (" + num(d - 1) + "))";
      case 5: return std::string(chance(0.5) ? "min(" : "max(") + num(d - 1) + ", " + num(d - 1) + ")";
      case 6: return "where(" + cond(d - 1) + ", " + num(d - 1) + ", " + num(d - 1) + ")";
      case 7: return "abs(" + num(d - 1) + ")";
      default: return "-" + num(d - 1);
    }
  }
  std::string fnum(int d) {
    if (d == 0 || chance(0.2)) return chance(0.5) ? "score" : "float(" + num(1) + ")";
    switch (pick(6)) {
      case 0: return "(" + fnum(d - 1) + " / " + fnum(d - 1) + ")";
      case 1: return "tanh(" + fnum(d - 1) + ")";
      case 2: return "(" + fnum(d - 1) + " * 1.0 + 0.0)";
      case 3: return "round(" + fnum(d - 1) + ")";
      case 4: return "(" + num(d - 1) + " + " + fnum(d - 1) + ")";
      default: return "exp(" + fnum(d - 1) + ") - 1.5";
    }
  }
  std::string cond(int d) {
    if (d == 0 || chance(0.2)) return num(0) + " < " + num(0);
    static const char* cmp[] = {" < ", " <= ", " > ", " >= ", " == ", " != "};
    switch (pick(5)) {
      case 0: return "(" + cond(d - 1) + " && " + cond(d - 1) + ")";
      case 1: return "(" + cond(d - 1) + " || " + cond(d - 1) + ")";
      case 2: return "!(" + cond(d - 1) + ")";
      case 3: return "(" + fnum(d - 1) + std::string(cmp[pick(6)]) + fnum(d - 1) + ")";
      default: return "(" + num(d - 1) + std::string(cmp[pick(6)]) + num(d - 1) + ")";
    }
  }

 private:
  std::string atom_num() {
    static const char* a[] = {"q", "kv", "b", "h", "Sq", "Skv", "w", "t[kv]", "1", "2", "64", "0", "-3"};
    return a[pick(sizeof a / sizeof a[0])];
  }
  bool chance(double p) { return std::uniform_real_distribution<double>(0, 1)(rng_) < p; }
  size_t pick(size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng_); }
  std::mt19937_64 rng_;
};

}  // namespace

TEST_CASE("passes preserve values on random source programs", "[compiler][passes][random]") {
  int checked = 0;
  for (uint64_t seed = 1; seed <= 300; ++seed) {
    RandomSource src(seed);
    dsl::Spec spec;
    spec.score_mod = src.fnum(3);
    spec.mask_mod = src.cond(3);
    dsl::Diagnostics diags;
    dsl::add_buffer(spec, "t: i32[Skv]", "test", diags);
    dsl::add_param(spec, "w: int", "test", diags);
    auto cs = dsl::check_spec(spec, diags);
    if (!cs) continue;  // e.g. a literal zero divisor: a compile error by design
    SpecIR ir = lower_spec(*cs);
    SpecIR opt = optimize(ir);
    std::mt19937_64 rng(seed);
    std::vector<int32_t> t(7);
    for (auto& v : t) v = static_cast<int32_t>(rng() % 21) - 10;
    for (int k = 0; k < 10; ++k) {
      EvalEnv env;
      env.symbols = test::symbols(ir.checked, {{"Sq", 5}, {"Skv", 7}, {"B", 2}, {"H", 3}});
      env.params = {Value::of_int(static_cast<int64_t>(rng() % 9) - 4)};
      env.buffers = {test::view(dsl::DType::I32, t, {7})};
      test::set_point(env, rng() % 2, rng() % 3, rng() % 5, rng() % 7, static_cast<float>(static_cast<int>(rng() % 9) - 4) * 0.5f);
      EvalFlags f0, f1, g0, g1;
      INFO(*spec.score_mod << "\n" << *spec.mask_mod);
      CHECK(test::same_value(evaluate(ir.score_mod, env, &f0), evaluate(opt.score_mod, env, &f1)));
      CHECK(test::same_value(evaluate(ir.mask_mod, env, &g0), evaluate(opt.mask_mod, env, &g1)));
      CHECK(same_flags(f0, f1));
      CHECK(same_flags(g0, g1));
    }
    ++checked;
  }
  CHECK(checked > 200);
}
