// GPU ragged-prefill tests (label gpu): Kernel::forward_varlen over packed sequences of lengths 1 to 3000
// against the float64 reference run per sequence (the mods see positions within the sequence).
#include <catch2/catch.hpp>
#include <cmath>

#include "gpu/gpu_harness.h"

using namespace flexjit;
using namespace flexjit::test;

namespace {

void run_varlen(const dsl::Spec& spec, int H, int Hkv, const std::vector<int>& lq, const std::vector<int>& lkv,
                std::vector<std::pair<std::string, double>> params, unsigned seed) {
  const int B = static_cast<int>(lq.size());
  const int D = spec.head_dim;
  std::vector<int32_t> cq(B + 1, 0), ck(B + 1, 0);
  for (int b = 0; b < B; ++b) {
    cq[b + 1] = cq[b] + lq[b];
    ck[b + 1] = ck[b] + lkv[b];
  }
  const int tq = cq[B], tk = ck[B];
  const int max_q = *std::max_element(lq.begin(), lq.end()), max_kv = *std::max_element(lkv.begin(), lkv.end());
  std::mt19937 rng(seed);
  std::vector<uint16_t> qb, kb, vb;
  std::vector<float> q = random_rounded(size_t(tq) * H * D, dsl::DType::BF16, rng, qb);  // [tq, H, D]
  std::vector<float> k = random_rounded(size_t(tk) * Hkv * D, dsl::DType::BF16, rng, kb);
  std::vector<float> v = random_rounded(size_t(tk) * Hkv * D, dsl::DType::BF16, rng, vb);
  const int dev = 0;
  runtime::DeviceBuffer dq(dev, qb.size() * 2), dk(dev, kb.size() * 2), dv(dev, vb.size() * 2), dout(dev, qb.size() * 2),
      dlse(dev, size_t(H) * tq * 4), dcq(dev, cq.size() * 4), dck(dev, ck.size() * 4);
  dq.upload(qb.data(), qb.size() * 2);
  dk.upload(kb.data(), kb.size() * 2);
  dv.upload(vb.data(), vb.size() * 2);
  dcq.upload(cq.data(), cq.size() * 4);
  dck.upload(ck.data(), ck.size() * 4);
  dout.fill_bytes(0xff);
  dlse.fill_bytes(0xff);

  Runtime rt;
  auto kernel = rt.compile(spec);
  VarlenArgs a;
  a.q = Tensor{dq.data(), spec.dtype, {tq, H, D}, {}};
  a.k = Tensor{dk.data(), spec.dtype, {tk, Hkv, D}, {}};
  a.v = Tensor{dv.data(), spec.dtype, {tk, Hkv, D}, {}};
  a.o = Tensor{dout.data(), spec.dtype, {tq, H, D}, {}};
  a.lse = Tensor{dlse.data(), dsl::DType::F32, {H, tq}, {}};
  a.cu_seqlens_q = Tensor{dcq.data(), dsl::DType::I32, {B + 1}, {}};
  a.cu_seqlens_kv = Tensor{dck.data(), dsl::DType::I32, {B + 1}, {}};
  a.max_seqlen_q = max_q;
  a.max_seqlen_kv = max_kv;
  a.params = params;
  kernel->forward_varlen(a);
  kernel->check_errors(dev, nullptr);
  std::vector<uint16_t> raw(qb.size());
  dout.download(raw.data(), raw.size() * 2);
  std::vector<float> lse(size_t(H) * tq);
  dlse.download(lse.data(), lse.size() * 4);

  SpecIR ir = build_spec_ir(spec);
  std::map<std::string, int64_t> sym = {{"B", B}, {"H", H}, {"Hkv", Hkv}, {"Sq", max_q}, {"Skv", max_kv}, {"D", D}};
  EvalEnv env;
  env.symbols.resize(ir.checked.symbols.size());
  for (size_t i = 0; i < ir.checked.symbols.size(); ++i) env.symbols[i] = sym.count(ir.checked.symbols[i]) ? sym[ir.checked.symbols[i]] : 1;
  env.params.resize(spec.params.size());
  for (size_t i = 0; i < spec.params.size(); ++i) {
    const dsl::ParamDecl& p = spec.params[i];
    Value val;
    val.type = p.type == dsl::ValueType::Float ? ir::Type::Float : p.type == dsl::ValueType::Bool ? ir::Type::Bool : ir::Type::Int;
    double x = p.type == dsl::ValueType::Float ? p.float_value : p.type == dsl::ValueType::Bool ? double(p.bool_value) : double(p.int_value);
    for (auto& [n, pv] : params)
      if (n == p.name) x = pv;
    val.i = static_cast<int64_t>(x);
    val.f = static_cast<float>(x);
    val.b = x != 0;
    env.params[i] = val;
  }
  std::vector<float> got_o, got_l;
  std::vector<double> ref_o, ref_l;
  for (int b = 0; b < B; ++b) {
    // Sequence b as [1, H, lq, D] / [1, Hkv, lkv, D].
    std::vector<float> qs(size_t(H) * lq[b] * D), ks(size_t(Hkv) * lkv[b] * D), vs(ks.size());
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < lq[b]; ++i)
        for (int d = 0; d < D; ++d) qs[(size_t(h) * lq[b] + i) * D + d] = q[(size_t(cq[b] + i) * H + h) * D + d];
    for (int h = 0; h < Hkv; ++h)
      for (int j = 0; j < lkv[b]; ++j)
        for (int d = 0; d < D; ++d) {
          ks[(size_t(h) * lkv[b] + j) * D + d] = k[(size_t(ck[b] + j) * Hkv + h) * D + d];
          vs[(size_t(h) * lkv[b] + j) * D + d] = v[(size_t(ck[b] + j) * Hkv + h) * D + d];
        }
    RefResult r = reference_attention(ir, RefShape{1, H, Hkv, lq[b], lkv[b], D, D}, qs, ks, vs, env, 1.0 / std::sqrt(double(D)));
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < lq[b]; ++i) {
        for (int d = 0; d < D; ++d) {
          ref_o.push_back(r.o[(size_t(h) * lq[b] + i) * D + d]);
          got_o.push_back(bf16_to_float(raw[(size_t(cq[b] + i) * H + h) * D + d]));
        }
        ref_l.push_back(r.lse[size_t(h) * lq[b] + i]);
        got_l.push_back(lse[size_t(h) * tq + cq[b] + i]);
      }
  }
  Comparison co = compare(got_o, ref_o), cl = compare(got_l, ref_l);
  INFO(spec.name << " O: rel_l2 " << co.rel_l2 << " max_abs " << co.max_abs << " bad " << co.bad << " (first " << co.first_bad << ")");
  INFO("LSE: max_abs " << cl.max_abs << " bad " << cl.bad << " (first " << cl.first_bad << ")");
  CHECK(co.bad == 0);
  CHECK(cl.bad == 0);
  CHECK(co.rel_l2 < 1.5e-2);
  CHECK(cl.max_abs < 1e-3);
}

}  // namespace

TEST_CASE("ragged prefill: packed sequences of lengths 1 to 3000 match the float64 reference", "[gpu][varlen]") {
  FLEXJIT_REQUIRE_GPU();
  const std::vector<int> lq = {1, 17, 300, 3000, 128, 129};
  const std::vector<int> lkv = {1, 40, 300, 3000, 200, 129};
  run_varlen(load_spec(gallery_dir() / "causal.json"), 4, 2, lq, lkv, {}, 1);
  run_varlen(load_spec(gallery_dir() / "sliding_window.json"), 4, 4, lq, lkv, {{"window", 256}}, 2);
  run_varlen(load_spec(gallery_dir() / "softcap.json"), 4, 1, lq, lq, {}, 3);
}

// The Hopper kernel's three-warpgroup tiles (192 query rows) at head dims 64 and 96: query tiles that straddle the
// end of a packed sequence, and sequences shorter than one tile.
TEST_CASE("ragged prefill at head dims 64 and 96", "[gpu][varlen]") {
  FLEXJIT_REQUIRE_GPU();
  const std::vector<int> lq = {1, 191, 192, 193, 700, 385};
  const std::vector<int> lkv = {5, 191, 250, 193, 700, 1000};
  for (int d : {64, 96}) {
    INFO("head dim " << d);
    dsl::Spec causal = load_spec(gallery_dir() / "causal.json"), window = load_spec(gallery_dir() / "sliding_window.json");
    causal.head_dim = window.head_dim = d;
    run_varlen(causal, 4, 2, lq, lkv, {}, 4 + d);
    run_varlen(window, 4, 1, lq, lkv, {{"window", 150}}, 5 + d);
  }
}

// Hidden (run with "[forward_bench]"): full and causal forward, B4 H16 S4096 D128 bf16, to check that the
// ragged-batch branch of flex_forward.cuh does not slow the dense path (compare with a build of the old template).
TEST_CASE("forward timings of the dense path", "[.][forward_bench]") {
  FLEXJIT_REQUIRE_GPU();
  const runtime::CudaDriver& d = *runtime::cuda_driver();
  runtime::ScopedDevice scope(0);
  const int B = 4, H = 16, S = 4096, D = 128;
  const size_t n = size_t(B) * H * S * D;
  runtime::DeviceBuffer dq(0, n * 2), dk(0, n * 2), dv(0, n * 2), dout(0, n * 2), dlse(0, size_t(B) * H * S * 4);
  std::mt19937 rng(3);
  std::vector<uint16_t> bits;
  random_rounded(n, dsl::DType::BF16, rng, bits);
  dq.upload(bits.data(), n * 2);
  dk.upload(bits.data(), n * 2);
  dv.upload(bits.data(), n * 2);
  for (const char* mask : {"", "q >= kv"}) {
    dsl::Spec spec;
    spec.name = *mask ? "causal" : "full";
    if (*mask) spec.mask_mod = std::string(mask);
    spec.head_dim = D;
    Runtime rt;
    auto kernel = rt.compile(spec);
    AttentionArgs a;
    a.q = Tensor{dq.data(), dsl::DType::BF16, {B, H, S, D}, {}};
    a.k = Tensor{dk.data(), dsl::DType::BF16, {B, H, S, D}, {}};
    a.v = Tensor{dv.data(), dsl::DType::BF16, {B, H, S, D}, {}};
    a.o = Tensor{dout.data(), dsl::DType::BF16, {B, H, S, D}, {}};
    a.lse = Tensor{dlse.data(), dsl::DType::F32, {B, H, S}, {}};
    std::unique_ptr<BlockMask> bm;
    if (*mask) {
      bm = kernel->build_block_mask(a);
      a.block_mask = bm.get();
    }
    for (int i = 0; i < 5; ++i) kernel->forward(a);
    CUevent start, stop;
    runtime::check_cu(d.cuEventCreate(&start, 0), "cuEventCreate");
    runtime::check_cu(d.cuEventCreate(&stop, 0), "cuEventCreate");
    std::vector<float> ms;
    for (int i = 0; i < 30; ++i) {
      runtime::check_cu(d.cuEventRecord(start, nullptr), "cuEventRecord");
      kernel->forward(a);
      runtime::check_cu(d.cuEventRecord(stop, nullptr), "cuEventRecord");
      runtime::check_cu(d.cuEventSynchronize(stop), "cuEventSynchronize");
      float t = 0;
      runtime::check_cu(d.cuEventElapsedTime_v2(&t, start, stop), "cuEventElapsedTime");
      ms.push_back(t);
    }
    d.cuEventDestroy_v2(start);
    d.cuEventDestroy_v2(stop);
    std::sort(ms.begin(), ms.end());
    std::printf("FORWARD_BENCH | %s | %.4f ms |\n", spec.name.c_str(), ms[ms.size() / 2]);
    std::fflush(stdout);
  }
}
