// Tests of score_mod autodiff: the derivative and scatter terms of the gallery's learnable
// score modifications, PyTorch's conventions at non-differentiable points, and finite
// differences of the interpreter on fixed and random programs over score and buffers.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "compiler/frontend.h"
#include "compiler/interpreter.h"
#include "compiler/ir/ir_mutator.h"
#include "compiler/ir/ir_printer.h"
#include "compiler/passes/autodiff.h"
#include "dsl/compile_error.h"
#include "unit/compiler/spec_fixture.h"

using namespace flexjit;
using namespace flexjit::ir;
using flexjit::test::set_point;

namespace {

// Builds a spec through the whole front end (check, lower, optimize), marking `grads` as
// requiring a gradient.
SpecIR grad_spec(const std::string& score_mod, const std::vector<std::string>& buffers, const std::vector<std::string>& grads = {},
                 const std::vector<std::string>& params = {}) {
  dsl::Spec spec;
  spec.score_mod = score_mod;
  dsl::Diagnostics diags;
  for (const std::string& b : buffers) REQUIRE(dsl::add_buffer(spec, b, "test", diags));
  for (const std::string& p : params) REQUIRE(dsl::add_param(spec, p, "test", diags));
  for (const std::string& g : grads) {
    bool found = false;
    for (dsl::BufferDecl& b : spec.buffers)
      if (b.name == g) b.requires_grad = found = true;
    REQUIRE(found);
  }
  try {
    return build_spec_ir(spec);
  } catch (const CompileError& e) {
    FAIL("spec does not compile: " << score_mod << "\n" << e.what());
  }
  return {};
}

bool is_imm(const Expr& e, float v) { return e.as<FloatImm>() && e.as<FloatImm>()->value == v; }

// The loads of buffer `buffer` in e, in post-order.
std::vector<Expr> loads_of(const Expr& e, int buffer) {
  std::vector<Expr> out;
  for_each_node(e, [&](const Expr& n) {
    if (n.as<Load>() && n.as<Load>()->buffer == buffer) out.push_back(n);
  });
  return out;
}

bool same_nodes(const std::vector<Expr>& a, const std::vector<Expr>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!a[i].same_as(b[i])) return false;
  return true;
}

int64_t eval_int(const Expr& e, const EvalEnv& env) { return evaluate(e, env).i; }
float eval_float(const Expr& e, const EvalEnv& env) { return evaluate(e, env).f; }

// An environment for the gallery tests: symbols by name, every buffer f32 with known data.
struct GalleryEnv {
  EvalEnv env;
  std::vector<std::vector<float>> data;
  GalleryEnv(const SpecIR& s, const std::map<std::string, int64_t>& syms) {
    env.symbols = test::symbols(s.checked, syms);
    for (const dsl::BufferDecl& b : s.spec().buffers) {
      std::vector<int64_t> shape;
      for (const dsl::Dim& d : b.shape) shape.push_back(d.is_symbol ? env.symbols[s.checked.symbol_index(d.symbol)] : d.value);
      int64_t n = 1;
      for (int64_t x : shape) n *= x;
      data.emplace_back(n);
      for (int64_t i = 0; i < n; ++i) data.back()[i] = 0.25f * static_cast<float>(i % 7) - 0.5f;
      env.buffers.push_back(test::view(dsl::DType::F32, data.back(), shape));
    }
  }
};

}  // namespace

TEST_CASE("autodiff: d_score of plain and scaled scores", "[autodiff]") {
  ScoreModGradient none = differentiate_score_mod(grad_spec("score", {}));
  CHECK(is_imm(none.d_score, 1.0f));
  CHECK(none.scatters.empty());

  dsl::Spec mask_only;
  mask_only.mask_mod = "q >= kv";
  SpecIR m = build_spec_ir(mask_only);
  ScoreModGradient g = differentiate_score_mod(m);
  CHECK(is_imm(g.d_score, 1.0f));
  CHECK(g.scatters.empty());
  CHECK(!g.score_mod);
  CHECK(g.mask_mod.same_as(m.mask_mod));

  CHECK(is_imm(differentiate_score_mod(grad_spec("score * 2", {})).d_score, 2.0f));
  CHECK(is_imm(differentiate_score_mod(grad_spec("2 * score - 1.5", {})).d_score, 2.0f));
  CHECK(is_imm(differentiate_score_mod(grad_spec("float(q - kv)", {})).d_score, 0.0f));
  CHECK(print_inline(differentiate_score_mod(grad_spec("score * float(kv)", {})).d_score) == "float(kv)");
}

TEST_CASE("autodiff: softcap gives 1 - tanh^2", "[autodiff]") {
  // The chain rule's cap * (1 - t^2) / cap cancels, and t is the forward's tanh node.
  ScoreModGradient c = differentiate_score_mod(grad_spec("cap * tanh(score / cap)", {}, {}, {"const cap: float = 30"}));
  CHECK(print_inline(c.d_score) == "1.0 - (tanh(score / 30.0) * tanh(score / 30.0))");
  const Binary* one_minus = c.d_score.as<Binary>();
  REQUIRE(one_minus);
  const Binary* square = one_minus->b.as<Binary>();
  REQUIRE(square);
  bool shared = false;
  for_each_node(c.score_mod, [&](const Expr& n) { shared |= n.same_as(square->a); });
  CHECK(shared);
  CHECK(square->a.same_as(square->b));

  for (const char* params : {"const cap: float = 30", "cap: float"}) {
    SpecIR s = grad_spec("cap * tanh(score / cap)", {}, {}, {params});
    ScoreModGradient g = differentiate_score_mod(s);
    CHECK(g.scatters.empty());
    EvalEnv env;
    env.params = {Value::of_float(30.0f)};
    for (float score : {-100.0f, -31.0f, -2.0f, 0.0f, 0.5f, 17.0f, 29.0f, 300.0f}) {
      set_point(env, 0, 0, 0, 0, score);
      double t = std::tanh(static_cast<double>(score) / 30.0);
      INFO("score " << score << ": " << print_inline(g.d_score));
      CHECK(eval_float(g.d_score, env) == Approx(1.0 - t * t).epsilon(1e-6).margin(1e-7));
    }
  }
}

TEST_CASE("autodiff: learnable relative bias", "[autodiff]") {
  SpecIR s = grad_spec("score + bias[h, q - kv + Skv - 1]", {"bias: f32[H, L]"}, {"bias"});
  ScoreModGradient g = differentiate_score_mod(s);
  CHECK(is_imm(g.d_score, 1.0f));
  REQUIRE(g.scatters.size() == 1);
  const GradScatter& sc = g.scatters[0];
  CHECK(sc.buffer == 0);
  CHECK(is_imm(sc.coefficient, 1.0f));
  // The scatter indexes with the very nodes of the forward load (shared, printed once).
  std::vector<Expr> fwd = loads_of(g.score_mod, 0);
  REQUIRE(fwd.size() == 1);
  CHECK(same_nodes(sc.indices, fwd[0].as<Load>()->indices));
  CHECK(g.score_mod.same_as(s.score_mod));
  REQUIRE(sc.indices.size() == 2);
  CHECK(print_inline(sc.indices[0]) == "h");
  GalleryEnv ge(s, {{"H", 4}, {"Sq", 9}, {"Skv", 11}, {"L", 20}});
  for (int64_t q : {0, 3, 8})
    for (int64_t kv : {0, 5, 10}) {
      set_point(ge.env, 0, 2, q, kv);
      CHECK(eval_int(sc.indices[0], ge.env) == 2);
      CHECK(eval_int(sc.indices[1], ge.env) == q - kv + 11 - 1);
    }

  // Without requires_grad there is nothing to scatter.
  CHECK(differentiate_score_mod(grad_spec("score + bias[h, q - kv + Skv - 1]", {"bias: f32[H, L]"})).scatters.empty());
}

TEST_CASE("autodiff: ALiBi slopes", "[autodiff]") {
  SpecIR s = grad_spec("score + slope[h] * (kv - q)", {"slope: f32[H]"}, {"slope"});
  ScoreModGradient g = differentiate_score_mod(s);
  CHECK(is_imm(g.d_score, 1.0f));
  REQUIRE(g.scatters.size() == 1);
  CHECK(g.scatters[0].buffer == 0);
  REQUIRE(g.scatters[0].indices.size() == 1);
  CHECK(print_inline(g.scatters[0].indices[0]) == "h");
  CHECK(print_inline(g.scatters[0].coefficient) == "float(kv - q)");
  // float(kv - q) is the forward's node, not a copy.
  bool shared = false;
  for_each_node(g.score_mod, [&](const Expr& n) { shared |= n.same_as(g.scatters[0].coefficient); });
  CHECK(shared);
}

TEST_CASE("autodiff: SAM decomposed relative position", "[autodiff]") {
  SpecIR s = grad_spec("score + rel_h[b, h, q, kv // 64] + rel_w[b, h, q, kv % 64]",
                       {"rel_h: bf16[B, H, Sq, 64]", "rel_w: bf16[B, H, Sq, 64]"}, {"rel_h", "rel_w"});
  ScoreModGradient g = differentiate_score_mod(s);
  CHECK(is_imm(g.d_score, 1.0f));
  REQUIRE(g.scatters.size() == 2);
  CHECK(g.scatters[0].buffer == 0);
  CHECK(g.scatters[1].buffer == 1);
  for (const GradScatter& sc : g.scatters) {
    CHECK(is_imm(sc.coefficient, 1.0f));  // fp32 even though the buffers are bf16
    std::vector<Expr> fwd = loads_of(g.score_mod, sc.buffer);
    REQUIRE(fwd.size() == 1);
    CHECK(same_nodes(sc.indices, fwd[0].as<Load>()->indices));
  }
  CHECK(print_inline(g.scatters[0].indices[3]) == "kv // 64");
  CHECK(print_inline(g.scatters[1].indices[3]) == "kv % 64");

  // Only the buffers marked: rel_w alone.
  ScoreModGradient w = differentiate_score_mod(grad_spec("score + rel_h[b, h, q, kv // 64] + rel_w[b, h, q, kv % 64]",
                                                         {"rel_h: bf16[B, H, Sq, 64]", "rel_w: bf16[B, H, Sq, 64]"}, {"rel_w"}));
  REQUIRE(w.scatters.size() == 1);
  CHECK(w.scatters[0].buffer == 1);
}

TEST_CASE("autodiff: learnable bias through an offset table", "[autodiff]") {
  SpecIR s = grad_spec("score + bias[offset[q]]", {"offset: i32[Sq]", "bias: f32[L]"}, {"bias"});
  ScoreModGradient g = differentiate_score_mod(s);
  CHECK(is_imm(g.d_score, 1.0f));
  REQUIRE(g.scatters.size() == 1);
  CHECK(g.scatters[0].buffer == 1);
  CHECK(is_imm(g.scatters[0].coefficient, 1.0f));
  REQUIRE(g.scatters[0].indices.size() == 1);
  const Load* idx = g.scatters[0].indices[0].as<Load>();
  REQUIRE(idx);
  CHECK(idx->buffer == 0);
  CHECK(print_inline(g.scatters[0].indices[0]) == "offset[q]");

  // requires_grad on the int table adds nothing: ints carry no gradient.
  CHECK(differentiate_score_mod(grad_spec("score + bias[offset[q]]", {"offset: i32[Sq]", "bias: f32[L]"}, {"offset"})).scatters.empty());
}

TEST_CASE("autodiff: two loads of one buffer follow the product rule", "[autodiff]") {
  SpecIR s = grad_spec("score + t[h] * t[h + 1]", {"t: f32[16]"}, {"t"});
  ScoreModGradient g = differentiate_score_mod(s);
  CHECK(is_imm(g.d_score, 1.0f));
  REQUIRE(g.scatters.size() == 2);
  std::map<std::string, std::string> coefficient_of;
  for (const GradScatter& sc : g.scatters) {
    CHECK(sc.buffer == 0);
    REQUIRE(sc.indices.size() == 1);
    coefficient_of[print_inline(sc.indices[0])] = print_inline(sc.coefficient);
    // The coefficient is the other load: the forward's node.
    std::vector<Expr> fwd = loads_of(g.score_mod, 0);
    bool shared = false;
    for (const Expr& l : fwd) shared |= l.same_as(sc.coefficient);
    CHECK(shared);
  }
  CHECK(coefficient_of["h"] == "t[h + 1]");
  CHECK(coefficient_of["h + 1"] == "t[h]");

  // The same load used twice is one scatter whose coefficient sums both uses.
  ScoreModGradient sq = differentiate_score_mod(grad_spec("score + t[h] * t[h]", {"t: f32[16]"}, {"t"}));
  REQUIRE(sq.scatters.size() == 1);
  CHECK(print_inline(sq.scatters[0].coefficient) == "t[h] + t[h]");
  // Structurally equal loads written twice are one load too.
  ScoreModGradient twice = differentiate_score_mod(grad_spec("t[h] * score + t[h]", {"t: f32[16]"}, {"t"}));
  REQUIRE(twice.scatters.size() == 1);
}

TEST_CASE("autodiff: exp(score) * w[h]", "[autodiff]") {
  SpecIR s = grad_spec("exp(score) * w[h]", {"w: f32[8]"}, {"w"});
  ScoreModGradient g = differentiate_score_mod(s);
  REQUIRE(g.scatters.size() == 1);
  CHECK(print_inline(g.scatters[0].coefficient) == "exp(score)");
  bool shared = false;
  for_each_node(g.score_mod, [&](const Expr& n) { shared |= n.same_as(g.scatters[0].coefficient); });
  CHECK(shared);
  // d_score = w[h] * exp(score), built on the forward's nodes.
  GalleryEnv ge(s, {{"H", 4}});
  for (float score : {-3.0f, 0.0f, 1.25f}) {
    set_point(ge.env, 0, 3, 0, 0, score);
    float w = ge.data[0][3];
    CHECK(eval_float(g.d_score, ge.env) == Approx(std::exp(score) * w).epsilon(1e-6));
  }
  bool all_shared = true;
  for_each_node(g.d_score, [&](const Expr& n) {
    if (n.as<Load>() || (n.as<Unary>() && n.as<Unary>()->op == UnaryOp::Exp)) {
      bool found = false;
      for_each_node(g.score_mod, [&](const Expr& f) { found |= f.same_as(n); });
      all_shared &= found;
    }
  });
  CHECK(all_shared);
}

TEST_CASE("autodiff: conventions at non-differentiable points follow PyTorch", "[autodiff]") {
  auto d_at = [](const std::string& prog, float score, float w = 1.0f) {
    SpecIR s = grad_spec(prog, {"w: f32[4]"}, {"w"});
    ScoreModGradient g = differentiate_score_mod(s);
    std::vector<float> data(4, w);
    EvalEnv env;
    env.symbols = test::symbols(s.checked, {});
    env.buffers = {test::view(dsl::DType::F32, data, {4})};
    set_point(env, 0, 0, 0, 0, score);
    float dw = 0;
    for (const GradScatter& sc : g.scatters) dw += eval_float(sc.coefficient, env);
    return std::pair<float, float>(eval_float(g.d_score, env), dw);
  };
  CHECK(d_at("abs(score)", 0.0f).first == 0.0f);
  CHECK(d_at("abs(score)", -2.0f).first == -1.0f);
  CHECK(d_at("abs(score)", -0.0f).first == 0.0f);
  // max/min: the gradient goes to the selected operand; on a tie to the left one of the
  // optimized IR, where constants are on the right (so both spellings give score the gradient
  // at 0, as torch.clamp(score, min=0) does).
  CHECK(d_at("max(score, 0.0)", 0.0f).first == 1.0f);
  CHECK(d_at("max(0.0, score)", 0.0f).first == 1.0f);
  CHECK(d_at("max(score, 0.0)", -1.0f).first == 0.0f);
  CHECK(d_at("min(score, 0.0)", 2.0f).first == 0.0f);
  CHECK(d_at("min(score, 0.0)", -2.0f).first == 1.0f);
  CHECK(d_at("max(score, w[0])", 0.5f, 2.0f) == std::pair<float, float>(0.0f, 1.0f));
  CHECK(d_at("max(score, w[0])", 3.0f, 2.0f) == std::pair<float, float>(1.0f, 0.0f));
  CHECK(d_at("max(score, w[0])", NAN, 2.0f) == std::pair<float, float>(0.0f, 1.0f));  // NaN is never selected
  CHECK(d_at("clamp(score, -1.0, 1.0)", 0.5f).first == 1.0f);
  CHECK(d_at("clamp(score, -1.0, 1.0)", 1.5f).first == 0.0f);
  const std::pair<const char*, float> steps[] = {{"floor", 0.0f}, {"ceil", 1.0f}, {"round", 0.0f}, {"sign", 1.0f}};
  for (const auto& [f, at_03] : steps) {
    INFO(f);
    CHECK(d_at(std::string(f) + "(score) * w[0]", 0.3f) == std::pair<float, float>(0.0f, at_03));
    CHECK(d_at("score + " + std::string(f) + "(score * w[0])", 0.3f) == std::pair<float, float>(1.0f, 0.0f));
  }
  // where routes to the taken branch; the condition is a constant.
  CHECK(d_at("where(score > 0.0, score, 0.1 * score)", 1.0f).first == 1.0f);
  CHECK(d_at("where(score > 0.0, score, 0.1 * score)", -1.0f).first == Approx(0.1f));
  CHECK(d_at("where(w[0] > 0.0, score, 0.0)", 1.0f) == std::pair<float, float>(1.0f, 0.0f));
  CHECK(differentiate_score_mod(grad_spec("where(w[0] > 0.0, score, 0.0)", {"w: f32[4]"}, {"w"})).scatters.empty());
  // pow: no base gradient when the exponent is 0; no exponent gradient when the base is 0 and
  // the exponent >= 0; a negative base gives a NaN exponent gradient (pow * log(x)).
  CHECK(d_at("pow(score, w[0])", 0.0f, 0.0f) == std::pair<float, float>(0.0f, 0.0f));
  CHECK(d_at("pow(score, w[0])", 2.0f, 0.0f).first == 0.0f);
  CHECK(d_at("pow(score, w[0])", 0.0f, 2.0f) == std::pair<float, float>(0.0f, 0.0f));
  CHECK(d_at("pow(score, w[0])", 3.0f, 2.0f).first == Approx(6.0f));
  CHECK(d_at("pow(score, w[0])", 3.0f, 2.0f).second == Approx(9.0f * std::log(3.0f)));
  CHECK(std::isnan(d_at("pow(score, w[0])", -2.0f, 2.0f).second));
  CHECK(d_at("pow(score, w[0])", -2.0f, 2.0f).first == Approx(-4.0f));
  CHECK(std::isinf(d_at("pow(score, w[0])", 0.0f, -1.0f).first));
  CHECK(std::isinf(d_at("sqrt(score)", 0.0f).first));  // 1 / (2 sqrt(0)) as in PyTorch
  // Ints carry no gradient: float(int(score)) is a constant.
  CHECK(d_at("score + float(int(score * w[0]))", 0.7f) == std::pair<float, float>(1.0f, 0.0f));
  // An exact zero coefficient emits no scatter.
  CHECK(differentiate_score_mod(grad_spec("score + w[0] * 0.0", {"w: f32[4]"}, {"w"})).scatters.empty());
}

TEST_CASE("autodiff: cost and size are linear in the DAG", "[autodiff]") {
  // As a tree this doubles with every let; the derivative must stay a DAG of linear size.
  auto name = [](int i) {
    std::string v = "a";
    return v.append(std::to_string(i));
  };
  std::string prog = "let a0 = score * w[h]; ";
  const int n = 200;
  for (int i = 1; i < n; ++i) {
    std::string prev = name(i - 1);
    prog.append("let ").append(name(i)).append(" = tanh(").append(prev).append(" * ").append(prev).append(" + w[");
    prog.append(std::to_string(i % 8)).append("]); ");
  }
  prog += name(n - 1);
  SpecIR s = grad_spec(prog, {"w: f32[8]"}, {"w"});
  ScoreModGradient g = differentiate_score_mod(s);
  REQUIRE(g.scatters.size() == 9);  // w[h] and w[0] .. w[7]
  std::vector<Expr> roots = {g.score_mod, g.d_score};
  for (const GradScatter& sc : g.scatters) roots.push_back(sc.coefficient);
  size_t nodes = 0;
  for_each_node(roots, [&](const Expr&) { ++nodes; });
  CHECK(nodes < static_cast<size_t>(20 * n));
}

namespace {

// --- finite differences ---------------------------------------------------------------------

uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
float from_bf16(uint16_t v) {
  uint32_t u = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// The buffers every finite-difference program may use: w, u, hb require gradients; c and ix
// do not.
const std::vector<std::string> kFdBuffers = {"w: f32[8]", "u: f32[H, 4]", "hb: bf16[8]", "c: f32[8]", "ix: i32[8]"};
const std::vector<std::string> kFdGrads = {"w", "u", "hb"};
constexpr int64_t kH = 3;

struct FdPoint {
  EvalEnv env;
  std::vector<float> w, u, c;
  std::vector<uint16_t> hb;
  std::vector<int32_t> ix;
};

// One scalar input: score, or an element of a buffer that requires a gradient.
struct FdInput {
  int buffer;  // -1 for score
  int64_t element;
};

float get(FdPoint& p, const FdInput& in) {
  switch (in.buffer) {
    case -1: return p.env.score;
    case 0: return p.w[in.element];
    case 1: return p.u[in.element];
    default: return from_bf16(p.hb[in.element]);
  }
}
// Stores x (rounded to the buffer's type) and returns what was stored.
float set(FdPoint& p, const FdInput& in, float x) {
  switch (in.buffer) {
    case -1: p.env.score = x; break;
    case 0: p.w[in.element] = x; break;
    case 1: p.u[in.element] = x; break;
    default: p.hb[in.element] = to_bf16(x); break;
  }
  return get(p, in);
}

struct FdStats {
  int checked = 0, skipped = 0, failed = 0;
  std::vector<std::string> failures;
};

// Flat element offset a load with these index values reads (negative wrap, then clamp).
int64_t resolve(const std::vector<int64_t>& idx, const std::vector<int64_t>& shape) {
  int64_t off = 0;
  for (size_t d = 0; d < idx.size(); ++d) {
    int64_t n = shape[d], i = idx[d];
    if (i < 0 && i >= -n) i += n;
    i = std::min(std::max<int64_t>(i, 0), n - 1);
    off = off * n + i;
  }
  return off;
}

// Compares the analytical derivatives with central differences for score and every element of
// w, u and hb at one point. Inputs whose one-sided differences disagree (a kink or jump within
// a step) or whose central differences at two steps disagree (too curved to tell) are skipped.
void check_point(const std::string& prog, const ScoreModGradient& g, FdPoint& p, FdStats& st) {
  const Expr& f = g.score_mod;
  float f0 = eval_float(f, p.env);
  if (!std::isfinite(f0)) {
    ++st.skipped;
    return;
  }
  // Analytical: d_score, and per element the sum of the scatters that target it.
  std::map<std::pair<int, int64_t>, double> grad;
  const std::vector<std::vector<int64_t>> shapes = {{8}, {kH, 4}, {8}};
  const int grad_buffer[] = {0, 1, 2};  // spec indices of w, u, hb
  for (const GradScatter& sc : g.scatters) {
    int k = -1;
    for (int i = 0; i < 3; ++i)
      if (grad_buffer[i] == sc.buffer) k = i;
    REQUIRE(k >= 0);
    std::vector<int64_t> idx;
    for (const Expr& e : sc.indices) idx.push_back(eval_int(e, p.env));
    grad[{k, resolve(idx, shapes[k])}] += eval_float(sc.coefficient, p.env);
  }
  std::vector<FdInput> inputs = {{-1, 0}};
  for (int k = 0; k < 3; ++k)
    for (int64_t e = 0; e < (k == 1 ? kH * 4 : 8); ++e) inputs.push_back({k, e});

  for (const FdInput& in : inputs) {
    double an = in.buffer < 0 ? eval_float(g.d_score, p.env) : grad[{in.buffer, in.element}];
    float x0 = get(p, in);
    // Steps of 1/64 and 1/128: exact in bf16 for the multiples of 1/128 the buffers hold.
    auto diff = [&](float h, double* fwd, double* bwd) {
      float xp = set(p, in, x0 + h);
      double fp = eval_float(f, p.env);
      float xm = set(p, in, x0 - h);
      double fm = eval_float(f, p.env);
      set(p, in, x0);
      *fwd = (fp - f0) / (double(xp) - x0);
      *bwd = (f0 - fm) / (x0 - double(xm));
      return (fp - fm) / (double(xp) - xm);
    };
    double fwd1, bwd1, fwd2, bwd2;
    double c1 = diff(1.0f / 64, &fwd1, &bwd1);
    double c2 = diff(1.0f / 128, &fwd2, &bwd2);
    if (c1 == 0 && c2 == 0 && an == 0) continue;  // not read at this point
    double noise = 2e-4 * (1 + std::fabs(f0));
    auto close = [&](double a, double b, double rel) { return std::fabs(a - b) <= rel * std::max(std::fabs(a), std::fabs(b)) + noise; };
    if (!std::isfinite(c1) || !std::isfinite(c2) || !std::isfinite(an) || !close(fwd1, bwd1, 0.2) || !close(fwd2, bwd2, 0.2) ||
        !close(c1, c2, 5e-3)) {
      ++st.skipped;
      continue;
    }
    ++st.checked;
    if (!close(an, c2, 1e-2)) {
      ++st.failed;
      if (st.failures.size() < 12) {
        std::string what = in.buffer < 0 ? "score" : std::string(in.buffer == 0 ? "w" : in.buffer == 1 ? "u" : "hb") + "[" +
                                                         std::to_string(in.element) + "]";
        st.failures.push_back(prog + "\n  d/d" + what + " analytical " + std::to_string(an) + " vs finite difference " +
                              std::to_string(c2) + " (score " + std::to_string(p.env.score) + ", f " + std::to_string(f0) + ")");
      }
    }
  }
}

void random_point(std::mt19937_64& rng, const SpecIR& s, FdPoint& p) {
  std::uniform_real_distribution<float> val(-1.5f, 1.5f);
  auto pick = [&](int64_t n) { return std::uniform_int_distribution<int64_t>(0, n - 1)(rng); };
  p.env.symbols = test::symbols(s.checked, {{"B", 2}, {"H", kH}, {"Sq", 8}, {"Skv", 8}});
  set_point(p.env, pick(2), pick(kH), pick(8), pick(8), std::uniform_real_distribution<float>(-2.0f, 2.0f)(rng));
  auto grid = [&] { return std::round(val(rng) * 128) / 128; };  // bf16-exact with room for the steps
  p.w.resize(8);
  for (float& x : p.w) x = val(rng);
  p.u.resize(kH * 4);
  for (float& x : p.u) x = val(rng);
  p.c.resize(8);
  for (float& x : p.c) x = val(rng);
  p.hb.resize(8);
  for (uint16_t& x : p.hb) x = to_bf16(grid());
  p.ix.resize(8);
  for (int32_t& x : p.ix) x = static_cast<int32_t>(pick(8));
  p.env.params = {Value::of_float(val(rng))};
  p.env.buffers = {test::view(dsl::DType::F32, p.w, {8}), test::view(dsl::DType::F32, p.u, {kH, 4}),
                   test::view(dsl::DType::BF16, p.hb, {8}), test::view(dsl::DType::F32, p.c, {8}),
                   test::view(dsl::DType::I32, p.ix, {8})};
}

void check_program(const std::string& prog, std::mt19937_64& rng, int points, FdStats& st) {
  SpecIR s = grad_spec(prog, kFdBuffers, kFdGrads, {"pf: float"});
  ScoreModGradient g = differentiate_score_mod(s);
  for (int i = 0; i < points; ++i) {
    FdPoint p;
    random_point(rng, s, p);
    check_point(prog, g, p, st);
  }
}

// Random score_mod text over score, the buffers, a parameter, constants and index
// arithmetic, with every float function and operator; arguments of functions with a
// restricted domain are usually (not always) made positive.
class RandomProgram {
 public:
  explicit RandomProgram(uint64_t seed) : rng_(seed) {}

  std::string program() {
    lets_.clear();
    std::string text;
    int n = static_cast<int>(pick(3));
    for (int i = 0; i < n; ++i) {
      std::string name = "t";
      name += std::to_string(i);
      text.append("let ").append(name).append(" = ").append(expr(2)).append("; ");
      lets_.push_back(name);
    }
    return text + expr(3);
  }

 private:
  size_t pick(size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng_); }
  bool chance(double p) { return std::uniform_real_distribution<double>(0, 1)(rng_) < p; }

  std::string index8() {
    static const char* v[] = {"h", "q", "kv", "(q + kv) % 8", "ix[q]", "7 - kv", "h + 1", "(q - kv) % 8", "kv // 2", "ix[kv] % 8"};
    return v[pick(sizeof v / sizeof v[0])];
  }
  std::string index4() {
    static const char* v[] = {"kv % 4", "q // 2", "h", "ix[q] % 4", "3"};
    return v[pick(sizeof v / sizeof v[0])];
  }
  std::string literal() {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2f", std::uniform_real_distribution<double>(-2, 2)(rng_));
    return std::string("(") + buf + ")";
  }
  std::string leaf() {
    if (!lets_.empty() && chance(0.3)) return lets_[pick(lets_.size())];
    switch (pick(10)) {
      case 0: case 1: case 2: return "score";
      case 3: return "w[" + index8() + "]";
      case 4: return "u[h, " + index4() + "]";
      case 5: return "hb[" + index8() + "]";
      case 6: return "c[" + index8() + "]";
      case 7: return "pf";
      case 8: return chance(0.5) ? "float(q - kv)" : "float(ix[q])";
      default: return literal();
    }
  }
  std::string positive(int d) {
    std::string x = expr(d);
    switch (pick(5)) {
      case 0: return "(" + x + " * " + x + " + 0.25)";
      case 1: return "exp(" + x + ")";
      case 2: return "(sigmoid(" + x + ") + 0.1)";
      case 3: return "(abs(" + x + ") + 0.5)";
      default: return x;  // sometimes outside the domain: NaN points are skipped
    }
  }
  std::string expr(int d) {
    if (d <= 0 || chance(0.2)) return leaf();
    static const char* kSmooth[] = {"exp", "exp2", "tanh", "sigmoid", "sin", "cos", "abs", "floor", "ceil", "round", "sign"};
    static const char* kDomain[] = {"log", "log2", "log1p", "sqrt", "rsqrt"};
    switch (pick(12)) {
      case 0: case 1: return std::string(kSmooth[pick(11)]) + "(" + expr(d - 1) + ")";
      case 2: return std::string(kDomain[pick(5)]) + "(" + positive(d - 1) + ")";
      case 3: return "(" + expr(d - 1) + " + " + expr(d - 1) + ")";
      case 4: return "(" + expr(d - 1) + " - " + expr(d - 1) + ")";
      case 5: return "(" + expr(d - 1) + " * " + expr(d - 1) + ")";
      case 6: return "(" + expr(d - 1) + " / " + (chance(0.7) ? positive(d - 1) : expr(d - 1)) + ")";
      case 7: return "pow(" + positive(d - 1) + ", " + expr(d - 1) + ")";
      case 8: return std::string(chance(0.5) ? "min" : "max") + "(" + expr(d - 1) + ", " + expr(d - 1) + ")";
      case 9: return "(" + expr(d - 1) + (chance(0.5) ? " // " : " % ") + positive(d - 1) + ")";
      case 10: return "where(" + expr(d - 1) + " > " + expr(d - 1) + ", " + expr(d - 1) + ", " + expr(d - 1) + ")";
      default: return "-" + expr(d - 1);
    }
  }

  std::mt19937_64 rng_;
  std::vector<std::string> lets_;
};

void report(const FdStats& st) {
  std::string text;
  for (const std::string& f : st.failures) text += f + "\n";
  INFO("checked " << st.checked << ", skipped " << st.skipped << ", failed " << st.failed << "\n" << text);
  CHECK(st.failed == 0);
  if (std::getenv("FLEXJIT_AUTODIFF_STATS")) WARN("checked " << st.checked << ", skipped " << st.skipped);
}

}  // namespace

TEST_CASE("autodiff: finite differences of every function", "[autodiff]") {
  const char* programs[] = {
      "score",
      "score * 2",
      "30.0 * tanh(score / 30.0)",
      "pf * tanh(score / pf) + w[h]",
      "score + w[(q - kv) % 8]",
      "score + w[h] * float(kv - q)",
      "score + u[h, kv // 2 % 4] + hb[kv % 8]",
      "score + w[ix[q]]",
      "score + w[h] * w[h + 1]",
      "exp(score) * w[h]",
      "exp(score * w[h])",
      "exp2(score + hb[q])",
      "log(score * score + u[h, kv % 4] * u[h, kv % 4] + 0.1)",
      "log2(sigmoid(score) + w[kv] * w[kv])",
      "log1p(score * score * w[h] * w[h])",
      "sqrt(score * score + hb[q] * hb[q] + 0.01)",
      "rsqrt(1.0 + exp(score * hb[kv]))",
      "tanh(score * w[h]) * u[h, q % 4]",
      "sigmoid(score - w[q]) * 3.0",
      "sin(score * hb[h]) + cos(score + u[h, 0])",
      "pow(sigmoid(score) + 0.5, w[h] * 2.0)",
      "pow(abs(score) + 0.1, 2.5) + pow(2.0, score * w[q])",
      "pow(w[h], 3.0) * score",
      "score / (1.0 + w[h] * w[h])",
      "w[h] / (score + 3.0)",
      "min(score, w[kv]) + max(score * u[h, 1], c[q])",
      "abs(score - w[q]) + abs(hb[kv])",
      "-score * hb[q]",
      "score % (w[h] * w[h] + 0.5)",
      "(score * 3.0) % 1.7 + w[q] % 0.6",
      "score // 0.7 + score * w[h]",
      "where(score > w[h], score * u[h, 2], w[q] - score)",
      "floor(score * 4.0) + score * w[h]",
      "round(w[h] * 3.0) * score + sign(score) * w[q] + ceil(score)",
      "score * float(int(w[h] * 4.0)) + c[q] * score",
      "let a = tanh(score * w[h]); let e = a * a + u[h, kv % 4]; e * a + exp(e) * w[h]",
      "let a = score * hb[q]; let e = a * a; e * e + a * w[ix[kv]] + max(a, e)",
  };
  std::mt19937_64 rng(1234);
  FdStats st;
  for (const char* prog : programs) check_program(prog, rng, 24, st);
  report(st);
  CHECK(st.checked > 800);
}

TEST_CASE("autodiff: finite differences of random programs", "[autodiff]") {
  RandomProgram gen(99);
  std::mt19937_64 rng(4321);
  FdStats st;
  int programs = 400;
  for (int i = 0; i < programs; ++i) check_program(gen.program(), rng, 6, st);
  report(st);
  CHECK(st.checked > 2000);
}
