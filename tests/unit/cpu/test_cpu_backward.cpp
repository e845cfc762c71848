// The CPU backward end to end (Runtime::compile -> Kernel::forward, then Kernel::backward with
// Device::cpu()) against the float64 reference backward (tests/support/
// attention_reference_backward.h): the gallery with its learnable buffers, relative bias,
// ALiBi slopes, SAM's rel_h / rel_w, nested loads, GQA, head dims 24 / 64 / 80, Sq != Skv,
// f32 and bf16 operands, fully masked rows, every instruction set, strided operands, the
// LSE in / out property of a sequence split into KV chunks, and argument errors.
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <algorithm>
#include <limits>
#include <random>

#include "compiler/frontend.h"
#include "dsl/error.h"
#include "runtime/cpu/cpu_backend.h"
#include "runtime/flexjit.hpp"
#include "support/attention_reference.h"
#include "support/attention_reference_backward.h"
#include "support/spec_loading.h"
#include "unit/cpu/backward_operands.h"
#include "unit/cpu/gallery_inputs.h"

using namespace flexjit;
using test::Operands;
using test::Sizes;
using test::bf16_round;
using test::expect_close;
using test::kNanF;

namespace {

// One backward problem: a spec (with its `grad` buffers marked), sizes, inputs rounded to the
// operands' dtype, captured buffers and parameters.
struct Problem {
  dsl::Spec spec;
  Sizes sz;
  int64_t Dv = 0;
  DType dtype = DType::F32;
  float scale = 0;
  std::vector<float> q, k, v, d_o;
  std::vector<test::HostBuffer> buffers;
  std::vector<std::pair<std::string, double>> params;
  std::vector<std::string> no_grad_entry;  // marked `grad`, but the launch passes no gradient tensor
};

Problem make_problem(dsl::Spec spec, Sizes sz, uint64_t seed, DType dtype = DType::F32, const std::vector<std::string>& grad = {"*"}) {
  if (spec.name == "document") sz.Skv = sz.Sq;  // doc: i32[Sq] is indexed with kv too
  Problem p;
  spec.dtype = dtype;
  spec.head_dim = static_cast<int>(sz.D);
  spec.head_dim_v = 0;
  // "*": every float buffer requires a gradient; otherwise the named ones.
  for (dsl::BufferDecl& b : spec.buffers) {
    bool is_float = b.dtype == dsl::DType::F32 || b.dtype == dsl::DType::BF16 || b.dtype == dsl::DType::F16;
    b.requires_grad = grad.size() == 1 && grad[0] == "*" ? is_float : std::find(grad.begin(), grad.end(), b.name) != grad.end();
  }
  p.spec = spec;
  p.sz = sz;
  p.Dv = sz.D;
  p.dtype = dtype;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.5f, 1.5f);
  auto fill = [&](std::vector<float>& t, int64_t n) {
    t.resize(static_cast<size_t>(n));
    for (float& x : t) {
      x = u(rng);
      if (dtype == DType::BF16) x = bf16_round(x);
      if (dtype == DType::F16) x = std::round(x * 64) / 64;  // exact in fp16
    }
  };
  fill(p.q, sz.B * sz.H * sz.Sq * sz.D);
  fill(p.k, sz.B * sz.Hkv * sz.Skv * sz.D);
  fill(p.v, sz.B * sz.Hkv * sz.Skv * p.Dv);
  fill(p.d_o, sz.B * sz.H * sz.Sq * p.Dv);
  p.buffers = test::make_buffers(spec, sz, rng);
  p.params = test::gallery_params(spec, sz);
  return p;
}

double scale_of(const Problem& p) { return p.scale > 0 ? p.scale : 1.0 / std::sqrt(static_cast<double>(p.sz.D)); }

struct Result {
  std::vector<float> o, lse;          // the forward's (o as fp32 values of the stored dtype)
  std::vector<float> dq, dk, dv;      // fp32 values of the stored dtype
  std::vector<std::vector<float>> grads;  // per spec buffer; empty unless it requires a gradient
};

// Forward, then backward through the public API with contiguous operands. Outputs are
// poisoned with NaN first. `o_in` / `lse_in`, when given, replace the forward's for the backward.
Result run_cpu(const Problem& p, const std::vector<float>* o_in = nullptr, const std::vector<float>* lse_in = nullptr) {
  cpu::install();
  Runtime rt;
  std::shared_ptr<Kernel> kernel = rt.compile(p.spec);
  const Sizes& s = p.sz;
  Operands q(p.dtype, p.q), k(p.dtype, p.k), v(p.dtype, p.v), d_o(p.dtype, p.d_o);
  Operands o(p.dtype, static_cast<size_t>(s.B * s.H * s.Sq * p.Dv));
  std::vector<float> lse(static_cast<size_t>(s.B * s.H * s.Sq), kNanF);
  std::vector<test::HostBuffer> buffers = p.buffers;
  AttentionArgs a;
  a.q = q.tensor({s.B, s.H, s.Sq, s.D});
  a.k = k.tensor({s.B, s.Hkv, s.Skv, s.D});
  a.v = v.tensor({s.B, s.Hkv, s.Skv, p.Dv});
  a.o = o.tensor({s.B, s.H, s.Sq, p.Dv});
  a.lse = Tensor::contiguous(lse.data(), DType::F32, {s.B, s.H, s.Sq});
  a.scale = p.scale;
  for (test::HostBuffer& b : buffers) a.buffers.push_back({b.name, b.tensor()});
  a.params = p.params;
  a.device = Device::cpu();
  kernel->forward(a);
  Result r;
  if (o_in) {
    o = Operands(p.dtype, *o_in);
    lse = *lse_in;
  }
  r.o = o.values();
  r.lse = lse;

  Operands dq(p.dtype, q.f32.size()), dk(p.dtype, k.f32.size()), dv(p.dtype, v.f32.size());
  BackwardArgs ba;
  ba.q = a.q;
  ba.k = a.k;
  ba.v = a.v;
  ba.o = o.tensor({s.B, s.H, s.Sq, p.Dv});
  ba.lse = Tensor::contiguous(lse.data(), DType::F32, {s.B, s.H, s.Sq});
  ba.d_o = d_o.tensor({s.B, s.H, s.Sq, p.Dv});
  ba.dq = dq.tensor({s.B, s.H, s.Sq, s.D});
  ba.dk = dk.tensor({s.B, s.Hkv, s.Skv, s.D});
  ba.dv = dv.tensor({s.B, s.Hkv, s.Skv, p.Dv});
  ba.scale = p.scale;
  ba.buffers = a.buffers;
  ba.params = p.params;
  ba.device = Device::cpu();
  r.grads = test::poisoned_grads(p.spec, buffers, p.no_grad_entry, ba.grads);
  kernel->backward(ba);
  r.dq = dq.values();
  r.dk = dk.values();
  r.dv = dv.values();
  return r;
}

test::RefBackward reference(const Problem& p, const Result& r) {
  SpecIR ir = build_spec_ir(p.spec);
  EvalEnv env = test::eval_env(ir.checked, p.sz, p.buffers, p.params);
  const Sizes& s = p.sz;
  test::RefShape shape{s.B, s.H, s.Hkv, s.Sq, s.Skv, s.D, p.Dv};
  std::vector<double> o(r.o.begin(), r.o.end()), lse(r.lse.begin(), r.lse.end());
  return test::reference_backward(ir, shape, p.q, p.k, p.v, p.d_o, o, lse, env, scale_of(p));
}

void check(const Problem& p, const Result& r, const test::RefBackward& ref, const std::string& what) {
  // bf16 / fp16 outputs carry a rounding of 2^-9 / 2^-12 relative each.
  const double rel = p.dtype == DType::BF16 ? 1e-2 : p.dtype == DType::F16 ? 2e-3 : 2e-5;
  const double abs = p.dtype == DType::BF16 ? 1e-3 : p.dtype == DType::F16 ? 2e-4 : 1e-6;
  expect_close(r.dq, ref.dq, rel, abs, what + ": dq");
  expect_close(r.dk, ref.dk, rel, abs, what + ": dk");
  expect_close(r.dv, ref.dv, rel, abs, what + ": dv");
  for (size_t i = 0; i < p.spec.buffers.size(); ++i) {
    if (!p.spec.buffers[i].requires_grad || r.grads[i].empty()) continue;
    // Buffer gradients sum many dS terms that cancel (each row's dS sums to 0), so their
    // absolute error, not only the relative one, is what is bounded.
    expect_close(r.grads[i], ref.grads[i], p.dtype == DType::F32 ? 2e-4 : 2e-2, p.dtype == DType::F32 ? 1e-5 : 2e-3,
                 what + ": grad of " + p.spec.buffers[i].name);
  }
}

std::string describe(const Problem& p) {
  const Sizes& s = p.sz;
  return fmt::format("{} {} B{} H{} Hkv{} Sq{} Skv{} D{} isa {} threads {}", p.spec.name, dsl::dtype_name(p.dtype), s.B, s.H, s.Hkv, s.Sq,
                     s.Skv, s.D, cpu::settings().isa, cpu::settings().threads);
}

void run_and_check(const Problem& p) {
  Result r = run_cpu(p);
  check(p, r, reference(p, r), describe(p));
}

struct SettingsGuard {
  cpu::CpuSettings saved = cpu::settings();
  ~SettingsGuard() { cpu::configure(saved); }
};

dsl::Spec inline_spec(const std::string& name, const std::string& score_mod, const std::string& mask_mod,
                      const std::vector<std::string>& buffers, const std::vector<std::string>& params = {}) {
  dsl::Spec spec;
  spec.name = name;
  if (!score_mod.empty()) spec.score_mod = score_mod;
  if (!mask_mod.empty()) spec.mask_mod = mask_mod;
  dsl::Diagnostics diags;
  for (const std::string& b : buffers) REQUIRE(dsl::add_buffer(spec, b, "test", diags));
  for (const std::string& pr : params) REQUIRE(dsl::add_param(spec, pr, "test", diags));
  return spec;
}

}  // namespace

TEST_CASE("CPU backward: the gallery matches the float64 reference", "[cpu][backward][gallery]") {
  uint64_t seed = 1;
  for (const auto& path : test::gallery_specs()) {
    dsl::Spec spec = test::load_spec(path);
    run_and_check(make_problem(spec, {1, 2, 1, 67, 131, 64}, seed++));
  }
}

TEST_CASE("CPU backward: learnable buffers, GQA, head dims and odd lengths", "[cpu][backward]") {
  uint64_t seed = 50;
  SECTION("relative bias, GQA 4:1, head dims 24 / 64 / 80") {
    dsl::Spec spec = test::load_spec(test::gallery_dir() / "relative_bias.json");
    for (int64_t d : {24, 64, 80}) run_and_check(make_problem(spec, {1, 4, 1, 45, 77, d}, seed++));
  }
  SECTION("ALiBi slopes with a causal mask, Sq > Skv") {
    run_and_check(make_problem(test::load_spec(test::gallery_dir() / "alibi_causal.json"), {2, 2, 1, 90, 70, 24}, seed++));
  }
  SECTION("SAM rel_h / rel_w (bf16 buffers, f32 gradients) over several KV tiles") {
    run_and_check(make_problem(test::load_spec(test::gallery_dir() / "sam_relpos_d80.json"), {1, 2, 2, 70, 200, 80}, seed++));
  }
  SECTION("bias[offset[q]]: the gradient goes to bias only, and is an exact zero (each row's dS sums to 0)") {
    Problem p = make_problem(test::load_spec(test::gallery_dir() / "offset_bias.json"), {1, 2, 2, 33, 65, 64}, seed++, DType::F32, {"bias"});
    Result r = run_cpu(p);
    check(p, r, reference(p, r), describe(p));
    for (size_t i = 0; i < p.spec.buffers.size(); ++i)
      if (p.spec.buffers[i].name == "bias") CHECK(std::all_of(r.grads[i].begin(), r.grads[i].end(), [](float g) { return g == 0.f; }));
  }
  SECTION("softcap and a scaled score: d_score is not 1") {
    dsl::Spec spec = inline_spec("softcap_w", "20.0 * tanh(score * w[h] / 20.0) + bias[h, q - kv + Skv - 1]", "q + 3 >= kv",
                                 {"w: f32[H]", "bias: f32[H, L]"});
    run_and_check(make_problem(spec, {1, 4, 2, 70, 72, 64}, seed++));
  }
  SECTION("a marked buffer without a grads entry gets none") {
    Problem p = make_problem(test::load_spec(test::gallery_dir() / "sam_relpos.json"), {1, 2, 1, 40, 100, 64}, seed++, DType::F32,
                             {"rel_h", "rel_w"});
    p.no_grad_entry = {"rel_w"};
    Result r = run_cpu(p);
    CHECK(r.grads[1].empty());
    check(p, r, reference(p, r), describe(p));
  }
}

TEST_CASE("CPU backward: bf16 and fp16 operands", "[cpu][backward][half]") {
  uint64_t seed = 80;
  for (const char* name : {"relative_bias.json", "alibi_causal.json", "sam_relpos.json", "softcap.json"})
    run_and_check(make_problem(test::load_spec(test::gallery_dir() / name), {1, 2, 1, 50, 90, 64}, seed++, DType::BF16));
  for (const char* name : {"relative_bias.json", "sliding_window.json"})
    run_and_check(make_problem(test::load_spec(test::gallery_dir() / name), {1, 2, 1, 50, 90, 64}, seed++, DType::F16));
}

TEST_CASE("CPU backward: fully masked rows get zero gradients", "[cpu][backward][masked]") {
  // Rows q < 5 attend nothing (LSE = -inf); the window leaves KV tiles empty for later rows.
  dsl::Spec spec = inline_spec("late", "score + bias[h, q - kv + Skv - 1]", "q >= kv + 5 && q - kv < 40", {"bias: f32[H, L]"});
  Problem p = make_problem(spec, {1, 2, 1, 150, 150, 64}, 90);
  Result r = run_cpu(p);
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t qi = 0; qi < 5; ++qi) {
      size_t row = static_cast<size_t>(h * 150 + qi);
      REQUIRE(r.lse[row] == -std::numeric_limits<float>::infinity());
      for (int64_t d = 0; d < 64; ++d) REQUIRE(r.dq[row * 64 + static_cast<size_t>(d)] == 0.0f);
    }
  check(p, r, reference(p, r), describe(p));
}

TEST_CASE("CPU backward: every instruction set and thread count", "[cpu][backward][isa]") {
  SettingsGuard guard;
  Problem p = make_problem(test::load_spec(test::gallery_dir() / "relative_bias.json"), {1, 4, 2, 70, 130, 80}, 110);
  Result first;
  bool have_first = false;
  for (const std::string& isa : cpu::available_isas()) {
    for (int threads : {1, 3}) {
      cpu::configure({threads, isa});
      Result r = run_cpu(p);
      check(p, r, reference(p, r), describe(p));
      if (!have_first) {
        first = r;
        have_first = true;
      } else if (isa == cpu::available_isas().front()) {
        // dq, dk and dv are each computed by one work item: the thread count never changes them.
        CHECK(std::memcmp(first.dq.data(), r.dq.data(), r.dq.size() * 4) == 0);
        CHECK(std::memcmp(first.dk.data(), r.dk.data(), r.dk.size() * 4) == 0);
        CHECK(std::memcmp(first.dv.data(), r.dv.data(), r.dv.size() * 4) == 0);
      }
    }
  }
}

TEST_CASE("CPU backward: tile sizes other than 64", "[cpu][backward][tiles]") {
  SettingsGuard guard;
  cpu::configure({0, "", 32, 16, 0});
  run_and_check(make_problem(test::load_spec(test::gallery_dir() / "sam_relpos.json"), {1, 2, 1, 70, 100, 64}, 120));
  cpu::configure({0, "", 48, 128, 0});
  run_and_check(make_problem(test::load_spec(test::gallery_dir() / "sliding_window.json"), {1, 2, 1, 140, 300, 24}, 121));
}

TEST_CASE("CPU backward: strided operands and a scale", "[cpu][backward][strides]") {
  // q, d_o and dq as [B, Sq, H, D] memory (strides of a transpose), gradient of bias transposed.
  cpu::install();
  dsl::Spec spec = inline_spec("rel", "score + bias[h, q - kv + Skv - 1]", "", {"bias: f32[H, L]"});
  Problem p = make_problem(spec, {1, 3, 3, 20, 30, 24}, 130);
  p.scale = 0.3f;
  Result contiguous = run_cpu(p);
  test::RefBackward ref = reference(p, contiguous);
  check(p, contiguous, ref, describe(p));

  const Sizes& s = p.sz;
  Runtime rt;
  std::shared_ptr<Kernel> kernel = rt.compile(p.spec);
  std::vector<float> qt(p.q.size()), dot(p.d_o.size()), dqt(p.q.size(), kNanF), o = contiguous.o, lse = contiguous.lse;
  for (int64_t h = 0; h < s.H; ++h)
    for (int64_t i = 0; i < s.Sq; ++i)
      for (int64_t d = 0; d < s.D; ++d) {
        qt[static_cast<size_t>((i * s.H + h) * s.D + d)] = p.q[static_cast<size_t>((h * s.Sq + i) * s.D + d)];
        dot[static_cast<size_t>((i * s.H + h) * s.D + d)] = p.d_o[static_cast<size_t>((h * s.Sq + i) * s.D + d)];
      }
  std::vector<float> k = p.k, v = p.v, dk(k.size(), kNanF), dv(v.size(), kNanF);
  std::vector<test::HostBuffer> buffers = p.buffers;
  const int64_t L = buffers[0].shape[1];
  std::vector<float> gbias(static_cast<size_t>(s.H * L), kNanF);  // stored [L, H]
  std::vector<int64_t> tstrides = {s.Sq * s.H * s.D, s.D, s.H * s.D, 1};
  BackwardArgs ba;
  ba.q = {qt.data(), DType::F32, {s.B, s.H, s.Sq, s.D}, tstrides};
  ba.k = Tensor::contiguous(k.data(), DType::F32, {s.B, s.Hkv, s.Skv, s.D});
  ba.v = Tensor::contiguous(v.data(), DType::F32, {s.B, s.Hkv, s.Skv, s.D});
  ba.o = Tensor::contiguous(o.data(), DType::F32, {s.B, s.H, s.Sq, s.D});
  ba.lse = Tensor::contiguous(lse.data(), DType::F32, {s.B, s.H, s.Sq});
  ba.d_o = {dot.data(), DType::F32, {s.B, s.H, s.Sq, s.D}, tstrides};
  ba.dq = {dqt.data(), DType::F32, {s.B, s.H, s.Sq, s.D}, tstrides};
  ba.dk = Tensor::contiguous(dk.data(), DType::F32, {s.B, s.Hkv, s.Skv, s.D});
  ba.dv = Tensor::contiguous(dv.data(), DType::F32, {s.B, s.Hkv, s.Skv, s.D});
  ba.scale = p.scale;
  ba.buffers = {{"bias", buffers[0].tensor()}};
  ba.grads = {{"bias", Tensor{gbias.data(), DType::F32, {s.H, L}, {1, s.H}}}};
  ba.device = Device::cpu();
  kernel->backward(ba);
  for (int64_t h = 0; h < s.H; ++h)
    for (int64_t i = 0; i < s.Sq; ++i)
      for (int64_t d = 0; d < s.D; ++d)
        REQUIRE(dqt[static_cast<size_t>((i * s.H + h) * s.D + d)] == contiguous.dq[static_cast<size_t>((h * s.Sq + i) * s.D + d)]);
  CHECK(dk == contiguous.dk);
  CHECK(dv == contiguous.dv);
  for (int64_t h = 0; h < s.H; ++h)
    for (int64_t l = 0; l < L; ++l) REQUIRE(gbias[static_cast<size_t>(l * s.H + h)] == contiguous.grads[0][static_cast<size_t>(h * L + l)]);
}

TEST_CASE("CPU backward: a sequence split into KV chunks, merged by LSE", "[cpu][backward][lse]") {
  // Forward per KV chunk, merge O and LSE exactly, backward per chunk with the merged O and
  // LSE: dq summed over the chunks is the unsplit dq, dk / dv per chunk the unsplit slices.
  dsl::Spec spec = inline_spec("chunks", "score + slope[h] * (kv - q)", "q + 40 >= kv", {"slope: f32[H]"});
  const Sizes full_sz{1, 2, 1, 60, 150, 64};
  Problem full = make_problem(spec, full_sz, 140, DType::F32, {});
  Result whole = run_cpu(full);
  const int64_t split = 70, H = full_sz.H, Sq = full_sz.Sq, D = full_sz.D, Skv = full_sz.Skv;
  Problem part[2];
  Result first[2];
  for (int c = 0; c < 2; ++c) {
    int64_t k0 = c == 0 ? 0 : split, n = c == 0 ? split : Skv - split;
    part[c] = full;
    part[c].sz.Skv = n;
    part[c].k.assign(full.k.begin() + k0 * D, full.k.begin() + (k0 + n) * D);
    part[c].v.assign(full.v.begin() + k0 * D, full.v.begin() + (k0 + n) * D);
    // The chunk's positions: kv = k0 + local index, so the mods take the offset explicitly.
    part[c].spec = inline_spec("chunk", fmt::format("score + slope[h] * (kv + {} - q)", k0), fmt::format("q + 40 >= kv + {}", k0), {"slope: f32[H]"});
    part[c].spec.dtype = DType::F32;
    part[c].spec.head_dim = static_cast<int>(D);
    first[c] = run_cpu(part[c]);
  }
  // Merge: lse = log(exp(l0) + exp(l1)), o = sum_c exp(l_c - lse) o_c.
  std::vector<float> o(whole.o.size()), lse(whole.lse.size());
  for (int64_t row = 0; row < H * Sq; ++row) {
    double l0 = first[0].lse[static_cast<size_t>(row)], l1 = first[1].lse[static_cast<size_t>(row)];
    double mx = std::max(l0, l1);
    double l = mx == -std::numeric_limits<double>::infinity() ? mx : mx + std::log(std::exp(l0 - mx) + std::exp(l1 - mx));
    lse[static_cast<size_t>(row)] = static_cast<float>(l);
    for (int64_t d = 0; d < D; ++d) {
      size_t i = static_cast<size_t>(row * D + d);
      double w0 = l0 == -std::numeric_limits<double>::infinity() ? 0 : std::exp(l0 - l);
      double w1 = l1 == -std::numeric_limits<double>::infinity() ? 0 : std::exp(l1 - l);
      o[i] = static_cast<float>(w0 * first[0].o[i] + w1 * first[1].o[i]);
    }
  }
  // The unsplit backward with the merged O and LSE, so both sides see the same inputs.
  Result unsplit = run_cpu(full, &o, &lse);
  std::vector<float> dq_sum(unsplit.dq.size(), 0.0f);
  for (int c = 0; c < 2; ++c) {
    Result r = run_cpu(part[c], &o, &lse);
    for (size_t i = 0; i < dq_sum.size(); ++i) dq_sum[i] += r.dq[i];
    int64_t k0 = c == 0 ? 0 : split;
    for (size_t i = 0; i < r.dk.size(); ++i) {
      INFO("chunk " << c << " element " << i);
      REQUIRE(std::abs(r.dk[i] - unsplit.dk[static_cast<size_t>(k0 * D) + i]) <= 1e-5 * (1 + std::abs(unsplit.dk[static_cast<size_t>(k0 * D) + i])));
      REQUIRE(std::abs(r.dv[i] - unsplit.dv[static_cast<size_t>(k0 * D) + i]) <= 1e-5 * (1 + std::abs(unsplit.dv[static_cast<size_t>(k0 * D) + i])));
    }
  }
  for (size_t i = 0; i < dq_sum.size(); ++i) {
    INFO("dq element " << i);
    REQUIRE(std::abs(dq_sum[i] - unsplit.dq[i]) <= 1e-5 * (1 + std::abs(unsplit.dq[i])));
  }
  // And the merged forward is the unsplit forward.
  for (size_t i = 0; i < o.size(); ++i) REQUIRE(std::abs(o[i] - whole.o[i]) <= 1e-5);
}

TEST_CASE("CPU backward: argument errors are reported", "[cpu][backward][errors]") {
  cpu::install();
  dsl::Spec spec = inline_spec("rel", "score + bias[h, q - kv + Skv - 1] + t[h]", "", {"bias: f32[H, L]", "t: f32[H]"});
  spec.dtype = DType::F32;
  spec.head_dim = 64;
  spec.buffers[0].requires_grad = true;
  Runtime rt;
  std::shared_ptr<Kernel> kernel = rt.compile(spec);
  const int64_t H = 2, S = 8, D = 64, L = 2 * S - 1;
  std::vector<float> q(static_cast<size_t>(H * S * D), 0.5f), o = q, d_o = q, dq = q, k = q, v = q, dk = q, dv = q, lse(static_cast<size_t>(H * S), 1.0f);
  std::vector<float> bias(static_cast<size_t>(H * L), 0.0f), t(static_cast<size_t>(H), 0.0f), gbias = bias;
  auto args = [&] {
    BackwardArgs a;
    a.q = Tensor::contiguous(q.data(), DType::F32, {1, H, S, D});
    a.k = Tensor::contiguous(k.data(), DType::F32, {1, H, S, D});
    a.v = Tensor::contiguous(v.data(), DType::F32, {1, H, S, D});
    a.o = Tensor::contiguous(o.data(), DType::F32, {1, H, S, D});
    a.d_o = Tensor::contiguous(d_o.data(), DType::F32, {1, H, S, D});
    a.lse = Tensor::contiguous(lse.data(), DType::F32, {1, H, S});
    a.dq = Tensor::contiguous(dq.data(), DType::F32, {1, H, S, D});
    a.dk = Tensor::contiguous(dk.data(), DType::F32, {1, H, S, D});
    a.dv = Tensor::contiguous(dv.data(), DType::F32, {1, H, S, D});
    a.buffers = {{"bias", Tensor::contiguous(bias.data(), DType::F32, {H, L})}, {"t", Tensor::contiguous(t.data(), DType::F32, {H})}};
    a.grads = {{"bias", Tensor::contiguous(gbias.data(), DType::F32, {H, L})}};
    a.device = Device::cpu();
    return a;
  };
  CHECK_NOTHROW(kernel->backward(args()));
  BackwardArgs a = args();
  a.lse = {};
  CHECK_THROWS_WITH(kernel->backward(a), Catch::Contains("`lse` is required"));
  a = args();
  a.d_o.shape = {1, H, S - 1, D};
  CHECK_THROWS_WITH(kernel->backward(a), Catch::Contains("`d_o` has shape [1, 2, 7, 64] but must be [B, H, Sq, Dv] = [1, 2, 8, 64]"));
  a = args();
  a.dk.dtype = DType::BF16;
  CHECK_THROWS_WITH(kernel->backward(a), Catch::Contains("`dk` is bf16 but must be f32"));
  a = args();
  a.dv.data = nullptr;
  CHECK_THROWS_WITH(kernel->backward(a), Catch::Contains("`dv` has no data"));
  a = args();
  a.grads = {{"t", Tensor::contiguous(gbias.data(), DType::F32, {H})}};
  CHECK_THROWS_WITH(kernel->backward(a), Catch::Contains("does not mark as requiring a gradient") && Catch::Contains("\"grad\" list"));
  a = args();
  a.grads = {{"bais", Tensor::contiguous(gbias.data(), DType::F32, {H, L})}};
  CHECK_THROWS_WITH(kernel->backward(a), Catch::Contains("does not declare; did you mean `bias`?"));
  a = args();
  a.grads[0].second.dtype = DType::BF16;
  CHECK_THROWS_WITH(kernel->backward(a), Catch::Contains("must be f32"));
  a = args();
  a.grads[0].second.shape = {H, L - 1};
  CHECK_THROWS_WITH(kernel->backward(a), Catch::Contains("has shape [2, 14] but the buffer has shape [2, 15]"));
  a = args();
  a.grads.push_back(a.grads[0]);
  CHECK_THROWS_WITH(kernel->backward(a), Catch::Contains("twice"));
}
