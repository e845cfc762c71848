// Tests of the reference interpreter against docs/SEMANTICS.md and the gallery of docs/LANGUAGE.md.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>

#include "compiler/interpreter.h"
#include "unit/compiler/spec_fixture.h"

using namespace flexjit;
using flexjit::test::make_spec;

namespace {

constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
const float kNan = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

uint16_t to_bf16(float f) { return static_cast<uint16_t>(bits(f) >> 16); }  // exact for the values used here

// A binary int operation `a OP b` on runtime parameters.
struct IntBinop {
  SpecIR ir;
  explicit IntBinop(const std::string& op) : ir(make_spec("x " + op + " y", std::nullopt, {}, {"x: int", "y: int"})) {}
  Value operator()(int64_t a, int64_t b, EvalFlags* flags = nullptr) const {
    EvalEnv env;
    env.params = {Value::of_int(a), Value::of_int(b)};
    return evaluate(test::int_score(ir), env, flags);
  }
};

// A float expression over runtime float parameters x and y.
struct FloatExpr {
  SpecIR ir;
  explicit FloatExpr(const std::string& text) : ir(make_spec(text, std::nullopt, {}, {"x: float", "y: float"})) {}
  float operator()(float x, float y = 0) const {
    EvalEnv env;
    env.params = {Value::of_float(x), Value::of_float(y)};
    Value v = evaluate(ir.score_mod, env);
    REQUIRE(v.type == ir::Type::Float);
    return v.f;
  }
};

}  // namespace

TEST_CASE("interpreter: int floor division and modulo follow Python", "[compiler][interpreter]") {
  IntBinop div("//"), mod("%");
  CHECK(div(-7, 2).i == -4);
  CHECK(div(7, -2).i == -4);
  CHECK(div(7, 2).i == 3);
  CHECK(div(-7, -2).i == 3);
  CHECK(div(-8, 2).i == -4);
  CHECK(mod(-7, 2).i == 1);
  CHECK(mod(7, -2).i == -1);
  CHECK(mod(-7, -2).i == -1);
  CHECK(mod(7, 2).i == 1);
  CHECK(mod(-8, 2).i == 0);
  CHECK(div(kMin, -1).i == kMin);  // wraps
  CHECK(mod(kMin, -1).i == 0);
}

TEST_CASE("interpreter: a runtime zero divisor gives 0 and sets the flag", "[compiler][interpreter]") {
  IntBinop div("//"), mod("%");
  EvalFlags f;
  CHECK(div(5, 0, &f).i == 0);
  CHECK(f.int_div_by_zero);
  CHECK_FALSE(f.index_out_of_range);
  CHECK(f.first_error.find("division") != std::string::npos);
  EvalFlags g;
  CHECK(mod(-5, 0, &g).i == 0);
  CHECK(g.int_div_by_zero);
  EvalFlags h;
  CHECK(div(5, 1, &h).i == 5);
  CHECK_FALSE(h.int_div_by_zero);
  CHECK(h.first_error.empty());
}

TEST_CASE("interpreter: float floor division and modulo", "[compiler][interpreter]") {
  FloatExpr div("x // y"), mod("x % y");
  CHECK(div(-7.0f, 2.0f) == -4.0f);
  CHECK(div(7.0f, -2.0f) == -4.0f);
  CHECK(div(7.5f, 2.0f) == 3.0f);
  CHECK(mod(-7.0f, 2.0f) == 1.0f);
  CHECK(mod(7.0f, -2.0f) == -1.0f);
  CHECK(mod(5.5f, 2.0f) == 1.5f);
  CHECK(mod(-5.5f, 2.0f) == 0.5f);
  CHECK(bits(mod(6.0f, -3.0f)) == bits(0.0f));  // zero keeps fmodf's sign
  CHECK(std::isnan(mod(1.0f, 0.0f)));
  CHECK(div(1.0f, 0.0f) == kInf);
}

TEST_CASE("interpreter: ints are 64-bit and wrap", "[compiler][interpreter]") {
  SpecIR mul = make_spec("q * kv", std::nullopt);
  EvalEnv env;
  test::set_point(env, 0, 0, 3000000000LL, 3000000000LL);
  CHECK(evaluate(test::int_score(mul), env).i == 9000000000000000000LL);
  IntBinop add("+"), sub("-"), times("*");
  CHECK(add(kMax, 1).i == kMin);
  CHECK(sub(kMin, 1).i == kMax);
  CHECK(times(kMax, 2).i == -2);
  SpecIR neg = make_spec("-x + abs(x) * 0 + abs(y)", std::nullopt, {}, {"x: int", "y: int"});
  EvalEnv e2;
  e2.params = {Value::of_int(kMin), Value::of_int(kMin)};
  CHECK(evaluate(test::int_score(neg), e2).i == 0);  // -MIN == MIN and abs(MIN) == MIN: MIN + MIN wraps to 0
}

TEST_CASE("interpreter: shifts and bitwise operators", "[compiler][interpreter]") {
  IntBinop shl("<<"), shr(">>"), band("&"), bor("|"), bxor("^");
  CHECK(shl(1, 63).i == kMin);
  CHECK(shl(1, 64).i == 0);
  CHECK(shl(1, -1).i == 0);
  CHECK(shl(3, 2).i == 12);
  CHECK(shr(-8, 1).i == -4);
  CHECK(shr(-8, 70).i == -1);
  CHECK(shr(8, 70).i == 0);
  CHECK(shr(8, -1).i == 0);
  CHECK(band(12, 10).i == 8);
  CHECK(bor(12, 10).i == 14);
  CHECK(bxor(12, 10).i == 6);
  SpecIR bnot = make_spec("~a", std::nullopt, {}, {"a: int"});
  EvalEnv env;
  env.params = {Value::of_int(5)};
  CHECK(evaluate(test::int_score(bnot), env).i == -6);
}

TEST_CASE("interpreter: int() truncates and saturates, float() rounds", "[compiler][interpreter]") {
  SpecIR to_int = make_spec("int(x)", std::nullopt, {}, {"x: float"});
  auto ti = [&](float x) {
    EvalEnv env;
    env.params = {Value::of_float(x)};
    return evaluate(test::int_score(to_int), env).i;
  };
  CHECK(ti(2.7f) == 2);
  CHECK(ti(-2.7f) == -2);
  CHECK(ti(-0.5f) == 0);
  CHECK(ti(kNan) == 0);
  CHECK(ti(1e30f) == kMax);
  CHECK(ti(-1e30f) == kMin);
  CHECK(ti(kInf) == kMax);
  SpecIR to_float = make_spec("float(a)", std::nullopt, {}, {"a: int"});
  EvalEnv env;
  env.params = {Value::of_int(16777217)};  // 2^24 + 1 rounds to even
  CHECK(evaluate(to_float.score_mod, env).f == 16777216.0f);
  env.params = {Value::of_int(-3)};
  CHECK(evaluate(to_float.score_mod, env).f == -3.0f);
  SpecIR from_bool = make_spec("int(c) * 10 + int(!c)", std::nullopt, {}, {"c: bool"});
  env.params = {Value::of_bool(true)};
  CHECK(evaluate(test::int_score(from_bool), env).i == 10);
}

TEST_CASE("interpreter: round is half to even; sign, min, max", "[compiler][interpreter]") {
  FloatExpr round("round(x)");
  CHECK(round(0.5f) == 0.0f);
  CHECK(round(1.5f) == 2.0f);
  CHECK(round(2.5f) == 2.0f);
  CHECK(round(-1.5f) == -2.0f);
  CHECK(round(-2.5f) == -2.0f);
  CHECK(round(2.4999998f) == 2.0f);
  CHECK(round(2.5000002f) == 3.0f);
  CHECK(bits(round(-0.5f)) == bits(-0.0f));
  CHECK(round(8388609.0f) == 8388609.0f);
  FloatExpr sign("sign(x)");
  CHECK(sign(-3.0f) == -1.0f);
  CHECK(sign(2.0f) == 1.0f);
  CHECK(bits(sign(-0.0f)) == bits(0.0f));
  CHECK(std::isnan(sign(kNan)));
  FloatExpr mn("min(x, y)"), mx("max(x, y)");
  CHECK(mn(kNan, 1.0f) == 1.0f);
  CHECK(mx(2.0f, kNan) == 2.0f);
  CHECK(mn(-1.0f, 3.0f) == -1.0f);
  CHECK(std::isnan(mn(kNan, kNan)));
  // -0.0 is below +0.0, whatever the operand order.
  CHECK(bits(mn(-0.0f, 0.0f)) == bits(-0.0f));
  CHECK(bits(mn(0.0f, -0.0f)) == bits(-0.0f));
  CHECK(bits(mx(-0.0f, 0.0f)) == bits(0.0f));
  CHECK(bits(mx(0.0f, -0.0f)) == bits(0.0f));
  // A signaling NaN (as loaded from a buffer) also yields the other operand.
  uint32_t snan_bits = 0x7f800001u;
  float snan;
  std::memcpy(&snan, &snan_bits, 4);
  CHECK(mn(snan, 2.0f) == 2.0f);
  CHECK(mx(2.0f, snan) == 2.0f);
  FloatExpr floor("floor(x) + ceil(y)");
  CHECK(floor(-1.5f, -1.5f) == -3.0f);
  FloatExpr misc("sigmoid(x) + rsqrt(y)");
  CHECK(misc(0.0f, 4.0f) == 1.0f);
  FloatExpr tdiv("x / y");
  CHECK(tdiv(1.0f, 4.0f) == 0.25f);
  SpecIR int_div = make_spec("x / y", std::nullopt, {}, {"x: int", "y: int"});
  EvalEnv env;
  env.params = {Value::of_int(7), Value::of_int(2)};
  CHECK(evaluate(int_div.score_mod, env).f == 3.5f);  // true division is float
}

TEST_CASE("interpreter: bool operators", "[compiler][interpreter]") {
  auto run = [](const std::string& text, bool a, bool b) {
    SpecIR s = make_spec(std::nullopt, text, {}, {"u: bool", "v: bool"});
    EvalEnv env;
    env.params = {Value::of_bool(a), Value::of_bool(b)};
    return evaluate(s.mask_mod, env).b;
  };
  for (bool a : {false, true})
    for (bool b : {false, true}) {
      CHECK(run("u && v", a, b) == (a && b));
      CHECK(run("u and v", a, b) == (a && b));
      CHECK(run("u & v", a, b) == (a && b));
      CHECK(run("u || v", a, b) == (a || b));
      CHECK(run("u | v", a, b) == (a || b));
      CHECK(run("u ^ v", a, b) == (a != b));
      CHECK(run("u == v", a, b) == (a == b));
      CHECK(run("u != v", a, b) == (a != b));
      CHECK(run("!u", a, b) == !a);
      CHECK(run("not v", a, b) == !b);
      CHECK(run("u ? v : !v", a, b) == (a ? b : !b));
    }
}

TEST_CASE("interpreter: float comparisons are IEEE", "[compiler][interpreter]") {
  SpecIR s = make_spec(std::nullopt, "x < y || x == y || x > y", {}, {"x: float", "y: float"});
  EvalEnv env;
  env.params = {Value::of_float(kNan), Value::of_float(1.0f)};
  CHECK_FALSE(evaluate(s.mask_mod, env).b);
  env.params = {Value::of_float(-0.0f), Value::of_float(0.0f)};
  CHECK(evaluate(s.mask_mod, env).b);
}

TEST_CASE("interpreter: negative indices wrap, out-of-range ones clamp and flag", "[compiler][interpreter]") {
  SpecIR s = make_spec("t[a]", std::nullopt, {"t: i32[5]"}, {"a: int"});
  std::vector<int32_t> data = {10, 11, 12, 13, 14};
  auto run = [&](int64_t a, EvalFlags* f) {
    EvalEnv env;
    env.params = {Value::of_int(a)};
    env.buffers = {test::view(dsl::DType::I32, data, {5})};
    return evaluate(test::int_score(s), env, f).i;
  };
  EvalFlags f;
  CHECK(run(2, &f) == 12);
  CHECK(run(-1, &f) == 14);
  CHECK(run(-5, &f) == 10);
  CHECK_FALSE(f.index_out_of_range);
  EvalFlags g;
  CHECK(run(-6, &g) == 10);
  CHECK(g.index_out_of_range);
  CHECK(g.first_error.find("t[-6]") != std::string::npos);
  EvalFlags h;
  CHECK(run(5, &h) == 14);
  CHECK(h.index_out_of_range);
  CHECK(h.first_error.find("t[5]") != std::string::npos);
  CHECK(h.first_error.find("[5]") != std::string::npos);
  EvalFlags k;
  CHECK(run(1000000000000LL, &k) == 14);
  CHECK(k.index_out_of_range);
}

TEST_CASE("interpreter: multi-dimensional loads use strides; every dtype converts", "[compiler][interpreter]") {
  SpecIR s = make_spec("m[q, kv] + float(u[kv]) + float(l[q]) + h2[kv] + float(bb[q])", std::nullopt,
                       {"m: f32[Sq, Skv]", "u: u8[Skv]", "l: i64[Sq]", "h2: f16[Skv]", "bb: bool[Sq]"});
  // A transposed view: m[q, kv] lives at q + 2 * kv.
  std::vector<float> m = {0, 1, 2, 3, 4, 5};  // Sq = 2, Skv = 3
  BufferView mv{dsl::DType::F32, m.data(), {2, 3}, {1, 2}};
  std::vector<uint8_t> u = {200, 255, 7};
  std::vector<int64_t> l = {int64_t{1} << 40, -3};
  std::vector<uint16_t> h2 = {0x3c00 /*1.0*/, 0xc000 /*-2.0*/, 0x0001 /*2^-24*/};
  std::vector<uint8_t> bb = {0, 5};
  EvalEnv env;
  env.buffers = {mv, test::view(dsl::DType::U8, u, {3}), test::view(dsl::DType::I64, l, {2}), test::view(dsl::DType::F16, h2, {3}),
                 test::view(dsl::DType::Bool, bb, {2})};
  test::set_point(env, 0, 0, 1, 2);
  // m[1, 2] = m[1 + 4] = 5; u[2] = 7; l[1] = -3; h2[2] = 2^-24; bb[1] = true.
  CHECK(evaluate(s.score_mod, env).f == 5.0f + 7.0f - 3.0f + std::ldexp(1.0f, -24) + 1.0f);
  test::set_point(env, 0, 0, 0, 1);
  // m[0, 1] = 2; u[1] = 255; l[0] = 2^40; h2[1] = -2; bb[0] = false.
  CHECK(evaluate(s.score_mod, env).f == 2.0f + 255.0f + std::ldexp(1.0f, 40) - 2.0f);
  SpecIR half = make_spec("h2[kv]", std::nullopt, {"h2: f16[Skv]"});
  EvalEnv e2;
  e2.buffers = {test::view(dsl::DType::F16, h2, {3})};
  float expect[3] = {1.0f, -2.0f, std::ldexp(1.0f, -24)};  // the last is the smallest f16 subnormal
  for (int kv = 0; kv < 3; ++kv) {
    test::set_point(e2, 0, 0, 0, kv);
    CHECK(evaluate(half.score_mod, e2).f == expect[kv]);
  }
}

TEST_CASE("interpreter: untaken select branches and decided && / || raise no flag", "[compiler][interpreter]") {
  SpecIR s = make_spec("where(kv < 3, float(t[kv]), 0.0)", "kv < 3 && t[kv] > 0 || kv == 7", {"t: i32[3]"});
  std::vector<int32_t> data = {1, 2, 3};
  EvalEnv env;
  env.buffers = {test::view(dsl::DType::I32, data, {3})};
  test::set_point(env, 0, 0, 0, 10);
  EvalFlags f;
  CHECK(evaluate(s.score_mod, env, &f).f == 0.0f);
  CHECK_FALSE(evaluate(s.mask_mod, env, &f).b);
  CHECK_FALSE(f.index_out_of_range);
  test::set_point(env, 0, 0, 0, 2);
  CHECK(evaluate(s.score_mod, env, &f).f == 3.0f);
  CHECK(evaluate(s.mask_mod, env, &f).b);
  CHECK_FALSE(f.index_out_of_range);
}

TEST_CASE("interpreter: Value::str round-trips", "[compiler][interpreter]") {
  CHECK(Value::of_float(0.1f).str() == "0.1");
  CHECK(Value::of_float(30.0f).str() == "30.0");
  CHECK(Value::of_float(kInf).str() == "inf");
  CHECK(Value::of_float(-kInf).str() == "-inf");
  CHECK(Value::of_float(kNan).str() == "nan");
  CHECK(std::stof(Value::of_float(1.0f / 3.0f).str()) == 1.0f / 3.0f);
  CHECK(Value::of_int(-7).str() == "-7");
  CHECK(Value::of_int(kMin).str() == "-9223372036854775808");
  CHECK(Value::of_bool(true).str() == "true");
  CHECK(Value::of_bool(false).str() == "false");
}

TEST_CASE("interpreter: missing bindings are reported, not read", "[compiler][interpreter]") {
  SpecIR s = make_spec("t[q] + x", std::nullopt, {"t: f32[Sq]"}, {"x: float"});
  EvalEnv env;
  CHECK_THROWS_AS(evaluate(s.score_mod, env), flexjit::Error);
}

// ---- The gallery of docs/LANGUAGE.md at a few points, against hand-computed values. ----

TEST_CASE("gallery: causal, sliding window, prefix LM", "[compiler][interpreter][gallery]") {
  SpecIR causal = make_spec(std::nullopt, "q >= kv");
  SpecIR window = make_spec(std::nullopt, "q >= kv && q - kv < window", {}, {"window: int"});
  SpecIR prefix = make_spec(std::nullopt, "kv < prefix || q >= kv", {}, {"prefix: int"});
  EvalEnv env;
  auto at = [&](const SpecIR& s, int64_t q, int64_t kv) {
    test::set_point(env, 0, 0, q, kv);
    return evaluate(s.mask_mod, env).b;
  };
  CHECK(at(causal, 5, 3));
  CHECK(at(causal, 5, 5));
  CHECK_FALSE(at(causal, 3, 5));
  env.params = {Value::of_int(4)};
  CHECK(at(window, 10, 7));
  CHECK_FALSE(at(window, 10, 6));
  CHECK_FALSE(at(window, 6, 7));
  CHECK(at(prefix, 1, 3));
  CHECK_FALSE(at(prefix, 1, 5));
  CHECK(at(prefix, 6, 5));
}

TEST_CASE("gallery: document mask", "[compiler][interpreter][gallery]") {
  SpecIR s = make_spec(std::nullopt, "doc[q] == doc[kv]", {"doc: i32[Sq]"});
  std::vector<int32_t> doc = {0, 0, 1, 1, 1, 2};
  EvalEnv env;
  env.buffers = {test::view(dsl::DType::I32, doc, {6})};
  auto at = [&](int64_t q, int64_t kv) {
    test::set_point(env, 0, 0, q, kv);
    return evaluate(s.mask_mod, env).b;
  };
  CHECK(at(1, 0));
  CHECK_FALSE(at(2, 1));
  CHECK(at(4, 2));
  CHECK_FALSE(at(5, 4));
}

TEST_CASE("gallery: ALiBi and softcap", "[compiler][interpreter][gallery]") {
  SpecIR alibi = make_spec("score + slope[h] * (kv - q)", std::nullopt, {"slope: f32[H]"});
  std::vector<float> slope = {0.5f, 0.25f};
  EvalEnv env;
  env.buffers = {test::view(dsl::DType::F32, slope, {2})};
  test::set_point(env, 0, 1, 10, 4, 1.0f);
  CHECK(evaluate(alibi.score_mod, env).f == -0.5f);  // 1 + 0.25 * (4 - 10)
  test::set_point(env, 0, 0, 3, 7, 2.0f);
  CHECK(evaluate(alibi.score_mod, env).f == 4.0f);  // 2 + 0.5 * 4

  SpecIR softcap = make_spec("cap * tanh(score / cap)", std::nullopt, {}, {"const cap: float = 30"});
  EvalEnv e2;
  e2.score = 15.0f;
  float v = evaluate(softcap.score_mod, e2).f;
  CHECK(v == 30.0f * std::tanh(0.5f));
  CHECK(v == Approx(13.8635147).epsilon(1e-6));  // 30 * tanh(0.5)
  SpecIR runtime_cap = make_spec("cap * tanh(score / cap)", std::nullopt, {}, {"cap: float"});
  e2.params = {Value::of_float(30.0f)};
  CHECK(evaluate(runtime_cap.score_mod, e2).f == v);
}

TEST_CASE("gallery: relative bias", "[compiler][interpreter][gallery]") {
  SpecIR s = make_spec("score + bias[h, q - kv + Skv - 1]", std::nullopt, {"bias: f32[H, L]"});
  // H = 2, Skv = 4, L = 2 * Skv - 1 = 7; bias[h, i] = 100 h + i.
  std::vector<float> bias(14);
  for (int h = 0; h < 2; ++h)
    for (int i = 0; i < 7; ++i) bias[h * 7 + i] = 100.0f * h + i;
  EvalEnv env;
  env.symbols = test::symbols(s.checked, {{"H", 2}, {"Skv", 4}, {"Sq", 4}, {"L", 7}});
  env.buffers = {test::view(dsl::DType::F32, bias, {2, 7})};
  test::set_point(env, 0, 1, 2, 3, 0.5f);
  CHECK(evaluate(s.score_mod, env).f == 102.5f);  // index 2 - 3 + 3 = 2
  test::set_point(env, 0, 0, 3, 0, 0.0f);
  CHECK(evaluate(s.score_mod, env).f == 6.0f);  // index 3 - 0 + 3 = 6
  test::set_point(env, 0, 0, 0, 3, 0.0f);
  CHECK(evaluate(s.score_mod, env).f == 0.0f);  // index 0
}

TEST_CASE("gallery: SAM decomposed relative position", "[compiler][interpreter][gallery]") {
  SpecIR s = make_spec("score + rel_h[b, h, q, kv // 64] + rel_w[b, h, q, kv % 64]", std::nullopt,
                       {"rel_h: bf16[B, H, Sq, 64]", "rel_w: bf16[B, H, Sq, 64]"});
  // B = 1, H = 1, Sq = 2: rel_h[i] = i, rel_w[i] = -i / 2 (flat index), exact in bf16.
  std::vector<uint16_t> rel_h(128), rel_w(128);
  for (int i = 0; i < 128; ++i) {
    rel_h[i] = to_bf16(static_cast<float>(i));
    rel_w[i] = to_bf16(-0.5f * i);
  }
  EvalEnv env;
  env.symbols = test::symbols(s.checked, {{"B", 1}, {"H", 1}, {"Sq", 2}, {"Skv", 4096}});
  env.buffers = {test::view(dsl::DType::BF16, rel_h, {1, 1, 2, 64}), test::view(dsl::DType::BF16, rel_w, {1, 1, 2, 64})};
  test::set_point(env, 0, 0, 1, 130, 0.25f);
  EvalFlags f;
  CHECK(evaluate(s.score_mod, env, &f).f == 33.25f);  // 0.25 + rel_h[66] + rel_w[66] = 0.25 + 66 - 33
  test::set_point(env, 0, 0, 0, 4095, 0.0f);
  CHECK(evaluate(s.score_mod, env, &f).f == 63.0f - 31.5f);  // kv // 64 = 63, kv % 64 = 63
  CHECK_FALSE(f.index_out_of_range);
  test::set_point(env, 0, 0, 0, 4096, 0.0f);  // kv // 64 = 64: clamps to 63 and flags rel_h
  CHECK(evaluate(s.score_mod, env, &f).f == 63.0f - 0.0f);
  CHECK(f.index_out_of_range);
  CHECK(f.first_error.find("rel_h") != std::string::npos);
}

TEST_CASE("gallery: learnable offset bias (nested loads)", "[compiler][interpreter][gallery]") {
  SpecIR s = make_spec("score + bias[offset[q]]", std::nullopt, {"bias: f32[L]", "offset: i32[Sq]"});
  std::vector<float> bias = {0.5f, 1.5f, 2.5f, 3.5f, 4.5f};
  std::vector<int32_t> offset = {3, -1, 9};
  EvalEnv env;
  env.buffers = {test::view(dsl::DType::F32, bias, {5}), test::view(dsl::DType::I32, offset, {3})};
  EvalFlags f;
  test::set_point(env, 0, 0, 0, 0, 1.0f);
  CHECK(evaluate(s.score_mod, env, &f).f == 4.5f);
  test::set_point(env, 0, 0, 1, 0, 1.0f);
  CHECK(evaluate(s.score_mod, env, &f).f == 5.5f);  // -1 wraps to the last element
  CHECK_FALSE(f.index_out_of_range);
  test::set_point(env, 0, 0, 2, 0, 1.0f);
  CHECK(evaluate(s.score_mod, env, &f).f == 5.5f);  // 9 clamps to 4
  CHECK(f.index_out_of_range);
  CHECK(f.first_error.find("bias[9]") != std::string::npos);
}
