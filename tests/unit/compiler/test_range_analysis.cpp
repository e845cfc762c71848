// Tests of the symbolic range analysis: bounds, load checks with launch-time obligations,
// the int32 obligation, and soundness against the interpreter on random programs.
#include <catch2/catch.hpp>

#include <limits>

#include "compiler/codegen/decode_source.h"
#include "compiler/interpreter.h"
#include "compiler/ir/ir_mutator.h"
#include "compiler/ir/ir_printer.h"
#include "compiler/passes/cse.h"
#include "compiler/passes/fold_constants.h"
#include "compiler/passes/pipeline.h"
#include "compiler/passes/simplify.h"
#include "compiler/passes/range_analysis.h"
#include "unit/compiler/random_ir.h"
#include "unit/compiler/spec_fixture.h"

using namespace flexjit;
using namespace flexjit::ir;
using Status = LoadCheck::Status;

namespace {

struct Analysed {
  SpecIR ir;
  RangeInfo info;
};

Analysed analyse(std::optional<std::string> score, std::optional<std::string> mask, const std::vector<std::string>& buffers = {},
                 const std::vector<std::string>& params = {}, bool decode = false) {
  SpecIR s = optimize(test::make_spec(std::move(score), std::move(mask), buffers, params));
  VarDomains d = decode ? decode_var_domains(s.checked) : VarDomains::forward(s.checked);
  RangeInfo info = analyze_ranges({s.score_mod, s.mask_mod}, s.checked, d);
  return {s, std::move(info)};
}

const LoadCheck& check_named(const RangeInfo& info, const std::string& name) {
  for (const LoadCheck& c : info.loads)
    if (c.load.as<Load>()->name == name) return c;
  FAIL("no load of " << name);
  throw 0;
}

std::vector<Expr> optimize_roots(const std::vector<Expr>& roots) {
  std::vector<Expr> r;
  for (const Expr& e : roots) r.push_back(simplify(fold_constants(e)));
  return cse(r);
}

bool holds(const Expr& cond, const SpecIR& s, const std::map<std::string, int64_t>& syms) {
  EvalEnv env;
  env.symbols = test::symbols(s.checked, syms);
  Value v = evaluate(cond, env);
  REQUIRE(v.type == Type::Bool);
  return v.b;
}

}  // namespace

TEST_CASE("ranges: SAM rel_w is proven, rel_h is conditional on Skv", "[compiler][ranges]") {
  Analysed a = analyse("score + rel_h[b, h, q, kv // 64] + rel_w[b, h, q, kv % 64]", std::nullopt,
                       {"rel_h: bf16[B, H, Sq, 64]", "rel_w: bf16[B, H, Sq, 64]"});
  REQUIRE(a.info.loads.size() == 2);
  const LoadCheck& w = check_named(a.info, "rel_w");
  CHECK(w.status == Status::Proven);
  CHECK_FALSE(w.obligation);
  CHECK_FALSE(w.may_be_negative);
  const LoadCheck& h = check_named(a.info, "rel_h");
  REQUIRE(h.status == Status::Conditional);
  REQUIRE(h.obligation);
  CHECK_FALSE(h.may_be_negative);
  CHECK(print_inline(h.obligation) == "((Skv - 1) // 64) <= 63");
  CHECK(holds(h.obligation, a.ir, {{"Skv", 4096}}));
  CHECK(holds(h.obligation, a.ir, {{"Skv", 1}}));
  CHECK_FALSE(holds(h.obligation, a.ir, {{"Skv", 4097}}));
  CHECK(a.info.describe(h.load.as<Load>()->indices[3]) == "[0, (Skv - 1) // 64]");
  CHECK(a.info.describe(w.load.as<Load>()->indices[3]) == "[0, min(Skv - 1, 63)]");
  CHECK(a.info.describe(h.load.as<Load>()->indices[0]) == "[0, B - 1]");
  REQUIRE(h.index_ranges.size() == 4);
  CHECK(print_inline(h.index_ranges[2].hi) == "Sq - 1");
  CHECK(a.info.check_of(h.load) == &h);
  CHECK(a.info.check_of(make_int(0)) == nullptr);
  CHECK_FALSE(a.info.int32_obligation);  // every int here provably fits in int32
}

TEST_CASE("ranges: relative bias needs the bias to be long enough", "[compiler][ranges]") {
  Analysed a = analyse("score + bias[h, q - kv + Skv - 1]", std::nullopt, {"bias: f32[H, L]"});
  const LoadCheck& c = check_named(a.info, "bias");
  REQUIRE(c.status == Status::Conditional);
  CHECK(a.info.describe(c.load.as<Load>()->indices[1]) == "[0, (Sq + Skv) - 2]");
  CHECK_FALSE(c.may_be_negative);
  CHECK(print_inline(c.obligation) == "(Sq + Skv) <= (L + 1)");
  CHECK(holds(c.obligation, a.ir, {{"Sq", 4096}, {"Skv", 4096}, {"L", 8191}}));
  CHECK_FALSE(holds(c.obligation, a.ir, {{"Sq", 4096}, {"Skv", 4096}, {"L", 8190}}));
  CHECK(holds(c.obligation, a.ir, {{"Sq", 1}, {"Skv", 4096}, {"L", 4096}}));
}

TEST_CASE("ranges: decode queries lie among the KV positions (each sequence's last q_len of its kv_len)", "[compiler][ranges]") {
  Analysed a = analyse("score + bias[h, q - kv + Skv - 1]", std::nullopt, {"bias: f32[H, L]"}, {}, /*decode=*/true);
  const LoadCheck& c = check_named(a.info, "bias");
  REQUIRE(c.status == Status::Conditional);
  CHECK_FALSE(c.may_be_negative);
  CHECK(a.info.describe(c.load.as<Load>()->indices[1]) == "[0, (Skv * 2) - 2]");
  CHECK(holds(c.obligation, a.ir, {{"Sq", 1}, {"Skv", 4096}, {"L", 8191}}));
  CHECK_FALSE(holds(c.obligation, a.ir, {{"Sq", 1}, {"Skv", 4096}, {"L", 8190}}));
  // A query position alone: a sequence shorter than the plan's bound puts its queries below Skv - Sq.
  Analysed pos = analyse("score + t[q - (Skv - Sq)]", std::nullopt, {"t: f32[Sq]"}, {}, /*decode=*/true);
  CHECK(check_named(pos.info, "t").status != Status::Proven);
}

TEST_CASE("ranges: indices from loads and runtime params are unproven", "[compiler][ranges]") {
  Analysed a = analyse("score + bias[offset[q]] + t[w]", std::nullopt, {"bias: f32[L]", "offset: i32[Sq]", "t: f32[16]"}, {"w: int"});
  REQUIRE(a.info.loads.size() == 3);
  CHECK(a.info.loads[0].load.as<Load>()->name == "offset");  // post-order: the inner load first
  CHECK(check_named(a.info, "offset").status == Status::Proven);
  const LoadCheck& bias = check_named(a.info, "bias");
  CHECK(bias.status == Status::Unproven);
  CHECK_FALSE(bias.obligation);
  CHECK(bias.may_be_negative);
  CHECK(a.info.describe(bias.load.as<Load>()->indices[0]) == "[-2147483648, 2147483647]");
  const LoadCheck& t = check_named(a.info, "t");
  CHECK(t.status == Status::Unproven);
  CHECK(t.may_be_negative);
  CHECK(a.info.unbounded_ints.count(t.load.as<Load>()->indices[0].get()) == 1);
}

TEST_CASE("ranges: statically out-of-range and statically negative indices", "[compiler][ranges]") {
  Analysed a = analyse("t[kv % 64 + 64] + u[-1] + u[q - Sq]", std::nullopt, {"t: f32[64]", "u: f32[Sq]"});
  CHECK(check_named(a.info, "t").status == Status::Unproven);  // index >= 64 always
  for (const LoadCheck& c : a.info.loads)
    if (c.load.as<Load>()->name == "u") {
      CHECK(c.status == Status::Unproven);  // negative: valid only through the wrap
      CHECK(c.may_be_negative);
    }
}

TEST_CASE("ranges: int32 obligation", "[compiler][ranges]") {
  Analysed causal = analyse(std::nullopt, "q >= kv");
  CHECK_FALSE(causal.info.int32_obligation);
  CHECK(causal.info.unbounded_ints.empty());

  Analysed prod = analyse(std::nullopt, "q * kv < 100");
  REQUIRE(prod.info.int32_obligation);
  CHECK(holds(prod.info.int32_obligation, prod.ir, {{"Sq", 4096}, {"Skv", 4096}}));
  CHECK_FALSE(holds(prod.info.int32_obligation, prod.ir, {{"Sq", 100000}, {"Skv", 100000}}));
  CHECK(holds(prod.info.int32_obligation, prod.ir, {{"Sq", 46341}, {"Skv", 46341}}));   // 46340^2 < 2^31
  CHECK_FALSE(holds(prod.info.int32_obligation, prod.ir, {{"Sq", 46342}, {"Skv", 46342}}));  // 46341^2 > 2^31 - 1

  // A constant that cannot fit keeps just that node 64-bit.
  Analysed wide = analyse(std::nullopt, "q * 10000000000 > kv");
  CHECK_FALSE(wide.info.int32_obligation);
  CHECK(wide.info.wide_ints.size() >= 1);

  // A runtime parameter is unbounded.
  Analysed param = analyse(std::nullopt, "q - kv < w", {}, {"w: int"});
  CHECK(param.info.unbounded_ints.size() == 1);
}

TEST_CASE("ranges: interval rules", "[compiler][ranges]") {
  auto describe_int = [](const std::string& text, const std::vector<std::string>& buffers = {}) {
    Analysed a = analyse("float(" + text + ")", std::nullopt, buffers);
    return a.info.describe(a.ir.score_mod.as<Cast>()->a);
  };
  CHECK(describe_int("q - kv") == "[1 - Skv, Sq - 1]");
  CHECK(describe_int("abs(q - kv)") == "[0, max(Skv - 1, Sq - 1)]");
  CHECK(describe_int("q * 3 - 1") == "[-1, (Sq * 3) - 4]");
  CHECK(describe_int("-2 * h") == "[2 - (H * 2), 0]");
  CHECK(describe_int("q * kv") == "[0, (((Sq * Skv) - Sq) - Skv) + 1]");
  CHECK(describe_int("(q - kv) // 64") == "[(1 - Skv) // 64, (Sq - 1) // 64]");
  CHECK(describe_int("(q - kv) % 64") == "[0, 63]");
  CHECK(describe_int("q % -8") == "[-7, 0]");
  CHECK(describe_int("kv & 7") == "[0, min(Skv - 1, 7)]");
  CHECK(describe_int("q | kv") == "[0, (Sq + Skv) - 2]");
  CHECK(describe_int("b | 3") == "[3, B + 2]");
  CHECK(describe_int("q ^ 5") == "[0, Sq + 4]");
  CHECK(describe_int("(kv & 7) | 8") == "[8, min(Skv - 1, 7) + 8]");
  CHECK(describe_int("kv >> 2") == "[0, (Skv - 1) // 4]");
  CHECK(describe_int("kv << 2") == "[0, (Skv * 4) - 4]");
  CHECK(describe_int("min(q, kv)") == "[0, min(Skv - 1, Sq - 1)]");
  CHECK(describe_int("max(q, 5)") == "[5, max(Sq - 1, 5)]");
  CHECK(describe_int("clamp(q - kv, 0, 63)") == "[0, min(Sq - 1, 63)]");
  CHECK(describe_int("where(q > kv, q, -1)") == "[-1, Sq - 1]");
  CHECK(describe_int("int(q > kv)") == "[0, 1]");
  CHECK(describe_int("t[q]", {"t: u8[Sq]"}) == "[0, 255]");
  CHECK(describe_int("t[q]", {"t: i64[Sq]"}) == "[-inf, +inf]");
  CHECK(describe_int("int(score)") == "[-inf, +inf]");
  CHECK(describe_int("Skv - Skv + q") == "[0, Sq - 1]");
  CHECK(describe_int("sign(q)") == "[0, 1]");
  CHECK(describe_int("q // kv") == "[0, Sq - 1]");
  // A factor whose sign depends on the shapes (27 - kv is positive when Skv <= 27).
  Analysed a = analyse("float(h * (27 - kv))", std::nullopt);
  const Interval& r = a.info.ranges.at(a.ir.score_mod.as<Cast>()->a.get());
  EvalEnv env;
  env.symbols = test::symbols(a.ir.checked, {{"H", 8}, {"Skv", 8}});
  CHECK(evaluate(r.lo, env).i <= 0);   // h = 0
  CHECK(evaluate(r.hi, env).i >= 189);  // h = 7, kv = 0
  env.symbols = test::symbols(a.ir.checked, {{"H", 8}, {"Skv", 100}});
  CHECK(evaluate(r.lo, env).i <= -504);  // h = 7, kv = 99
  // A product that could exceed int64 would wrap: no bound is claimed for it or what follows.
  CHECK(describe_int("q * 4611686018427387904") == "[-inf, +inf]");
  CHECK(describe_int("q * 4611686018427387904 // 4611686018427387904") == "[-inf, +inf]");
  CHECK(describe_int("b * h * q * kv") == "[-inf, +inf]");
  // Corner products whose coefficients do not fit in int64 leave the product unbounded.
  CHECK(describe_int("(q * 2097152 - 1099511627776) * (kv * 2097152 - 1099511627776)") == "[-inf, +inf]");  // bounds would not be safe to evaluate
}

TEST_CASE("ranges: bounds and load checks are sound on random programs", "[compiler][ranges][random]") {
  SpecIR spec = test::random_ir_spec();
  const dsl::CheckedSpec& cs = spec.checked;
  int proven = 0, conditional_true = 0, bounded = 0, checked_values = 0;
  for (uint64_t seed = 1; seed <= 1000; ++seed) {
    test::RandomIR gen(seed * 7919, /*int_heavy=*/true);
    std::vector<Expr> roots = {gen.gen(Type::Int, 4), gen.gen(Type::Bool, 4), gen.gen(Type::Int, 3)};
    if (seed % 2) roots = optimize_roots(roots);
    RangeInfo info = analyze_ranges(roots, cs, VarDomains::forward(cs));
    for (int k = 0; k < 8; ++k) {
      test::RandomIR::Point p;
      gen.fill(p, cs, /*in_domain=*/true);
      p.env.vars[int(dsl::VarId::KvHead)] = gen.range(0, p.env.symbols[cs.symbol_index("Hkv")] - 1);
      bool int32_ok = !info.int32_obligation || evaluate(info.int32_obligation, p.env).b;
      std::vector<Expr> ints;
      for_each_node(roots, [&](const Expr& e) {
        if (e.type() == Type::Int) ints.push_back(e);
      });
      REQUIRE(ints.size() == info.ranges.size());
      for (const Expr& e : ints) {
        const Node* node = e.get();
        const Interval& r = info.ranges.at(node);
        int64_t v = evaluate(e, p.env).i;
        INFO("seed " << seed << " node " << print_inline(e) << " = " << v << " in " << info.describe(e));
        if (r.lo) CHECK(evaluate(r.lo, p.env).i <= v);
        if (r.hi) CHECK(v <= evaluate(r.hi, p.env).i);
        if (r.lo && r.hi) ++bounded;
        if (int32_ok && r.lo && r.hi && !info.wide_ints.count(node))
          CHECK((v >= std::numeric_limits<int32_t>::min() && v <= std::numeric_limits<int32_t>::max()));
        ++checked_values;
      }
      for (const LoadCheck& c : info.loads) {
        bool claimed = c.status == Status::Proven || (c.status == Status::Conditional && evaluate(c.obligation, p.env).b);
        const Load* l = c.load.as<Load>();
        const dsl::BufferDecl& decl = cs.spec.buffers[l->buffer];
        for (size_t d = 0; d < l->indices.size(); ++d) {
          int64_t i = evaluate(l->indices[d], p.env).i;
          int64_t n = decl.shape[d].is_symbol ? p.env.symbols[cs.symbol_index(decl.shape[d].symbol)] : decl.shape[d].value;
          INFO("seed " << seed << " load " << print_inline(c.load) << " dim " << d << " index " << i << " extent " << n);
          if (claimed) CHECK((i >= 0 && i < n));
          if (!c.may_be_negative) CHECK(i >= 0);
        }
        if (c.status == Status::Proven) ++proven;
        if (c.status == Status::Conditional && evaluate(c.obligation, p.env).b) ++conditional_true;
      }
    }
  }
  CHECK(proven > 0);
  CHECK(conditional_true > 0);
  CHECK(bounded > checked_values / 4);
}

TEST_CASE("ranges: bounds built from shared sub-bounds stay small", "[compiler][ranges]") {
  // Each level uses the previous one twice; written out as trees the bounds would double in
  // size per level.
  std::string text = "let x0 = q;\n";
  for (int i = 0; i < 80; ++i)
    text += "let x" + std::to_string(i + 1) + " = min(x" + std::to_string(i) + ", kv) + max(x" + std::to_string(i) + ", h);\n";
  text += "x80 >= kv";
  Analysed a = analyse(std::nullopt, text);
  EvalEnv env;
  env.symbols = test::symbols(a.ir.checked, {{"Sq", 7}, {"Skv", 5}, {"H", 3}});
  test::set_point(env, 0, 2, 6, 4);
  int64_t v = evaluate(a.ir.mask_mod.as<Binary>()->a, env).i;
  const Interval& r = a.info.ranges.at(a.ir.mask_mod.as<Binary>()->a.get());
  if (r.hi) CHECK(v <= evaluate(r.hi, env).i);
  CHECK(a.info.describe(a.ir.mask_mod).size() < 100000);
}

TEST_CASE("ranges: a long chain of lets", "[compiler][ranges]") {
  std::string text = "let x0 = kv;\n";
  for (int i = 0; i < 300; ++i) text += "let x" + std::to_string(i + 1) + " = (x" + std::to_string(i) + " * 3 + q) % 1000;\n";
  text += "t[x300 // 10]";
  Analysed a = analyse(text, std::nullopt, {"t: f32[100]"});
  REQUIRE(a.info.loads.size() == 1);
  CHECK(a.info.loads[0].status == Status::Proven);  // [0, 999] // 10 is in [0, 99]
}
