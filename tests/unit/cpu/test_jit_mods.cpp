// The JIT-compiled mods against the reference interpreter: random programs, the gallery,
// integer and float edge cases, error bits (including the interpreter's short-circuit
// rules), hoisting, the in-memory cache and vectorisation of the row loops.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <random>

#include "compiler/frontend.h"
#include "compiler/ir/ir_mutator.h"
#include "compiler/ir/ir_printer.h"
#include "compiler/passes/pipeline.h"
#include "runtime/cpu/llvm_jit.h"
#include "support/spec_loading.h"
#include "unit/compiler/random_ir.h"
#include "unit/compiler/spec_fixture.h"
#include "unit/cpu/gallery_inputs.h"
#include "unit/cpu/jit_harness.h"

using namespace flexjit;
using dsl::VarId;

namespace {

bool uses_score(const ir::Expr& e) {
  bool r = false;
  ir::for_each_node(e, [&](const ir::Expr& n) {
    if (const ir::Var* v = n.as<ir::Var>()) r |= v->var == VarId::Score;
  });
  return r;
}

void set_vars(EvalEnv& env, int64_t b, int64_t h, int64_t hkv, int64_t q, int64_t kv) {
  env.vars[int(VarId::B)] = b;
  env.vars[int(VarId::H)] = h;
  env.vars[int(VarId::KvHead)] = hkv;
  env.vars[int(VarId::Q)] = q;
  env.vars[int(VarId::KV)] = kv;
}

// Compares every column of one row segment of the JIT'd mods with the interpreter: values
// exactly (floats bit for bit up to NaN payloads and signed zeros) and the error bits as the
// interpreter's flags ORed over the same points.
void compare_segment(test::JitHarness& jh, const SpecIR& s, EvalEnv env, int64_t b, int64_t h, int64_t hkv, int64_t q, int64_t k0, int64_t n,
                     std::mt19937_64& rng, const std::string& what) {
  jh.start(b, h, hkv, q, k0);
  std::uniform_real_distribution<float> sd(-8, 8);
  if (s.mask_mod) {
    std::vector<uint8_t> keep(static_cast<size_t>(n), 7);
    uint32_t bits = jh.mask(keep);
    EvalFlags flags;
    for (int64_t j = 0; j < n; ++j) {
      set_vars(env, b, h, hkv, q, k0 + j);
      bool want = evaluate(s.mask_mod, env, &flags).b;
      INFO(what << "\nmask " << ir::print_inline(s.mask_mod) << "\nat b=" << b << " h=" << h << " q=" << q << " kv=" << k0 + j);
      REQUIRE(int(keep[static_cast<size_t>(j)]) == int(want));
    }
    INFO(what << "\nmask " << ir::print_inline(s.mask_mod) << " row q=" << q << " k0=" << k0 << " n=" << n << " bits=" << bits);
    CHECK(flags.index_out_of_range == ((bits & ~cpu::kZeroDivisorBit) != 0));
    CHECK(flags.int_div_by_zero == ((bits & cpu::kZeroDivisorBit) != 0));
  }
  std::vector<float> in(static_cast<size_t>(n)), out(static_cast<size_t>(n));
  std::vector<uint8_t> keep(static_cast<size_t>(n), 1);
  for (auto& x : in) x = (rng() % 5 == 0) ? test::RandomIR(rng()).special_float() : sd(rng);
  out = in;
  uint32_t bits = jh.score(out, keep);
  EvalFlags flags;
  for (int64_t j = 0; j < n; ++j) {
    set_vars(env, b, h, hkv, q, k0 + j);
    env.score = in[static_cast<size_t>(j)];
    float want = s.score_mod ? evaluate(s.score_mod, env, &flags).f : env.score;
    INFO(what << "\nscore_mod " << (s.score_mod ? ir::print_inline(s.score_mod) : "none") << "\nat b=" << b << " h=" << h << " q=" << q
              << " kv=" << k0 + j << " score=" << env.score << ": jit " << out[static_cast<size_t>(j)] << " interpreter " << want);
    REQUIRE(test::same_float(out[static_cast<size_t>(j)], want));
  }
  INFO(what << "\nscore_mod " << (s.score_mod ? ir::print_inline(s.score_mod) : "none") << " row q=" << q << " bits=" << bits);
  CHECK(flags.index_out_of_range == ((bits & ~cpu::kZeroDivisorBit) != 0));
  CHECK(flags.int_div_by_zero == ((bits & cpu::kZeroDivisorBit) != 0));
}

}  // namespace

TEST_CASE("JIT mods: random programs agree with the interpreter exactly", "[cpu][jit][random]") {
  SpecIR base = test::random_ir_spec();
  const dsl::CheckedSpec& cs = base.checked;
  for (uint64_t seed = 1; seed <= 160; ++seed) {
    test::RandomIR gen(seed * 7919, /*int_heavy=*/seed % 3 != 0);
    ir::Expr score = gen.gen(ir::Type::Float, 2 + static_cast<int>(seed % 4));
    ir::Expr mask;
    for (int tries = 0; tries < 8 && !mask; ++tries) {
      ir::Expr m = gen.gen(ir::Type::Bool, 2 + static_cast<int>(seed % 3));
      if (!uses_score(m)) mask = m;
    }
    SpecIR s{cs, score, mask};
    if (seed % 2) s = optimize(s);
    test::RandomIR::Point p;
    gen.fill(p, cs, /*in_domain=*/true);
    // kv_head = h (set_point) is in its domain only when Hkv = H.
    p.env.symbols[cs.symbol_index("Hkv")] = p.env.symbols[cs.symbol_index("H")];
    int tile = seed % 3 == 0 ? 64 : seed % 3 == 1 ? 4 : 2;
    test::JitHarness jh(s, p.env, tile, /*hoist=*/seed % 5 != 0);
    int64_t B = jh.symbol("B"), H = jh.symbol("H"), Sq = jh.symbol("Sq"), Skv = jh.symbol("Skv");
    std::mt19937_64 rng(seed);
    for (int k = 0; k < 4; ++k) {
      int64_t b = gen.range(0, B - 1), h = gen.range(0, H - 1), q = gen.range(0, Sq - 1);
      int64_t ntiles = (Skv + tile - 1) / tile, k0 = gen.range(0, ntiles - 1) * tile;
      int64_t n = std::min<int64_t>(tile, Skv - k0);
      compare_segment(jh, s, p.env, b, h, h, q, k0, n, rng, "seed " + std::to_string(seed));
    }
  }
}

TEST_CASE("JIT mods: the gallery agrees with the interpreter", "[cpu][jit][gallery]") {
  for (const auto& path : test::gallery_specs()) {
    dsl::Spec spec = test::load_spec(path);
    spec.dtype = dsl::DType::F32;
    SpecIR ir = build_spec_ir(spec);
    test::Sizes sz{2, 4, 2, 37, 150, spec.head_dim};
    std::mt19937_64 rng(std::hash<std::string>()(spec.name));
    std::vector<test::HostBuffer> buffers = test::make_buffers(spec, sz, rng);
    EvalEnv env = test::eval_env(ir.checked, sz, buffers, test::gallery_params(spec, sz));
    test::JitHarness jh(ir, env);
    for (int k = 0; k < 12; ++k) {
      int64_t b = rng() % sz.B, h = rng() % sz.H, q = rng() % sz.Sq, hkv = h / (sz.H / sz.Hkv);
      int64_t k0 = static_cast<int64_t>(rng() % 3) * 64, n = std::min<int64_t>(64, sz.Skv - k0);
      compare_segment(jh, ir, env, b, h, hkv, q, k0, n, rng, spec.name);
    }
  }
}

namespace {

const int64_t kSpecialInts[] = {0, 1, -1, 2, -2, 3, -7, 7, 63, 64, 65, -64, 1000, std::numeric_limits<int64_t>::min(),
                                std::numeric_limits<int64_t>::max(), int64_t{1} << 32, -(int64_t{1} << 40) - 3};

}  // namespace

TEST_CASE("JIT mods: integer operations match at edge values", "[cpu][jit]") {
  const char* ops[] = {"x // y", "x % y", "x << y", "x >> y", "x * y", "x + y", "x - y", "min(x, y)", "max(x, y)", "x & y", "x | y", "x ^ y",
                       "abs(x) + ~y", "-x", "sign(x) * y", "int(float(x))", "x // 64 + y % 64"};
  for (const char* op : ops) {
    // mask: (x OP y) == r, with r the interpreter's value of x OP y: the JIT must keep every
    // column, both as lowered and after the optimizer.
    SpecIR raw = test::make_spec(std::nullopt, std::string("(") + op + ") == r", {}, {"x: int", "y: int", "r: int"});
    ir::Expr value = raw.mask_mod.as<ir::Binary>()->a;
    for (const SpecIR& s : {raw, optimize(raw)}) {
      for (int64_t x : kSpecialInts)
        for (int64_t y : kSpecialInts) {
          EvalEnv env;
          env.symbols.assign(s.checked.symbols.size(), 3);
          env.params = {Value::of_int(x), Value::of_int(y), Value::of_int(0)};
          EvalFlags flags;
          int64_t want = evaluate(value, env, &flags).i;
          env.params[2] = Value::of_int(want);
          test::JitHarness jh(s, env);
          jh.start(0, 0, 0, 0, 0);
          std::vector<uint8_t> keep(3, 9);
          uint32_t bits = jh.mask(keep);
          INFO(op << " with x=" << x << " y=" << y << " expecting " << want);
          CHECK(keep == std::vector<uint8_t>(3, 1));
          CHECK(flags.int_div_by_zero == ((bits & cpu::kZeroDivisorBit) != 0));
        }
    }
  }
}

TEST_CASE("JIT mods: float operations match the C library bit for bit", "[cpu][jit]") {
  const char* exprs[] = {"exp(score)",    "exp2(score)",    "log(score)",         "log2(score)",     "log1p(score)",    "sqrt(score)",
                         "rsqrt(score)",  "tanh(score)",    "sigmoid(score)",     "sin(score)",      "cos(score)",      "floor(score)",
                         "ceil(score)",   "round(score)",   "abs(score)",         "sign(score)",     "-score",          "pow(score, y)",
                         "score / y",     "score // y",     "score % y",          "min(score, y)",   "max(score, y)",   "float(int(score))",
                         "where(score < y, score, y)",      "float(score == y)",  "float(score != y)", "score * y + 1.0", "pow(y, score)",
                         "pow(score, -1.0)", "pow(score, 0.5)", "pow(2.0, score)"};
  const float specials[] = {0.0f, -0.0f, 1.0f, -1.0f, 0.5f, 2.5f, -2.5f, 3.0f, 1e30f, -1e-30f, 1e-40f, 88.7f, -104.0f, 0.1f, 7.25f, -0.75f,
                            std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(), std::nanf(""),
                            16777217.0f, 9.3e18f, -9.3e18f};
  for (const char* e : exprs) {
    SpecIR s = optimize(test::make_spec(e, std::nullopt, {}, {"y: float"}));
    for (float y : specials) {
      EvalEnv env;
      env.symbols.assign(s.checked.symbols.size(), 40);
      env.params = {Value::of_float(y)};
      test::JitHarness jh(s, env);
      jh.start(0, 0, 0, 0, 0);
      std::vector<float> scores(std::begin(specials), std::end(specials));
      std::vector<uint8_t> keep(scores.size(), 1);
      jh.score(scores, keep);
      for (size_t i = 0; i < scores.size(); ++i) {
        env.score = specials[i];
        float want = evaluate(s.score_mod, env).f;
        INFO(e << " with score=" << specials[i] << " y=" << y << ": jit " << scores[i] << " interpreter " << want);
        CHECK(test::same_float(scores[i], want));
      }
    }
  }
}

TEST_CASE("JIT mods: error bits follow the interpreter's evaluation rules", "[cpu][jit][errors]") {
  struct Case {
    const char* score;
    const char* mask;
    bool flagged;
  };
  // bias has 16 entries and Skv = 40, so bias[kv] is out of range for kv >= 16.
  const Case cases[] = {
      {nullptr, "kv < 16 && bias[kv] > 0.0", false},   // && guard
      {nullptr, "kv >= 16 || bias[kv] > 0.0", false},  // || guard
      {nullptr, "bias[kv] > 0.0 || kv >= 16", true},   // evaluated first: flagged
      {nullptr, "bias[kv] > -2.0", true},
      {"score + where(kv < 16, bias[kv], 0.0)", nullptr, false},  // untaken select operand
      {"score + where(kv < 20, bias[kv], 0.0)", nullptr, true},
      {"score + bias[q]", nullptr, false},                            // q < Sq = 12 < 16: proven
      {"score + bias[-1] + bias[q - 12]", nullptr, false},            // negative indices wrap
      {"score + float(q // (kv - 3))", nullptr, true},                 // zero divisor at kv = 3
      {"score + where(kv != 3, float(q // (kv - 3)), 0.0)", nullptr, false},
      {"score + where(q < 100, bias[q + 20], 0.0)", nullptr, true},    // hoisted row value, reached
      {"score + where(q > 100, bias[q + 20], 0.0)", nullptr, false},   // hoisted row value, not reached
      {"score + where(kv < 16, bias[kv % 64], 0.0)", nullptr, false},  // hoisted column value, guarded
  };
  for (const Case& c : cases) {
    SpecIR s = optimize(test::make_spec(c.score ? std::optional<std::string>(c.score) : std::nullopt,
                                        c.mask ? std::optional<std::string>(c.mask) : std::nullopt, {"bias: f32[16]"}));
    std::vector<float> bias(16);
    for (int i = 0; i < 16; ++i) bias[static_cast<size_t>(i)] = 0.25f * static_cast<float>(i) - 1.0f;
    EvalEnv env;
    test::Sizes sz{1, 2, 2, 12, 40, 64};
    env.symbols = test::symbols(s.checked, {{"B", sz.B}, {"H", sz.H}, {"Hkv", sz.Hkv}, {"Sq", sz.Sq}, {"Skv", sz.Skv}, {"D", sz.D}});
    env.buffers = {test::view(dsl::DType::F32, bias, {16})};
    test::JitHarness jh(s, env);
    std::mt19937_64 rng(1);
    uint32_t any = 0;
    for (int64_t q = 0; q < sz.Sq; ++q) {
      compare_segment(jh, s, env, 0, 1, 1, q, 0, sz.Skv, rng, c.score ? c.score : c.mask);
      std::vector<uint8_t> keep(static_cast<size_t>(sz.Skv), 1);
      std::vector<float> scores(static_cast<size_t>(sz.Skv), 0.5f);
      any |= s.mask_mod ? jh.mask(keep) : jh.score(scores, keep);
    }
    INFO((c.score ? c.score : c.mask));
    CHECK((any != 0) == c.flagged);
  }
}

TEST_CASE("JIT mods: row, column and tile invariant work is hoisted", "[cpu][jit]") {
  dsl::Spec spec = test::load_spec(test::gallery_dir() / "sam_relpos.json");
  SpecIR ir = build_spec_ir(spec);
  test::Sizes sz{1, 2, 2, 8, 200, 64};
  std::mt19937_64 rng(5);
  std::vector<test::HostBuffer> buffers = test::make_buffers(spec, sz, rng);
  EvalEnv env = test::eval_env(ir.checked, sz, buffers, {});
  test::JitHarness jh(ir, env);
  // rel_h[b, h, q, kv // 64] is constant across a 64-wide KV tile, rel_w[b, h, q, kv % 64]
  // is the same in every tile.
  CHECK(jh.mods().info.tile_values >= 1);
  CHECK(jh.mods().info.col_values >= 1);
  CHECK(jh.mods().info.loads.empty());  // unchecked: kv // 64 < 64 holds for Skv = 200
}

TEST_CASE("JIT mods: compiled once per spec and tile size", "[cpu][jit]") {
  SpecIR s = optimize(test::make_spec("score * 0.5 + float(q - kv)", "q >= kv"));
  EvalEnv env;
  env.symbols.assign(s.checked.symbols.size(), 16);
  size_t before = cpu::jit_compile_count();
  { test::JitHarness a(s, env); }
  size_t after_first = cpu::jit_compile_count();
  { test::JitHarness b(s, env); }
  SpecIR same = optimize(test::make_spec("score * 0.5 + float(q - kv)", "q >= kv"));  // a different IR object, same text
  { test::JitHarness c(same, env); }
  CHECK(after_first == before + 1);
  CHECK(cpu::jit_compile_count() == after_first);
  { test::JitHarness d(s, env, /*tile_size=*/32); }
  CHECK(cpu::jit_compile_count() == after_first + 1);
}

TEST_CASE("JIT mods: the row loops are vectorised", "[cpu][jit]") {
  setenv("FLEXJIT_CPU_DUMP_IR", "1", 1);
  // A fresh constant keeps the spec out of the cache, so this compile records its IR.
  SpecIR s = optimize(test::make_spec("score + slope[h] * float(kv - q) * 0.123456", "q >= kv && q - kv < 1000", {"slope: f32[H]"}));
  std::vector<float> slope(4, 0.5f);
  EvalEnv env;
  env.symbols.assign(s.checked.symbols.size(), 4);
  env.buffers = {test::view(dsl::DType::F32, slope, {4})};
  test::JitHarness jh(s, env);
  std::string ir = cpu::JitEngine::instance().last_ir();
  unsetenv("FLEXJIT_CPU_DUMP_IR");
  INFO(ir);
  CHECK(ir.find("x float>") != std::string::npos);  // e.g. <16 x float>: the score loop
  CHECK(ir.find("x i8>") != std::string::npos);     // the keep bytes of the mask loop
}

TEST_CASE("JIT mods: vector math (libmvec) for tanh, log1p and pow stays within 4 ulp", "[cpu][jit]") {
  const cpu::TargetInfo& target = cpu::JitEngine::instance().target();
  if (target.vector_math_isas.empty()) {
    SUCCEED("no libmvec on this machine: the scalar C library is used");
    return;
  }
  auto ulps = [](float a, float b) {
    if (a != a && b != b) return int64_t{0};
    if (a == b) return int64_t{0};
    int32_t x, y;
    std::memcpy(&x, &a, 4);
    std::memcpy(&y, &b, 4);
    int64_t ox = x < 0 ? int64_t{INT32_MIN} - x : x, oy = y < 0 ? int64_t{INT32_MIN} - y : y;
    return std::abs(ox - oy);
  };
  setenv("FLEXJIT_CPU_DUMP_IR", "1", 1);
  // The functions alone: arithmetic around them could turn an ulp into a cancellation.
  for (const char* e : {"tanh(score)", "log1p(abs(score))", "pow(abs(score), y)"}) {
    SpecIR s = optimize(test::make_spec(e, std::nullopt, {}, {"y: float"}));
    EvalEnv env;
    env.symbols.assign(s.checked.symbols.size(), 64);
    env.params = {Value::of_float(1.7f)};
    test::JitHarness jh(s, env, 64, true, /*vector_math=*/true);
    std::string ir = cpu::JitEngine::instance().last_ir();
    INFO(e);
    CHECK(ir.find("@_ZGV") != std::string::npos);  // a libmvec variant is called from the vector loop
    std::mt19937_64 rng(3);
    std::uniform_real_distribution<float> dist(-60, 60);
    int64_t worst = 0;
    for (int row = 0; row < 200; ++row) {
      jh.start(0, 0, 0, row, 0);
      std::vector<float> in(64), out;
      for (float& x : in) x = dist(rng) * (row % 4 == 0 ? 0.01f : 1.0f);
      out = in;
      std::vector<uint8_t> keep(64, 1);
      jh.score(out, keep);
      for (size_t j = 0; j < in.size(); ++j) {
        env.score = in[j];
        float want = evaluate(s.score_mod, env).f;
        worst = std::max(worst, ulps(out[j], want));
      }
    }
    INFO("worst " << worst << " ulp");
    CHECK(worst <= 4);
  }
  unsetenv("FLEXJIT_CPU_DUMP_IR");
}
