// Tests of block classification by concrete interval evaluation: the gallery masks on
// boxes above, below and on the diagonal, and soundness against brute force.
#include <catch2/catch.hpp>

#include "compiler/interpreter.h"
#include "compiler/ir/ir_printer.h"
#include "compiler/passes/interval_eval.h"
#include "compiler/passes/pipeline.h"
#include "unit/compiler/random_ir.h"
#include "unit/compiler/spec_fixture.h"

using namespace flexjit;
using namespace flexjit::ir;
using dsl::VarId;

namespace {

IntervalEnv box(const SpecIR& s, ConcreteInterval q, ConcreteInterval kv, std::vector<double> params = {}) {
  IntervalEnv env;
  env.vars[int(VarId::B)] = {0, 1};
  env.vars[int(VarId::H)] = {0, 3};
  env.vars[int(VarId::KvHead)] = {0, 3};
  env.vars[int(VarId::Q)] = q;
  env.vars[int(VarId::KV)] = kv;
  env.symbols = test::symbols(s.checked, {{"B", 2}, {"H", 4}, {"Hkv", 4}, {"Sq", 1024}, {"Skv", 1024}});
  env.params = std::move(params);
  return env;
}

}  // namespace

TEST_CASE("classify_box: causal", "[compiler][interval_eval]") {
  SpecIR s = optimize(test::make_spec(std::nullopt, "q >= kv"));
  CHECK(classify_box(s.mask_mod, box(s, {64, 127}, {0, 63})) == TriBool::True);    // below the diagonal
  CHECK(classify_box(s.mask_mod, box(s, {0, 63}, {64, 127})) == TriBool::False);   // above
  CHECK(classify_box(s.mask_mod, box(s, {0, 63}, {0, 63})) == TriBool::Unknown);   // on it
  CHECK(classify_box(s.mask_mod, box(s, {63, 63}, {0, 63})) == TriBool::True);     // the last row of a diagonal tile
  CHECK(classify_box(s.mask_mod, box(s, {0, 0}, {1, 63})) == TriBool::False);
  CHECK(classify_box(Expr(), box(s, {0, 63}, {0, 63})) == TriBool::True);          // no mask
}

TEST_CASE("classify_box: sliding window", "[compiler][interval_eval]") {
  SpecIR s = optimize(test::make_spec(std::nullopt, "q >= kv && q - kv < window", {}, {"window: int"}));
  std::vector<double> w = {128};
  CHECK(classify_box(s.mask_mod, box(s, {256, 319}, {192, 255}, w)) == TriBool::True);    // q - kv in [1, 127]
  CHECK(classify_box(s.mask_mod, box(s, {256, 319}, {0, 63}, w)) == TriBool::False);      // too far back
  CHECK(classify_box(s.mask_mod, box(s, {256, 319}, {320, 383}, w)) == TriBool::False);   // in the future
  CHECK(classify_box(s.mask_mod, box(s, {256, 319}, {128, 191}, w)) == TriBool::Unknown); // the window's edge
  CHECK(classify_box(s.mask_mod, box(s, {256, 319}, {256, 319}, w)) == TriBool::Unknown); // the diagonal
}

TEST_CASE("classify_box: prefix LM", "[compiler][interval_eval]") {
  SpecIR s = optimize(test::make_spec(std::nullopt, "kv < prefix || q >= kv", {}, {"prefix: int"}));
  std::vector<double> p = {100};
  CHECK(classify_box(s.mask_mod, box(s, {0, 63}, {0, 63}, p)) == TriBool::True);       // all inside the prefix
  CHECK(classify_box(s.mask_mod, box(s, {0, 63}, {128, 191}, p)) == TriBool::False);   // after the prefix, in the future
  CHECK(classify_box(s.mask_mod, box(s, {0, 63}, {64, 127}, p)) == TriBool::Unknown);  // the prefix ends inside
  CHECK(classify_box(s.mask_mod, box(s, {256, 319}, {128, 191}, p)) == TriBool::True); // causal part
}

TEST_CASE("classify_box: masks reading buffers are unknown unless decided elsewhere", "[compiler][interval_eval]") {
  SpecIR s = optimize(test::make_spec(std::nullopt, "doc[q] == doc[kv]", {"doc: i32[Sq]"}));
  CHECK(classify_box(s.mask_mod, box(s, {0, 63}, {0, 63})) == TriBool::Unknown);
  SpecIR t = optimize(test::make_spec(std::nullopt, "q >= kv && doc[q] == doc[kv]", {"doc: i32[Sq]"}));
  CHECK(classify_box(t.mask_mod, box(t, {0, 63}, {64, 127})) == TriBool::False);
  SpecIR u = optimize(test::make_spec(std::nullopt, "(kv % 64) < 64 && kv // 64 == q // 64"));
  CHECK(classify_box(u.mask_mod, box(u, {64, 127}, {64, 127})) == TriBool::True);
  CHECK(classify_box(u.mask_mod, box(u, {64, 127}, {128, 191})) == TriBool::False);
}

TEST_CASE("classify_box: float arithmetic is decided soundly", "[compiler][interval_eval]") {
  SpecIR s = optimize(test::make_spec(std::nullopt, "float(q) * scale >= float(kv)", {}, {"scale: float"}));
  CHECK(classify_box(s.mask_mod, box(s, {64, 127}, {0, 63}, {1.0})) == TriBool::True);
  CHECK(classify_box(s.mask_mod, box(s, {64, 127}, {0, 63}, {0.25})) == TriBool::Unknown);
  CHECK(classify_box(s.mask_mod, box(s, {64, 127}, {200, 300}, {0.5})) == TriBool::False);
  // NaN scale: every comparison is false.
  CHECK(classify_box(s.mask_mod, box(s, {64, 127}, {0, 63}, {std::nan("")})) != TriBool::True);
}

TEST_CASE("classify_box: never wrong on random masks and boxes (brute force)", "[compiler][interval_eval][random]") {
  SpecIR spec = test::random_ir_spec();
  const dsl::CheckedSpec& cs = spec.checked;
  int decided = 0, total = 0;
  for (uint64_t seed = 1; seed <= 600; ++seed) {
    test::RandomIR gen(seed * 104729, /*int_heavy=*/seed % 3 != 0);
    Expr mask = gen.gen(Type::Bool, 2 + static_cast<int>(seed % 4));
    if (seed % 2) mask = optimize(SpecIR{cs, {}, mask}).mask_mod;
    for (int k = 0; k < 6; ++k) {
      test::RandomIR::Point p;
      gen.fill(p, cs, /*in_domain=*/false);
      IntervalEnv env;
      env.symbols = p.env.symbols;
      env.params = {static_cast<double>(p.env.params[0].i), static_cast<double>(p.env.params[1].f), p.env.params[2].b ? 1.0 : 0.0};
      for (VarId v : {VarId::B, VarId::H, VarId::Q, VarId::KV}) {
        int64_t lo = gen.range(-4, 12), len = gen.range(0, 3);
        env.vars[int(v)] = {lo, lo + len};
      }
      int64_t kvh = gen.range(-2, 5);
      env.vars[int(VarId::KvHead)] = {kvh, kvh};
      TriBool c = classify_box(mask, env);
      ++total;
      if (c == TriBool::Unknown) continue;
      ++decided;
      p.env.vars[int(VarId::KvHead)] = kvh;
      for (int64_t b = env.vars[0].lo; b <= env.vars[0].hi; ++b)
        for (int64_t h = env.vars[1].lo; h <= env.vars[1].hi; ++h)
          for (int64_t q = env.vars[2].lo; q <= env.vars[2].hi; ++q)
            for (int64_t kv = env.vars[3].lo; kv <= env.vars[3].hi; ++kv) {
              p.env.vars[int(VarId::B)] = b;
              p.env.vars[int(VarId::H)] = h;
              p.env.vars[int(VarId::Q)] = q;
              p.env.vars[int(VarId::KV)] = kv;
              bool v = evaluate(mask, p.env).b;
              INFO("seed " << seed << " mask " << print_inline(mask) << " at b=" << b << " h=" << h << " q=" << q << " kv=" << kv);
              CHECK(v == (c == TriBool::True));
            }
    }
  }
  CHECK(decided > total / 5);  // it is not just answering Unknown
}
