// The CPU ragged backward (Kernel::backward_varlen with Device::cpu()) after the CPU forward_varlen, against the
// float64 reference backward (tests/support/attention_reference_backward.h) run per sequence: packed sequences of
// different lengths (1, 0 query rows, 0 KV rows, both 0), causal, a document mask indexed by b, learnable buffers
// (a relative bias, a per-sequence slope read at b) whose gradients sum over the sequences, GQA 2:1, f32 and bf16;
// then equality with per-sequence dense backwards, and argument errors. Outputs are NaN-filled before each launch.
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <utility>

#include "compiler/frontend.h"
#include "dsl/error.h"
#include "runtime/cpu/cpu_backend.h"
#include "runtime/flexjit.hpp"
#include "support/attention_reference_backward.h"
#include "unit/cpu/backward_operands.h"
#include "unit/cpu/gallery_inputs.h"

using namespace flexjit;
using test::kNanF;
using test::Operands;
using test::Sizes;

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

dsl::Spec inline_spec(const std::string& name, const std::string& score_mod, const std::string& mask_mod, const std::vector<std::string>& buffers,
                      const std::vector<std::string>& grad, DType dtype, int64_t D) {
  dsl::Spec spec;
  spec.name = name;
  if (!score_mod.empty()) spec.score_mod = score_mod;
  if (!mask_mod.empty()) spec.mask_mod = mask_mod;
  dsl::Diagnostics diags;
  for (const std::string& b : buffers) REQUIRE(dsl::add_buffer(spec, b, "test", diags));
  for (dsl::BufferDecl& b : spec.buffers) b.requires_grad = std::find(grad.begin(), grad.end(), b.name) != grad.end();
  spec.dtype = dtype;
  spec.head_dim = static_cast<int>(D);
  return spec;
}

// A packed batch: sequence b owns query rows [cq[b], cq[b + 1]) and KV rows [ck[b], ck[b + 1]).
struct Batch {
  std::vector<int32_t> cq = {0}, ck = {0};
  int64_t B = 0, tq = 0, tk = 0, max_q = 1, max_kv = 1;
  Batch(const std::vector<int32_t>& lq, const std::vector<int32_t>& lk) : B(static_cast<int64_t>(lq.size())) {
    for (size_t b = 0; b < lq.size(); ++b) {
      cq.push_back(cq.back() + lq[b]);
      ck.push_back(ck.back() + lk[b]);
      max_q = std::max<int64_t>(max_q, lq[b]);
      max_kv = std::max<int64_t>(max_kv, lk[b]);
    }
    tq = cq.back();
    tk = ck.back();
  }
  int64_t q0(int64_t b) const { return cq[static_cast<size_t>(b)]; }
  int64_t k0(int64_t b) const { return ck[static_cast<size_t>(b)]; }
  int64_t lq(int64_t b) const { return cq[static_cast<size_t>(b + 1)] - q0(b); }
  int64_t lk(int64_t b) const { return ck[static_cast<size_t>(b + 1)] - k0(b); }
};

// One ragged problem: inputs exact in `dtype`, captured buffers for Sizes{B, H, Hkv, max_q, max_kv, D}.
struct Problem {
  Problem(dsl::Spec s, Batch b) : spec(std::move(s)), batch(std::move(b)) {}
  dsl::Spec spec;
  Batch batch;
  int64_t H = 4, Hkv = 2, D = 64;
  DType dtype = DType::F32;
  std::vector<float> q, k, v, d_o;
  std::vector<test::HostBuffer> buffers;
  Sizes sizes() const { return {batch.B, H, Hkv, batch.max_q, batch.max_kv, D}; }
};

Problem make_problem(const dsl::Spec& spec, const Batch& batch, uint64_t seed) {
  Problem p(spec, batch);
  p.dtype = spec.dtype;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.5f, 1.5f);
  auto fill = [&](std::vector<float>& t, int64_t n) {
    t.resize(static_cast<size_t>(n));
    for (float& x : t) x = p.dtype == DType::BF16 ? test::bf16_round(u(rng)) : u(rng);
  };
  fill(p.q, batch.tq * p.H * p.D);
  fill(p.k, batch.tk * p.Hkv * p.D);
  fill(p.v, batch.tk * p.Hkv * p.D);
  fill(p.d_o, batch.tq * p.H * p.D);
  p.buffers = test::make_buffers(spec, p.sizes(), rng);
  return p;
}

VarlenArgs forward_args(Problem& p, Operands& q, Operands& k, Operands& v, Operands& o, std::vector<float>& lse) {
  Batch& bt = p.batch;
  VarlenArgs a;
  a.q = q.tensor({bt.tq, p.H, p.D});
  a.k = k.tensor({bt.tk, p.Hkv, p.D});
  a.v = v.tensor({bt.tk, p.Hkv, p.D});
  a.o = o.tensor({bt.tq, p.H, p.D});
  a.lse = Tensor::contiguous(lse.data(), DType::F32, {p.H, bt.tq});
  a.cu_seqlens_q = Tensor::contiguous(bt.cq.data(), DType::I32, {bt.B + 1});
  a.cu_seqlens_kv = Tensor::contiguous(bt.ck.data(), DType::I32, {bt.B + 1});
  a.max_seqlen_q = static_cast<int>(bt.max_q);
  a.max_seqlen_kv = static_cast<int>(bt.max_kv);
  for (test::HostBuffer& hb : p.buffers) a.buffers.push_back({hb.name, hb.tensor()});
  a.device = Device::cpu();
  return a;
}

struct Result {
  std::vector<float> o, lse;              // the forward's (o as fp32 values of the stored dtype)
  std::vector<float> dq, dk, dv;          // fp32 values of the stored dtype, packed
  std::vector<std::vector<float>> grads;  // per spec buffer; empty unless it requires a gradient
};

// forward_varlen, then backward_varlen with NaN-filled dq, dk, dv and buffer gradients.
Result run_cpu(Problem& p, const std::shared_ptr<Kernel>& kernel) {
  Operands q(p.dtype, p.q), k(p.dtype, p.k), v(p.dtype, p.v), d_o(p.dtype, p.d_o), o(p.dtype, p.d_o.size());
  std::vector<float> lse(static_cast<size_t>(p.H * p.batch.tq), kNanF);
  VarlenArgs fa = forward_args(p, q, k, v, o, lse);
  kernel->forward_varlen(fa);
  Result r;
  r.o = o.values();
  r.lse = lse;

  Operands dq(p.dtype, p.q.size()), dk(p.dtype, p.k.size()), dv(p.dtype, p.v.size());
  VarlenBackwardArgs ba;
  ba.q = fa.q;
  ba.k = fa.k;
  ba.v = fa.v;
  ba.o = fa.o;
  ba.lse = fa.lse;
  ba.d_o = d_o.tensor({p.batch.tq, p.H, p.D});
  ba.dq = dq.tensor({p.batch.tq, p.H, p.D});
  ba.dk = dk.tensor({p.batch.tk, p.Hkv, p.D});
  ba.dv = dv.tensor({p.batch.tk, p.Hkv, p.D});
  ba.cu_seqlens_q = fa.cu_seqlens_q;
  ba.cu_seqlens_kv = fa.cu_seqlens_kv;
  ba.max_seqlen_q = fa.max_seqlen_q;
  ba.max_seqlen_kv = fa.max_seqlen_kv;
  ba.buffers = fa.buffers;
  ba.device = Device::cpu();
  r.grads = test::poisoned_grads(p.spec, p.buffers, {}, ba.grads);
  kernel->backward_varlen(ba);
  r.dq = dq.values();
  r.dk = dk.values();
  r.dv = dv.values();
  return r;
}

// The float64 reference, one sequence at a time: sequence b is batch b of a dense problem whose earlier batches are
// zeros with an LSE of -inf (the reference skips those rows), so the mods see b; packed like the launch's outputs,
// the buffer gradients summed over the sequences.
test::RefBackward reference(const Problem& p, const Result& r) {
  SpecIR ir = build_spec_ir(p.spec);
  EvalEnv env = test::eval_env(ir.checked, p.sizes(), p.buffers, {});
  const Batch& bt = p.batch;
  const int64_t H = p.H, Hkv = p.Hkv, D = p.D;
  test::RefBackward out;
  out.dq.assign(p.q.size(), 0.0);
  out.dk.assign(p.k.size(), 0.0);
  out.dv.assign(p.v.size(), 0.0);
  out.grads.resize(p.spec.buffers.size());
  for (int64_t b = 0; b < bt.B; ++b) {
    const int64_t sq = bt.lq(b), skv = bt.lk(b), nb = b + 1;
    std::vector<float> q(static_cast<size_t>(nb * H * sq * D)), d_o(q.size()), k(static_cast<size_t>(nb * Hkv * skv * D)), v(k.size());
    std::vector<double> o(q.size()), lse(static_cast<size_t>(nb * H * sq), kNegInf);
    // Dense [nb, heads, rows, D] element (b, h, i, d) from packed row (first + i, h, d).
    auto dense = [&](int64_t heads, int64_t rows, int64_t h, int64_t i, int64_t d) { return static_cast<size_t>(((b * heads + h) * rows + i) * D + d); };
    auto packed = [&](int64_t heads, int64_t row, int64_t h, int64_t d) { return static_cast<size_t>((row * heads + h) * D + d); };
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < sq; ++i) {
        lse[static_cast<size_t>((b * H + h) * sq + i)] = r.lse[static_cast<size_t>(h * bt.tq + bt.q0(b) + i)];
        for (int64_t d = 0; d < D; ++d) {
          q[dense(H, sq, h, i, d)] = p.q[packed(H, bt.q0(b) + i, h, d)];
          d_o[dense(H, sq, h, i, d)] = p.d_o[packed(H, bt.q0(b) + i, h, d)];
          o[dense(H, sq, h, i, d)] = r.o[packed(H, bt.q0(b) + i, h, d)];
        }
      }
    for (int64_t h = 0; h < Hkv; ++h)
      for (int64_t i = 0; i < skv; ++i)
        for (int64_t d = 0; d < D; ++d) {
          k[dense(Hkv, skv, h, i, d)] = p.k[packed(Hkv, bt.k0(b) + i, h, d)];
          v[dense(Hkv, skv, h, i, d)] = p.v[packed(Hkv, bt.k0(b) + i, h, d)];
        }
    test::RefBackward ref =
        test::reference_backward(ir, {nb, H, Hkv, sq, skv, D, D}, q, k, v, d_o, o, lse, env, 1.0 / std::sqrt(static_cast<double>(D)));
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < sq; ++i)
        for (int64_t d = 0; d < D; ++d) out.dq[packed(H, bt.q0(b) + i, h, d)] = ref.dq[dense(H, sq, h, i, d)];
    for (int64_t h = 0; h < Hkv; ++h)
      for (int64_t i = 0; i < skv; ++i)
        for (int64_t d = 0; d < D; ++d) {
          out.dk[packed(Hkv, bt.k0(b) + i, h, d)] = ref.dk[dense(Hkv, skv, h, i, d)];
          out.dv[packed(Hkv, bt.k0(b) + i, h, d)] = ref.dv[dense(Hkv, skv, h, i, d)];
        }
    for (size_t g = 0; g < ref.grads.size(); ++g) {
      if (out.grads[g].empty()) out.grads[g].assign(ref.grads[g].size(), 0.0);
      for (size_t i = 0; i < ref.grads[g].size(); ++i) out.grads[g][i] += ref.grads[g][i];
    }
  }
  return out;
}

void check(const Problem& p, const Result& r, const test::RefBackward& ref) {
  const std::string what = fmt::format("{} {} lengths q [{}] kv [{}]", p.spec.name, dsl::dtype_name(p.dtype), fmt::join(p.batch.cq, ", "),
                                       fmt::join(p.batch.ck, ", "));
  const bool bf16 = p.dtype == DType::BF16;
  test::expect_close(r.dq, ref.dq, bf16 ? 1e-2 : 2e-5, bf16 ? 1e-3 : 1e-6, what + ": dq");
  test::expect_close(r.dk, ref.dk, bf16 ? 1e-2 : 2e-5, bf16 ? 1e-3 : 1e-6, what + ": dk");
  test::expect_close(r.dv, ref.dv, bf16 ? 1e-2 : 2e-5, bf16 ? 1e-3 : 1e-6, what + ": dv");
  for (size_t i = 0; i < p.spec.buffers.size(); ++i)
    if (p.spec.buffers[i].requires_grad)
      test::expect_close(r.grads[i], ref.grads[i], bf16 ? 2e-2 : 2e-4, bf16 ? 2e-3 : 1e-5, what + ": grad of " + p.spec.buffers[i].name);
  // A sequence without KV rows has fully masked rows, one without query rows KV rows nothing attends: exact zeros.
  for (int64_t b = 0; b < p.batch.B; ++b) {
    INFO(what << " sequence " << b);
    if (p.batch.lk(b) == 0)
      for (int64_t i = p.batch.q0(b) * p.H * p.D; i < (p.batch.q0(b) + p.batch.lq(b)) * p.H * p.D; ++i) REQUIRE(r.dq[static_cast<size_t>(i)] == 0.0f);
    if (p.batch.lq(b) == 0)
      for (int64_t i = p.batch.k0(b) * p.Hkv * p.D; i < (p.batch.k0(b) + p.batch.lk(b)) * p.Hkv * p.D; ++i) {
        REQUIRE(r.dk[static_cast<size_t>(i)] == 0.0f);
        REQUIRE(r.dv[static_cast<size_t>(i)] == 0.0f);
      }
  }
}

// Lengths 1, 37, 80 and 130 rows, a sequence without KV rows, one without query rows and one with neither.
const Batch kMixed({1, 37, 6, 0, 80, 0, 23}, {1, 50, 0, 12, 130, 0, 23});

std::vector<dsl::Spec> ragged_specs(DType dtype) {
  const int64_t D = 64;
  return {
      inline_spec("causal", "", "q >= kv", {}, {}, dtype, D),
      // Documents per sequence: doc[b, :] holds sorted ids, so the mask differs between sequences.
      inline_spec("document", "", "doc[b, q] == doc[b, kv] && q >= kv", {"doc: i32[B, Skv]"}, {}, dtype, D),
      // Learnable: a relative bias over positions and a slope per sequence, both with gradients.
      inline_spec("learnable", "score + bias[h, q - kv + Skv - 1] + slope[b] * (kv - q) * 0.0625", "q + 20 >= kv",
                  {"bias: f32[H, L]", "slope: f32[B]"}, {"bias", "slope"}, dtype, D),
  };
}

}  // namespace

TEST_CASE("CPU ragged backward: packed sequences match the float64 reference", "[cpu][backward][varlen]") {
  cpu::install();
  uint64_t seed = 300;
  for (DType dtype : {DType::F32, DType::BF16})
    for (const dsl::Spec& spec : ragged_specs(dtype)) {
      Runtime rt;
      std::shared_ptr<Kernel> kernel = rt.compile(spec);
      Problem p = make_problem(spec, kMixed, seed++);
      Result r = run_cpu(p, kernel);
      check(p, r, reference(p, r));
    }
}

TEST_CASE("CPU ragged backward: one sequence, and sequences of one row", "[cpu][backward][varlen]") {
  cpu::install();
  uint64_t seed = 320;
  for (const Batch& batch : {Batch({70}, {90}), Batch({1, 1, 1}, {1, 3, 1})}) {
    dsl::Spec spec = ragged_specs(DType::F32)[2];
    Runtime rt;
    std::shared_ptr<Kernel> kernel = rt.compile(spec);
    Problem p = make_problem(spec, batch, seed++);
    Result r = run_cpu(p, kernel);
    check(p, r, reference(p, r));
  }
}

TEST_CASE("CPU ragged backward equals a dense backward per sequence", "[cpu][backward][varlen]") {
  // Mods that read neither b nor Sq / Skv see the same values in a ragged launch as in a dense B = 1 launch of each
  // sequence: dq, dk and dv are the dense ones exactly, and the slope's gradient is the sum of the dense ones.
  cpu::install();
  dsl::Spec spec = inline_spec("alibi", "score + slope[h] * (kv - q)", "q >= kv", {"slope: f32[H]"}, {"slope"}, DType::F32, 64);
  Runtime rt;
  std::shared_ptr<Kernel> kernel = rt.compile(spec);
  Problem p = make_problem(spec, kMixed, 340);
  Result r = run_cpu(p, kernel);
  const Batch& bt = p.batch;
  const int64_t H = p.H, Hkv = p.Hkv, D = p.D;
  std::vector<double> slope_grad(static_cast<size_t>(H), 0.0);
  for (int64_t b = 0; b < bt.B; ++b) {
    const int64_t sq = bt.lq(b), skv = bt.lk(b);
    if (sq == 0 || skv == 0) continue;  // a dense launch needs rows
    std::vector<float> q(static_cast<size_t>(H * sq * D)), o(q.size()), d_o(q.size()), lse(static_cast<size_t>(H * sq)), k(static_cast<size_t>(Hkv * skv * D)),
        v(k.size());
    std::vector<float> dq(q.size(), kNanF), dk(k.size(), kNanF), dv(v.size(), kNanF), g(static_cast<size_t>(H), kNanF);
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < sq; ++i) {
        lse[static_cast<size_t>(h * sq + i)] = r.lse[static_cast<size_t>(h * bt.tq + bt.q0(b) + i)];
        for (int64_t d = 0; d < D; ++d) {
          const size_t at = static_cast<size_t>((h * sq + i) * D + d), from = static_cast<size_t>(((bt.q0(b) + i) * H + h) * D + d);
          q[at] = p.q[from];
          o[at] = r.o[from];
          d_o[at] = p.d_o[from];
        }
      }
    for (int64_t h = 0; h < Hkv; ++h)
      for (int64_t i = 0; i < skv; ++i)
        for (int64_t d = 0; d < D; ++d) {
          const size_t at = static_cast<size_t>((h * skv + i) * D + d), from = static_cast<size_t>(((bt.k0(b) + i) * Hkv + h) * D + d);
          k[at] = p.k[from];
          v[at] = p.v[from];
        }
    BackwardArgs a;
    a.q = Tensor::contiguous(q.data(), DType::F32, {1, H, sq, D});
    a.k = Tensor::contiguous(k.data(), DType::F32, {1, Hkv, skv, D});
    a.v = Tensor::contiguous(v.data(), DType::F32, {1, Hkv, skv, D});
    a.o = Tensor::contiguous(o.data(), DType::F32, {1, H, sq, D});
    a.d_o = Tensor::contiguous(d_o.data(), DType::F32, {1, H, sq, D});
    a.lse = Tensor::contiguous(lse.data(), DType::F32, {1, H, sq});
    a.dq = Tensor::contiguous(dq.data(), DType::F32, {1, H, sq, D});
    a.dk = Tensor::contiguous(dk.data(), DType::F32, {1, Hkv, skv, D});
    a.dv = Tensor::contiguous(dv.data(), DType::F32, {1, Hkv, skv, D});
    a.buffers = {{"slope", p.buffers[0].tensor()}};
    a.grads = {{"slope", Tensor::contiguous(g.data(), DType::F32, {H})}};
    a.device = Device::cpu();
    kernel->backward(a);
    INFO("sequence " << b);
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < sq; ++i)
        for (int64_t d = 0; d < D; ++d)
          REQUIRE(r.dq[static_cast<size_t>(((bt.q0(b) + i) * H + h) * D + d)] == dq[static_cast<size_t>((h * sq + i) * D + d)]);
    for (int64_t h = 0; h < Hkv; ++h)
      for (int64_t i = 0; i < skv; ++i)
        for (int64_t d = 0; d < D; ++d) {
          REQUIRE(r.dk[static_cast<size_t>(((bt.k0(b) + i) * Hkv + h) * D + d)] == dk[static_cast<size_t>((h * skv + i) * D + d)]);
          REQUIRE(r.dv[static_cast<size_t>(((bt.k0(b) + i) * Hkv + h) * D + d)] == dv[static_cast<size_t>((h * skv + i) * D + d)]);
        }
    for (int64_t h = 0; h < H; ++h) slope_grad[static_cast<size_t>(h)] += g[static_cast<size_t>(h)];
  }
  for (int64_t h = 0; h < H; ++h) {
    INFO("slope gradient, head " << h);
    REQUIRE(std::abs(r.grads[0][static_cast<size_t>(h)] - slope_grad[static_cast<size_t>(h)]) <= 1e-5 * (1 + std::abs(slope_grad[static_cast<size_t>(h)])));
  }
}

TEST_CASE("CPU ragged backward: argument errors are reported", "[cpu][backward][varlen][errors]") {
  cpu::install();
  dsl::Spec spec = inline_spec("rel", "score + bias[h, q - kv + Skv - 1]", "", {"bias: f32[H, L]"}, {"bias"}, DType::F32, 64);
  Runtime rt;
  std::shared_ptr<Kernel> kernel = rt.compile(spec);
  const int64_t H = 2, T = 8, D = 64, L = 2 * 4 - 1;
  std::vector<float> q(static_cast<size_t>(T * H * D), 0.5f), k = q, v = q, o = q, d_o = q, dq = q, dk = q, dv = q;
  std::vector<float> lse(static_cast<size_t>(H * T), 1.0f), bias(static_cast<size_t>(H * L), 0.0f), gbias = bias;
  std::vector<int32_t> cu = {0, 4, 8};
  auto args = [&] {
    VarlenBackwardArgs a;
    a.q = Tensor::contiguous(q.data(), DType::F32, {T, H, D});
    a.k = Tensor::contiguous(k.data(), DType::F32, {T, H, D});
    a.v = Tensor::contiguous(v.data(), DType::F32, {T, H, D});
    a.o = Tensor::contiguous(o.data(), DType::F32, {T, H, D});
    a.d_o = Tensor::contiguous(d_o.data(), DType::F32, {T, H, D});
    a.lse = Tensor::contiguous(lse.data(), DType::F32, {H, T});
    a.dq = Tensor::contiguous(dq.data(), DType::F32, {T, H, D});
    a.dk = Tensor::contiguous(dk.data(), DType::F32, {T, H, D});
    a.dv = Tensor::contiguous(dv.data(), DType::F32, {T, H, D});
    a.cu_seqlens_q = Tensor::contiguous(cu.data(), DType::I32, {3});
    a.cu_seqlens_kv = Tensor::contiguous(cu.data(), DType::I32, {3});
    a.max_seqlen_q = 4;
    a.max_seqlen_kv = 4;
    a.buffers = {{"bias", Tensor::contiguous(bias.data(), DType::F32, {H, L})}};
    a.grads = {{"bias", Tensor::contiguous(gbias.data(), DType::F32, {H, L})}};
    a.device = Device::cpu();
    return a;
  };
  CHECK_NOTHROW(kernel->backward_varlen(args()));
  VarlenBackwardArgs a = args();
  a.lse = {};
  CHECK_THROWS_WITH(kernel->backward_varlen(a), Catch::Contains("ragged backward (CPU): `lse` is required"));
  a = args();
  a.lse.shape = {T, H};
  CHECK_THROWS_WITH(kernel->backward_varlen(a), Catch::Contains("`lse` has shape [8, 2] but must be [H, total_q] = [2, 8]"));
  a = args();
  a.q.shape = {1, T, H, D};
  CHECK_THROWS_WITH(kernel->backward_varlen(a), Catch::Contains("`q` has 4 dimensions but must have 3"));
  a = args();
  a.d_o.shape = {T - 1, H, D};
  CHECK_THROWS_WITH(kernel->backward_varlen(a), Catch::Contains("`d_o` has shape [7, 2, 64] but must be [total_q, H, Dv] (the shape of o)"));
  a = args();
  a.dk.dtype = DType::BF16;
  CHECK_THROWS_WITH(kernel->backward_varlen(a), Catch::Contains("`dk` is bf16 but must be f32"));
  a = args();
  a.dv.data = nullptr;
  CHECK_THROWS_WITH(kernel->backward_varlen(a), Catch::Contains("`dv` has no data"));
  a = args();
  a.max_seqlen_kv = 0;
  CHECK_THROWS_WITH(kernel->backward_varlen(a), Catch::Contains("both must be >= 1"));
  a = args();
  a.max_seqlen_q = 3;
  CHECK_THROWS_WITH(kernel->backward_varlen(a), Catch::Contains("sequence 0 has 4 rows in cu_seqlens_q but the bound (max_seqlen_q) is 3"));
  a = args();
  a.cu_seqlens_kv.dtype = DType::I64;
  CHECK_THROWS_WITH(kernel->backward_varlen(a), Catch::Contains("`cu_seqlens_kv` is i64 but must be i32"));
  a = args();
  a.cu_seqlens_kv.shape = {2};
  CHECK_THROWS_WITH(kernel->backward_varlen(a), Catch::Contains("cu_seqlens_q has 3 entries and cu_seqlens_kv 2: both must be [B + 1]"));
  a = args();
  a.cu_seqlens_q.shape = {1, 3};
  CHECK_THROWS_WITH(kernel->backward_varlen(a), Catch::Contains("`cu_seqlens_q` has 2 dimensions but must have 1"));
  std::vector<int32_t> bad = {0, 5, 3};
  a = args();
  a.cu_seqlens_q = Tensor::contiguous(bad.data(), DType::I32, {3});
  a.max_seqlen_q = 8;
  CHECK_THROWS_WITH(kernel->backward_varlen(a), Catch::Contains("cu_seqlens_q decreases at sequence 1"));
  bad = {0, 4, 9};
  a.max_seqlen_q = 5;
  CHECK_THROWS_WITH(kernel->backward_varlen(a), Catch::Contains("cu_seqlens_q[B] = 9 exceeds the 8 rows of the packed tensor"));
  bad = {1, 4, 8};
  CHECK_THROWS_WITH(kernel->backward_varlen(a), Catch::Contains("cu_seqlens_q[0] is 1 but must be 0"));
  a = args();
  a.grads[0].second.shape = {H, L - 1};
  CHECK_THROWS_WITH(kernel->backward_varlen(a), Catch::Contains("has shape [2, 6] but the buffer has shape [2, 7]"));
  a = args();
  a.scale = -1;
  CHECK_THROWS_WITH(kernel->backward_varlen(a), Catch::Contains("scale must be a finite number >= 0"));
  a = args();
  a.k.shape = {T, 3, D};
  a.v.shape = {T, 3, D};
  a.dk.shape = {T, 3, D};
  a.dv.shape = {T, 3, D};
  CHECK_THROWS_WITH(kernel->backward_varlen(a), Catch::Contains("the query heads must be a multiple of the KV heads"));
}
