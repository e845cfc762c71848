// The float64 reference backward (tests/support/attention_reference_backward.h) against
// central finite differences of the float64 reference forward, loss = sum(O * dO), on tiny
// shapes: q, k, v and learnable buffers, with masks (a fully masked row), GQA and softcap.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "compiler/frontend.h"
#include "support/attention_reference.h"
#include "support/attention_reference_backward.h"
#include "unit/cpu/gallery_inputs.h"

using namespace flexjit;

namespace {

struct FdCase {
  std::string score_mod, mask_mod;
  std::vector<std::string> buffers;  // declarations; every f32 one is marked `grad`
};

double loss(const SpecIR& ir, const test::RefShape& s, const std::vector<float>& q, const std::vector<float>& k,
            const std::vector<float>& v, const std::vector<float>& d_o, const EvalEnv& env, double scale) {
  test::RefResult r = test::reference_attention(ir, s, q, k, v, env, scale);
  double l = 0;
  for (size_t i = 0; i < r.o.size(); ++i) l += r.o[i] * d_o[i];
  return l;
}

// Central difference of the loss along one float element, with the step the float rounding
// actually took.
template <class Eval>
double central_difference(float& x, Eval&& eval) {
  const float x0 = x, h = 1.0f / 64;
  x = x0 + h;
  const float up = x;
  double lp = eval();
  x = x0 - h;
  const float down = x;
  double lm = eval();
  x = x0;
  return (lp - lm) / (double(up) - double(down));
}

void check_close(double analytic, double fd, const std::string& what) {
  INFO(what << ": analytic " << analytic << ", finite difference " << fd);
  CHECK(std::abs(analytic - fd) <= 2e-4 + 2e-3 * std::abs(fd));
}

void run_case(const FdCase& c) {
  dsl::Spec spec;
  spec.name = "fd";
  if (!c.score_mod.empty()) spec.score_mod = c.score_mod;
  if (!c.mask_mod.empty()) spec.mask_mod = c.mask_mod;
  dsl::Diagnostics diags;
  for (const std::string& b : c.buffers) REQUIRE(dsl::add_buffer(spec, b, "test", diags));
  for (dsl::BufferDecl& b : spec.buffers) b.requires_grad = b.dtype == dsl::DType::F32;
  spec.dtype = dsl::DType::F32;
  spec.head_dim = 8;  // the spec's head dims only matter to kernels; the reference takes them from RefShape
  SpecIR ir = build_spec_ir(spec);

  test::Sizes sz;
  sz.B = 2, sz.H = 2, sz.Hkv = 1, sz.Sq = 3, sz.Skv = 4, sz.D = 3;
  const test::RefShape s{sz.B, sz.H, sz.Hkv, sz.Sq, sz.Skv, sz.D, 2};
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> q(size_t(s.B * s.H * s.Sq * s.D)), k(size_t(s.B * s.Hkv * s.Skv * s.D)), v(size_t(s.B * s.Hkv * s.Skv * s.Dv)),
      d_o(size_t(s.B * s.H * s.Sq * s.Dv));
  for (auto* t : {&q, &k, &v, &d_o})
    for (float& x : *t) x = u(rng);
  std::vector<test::HostBuffer> buffers = test::make_buffers(spec, sz, rng);
  EvalEnv env = test::eval_env(ir.checked, sz, buffers, test::gallery_params(spec, sz));
  const double scale = 0.7;

  test::RefResult fwd = test::reference_attention(ir, s, q, k, v, env, scale);
  test::RefBackward bwd = test::reference_backward(ir, s, q, k, v, d_o, fwd.o, fwd.lse, env, scale);
  REQUIRE(bwd.dq.size() == q.size());
  REQUIRE(bwd.dk.size() == k.size());
  REQUIRE(bwd.dv.size() == v.size());
  REQUIRE(bwd.grads.size() == spec.buffers.size());

  auto eval = [&] { return loss(ir, s, q, k, v, d_o, env, scale); };
  for (size_t i = 0; i < q.size(); ++i) check_close(bwd.dq[i], central_difference(q[i], eval), "dq[" + std::to_string(i) + "]");
  for (size_t i = 0; i < k.size(); ++i) check_close(bwd.dk[i], central_difference(k[i], eval), "dk[" + std::to_string(i) + "]");
  for (size_t i = 0; i < v.size(); ++i) check_close(bwd.dv[i], central_difference(v[i], eval), "dv[" + std::to_string(i) + "]");
  for (size_t bi = 0; bi < spec.buffers.size(); ++bi) {
    if (!spec.buffers[bi].requires_grad) {
      CHECK(bwd.grads[bi].empty());
      continue;
    }
    test::HostBuffer& hb = buffers[bi];
    REQUIRE(bwd.grads[bi].size() * 4 == hb.bytes.size());
    float* data = reinterpret_cast<float*>(hb.bytes.data());  // the bytes env reads, perturbed in place
    for (size_t i = 0; i < bwd.grads[bi].size(); ++i)
      check_close(bwd.grads[bi][i], central_difference(data[i], eval), hb.name + "[" + std::to_string(i) + "]");
  }
}

}  // namespace

TEST_CASE("reference backward: relative bias with a mask and a fully masked row", "[reference][backward]") {
  run_case({"score + bias[h, q - kv + Skv - 1]", "kv <= q + 1 && q != 1", {"bias: f32[H, L]"}});
}

TEST_CASE("reference backward: softcap and ALiBi slopes", "[reference][backward]") {
  run_case({"20.0 * tanh(score / 20.0) + slope[h] * (kv - q)", "", {"slope: f32[H]"}});
}

TEST_CASE("reference backward: nested loads and a scale of the score", "[reference][backward]") {
  // offset (i32) carries no gradient; bias[offset[q]] gets dS * w[h], w gets dS * bias[...];
  // an out-of-range index (offset values up to 96 into bias[5]) clamps to the last element.
  run_case({"score * w[h] + bias[offset[q]] * w[h]", "", {"bias: f32[5]", "offset: i32[Sq]", "w: f32[H]"}});
}

TEST_CASE("reference backward: plain attention", "[reference][backward]") { run_case({"", "", {}}); }
