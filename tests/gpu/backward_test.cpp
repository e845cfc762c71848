// GPU backward tests (label gpu): forward then backward through Runtime::compile + Kernel::backward, every
// gradient (dq, dk, dv and the marked buffers') compared element by element with the float64 reference
// backward, outputs poisoned with NaN first. Every case runs with both dQ strategies (atomics in the KV-major
// kernel, and the query-major pass that also takes the row-owned buffer gradients).
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>

#include "dsl/builtins.h"
#include "gpu/gpu_harness.h"
#include "support/attention_reference_backward.h"

using namespace flexjit;
using namespace flexjit::test;

namespace {

std::filesystem::path backward_data(const char* name) { return source_dir() / "tests" / "data" / "backward" / name; }

const std::vector<BackwardDqMode> kDqModes = {BackwardDqMode::Atomic, BackwardDqMode::QueryMajor};
const char* dq_mode_name(BackwardDqMode m) {
  return m == BackwardDqMode::Atomic ? "dq atomic" : m == BackwardDqMode::QueryMajor ? "dq query-major" : "dq auto";
}

struct BwdCase {
  int64_t B = 1, H = 2, Hkv = 2, Sq = 200, Skv = 260;
  dsl::DType dtype = dsl::DType::BF16;
  std::vector<std::pair<std::string, double>> params = {};  // initialised: designated initialisers may leave it out
  unsigned seed = 7;
  int64_t int_hi = 8;
  double scale = 0;  // softmax scale of the launches and the reference; 0: 1 / sqrt(D)
  // Rewrites a buffer's host values (by spec name) before they are uploaded, e.g. to put -inf entries in.
  std::function<void(const std::string&, NpyArray&)> edit_buffer = {};
};

// Everything a backward launch reads, on the host and the device.
struct Problem {
  dsl::Spec spec;
  BwdCase c;
  int64_t D = 0;
  std::vector<float> q, k, v, d_o;
  DeviceTensor4 dq_in, dk_in, dv_in, ddo;
  std::vector<HostDeviceBuffer> bufs;
  std::map<std::string, int64_t> sym;
};

Problem make_problem(const dsl::Spec& spec_in, const BwdCase& c) {
  Problem pr;
  pr.spec = spec_in;
  pr.spec.dtype = c.dtype;
  pr.c = c;
  pr.D = pr.spec.head_dim;
  std::mt19937 rng(c.seed);
  std::vector<uint16_t> qb, kb, vb, ob;
  pr.q = random_rounded(size_t(c.B * c.H * c.Sq * pr.D), c.dtype, rng, qb);
  pr.k = random_rounded(size_t(c.B * c.Hkv * c.Skv * pr.D), c.dtype, rng, kb);
  pr.v = random_rounded(size_t(c.B * c.Hkv * c.Skv * pr.D), c.dtype, rng, vb);
  pr.d_o = random_rounded(size_t(c.B * c.H * c.Sq * pr.D), c.dtype, rng, ob);
  pr.dq_in = upload4(0, qb, c.dtype, c.B, c.H, c.Sq, pr.D, false);
  pr.dk_in = upload4(0, kb, c.dtype, c.B, c.Hkv, c.Skv, pr.D, false);
  pr.dv_in = upload4(0, vb, c.dtype, c.B, c.Hkv, c.Skv, pr.D, false);
  pr.ddo = upload4(0, ob, c.dtype, c.B, c.H, c.Sq, pr.D, false);
  pr.sym = {{"B", c.B}, {"H", c.H}, {"Hkv", c.Hkv}, {"Sq", c.Sq}, {"Skv", c.Skv}, {"D", pr.D}, {"L", 2 * c.Skv - 1}, {"N", 64}};
  pr.bufs = make_buffers(pr.spec, pr.sym, 0, rng, c.int_hi);
  if (c.edit_buffer)
    for (size_t i = 0; i < pr.bufs.size(); ++i) {
      c.edit_buffer(pr.spec.buffers[i].name, pr.bufs[i].host);
      pr.bufs[i].mem.upload(pr.bufs[i].host.data.data(), pr.bufs[i].host.data.size());
    }
  return pr;
}

EvalEnv make_env(const SpecIR& ir, const Problem& pr) {
  EvalEnv env = reference_env(ir, pr.sym, pr.c.params);
  for (const HostDeviceBuffer& b : pr.bufs)
    env.buffers.push_back(BufferView{b.host.dtype, b.host.data.data(), b.host.shape, contiguous_strides(b.host.shape)});
  return env;
}

struct GpuGrads {
  std::vector<float> o, lse, dq, dk, dv;
  std::vector<std::vector<float>> grads;  // per spec buffer; empty unless marked
};

std::vector<std::pair<std::string, Tensor>> buffer_args(const Problem& pr) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (size_t i = 0; i < pr.bufs.size(); ++i)
    out.emplace_back(pr.spec.buffers[i].name, Tensor{pr.bufs[i].mem.data(), pr.bufs[i].host.dtype, pr.bufs[i].host.shape, {}});
  return out;
}

// Allocates dq / dk / dv ([B, H, q_rows, D] and [B, Hkv, kv_rows, D]) and the marked buffers' gradients, poisoned
// with NaN, into `a` (its inputs set), launches the backward and returns every gradient.
GpuGrads backward_into(Kernel& kernel, const Problem& pr, BackwardArgs a, int64_t q_rows, int64_t kv_rows) {
  const BwdCase& c = pr.c;
  std::vector<uint16_t> zq(size_t(c.B * c.H * q_rows * pr.D)), zk(size_t(c.B * c.Hkv * kv_rows * pr.D));
  DeviceTensor4 gq = upload4(0, zq, c.dtype, c.B, c.H, q_rows, pr.D, false);
  DeviceTensor4 gk = upload4(0, zk, c.dtype, c.B, c.Hkv, kv_rows, pr.D, false);
  DeviceTensor4 gv = upload4(0, zk, c.dtype, c.B, c.Hkv, kv_rows, pr.D, false);
  gq.mem.fill_bytes(0xff);
  gk.mem.fill_bytes(0xff);
  gv.mem.fill_bytes(0xff);
  std::vector<runtime::DeviceBuffer> gmem;
  a.dq = gq.tensor;
  a.dk = gk.tensor;
  a.dv = gv.tensor;
  a.params = c.params;
  a.buffers = buffer_args(pr);
  a.scale = static_cast<float>(c.scale);
  std::vector<int> marked;
  for (size_t i = 0; i < pr.spec.buffers.size(); ++i) {
    if (!pr.spec.buffers[i].requires_grad) continue;
    size_t n = size_t(pr.bufs[i].host.numel());
    gmem.emplace_back(0, n * 4);
    gmem.back().fill_bytes(0xff);
    a.grads.emplace_back(pr.spec.buffers[i].name, Tensor{gmem.back().data(), dsl::DType::F32, pr.bufs[i].host.shape, {}});
    marked.push_back(int(i));
  }
  kernel.backward(a);
  kernel.check_errors(0, nullptr);
  GpuGrads g;
  g.dq = download4(gq, c.dtype);
  g.dk = download4(gk, c.dtype);
  g.dv = download4(gv, c.dtype);
  g.grads.resize(pr.spec.buffers.size());
  for (size_t m = 0; m < marked.size(); ++m) {
    auto& out = g.grads[size_t(marked[m])];
    out.resize(size_t(pr.bufs[size_t(marked[m])].host.numel()));
    gmem[m].download(out.data(), out.size() * 4);
  }
  return g;
}

// Backward only, with the given o (device, dtype of q) and lse (device f32).
GpuGrads run_backward(Kernel& kernel, const Problem& pr, const Tensor& o, const Tensor& lse, bool deterministic, const Tensor& k, const Tensor& v,
                      int64_t Skv, BackwardDqMode dq_mode, const BlockMask* mask = nullptr) {
  BackwardArgs a;
  a.q = pr.dq_in.tensor;
  a.k = k;
  a.v = v;
  a.o = o;
  a.d_o = pr.ddo.tensor;
  a.lse = lse;
  a.deterministic = deterministic;
  a.dq_mode = dq_mode;
  a.block_mask = mask;
  return backward_into(kernel, pr, std::move(a), pr.c.Sq, Skv);
}

struct FwdOut {
  DeviceTensor4 o;
  runtime::DeviceBuffer lse;
  std::vector<float> o_host, lse_host;
};

AttentionArgs forward_args(const Problem& pr, const Tensor& k, const Tensor& v) {
  const BwdCase& c = pr.c;
  AttentionArgs a;
  a.q = pr.dq_in.tensor;
  a.k = k;
  a.v = v;
  a.params = c.params;
  a.buffers = buffer_args(pr);
  a.scale = static_cast<float>(c.scale);
  return a;
}

FwdOut run_forward(Kernel& kernel, const Problem& pr, const Tensor& k, const Tensor& v, int64_t Skv, const BlockMask* mask = nullptr) {
  const BwdCase& c = pr.c;
  std::vector<uint16_t> z(size_t(c.B * c.H * c.Sq * pr.D), 0);
  FwdOut f{upload4(0, z, c.dtype, c.B, c.H, c.Sq, pr.D, false), runtime::DeviceBuffer(0, size_t(c.B * c.H * c.Sq) * 4), {}, {}};
  AttentionArgs a = forward_args(pr, k, v);
  a.o = f.o.tensor;
  a.lse = Tensor{f.lse.data(), dsl::DType::F32, {c.B, c.H, c.Sq}, {}};
  a.block_mask = mask;
  kernel.forward(a);
  kernel.check_errors(0, nullptr);
  f.o_host = download4(f.o, c.dtype);
  f.lse_host.resize(size_t(c.B * c.H * c.Sq));
  f.lse.download(f.lse_host.data(), f.lse_host.size() * 4);
  (void)Skv;
  return f;
}

std::vector<double> to_double(const std::vector<float>& x) { return std::vector<double>(x.begin(), x.end()); }

void expect_match(const char* what, const std::vector<float>& got, const std::vector<double>& ref, double bound) {
  Comparison cmp = compare(got, ref);
  std::printf("  %-22s rel_l2 %.2e max_abs %.2e bad %lld\n", what, cmp.rel_l2, cmp.max_abs, static_cast<long long>(cmp.bad));
  INFO(what << ": rel_l2 " << cmp.rel_l2 << " max_abs " << cmp.max_abs << " bad " << cmp.bad << " (first " << cmp.first_bad << ")");
  CHECK(cmp.bad == 0);
  CHECK(cmp.rel_l2 < bound);
}

bool bitwise_equal(const std::vector<float>& x, const std::vector<float>& y) {
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * 4) == 0;
}

// Every gradient of two runs, bit for bit.
void expect_same_grads(const GpuGrads& x, const GpuGrads& y) {
  CHECK(bitwise_equal(x.dq, y.dq));
  CHECK(bitwise_equal(x.dk, y.dk));
  CHECK(bitwise_equal(x.dv, y.dv));
  for (size_t i = 0; i < x.grads.size(); ++i) CHECK(bitwise_equal(x.grads[i], y.grads[i]));
}

struct CheckedRun {
  std::vector<BackwardDqMode> modes;
  std::vector<GpuGrads> gpu;  // per mode
  RefBackward ref;
};

// Forward, the float64 reference backward (with the forward's own o and lse), and the backward with each dQ
// strategy in `modes`, each compared with the reference; `runs` > 1 repeats each backward and requires the same bits.
CheckedRun check_case(const dsl::Spec& spec, const BwdCase& c, bool deterministic = false, double bound = 2e-2,
                      const std::vector<BackwardDqMode>& modes = kDqModes, int runs = 1) {
  Problem pr = make_problem(spec, c);
  Runtime rt;
  auto kernel = rt.compile(pr.spec);
  FwdOut f = run_forward(*kernel, pr, pr.dk_in.tensor, pr.dv_in.tensor, c.Skv);
  Tensor lse{f.lse.data(), dsl::DType::F32, {c.B, c.H, c.Sq}, {}};
  SpecIR ir = build_spec_ir(pr.spec);
  EvalEnv env = make_env(ir, pr);
  std::vector<double> lse_d(f.lse_host.begin(), f.lse_host.end());
  RefBackward ref = reference_backward(ir, RefShape{c.B, c.H, c.Hkv, c.Sq, c.Skv, pr.D, pr.D}, pr.q, pr.k, pr.v, pr.d_o, to_double(f.o_host),
                                       lse_d, env, c.scale > 0 ? c.scale : 1.0 / std::sqrt(double(pr.D)));
  CheckedRun run{modes, {}, std::move(ref)};
  for (BackwardDqMode mode : modes) {
    GpuGrads g = run_backward(*kernel, pr, f.o.tensor, lse, deterministic, pr.dk_in.tensor, pr.dv_in.tensor, c.Skv, mode);
    std::printf("%s D%lld %s B%lld H%lld/%lld Sq%lld Skv%lld%s, %s\n", spec.name.c_str(), (long long)pr.D, dsl::dtype_name(c.dtype),
                (long long)c.B, (long long)c.H, (long long)c.Hkv, (long long)c.Sq, (long long)c.Skv, deterministic ? " deterministic" : "",
                dq_mode_name(mode));
    INFO(spec.name << " D" << pr.D << " " << dsl::dtype_name(c.dtype) << " B" << c.B << " H" << c.H << "/" << c.Hkv << " Sq" << c.Sq << " Skv"
                   << c.Skv << (deterministic ? " deterministic" : "") << ", " << dq_mode_name(mode));
    expect_match("dq", g.dq, run.ref.dq, bound);
    expect_match("dk", g.dk, run.ref.dk, bound);
    expect_match("dv", g.dv, run.ref.dv, bound);
    for (size_t i = 0; i < pr.spec.buffers.size(); ++i) {
      if (!pr.spec.buffers[i].requires_grad) continue;
      INFO("gradient of " << pr.spec.buffers[i].name);
      expect_match(("grad " + pr.spec.buffers[i].name).c_str(), g.grads[i], run.ref.grads[i], bound);
    }
    for (int r = 1; r < runs; ++r) {
      INFO("run " << r + 1 << " against run 1");
      expect_same_grads(g, run_backward(*kernel, pr, f.o.tensor, lse, deterministic, pr.dk_in.tensor, pr.dv_in.tensor, c.Skv, mode));
    }
    run.gpu.push_back(std::move(g));
  }
  return run;
}

// Two runs of the same case agree bit for bit in every gradient, per dQ strategy.
void expect_same_bits(const CheckedRun& a, const CheckedRun& b) {
  REQUIRE(a.modes == b.modes);
  for (size_t m = 0; m < a.modes.size(); ++m) {
    INFO(dq_mode_name(a.modes[m]));
    expect_same_grads(a.gpu[m], b.gpu[m]);
  }
}

dsl::Spec inline_spec(const std::string& name, std::optional<std::string> score, std::optional<std::string> mask, int d,
                      std::vector<std::string> buffers = {}, std::vector<std::string> grads = {}) {
  dsl::Spec s;
  s.name = name;
  s.score_mod = score;
  s.mask_mod = mask;
  s.head_dim = d;
  dsl::Diagnostics diags;
  for (auto& b : buffers) dsl::add_buffer(s, b, "test", diags);
  REQUIRE(!diags.has_errors());
  for (auto& g : grads)
    for (auto& b : s.buffers)
      if (b.name == g) b.requires_grad = true;
  return s;
}

dsl::Spec with_dim(dsl::Spec s, int d) {
  s.head_dim = d;
  return s;
}

}  // namespace

TEST_CASE("backward: gallery mods at odd lengths (bf16, D 128)", "[gpu][backward]") {
  FLEXJIT_REQUIRE_GPU();
  for (const char* name : {"causal", "softcap", "alibi", "alibi_causal", "sliding_window"}) {
    BwdCase c;
    c.Sq = 1000;
    c.Skv = 1037;
    if (std::string(name) == "sliding_window") c.params = {{"window", 100}};
    check_case(load_spec(gallery_dir() / (std::string(name) + ".json")), c);
  }
}

TEST_CASE("backward: learnable buffers (bias, slopes, kv bias, offset bias, SAM)", "[gpu][backward]") {
  FLEXJIT_REQUIRE_GPU();
  BwdCase c;
  c.Sq = 300;
  c.Skv = 333;
  check_case(load_spec(backward_data("learnable_bias.json")), c);
  check_case(load_spec(backward_data("alibi_learnable.json")), c);
  check_case(load_spec(backward_data("softcap_bias_learnable.json")), c);
  check_case(load_spec(backward_data("offset_bias_learnable.json")), c);
  // Unmasked learnable slopes: d slope[h] sums dS (kv - q) over every (q, kv) of the head, terms of both signs
  // 100-1000x larger than their sum (ill-conditioned; PyTorch's compiled flex_attention lands 5e-2 away), so it is
  // checked here against the float64 reference.
  check_case(inline_spec("alibi_learnable_unmasked", "score + slope[h] * (kv - q)", std::nullopt, 128, {"slope: f32[H]"}, {"slope"}), c);
  BwdCase sam;
  sam.Sq = sam.Skv = 320;
  check_case(load_spec(backward_data("sam_learnable.json")), sam);
  // A runtime width: its module has the value compiled in (compiler/specialize.h), so rel_h and rel_w are staged as
  // with a constant 64; W = 16 stages neither.
  for (double w : {64.0, 16.0}) {
    INFO("SAM with a runtime width W = " << w);
    sam.params = {{"W", w}};
    check_case(load_spec(backward_data("sam_runtime_width_learnable.json")), sam);
  }
}

TEST_CASE("backward: SAM rel_h / rel_w by the query-major pass (GQA, odd lengths, masks, routing)", "[gpu][backward]") {
  FLEXJIT_REQUIRE_GPU();
  const std::string sam_mod = "score + rel_h[b, h, q, kv // 64] + rel_w[b, h, q, kv % 64]";
  const std::vector<std::string> rel = {"rel_h: bf16[B, H, Sq, 64]", "rel_w: bf16[B, H, Sq, 64]"};
  check_case(load_spec(backward_data("sam_learnable.json")), BwdCase{.B = 2, .H = 4, .Hkv = 2, .Sq = 200, .Skv = 330});
  // Partial and full tiles of the forward's lists, and fully masked rows (q % 5 == 1: dq = 0, no gradient).
  const BwdCase m{.Sq = 300, .Skv = 300};
  check_case(inline_spec("sam_causal", sam_mod, std::string("kv <= q && q % 5 != 1"), 64, rel, {"rel_h", "rel_w"}), m);
  // Routing: the slope (uniform) stays in the KV-major kernel while rel_h / rel_w go to the pass.
  std::vector<std::string> mixed_bufs = rel;
  mixed_bufs.push_back("slope: f32[H]");
  check_case(inline_spec("sam_slope", sam_mod + " + slope[h] * (kv - q)", std::nullopt, 64, mixed_bufs, {"rel_h", "rel_w", "slope"}), m);
  // Auto: on Hopper the KV-major kernel stages rel_h / rel_w (flex_backward_staged.cuh) and one pass computes
  // everything; elsewhere the query-major pass takes them. Either way against the reference.
  check_case(load_spec(backward_data("sam_learnable.json")), BwdCase{.Sq = 256, .Skv = 256}, false, 2e-2,
             {BackwardDqMode::Auto, BackwardDqMode::QueryMajor});
}

TEST_CASE("backward: staged SAM terms - strided rows, fp16, head dim 128, a term without gradient", "[gpu][backward]") {
  FLEXJIT_REQUIRE_GPU();
  const std::string sam_mod = "score + rel_h[b, h, q, kv // 64] + rel_w[b, h, q, kv % 64]";
  // Rows of 65 and 66 elements: neither copy can go by cp.async (unaligned rows) nor rel_w's gradient by
  // vector atomics (rows of 66 floats), so the plain-load and scalar-atomic paths run.
  check_case(inline_spec("sam_strided", sam_mod, std::nullopt, 64, {"rel_h: bf16[B, H, Sq, 65]", "rel_w: bf16[B, H, Sq, 66]"}, {"rel_h", "rel_w"}),
             BwdCase{.Sq = 190, .Skv = 333});
  // fp16 buffers and q, head dim 128, GQA 2:1, and Skv ending inside the second warpgroup's 64 rows.
  check_case(inline_spec("sam_f16", sam_mod, std::nullopt, 128, {"rel_h: f16[B, H, Sq, 64]", "rel_w: f16[B, H, Sq, 64]"}, {"rel_h", "rel_w"}),
             BwdCase{.B = 2, .H = 4, .Hkv = 2, .Sq = 150, .Skv = 230, .dtype = dsl::DType::F16});
  // Spread rows (a CTA owns 16 kv % 64 columns of eight kv // 64 blocks): Skv = 1100 ends inside the third
  // 512-row range (J 16 and 17 of its 16 .. 23 exist), GQA 2:1, with and without a padding mask (the schedule
  // merges the block mask over the 512 rows); rel_w alone.
  check_case(load_spec(backward_data("sam_learnable.json")), BwdCase{.B = 1, .H = 4, .Hkv = 2, .Sq = 260, .Skv = 1100});
  check_case(inline_spec("sam_pad", sam_mod, std::string("kv < 1000 - 3 * q"), 64, {"rel_h: bf16[B, H, Sq, 64]", "rel_w: bf16[B, H, Sq, 64]"},
                         {"rel_h", "rel_w"}),
             BwdCase{.H = 2, .Hkv = 2, .Sq = 400, .Skv = 1100});
  check_case(inline_spec("rel_w_only", "score + rel_w[b, h, q, kv % 64]", std::nullopt, 64, {"rel_w: bf16[B, H, Sq, 64]"}, {"rel_w"}),
             BwdCase{.Sq = 130, .Skv = 700});
  // Only rel_w learnable (rel_h staged without a gradient), and a residual score_mod beside the staged terms.
  check_case(inline_spec("sam_half_grad", "score * (1.0 - 0.25 * (q % 3)) + rel_h[b, h, q, kv // 64] + rel_w[b, h, q, kv % 64]", std::nullopt, 64,
                         {"rel_h: bf16[B, H, Sq, 64]", "rel_w: bf16[B, H, Sq, 64]"}, {"rel_w"}),
             BwdCase{.Sq = 128, .Skv = 200});
}

TEST_CASE("backward: staged SAM terms - softmax scales, -inf entries, head dims 32 / 80 / 128, rel_w alone with a mask", "[gpu][backward]") {
  FLEXJIT_REQUIRE_GPU();
  const dsl::Spec sam = load_spec(backward_data("sam_learnable.json"));
  const BwdCase base{.B = 1, .H = 2, .Hkv = 2, .Sq = 200, .Skv = 600};  // partial tiles, a partial 512-row range
  for (double scale : {0.0, 0.1, 0.3, 0.7}) {
    INFO("scale " << scale);
    BwdCase c = base;
    c.scale = scale;
    check_case(sam, c, false, 2e-2, {BackwardDqMode::Atomic});
  }
  SECTION("-inf and the lowest finite bf16 in rel_w and rel_h mask their elements only") {
    BwdCase c = base;
    c.edit_buffer = [](const std::string& name, NpyArray& h) {
      uint16_t* x = h.as<uint16_t>();
      const int64_t step = name == "rel_w" ? 7 : 13;
      for (int64_t i = 0; i < h.numel(); i += step) x[i] = 0xff80;  // -inf
      for (int64_t i = 3; i < h.numel(); i += 11) x[i] = 0xff7f;     // -3.39e38
    };
    check_case(sam, c, false, 2e-2, {BackwardDqMode::Atomic});
  }
  SECTION("head dims 32, 80 and 128, GQA 2:1; rel_w alone under a mask") {
    for (int d : {32, 80, 128}) {
      INFO("head dim " << d);
      check_case(with_dim(sam, d), BwdCase{.B = 1, .H = 4, .Hkv = 2, .Sq = 130, .Skv = 520}, false, 2e-2, {BackwardDqMode::Atomic});
    }
    check_case(inline_spec("rel_w_only", "score + rel_w[b, h, q, kv % 64]", std::string("kv < q + 300"), 64, {"rel_w: bf16[B, H, Sq, 64]"}, {"rel_w"}),
               base, false, 2e-2, {BackwardDqMode::Atomic});
  }
}

TEST_CASE("backward: document mask, fully masked rows, GQA 4:1", "[gpu][backward]") {
  FLEXJIT_REQUIRE_GPU();
  BwdCase c;
  c.Sq = c.Skv = 400;
  c.int_hi = 5;
  check_case(load_spec(gallery_dir() / "document.json"), c);
  // Rows q % 7 == 3 see nothing: LSE -inf, dq must be 0 there (and no NaN anywhere).
  dsl::Spec holes = inline_spec("holes", std::nullopt, std::string("q % 7 != 3 && kv <= q"), 64);
  CheckedRun r = check_case(holes, c);
  for (const GpuGrads& g : r.gpu) {
    bool zero_rows = true;
    for (int64_t h = 0; h < c.H; ++h)
      for (int64_t q = 3; q < c.Sq; q += 7)
        for (int64_t d = 0; d < 64; ++d) zero_rows = zero_rows && g.dq[size_t((h * c.Sq + q) * 64 + d)] == 0.f;
    CHECK(zero_rows);
  }
  BwdCase g;
  g.H = 8;
  g.Hkv = 2;
  g.Sq = 250;
  g.Skv = 270;
  check_case(load_spec(backward_data("alibi_learnable.json")), g);
  check_case(load_spec(gallery_dir() / "causal.json"), g);
}

// FlexAttention users build one block mask and pass it to the forward and the backward. Kernel::build_block_mask
// builds it at the forward's tiles, which on Hopper differ from the 128 x 64 ones the backward reads: the backward
// must take it (and build its own) and give the gradients it gives without a mask, bit for bit in deterministic mode.
// A mask for another shape is still refused.
TEST_CASE("backward: the forward's block mask serves the backward too", "[gpu][backward]") {
  FLEXJIT_REQUIRE_GPU();
  BwdCase c;
  c.H = 4;
  c.Hkv = 2;
  c.Sq = 300;
  c.Skv = 520;
  const dsl::Spec docs = inline_spec("docs", std::nullopt, std::string("dq[q] == dk[kv]"), 128, {"dq: i32[Sq]", "dk: i32[Skv]"});
  for (const dsl::Spec& spec : {load_spec(gallery_dir() / "causal.json"), docs}) {
    INFO(spec.name);
    c.int_hi = 5;
    Problem pr = make_problem(spec, c);
    Runtime rt;
    auto kernel = rt.compile(pr.spec);
    FwdOut unmasked = run_forward(*kernel, pr, pr.dk_in.tensor, pr.dv_in.tensor, c.Skv);
    AttentionArgs shape = forward_args(pr, pr.dk_in.tensor, pr.dv_in.tensor);
    shape.o = unmasked.o.tensor;
    std::unique_ptr<BlockMask> mask = kernel->build_block_mask(shape);
    FwdOut f = run_forward(*kernel, pr, pr.dk_in.tensor, pr.dv_in.tensor, c.Skv, mask.get());
    CHECK(bitwise_equal(f.o_host, unmasked.o_host));
    Tensor lse{f.lse.data(), dsl::DType::F32, {c.B, c.H, c.Sq}, {}};
    for (BackwardDqMode mode : kDqModes) {
      INFO(dq_mode_name(mode));
      GpuGrads with = run_backward(*kernel, pr, f.o.tensor, lse, true, pr.dk_in.tensor, pr.dv_in.tensor, c.Skv, mode, mask.get());
      GpuGrads without = run_backward(*kernel, pr, f.o.tensor, lse, true, pr.dk_in.tensor, pr.dv_in.tensor, c.Skv, mode);
      CHECK(bitwise_equal(with.dq, without.dq));
      CHECK(bitwise_equal(with.dk, without.dk));
      CHECK(bitwise_equal(with.dv, without.dv));
    }
    BwdCase other = c;
    other.Sq = 200;
    Problem po = make_problem(spec, other);
    FwdOut fo = run_forward(*kernel, po, po.dk_in.tensor, po.dv_in.tensor, other.Skv);
    Tensor lse_o{fo.lse.data(), dsl::DType::F32, {other.B, other.H, other.Sq}, {}};
    REQUIRE_THROWS_WITH(run_backward(*kernel, po, fo.o.tensor, lse_o, true, po.dk_in.tensor, po.dv_in.tensor, other.Skv, kDqModes[0], mask.get()),
                        Catch::Matchers::Contains("of a sequence of 300 x 520 positions but this launch has 0, 0, 200 x 520"));
  }
}

// A buffer marked for a gradient that the score_mod does not read (read by the mask only, or not at all) has no
// scatter: its gradient is exactly zero and must be written as such over the poisoned output, in both modes.
// Found by the GPU differential run (issue 27): such gradients came back as the NaN poison.
TEST_CASE("backward: marked buffers the score_mod does not read get zero gradients", "[gpu][backward]") {
  FLEXJIT_REQUIRE_GPU();
  const BwdCase c{.Sq = 130, .Skv = 170};
  dsl::Spec spec = inline_spec("grad_without_scatter", "score + bias[h]", std::string("gate[kv] > 0.0 || kv <= q"), 64,
                               {"bias: f32[H]", "gate: f32[Skv]", "unused: bf16[5]"}, {"bias", "gate", "unused"});
  check_case(spec, c);
  check_case(spec, c, true);
  check_case(inline_spec("grad_no_mods", std::nullopt, std::nullopt, 64, {"unused: f32[H]"}, {"unused"}), c);
}

TEST_CASE("backward: head dims and fp16", "[gpu][backward]") {
  FLEXJIT_REQUIRE_GPU();
  dsl::Spec alibi = load_spec(backward_data("alibi_learnable.json"));
  for (int d : {64, 80, 128}) {
    BwdCase c;
    c.Sq = 333;
    c.Skv = 517;
    check_case(with_dim(alibi, d), c);
  }
  for (int d : {32, 96, 192, 256}) {
    BwdCase c;
    c.Sq = 150;
    c.Skv = 170;
    check_case(with_dim(alibi, d), c);
  }
  // Every scatter class in the head-dim split form: q-only and KV-only (the uniform slope above, the diagonal bias in
  // the every-head-dim test).
  for (const char* file : {"offset_bias_learnable.json", "softcap_bias_learnable.json"})
    for (int d : {192, 256}) check_case(with_dim(load_spec(backward_data(file)), d), BwdCase{.Sq = 150, .Skv = 170});
  BwdCase h;
  h.dtype = dsl::DType::F16;
  h.Sq = 280;  // bias[h, q - kv + Skv - 1] with L = 2 Skv - 1 needs Sq <= Skv
  h.Skv = 300;
  check_case(load_spec(backward_data("learnable_bias.json")), h);
  check_case(load_spec(gallery_dir() / "softcap.json"), h);
}

TEST_CASE("backward: every head dim x {causal, document, learnable bias} x {bf16, fp16}, GQA 8:1, odd lengths", "[gpu][backward]") {
  FLEXJIT_REQUIRE_GPU();
  const dsl::Spec causal = load_spec(gallery_dir() / "causal.json");
  const dsl::Spec document = load_spec(gallery_dir() / "document.json");  // doc: i32[Sq] is read at kv: Sq = Skv
  const dsl::Spec bias = load_spec(backward_data("learnable_bias.json"));  // L = 2 Skv - 1 needs Sq <= Skv
  for (dsl::DType dtype : {dsl::DType::BF16, dsl::DType::F16})
    for (int d : {64, 80, 96, 128, 192, 256}) {
      const BwdCase odd{.B = 1, .H = 8, .Hkv = 1, .Sq = 181, .Skv = 211, .dtype = dtype};
      const BwdCase square{.B = 1, .H = 8, .Hkv = 1, .Sq = 197, .Skv = 197, .dtype = dtype, .int_hi = 5};
      // Above head dim 128 the query-major pass too: the split form without dQ (deterministic launches' choice there).
      const std::vector<BackwardDqMode> causal_modes =
          d > 128 ? std::vector<BackwardDqMode>{BackwardDqMode::Auto, BackwardDqMode::QueryMajor} : std::vector<BackwardDqMode>{BackwardDqMode::Auto};
      check_case(with_dim(causal, d), odd, false, 2e-2, causal_modes);
      check_case(with_dim(document, d), square, false, 2e-2, {BackwardDqMode::Auto});
      check_case(with_dim(bias, d), odd, false, 2e-2, {BackwardDqMode::Auto});
    }
}

TEST_CASE("backward: deterministic mode is bitwise reproducible", "[gpu][backward]") {
  FLEXJIT_REQUIRE_GPU();
  BwdCase c;
  c.Sq = 500;
  c.Skv = 530;
  dsl::Spec spec = load_spec(backward_data("learnable_bias.json"));
  expect_same_bits(check_case(spec, c, true), check_case(spec, c, true));
  dsl::Spec alibi = load_spec(backward_data("alibi_learnable.json"));
  expect_same_bits(check_case(alibi, c, true), check_case(alibi, c, true));
  // The query-major pass's own scatters (SAM's rel_h per row and tile, rel_w per row and column), fixed point.
  const BwdCase sc{.Sq = 300, .Skv = 300};
  dsl::Spec sam = load_spec(backward_data("sam_learnable.json"));
  expect_same_bits(check_case(sam, sc, true), check_case(sam, sc, true));
  // The KV-major kernel's staged gradients in fixed point (on Hopper: spread rows), forced past Auto's choice,
  // over a partial 512-row range.
  const BwdCase spread{.Sq = 200, .Skv = 700};
  expect_same_bits(check_case(sam, spread, true, 2e-2, {BackwardDqMode::Atomic}), check_case(sam, spread, true, 2e-2, {BackwardDqMode::Atomic}));
}

TEST_CASE("backward: deterministic gradients from many KV tiles are the same in five runs", "[gpu][backward]") {
  FLEXJIT_REQUIRE_GPU();
  // Nine KV tiles of 128 rows add into each query row's dQ (on Hopper by bulk reductions of 64-bit fixed point, in
  // whatever order the CTAs arrive): every run must give the same bits, and each run must match the reference.
  for (int d : {64, 96, 128, 192, 256}) {
    const BwdCase c{.B = 2, .H = 4, .Hkv = 2, .Sq = 333, .Skv = 1100};
    // Above head dim 128 as Auto routes them: the query-major pass beside the split form.
    check_case(inline_spec("causal_det_d" + std::to_string(d), std::nullopt, std::string("kv <= q + 800"), d), c, true, 2e-2,
               {d > 128 ? BackwardDqMode::Auto : BackwardDqMode::Atomic}, 5);
  }
  // Buffer gradients too, as Auto runs them: the learnable bias (a diagonal scatter) and SAM's staged rel_h / rel_w.
  check_case(load_spec(backward_data("learnable_bias.json")), BwdCase{.B = 1, .H = 4, .Hkv = 4, .Sq = 700, .Skv = 1100}, true, 2e-2,
             {BackwardDqMode::Auto}, 5);
  // At head dim 256: the split form's scatter (fixed point, without its dQ) beside the query-major pass.
  check_case(with_dim(load_spec(backward_data("learnable_bias.json")), 256), BwdCase{.B = 1, .H = 4, .Hkv = 4, .Sq = 300, .Skv = 500}, true,
             2e-2, {BackwardDqMode::Auto}, 5);
  check_case(load_spec(backward_data("sam_learnable.json")), BwdCase{.B = 1, .H = 4, .Hkv = 4, .Sq = 600, .Skv = 600}, true, 2e-2,
             {BackwardDqMode::Auto}, 5);
}

TEST_CASE("backward: deterministic staged SAM gradients - blocked accumulators and their fallbacks", "[gpu][backward]") {
  FLEXJIT_REQUIRE_GPU();
  const std::string sam_mod = "score + rel_h[b, h, q, kv // 64] + rel_w[b, h, q, kv % 64]";
  // The warp-specialised kernel sends each query tile's sums of rel_w and rel_h as one 64-bit bulk reduction into
  // accumulators laid out in blocks (flex_bwd::blocked_index), which the conversion puts back in the buffers' order.
  // Buffers with more rows than Sq (a last block of 34 rows, of which the launch's last tile covers 14) and more
  // columns than the terms read, GQA 2:1, two runs bit for bit.
  check_case(inline_spec("sam_det_wide", sam_mod, std::nullopt, 64, {"rel_h: bf16[B, H, 290, 72]", "rel_w: bf16[B, H, 290, 80]"}, {"rel_h", "rel_w"}),
             BwdCase{.B = 2, .H = 4, .Hkv = 2, .Sq = 270, .Skv = 1100}, true, 2e-2, {BackwardDqMode::Atomic}, 2);
  // Columns the slices do not tile (65: rel_h by per-element atomics; 66: rel_w too), and rel_h alone blocked.
  check_case(inline_spec("sam_det_unaligned", sam_mod, std::nullopt, 64, {"rel_h: bf16[B, H, Sq, 65]", "rel_w: bf16[B, H, Sq, 66]"},
                         {"rel_h", "rel_w"}),
             BwdCase{.Sq = 190, .Skv = 333}, true, 2e-2, {BackwardDqMode::Atomic}, 2);
  check_case(inline_spec("sam_det_mixed", sam_mod, std::nullopt, 64, {"rel_h: bf16[B, H, Sq, 64]", "rel_w: bf16[B, H, Sq, 66]"}, {"rel_h", "rel_w"}),
             BwdCase{.Sq = 200, .Skv = 600}, true, 2e-2, {BackwardDqMode::Atomic}, 2);
}

TEST_CASE("backward: LSE in - KV split in two chunks with a merged LSE", "[gpu][backward]") {
  FLEXJIT_REQUIRE_GPU();
  // softcap: the mod depends on the score only, so a KV chunk sees the same mods as the whole.
  dsl::Spec spec = with_dim(load_spec(gallery_dir() / "softcap.json"), 64);
  BwdCase c;
  c.Sq = 300;
  c.Skv = 448;
  Problem pr = make_problem(spec, c);
  Runtime rt;
  auto kernel = rt.compile(pr.spec);
  const int64_t D = pr.D, split = 192;
  // K / V chunk views (contiguous [B, Hkv, Skv, D]: a chunk is an offset view with the full strides).
  auto view = [&](const DeviceTensor4& t, int64_t s0, int64_t n) {
    Tensor v = t.tensor;
    v.data = static_cast<char*>(t.mem.data()) + s0 * D * 2;
    v.shape = {c.B, c.Hkv, n, D};
    v.strides = {c.Hkv * c.Skv * D, c.Skv * D, D, 1};
    return v;
  };
  Tensor k1 = view(pr.dk_in, 0, split), k2 = view(pr.dk_in, split, c.Skv - split);
  Tensor v1 = view(pr.dv_in, 0, split), v2 = view(pr.dv_in, split, c.Skv - split);
  FwdOut f1 = run_forward(*kernel, pr, k1, v1, split);
  FwdOut f2 = run_forward(*kernel, pr, k2, v2, c.Skv - split);
  // Merge on the host: lse = log(e^lse1 + e^lse2), o = sum_i e^(lse_i - lse) o_i (rounded to the dtype).
  const size_t rows = size_t(c.B * c.H * c.Sq);
  std::vector<float> lse(rows);
  std::vector<double> o_ref(rows * size_t(D)), lse_ref(rows);
  std::vector<uint16_t> o_bits(rows * size_t(D));
  for (size_t r = 0; r < rows; ++r) {
    double l1 = f1.lse_host[r], l2 = f2.lse_host[r], m = std::max(l1, l2);
    double l = m + std::log(std::exp(l1 - m) + std::exp(l2 - m));
    lse[r] = float(l);
    lse_ref[r] = lse[r];
    for (int64_t d = 0; d < D; ++d) {
      double o = std::exp(l1 - l) * f1.o_host[r * size_t(D) + size_t(d)] + std::exp(l2 - l) * f2.o_host[r * size_t(D) + size_t(d)];
      o_bits[r * size_t(D) + size_t(d)] = float_to_bf16(float(o));
      o_ref[r * size_t(D) + size_t(d)] = bf16_to_float(o_bits[r * size_t(D) + size_t(d)]);
    }
  }
  DeviceTensor4 om = upload4(0, o_bits, c.dtype, c.B, c.H, c.Sq, D, false);
  runtime::DeviceBuffer lm(0, rows * 4);
  lm.upload(lse.data(), rows * 4);
  Tensor lse_t{lm.data(), dsl::DType::F32, {c.B, c.H, c.Sq}, {}};
  SpecIR ir = build_spec_ir(pr.spec);
  RefBackward ref = reference_backward(ir, RefShape{c.B, c.H, c.Hkv, c.Sq, c.Skv, D, D}, pr.q, pr.k, pr.v, pr.d_o, o_ref, lse_ref,
                                       make_env(ir, pr), 1.0 / std::sqrt(double(D)));
  for (BackwardDqMode mode : kDqModes) {
    INFO(dq_mode_name(mode));
    GpuGrads g1 = run_backward(*kernel, pr, om.tensor, lse_t, false, k1, v1, split, mode);
    GpuGrads g2 = run_backward(*kernel, pr, om.tensor, lse_t, false, k2, v2, c.Skv - split, mode);
    std::vector<float> dq(g1.dq.size());
    for (size_t i = 0; i < dq.size(); ++i) dq[i] = g1.dq[i] + g2.dq[i];
    expect_match("dq (sum of chunks)", dq, ref.dq, 2e-2);
    // dk / dv of each chunk against the matching rows of the unsplit reference.
    auto rows_of = [&](const std::vector<double>& full, int64_t s0, int64_t n) {
      std::vector<double> out;
      for (int64_t b = 0; b < c.B; ++b)
        for (int64_t h = 0; h < c.Hkv; ++h)
          for (int64_t s = s0; s < s0 + n; ++s)
            for (int64_t d = 0; d < D; ++d) out.push_back(full[size_t(((b * c.Hkv + h) * c.Skv + s) * D + d)]);
      return out;
    };
    expect_match("dk chunk 1", g1.dk, rows_of(ref.dk, 0, split), 2e-2);
    expect_match("dk chunk 2", g2.dk, rows_of(ref.dk, split, c.Skv - split), 2e-2);
    expect_match("dv chunk 1", g1.dv, rows_of(ref.dv, 0, split), 2e-2);
    expect_match("dv chunk 2", g2.dv, rows_of(ref.dv, split, c.Skv - split), 2e-2);
  }
}

// Context parallelism (issue 28): the backward of every (query shard, KV shard) block of a 300-position sequence cut
// at uneven places, each launch given its offsets and the whole launch's O and LSE (as a ring gives its blocks the
// merged ones), summed on the host, against the whole sequence's float64 reference backward: dq, dk, dv and the
// buffer gradients, summed over the blocks. The mods must see global positions for documents, a relative bias and
// learnable ALiBi slopes to come out right; pairs a causal mask empties must add zeros, not NaN.
TEST_CASE("backward: shards with global positions sum to the whole sequence's gradients", "[gpu][backward][context_parallel]") {
  FLEXJIT_REQUIRE_GPU();
  struct Span {
    int64_t first, rows;
  };
  auto spans = [](std::vector<int64_t> cuts) {
    std::vector<Span> out;
    for (size_t i = 0; i + 1 < cuts.size(); ++i) out.push_back({cuts[i], cuts[i + 1] - cuts[i]});
    return out;
  };
  const std::vector<Span> q_spans = spans({0, 37, 150, 211, 300}), kv_spans = spans({0, 90, 101, 230, 300});
  unsigned seed = 2900;
  for (const std::filesystem::path& path : {gallery_dir() / "causal.json", gallery_dir() / "document.json", backward_data("learnable_bias.json"),
                                            backward_data("alibi_learnable.json")})
    for (int d : {128, 64}) {
      BwdCase c;
      c.H = 4;
      c.Sq = c.Skv = 300;
      c.seed = seed++;
      Problem pr = make_problem(with_dim(load_spec(path), d), c);
      INFO(pr.spec.name << " D" << d);
      Runtime rt;
      auto kernel = rt.compile(pr.spec);
      FwdOut f = run_forward(*kernel, pr, pr.dk_in.tensor, pr.dv_in.tensor, c.Skv);
      SpecIR ir = build_spec_ir(pr.spec);
      const RefBackward ref = reference_backward(ir, RefShape{c.B, c.H, c.Hkv, c.Sq, c.Skv, pr.D, pr.D}, pr.q, pr.k, pr.v, pr.d_o,
                                                 to_double(f.o_host), to_double(f.lse_host), make_env(ir, pr), 1.0 / std::sqrt(double(pr.D)));
      // Rows [sp.first, sp.first + sp.rows) of a contiguous [B, heads, S, width] tensor ([B, heads, S] for width 0).
      auto rows = [&](const Tensor& t, Span sp, int64_t heads, int64_t width) {
        const int64_t row = std::max<int64_t>(width, 1);
        Tensor v = t;
        v.data = static_cast<char*>(t.data) + sp.first * row * dsl::dtype_size(t.dtype);
        v.shape = {c.B, heads, sp.rows};
        v.strides = {heads * c.Sq * row, c.Sq * row, row};
        if (width) {
          v.shape.push_back(width);
          v.strides.push_back(1);
        }
        return v;
      };
      const Tensor lse{f.lse.data(), dsl::DType::F32, {c.B, c.H, c.Sq}, {}};
      std::vector<float> dq(ref.dq.size(), 0.f), dk(ref.dk.size(), 0.f), dv(ref.dv.size(), 0.f);
      std::vector<std::vector<float>> grads(ref.grads.size());
      for (size_t i = 0; i < grads.size(); ++i) grads[i].assign(ref.grads[i].size(), 0.f);
      // Adds a block's [B, heads, rows, D] gradient into rows [first, first + rows) of the whole one.
      auto add_rows = [&](std::vector<float>& sum, const std::vector<float>& part, Span sp, int64_t heads) {
        for (int64_t bh = 0; bh < c.B * heads; ++bh)
          for (int64_t r = 0; r < sp.rows; ++r)
            for (int64_t e = 0; e < pr.D; ++e) sum[size_t(((bh * c.Sq) + sp.first + r) * pr.D + e)] += part[size_t((bh * sp.rows + r) * pr.D + e)];
      };
      for (const Span qs : q_spans)
        for (const Span ks : kv_spans) {
          BackwardArgs a;
          a.q = rows(pr.dq_in.tensor, qs, c.H, pr.D);
          a.k = rows(pr.dk_in.tensor, ks, c.Hkv, pr.D);
          a.v = rows(pr.dv_in.tensor, ks, c.Hkv, pr.D);
          a.o = rows(f.o.tensor, qs, c.H, pr.D);
          a.d_o = rows(pr.ddo.tensor, qs, c.H, pr.D);
          a.lse = rows(lse, qs, c.H, 0);
          a.q_offset = qs.first;
          a.kv_offset = ks.first;
          a.seqlen_q = a.seqlen_kv = c.Sq;
          const GpuGrads g = backward_into(*kernel, pr, std::move(a), qs.rows, ks.rows);
          add_rows(dq, g.dq, qs, c.H);
          add_rows(dk, g.dk, ks, c.Hkv);
          add_rows(dv, g.dv, ks, c.Hkv);
          for (size_t i = 0; i < grads.size(); ++i)
            for (size_t e = 0; e < g.grads[i].size(); ++e) grads[i][e] += g.grads[i][e];
        }
      std::printf("%s D%d: %zu x %zu shard blocks of S %lld\n", pr.spec.name.c_str(), d, q_spans.size(), kv_spans.size(), (long long)c.Sq);
      expect_match("dq (sum of blocks)", dq, ref.dq, 2e-2);
      expect_match("dk (sum of blocks)", dk, ref.dk, 2e-2);
      expect_match("dv (sum of blocks)", dv, ref.dv, 2e-2);
      for (size_t i = 0; i < grads.size(); ++i) {
        if (!pr.spec.buffers[i].requires_grad) continue;
        expect_match(("grad " + pr.spec.buffers[i].name + " (sum)").c_str(), grads[i], ref.grads[i], 2e-2);
      }
    }
}

TEST_CASE("backward: argument errors are clear", "[gpu][backward]") {
  FLEXJIT_REQUIRE_GPU();
  Problem pr = make_problem(load_spec(backward_data("alibi_learnable.json")), BwdCase{});
  Runtime rt;
  auto kernel = rt.compile(pr.spec);
  BackwardArgs a;
  a.q = pr.dq_in.tensor;
  a.k = pr.dk_in.tensor;
  a.v = pr.dv_in.tensor;
  a.o = pr.dq_in.tensor;
  a.d_o = pr.ddo.tensor;
  a.dq = pr.dq_in.tensor;
  a.dk = pr.dk_in.tensor;
  a.dv = pr.dv_in.tensor;
  a.buffers = buffer_args(pr);
  CHECK_THROWS_WITH(kernel->backward(a), Catch::Contains("lse is required"));
  runtime::DeviceBuffer lse(0, size_t(pr.c.B * pr.c.H * pr.c.Sq) * 4);
  a.lse = Tensor{lse.data(), dsl::DType::F32, {pr.c.B, pr.c.H, pr.c.Sq}, {}};
  runtime::DeviceBuffer g(0, 64);
  a.grads = {{"slope", Tensor{g.data(), dsl::DType::F32, {3}, {}}}};
  CHECK_THROWS_WITH(kernel->backward(a), Catch::Contains("gradient of `slope` has shape"));
  a.grads = {{"slope", Tensor{g.data(), dsl::DType::BF16, {pr.c.H}, {}}}};
  CHECK_THROWS_WITH(kernel->backward(a), Catch::Contains("must be f32"));
}
