// GPU ragged-prefill tests (label gpu): Kernel::forward_varlen over packed sequences of lengths 1 to 3000
// against the float64 reference run per sequence (the mods see positions within the sequence).
#include <catch2/catch.hpp>
#include <cmath>
#include <optional>

#include "gpu/gpu_harness.h"

using namespace flexjit;
using namespace flexjit::test;

namespace {

// kv_fp8: K and V stored in that FP8 format with scales (per KV head, or one for both when one_scale). The launch
// widens each value times its scale into bf16 with one rounding (flex_fp8_widen.cuh), which the reference's inputs
// repeat (fp32 product, round to nearest even), so the bounds stay those of bf16 inputs. A spec buffer `doc: i32[B,
// Skv]` gets random documents of 1 to 400 positions per sequence.
void run_varlen(const dsl::Spec& spec, int H, int Hkv, const std::vector<int>& lq, const std::vector<int>& lkv,
                std::vector<std::pair<std::string, double>> params, unsigned seed, std::optional<dsl::DType> kv_fp8 = std::nullopt,
                bool one_scale = false, bool queries_at_kv_end = false) {
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
  // FP8: uniform finite codes (every magnitude of the format), scaled so the scores stay O(1).
  std::vector<uint8_t> k8, v8;
  std::vector<float> k_scale, v_scale;
  if (kv_fp8) {
    const double base = *kv_fp8 == dsl::DType::F8E4M3 ? 1.0 / 64 : 1.0 / 8192;
    for (int h = 0; h < (one_scale ? 1 : Hkv); ++h) {
      k_scale.push_back(static_cast<float>(base * (1 + 0.3 * h)));
      v_scale.push_back(static_cast<float>(base * (1.5 - 0.1 * h)));
    }
    std::uniform_int_distribution<int> code(0, 255);
    auto finite = [&] {
      for (;;) {
        const uint8_t x = static_cast<uint8_t>(code(rng));
        if (std::isfinite(fp8_to_float(x, *kv_fp8))) return x;
      }
    };
    k8.resize(k.size()), v8.resize(v.size());
    for (size_t e = 0; e < k.size(); ++e) {
      const int h = one_scale ? 0 : static_cast<int>((e / D) % Hkv);
      k8[e] = finite(), v8[e] = finite();
      k[e] = bf16_to_float(float_to_bf16(k_scale[h] * fp8_to_float(k8[e], *kv_fp8)));
      v[e] = bf16_to_float(float_to_bf16(v_scale[h] * fp8_to_float(v8[e], *kv_fp8)));
    }
  }
  std::vector<int32_t> doc;
  for (const dsl::BufferDecl& bd : spec.buffers) {
    REQUIRE(bd.name == "doc");
    std::uniform_int_distribution<int> doc_len(1, 400);
    doc.resize(size_t(B) * max_kv);
    for (int b = 0; b < B; ++b)
      for (int j = 0, id = 0, left = doc_len(rng); j < max_kv; ++j, --left) {
        if (left == 0) ++id, left = doc_len(rng);
        doc[size_t(b) * max_kv + j] = id;
      }
  }
  const size_t kv_elem = kv_fp8 ? 1 : 2;
  const int dev = 0;
  runtime::DeviceBuffer dq(dev, qb.size() * 2), dk(dev, kb.size() * kv_elem), dv(dev, vb.size() * kv_elem), dout(dev, qb.size() * 2),
      dlse(dev, size_t(H) * tq * 4), dcq(dev, cq.size() * 4), dck(dev, ck.size() * 4), dks(dev, 4 * std::max<size_t>(1, k_scale.size())),
      dvs(dev, 4 * std::max<size_t>(1, v_scale.size())), ddoc(dev, 4 * std::max<size_t>(1, doc.size()));
  dq.upload(qb.data(), qb.size() * 2);
  if (!doc.empty()) ddoc.upload(doc.data(), doc.size() * 4);
  if (kv_fp8) {
    dk.upload(k8.data(), k8.size());
    dv.upload(v8.data(), v8.size());
    dks.upload(k_scale.data(), k_scale.size() * 4);
    dvs.upload(v_scale.data(), v_scale.size() * 4);
  } else {
    dk.upload(kb.data(), kb.size() * 2);
    dv.upload(vb.data(), vb.size() * 2);
  }
  dcq.upload(cq.data(), cq.size() * 4);
  dck.upload(ck.data(), ck.size() * 4);
  dout.fill_bytes(0xff);
  dlse.fill_bytes(0xff);

  Runtime rt;
  auto kernel = rt.compile(spec);
  VarlenArgs a;
  a.q = Tensor{dq.data(), spec.dtype, {tq, H, D}, {}};
  a.k = Tensor{dk.data(), kv_fp8.value_or(spec.dtype), {tk, Hkv, D}, {}};
  a.v = Tensor{dv.data(), kv_fp8.value_or(spec.dtype), {tk, Hkv, D}, {}};
  if (kv_fp8) {
    a.k_scale = Tensor{dks.data(), dsl::DType::F32, {static_cast<int64_t>(k_scale.size())}, {}};
    a.v_scale = Tensor{dvs.data(), dsl::DType::F32, {static_cast<int64_t>(v_scale.size())}, {}};
  }
  a.o = Tensor{dout.data(), spec.dtype, {tq, H, D}, {}};
  a.lse = Tensor{dlse.data(), dsl::DType::F32, {H, tq}, {}};
  a.cu_seqlens_q = Tensor{dcq.data(), dsl::DType::I32, {B + 1}, {}};
  a.cu_seqlens_kv = Tensor{dck.data(), dsl::DType::I32, {B + 1}, {}};
  a.max_seqlen_q = max_q;
  a.max_seqlen_kv = max_kv;
  a.params = params;
  a.queries_at_kv_end = queries_at_kv_end;
  if (!doc.empty()) a.buffers.emplace_back("doc", Tensor{ddoc.data(), dsl::DType::I32, {B, max_kv}, {}});
  kernel->forward_varlen(a);
  kernel->check_errors(dev, nullptr);
  std::vector<uint16_t> raw(qb.size());
  dout.download(raw.data(), raw.size() * 2);
  std::vector<float> lse(size_t(H) * tq);
  dlse.download(lse.data(), lse.size() * 4);

  SpecIR ir = build_spec_ir(spec);
  std::map<std::string, int64_t> sym = {{"B", B}, {"H", H}, {"Hkv", Hkv}, {"Sq", max_q}, {"Skv", max_kv}, {"D", D}};
  EvalEnv env = reference_env(ir, sym, params);
  if (!doc.empty()) env.buffers.push_back(BufferView{dsl::DType::I32, doc.data(), {B, max_kv}, {max_kv, 1}});
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
    RefResult r = reference_attention(ir, RefShape{1, H, Hkv, lq[b], lkv[b], D, D}, qs, ks, vs, env, 1.0 / std::sqrt(double(D)),
                                      /*query_offset=*/queries_at_kv_end ? lkv[b] - lq[b] : 0, /*batch_offset=*/b);
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

// A spec whose mask reads documents per sequence and position (doc: i32[B, Skv], which run_varlen fills).
dsl::Spec sequence_documents(const std::string& mask, int head_dim) {
  dsl::Spec spec = load_spec(gallery_dir() / "document.json");
  spec.buffers.clear();
  dsl::Diagnostics diags;
  dsl::add_buffer(spec, "doc: i32[B, Skv]", "test", diags);
  REQUIRE(!diags.has_errors());
  spec.mask_mod = mask;
  spec.head_dim = head_dim;
  return spec;
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

// The kernel classifies each work tile's KV tiles by interval arithmetic (flex::TileScheduler): excluded tiles are
// skipped and fully kept ones run without mask_mod. Masks whose kept tiles are not one range (attention sinks plus a
// window, whose gap is skipped; a prefix), that depend on the head or the sequence (sequence 2 keeps nothing: O = 0,
// LSE = -inf; so does the last, which has no KV rows), and a buffer-reading mask, which is not classified, at the
// Hopper kernel's tile sizes of head dims 64 and 128.
TEST_CASE("ragged prefill skips the KV tiles a mask excludes: sinks + window, prefix, per-head and per-sequence masks", "[gpu][varlen]") {
  FLEXJIT_REQUIRE_GPU();
  const std::vector<int> lq = {700, 1, 385, 2000, 129, 1000, 7};
  const std::vector<int> lkv = {700, 64, 385, 2100, 1000, 1000, 0};
  const std::vector<std::pair<const char*, const char*>> masks = {
      {"sinks_window", "kv < 4 || (q >= kv && q - kv < window)"},
      {"sinks_in_two_tiles_window", "kv < 130 || (q >= kv && q - kv < window)"},
      {"prefix", "kv < window || q >= kv"},
      {"per_head", "q >= kv && (h % 2 == 0 || q - kv < window)"},
      {"per_sequence", "q >= kv && b != 2"},
      {"everything_masked_past_q", "kv <= q && kv < 300"},
  };
  for (int d : {64, 128}) {
    for (auto [name, mask] : masks) {
      INFO("head dim " << d << ", mask " << mask);
      dsl::Spec spec = load_spec(gallery_dir() / "sliding_window.json");
      spec.name = name;
      spec.mask_mod = std::string(mask);
      spec.head_dim = d;
      run_varlen(spec, 4, 2, lq, lkv, {{"window", 200}}, 21 + d);
    }
    // A buffer-reading mask: not classified, every tile below a sequence's length runs mask_mod.
    INFO("head dim " << d << ", document mask");
    run_varlen(sequence_documents("doc[b, q] == doc[b, kv]", d), 4, 2, lq, lkv, {}, 31 + d);
  }
}

// A runtime int parameter compared with positions reads its copy saturated to int32 (codegen_cuda.cpp, narrow_param):
// windows past the int32 range keep every causal pair (2^40) or none (-2^40; O = 0, LSE = -inf), as in 64 bits.
TEST_CASE("a runtime window beyond the int32 range saturates exactly", "[gpu][varlen]") {
  FLEXJIT_REQUIRE_GPU();
  const std::vector<int> lq = {300, 129}, lkv = {300, 1000};
  for (double window : {1099511627776.0, -1099511627776.0, 2147483647.0, -2147483648.0}) {
    INFO("window " << window);
    run_varlen(load_spec(gallery_dir() / "sliding_window.json"), 4, 2, lq, lkv, {{"window", window}}, 41);
  }
}

// cu_seqlens are read on the device: a sequence longer than max_seqlen_q / max_seqlen_kv, or rows past the packed
// tensors, would be read and written out of range. Such a sequence is skipped and check_errors reports it; the
// other sequences are computed.
TEST_CASE("ragged prefill: a sequence outside the launch's bounds is skipped and reported", "[gpu][varlen]") {
  FLEXJIT_REQUIRE_GPU();
  const int H = 2, D = 64, dev = 0;
  dsl::Spec spec = load_spec(gallery_dir() / "causal.json");
  spec.head_dim = D;
  Runtime rt;
  auto kernel = rt.compile(spec);
  std::mt19937 rng(5);
  std::vector<uint16_t> qb, kb, vb;
  random_rounded(size_t(400) * H * D, dsl::DType::BF16, rng, qb);
  random_rounded(size_t(400) * H * D, dsl::DType::BF16, rng, kb);
  random_rounded(size_t(400) * H * D, dsl::DType::BF16, rng, vb);
  runtime::DeviceBuffer dq(dev, qb.size() * 2), dk(dev, kb.size() * 2), dv(dev, vb.size() * 2), dout(dev, qb.size() * 2), dcq(dev, 12), dck(dev, 12);
  dq.upload(qb.data(), qb.size() * 2);
  dk.upload(kb.data(), kb.size() * 2);
  dv.upload(vb.data(), vb.size() * 2);
  // Sequence 0 fits (100 x 100); sequence 1 has 300 KV rows against max_seqlen_kv = 200, then (second launch) KV rows
  // past the 400 of k, then (third) 200 query rows at the end of 50 KV rows (queries_at_kv_end).
  for (const std::vector<int32_t>& ck :
       {std::vector<int32_t>{0, 100, 400}, std::vector<int32_t>{0, 100, 450}, std::vector<int32_t>{0, 100, 150}}) {
    const std::vector<int32_t> cq = {0, 100, 300};
    dcq.upload(cq.data(), 12);
    dck.upload(ck.data(), 12);
    dout.fill_bytes(0xff);
    VarlenArgs a;
    a.q = Tensor{dq.data(), spec.dtype, {400, H, D}, {}};
    a.k = Tensor{dk.data(), spec.dtype, {400, H, D}, {}};
    a.v = Tensor{dv.data(), spec.dtype, {400, H, D}, {}};
    a.o = Tensor{dout.data(), spec.dtype, {400, H, D}, {}};
    a.cu_seqlens_q = Tensor{dcq.data(), dsl::DType::I32, {3}, {}};
    a.cu_seqlens_kv = Tensor{dck.data(), dsl::DType::I32, {3}, {}};
    a.max_seqlen_q = 200;
    a.max_seqlen_kv = ck[2] == 400 ? 200 : 400;
    a.queries_at_kv_end = ck[2] == 150;
    kernel->forward_varlen(a);
    CHECK_THROWS_WITH(kernel->check_errors(dev, nullptr), Catch::Contains("outside the launch's bounds"));
    std::vector<uint16_t> out(qb.size());
    dout.download(out.data(), out.size() * 2);
    bool first_computed = true;
    for (size_t e = 0; e < size_t(100) * H * D; ++e) first_computed = first_computed && std::isfinite(bf16_to_float(out[e]));
    CHECK(first_computed);
  }
}

// VarlenArgs::queries_at_kv_end: a chunked prefill, each sequence's query rows its last KV positions (as decode's), so
// that `q >= kv` lets the new tokens see their whole prefix. Causal, a window and a buffer indexed by the query
// position (doc[b, q]: positions reach max_seqlen_kv - 1, past max_seqlen_q), at D64 and D128; a sequence with more
// query rows than KV rows is skipped and reported.
TEST_CASE("ragged prefill with the queries at the end of their KV (chunked prefill)", "[gpu][varlen]") {
  FLEXJIT_REQUIRE_GPU();
  const std::vector<int> lq = {512, 1, 129, 300, 0};
  const std::vector<int> lkv = {4096, 700, 129, 2000, 50};
  for (int d : {64, 128}) {
    INFO("head dim " << d);
    dsl::Spec causal = load_spec(gallery_dir() / "causal.json"), window = load_spec(gallery_dir() / "sliding_window.json");
    causal.head_dim = window.head_dim = d;
    run_varlen(causal, 4, 2, lq, lkv, {}, 51 + d, std::nullopt, false, /*queries_at_kv_end=*/true);
    run_varlen(window, 4, 1, lq, lkv, {{"window", 300}}, 52 + d, std::nullopt, false, /*queries_at_kv_end=*/true);
    run_varlen(sequence_documents("doc[b, q] == doc[b, kv] && q >= kv", d), 4, 2, lq, lkv, {}, 53 + d, std::nullopt, false,
               /*queries_at_kv_end=*/true);
  }
}

// An FP8 K / V (VarlenArgs::k_scale / v_scale): widened into bf16 by the launch, then the usual kernels (the
// warp-specialised one at head dims 64 and 128, the mma.sync one at 32).
TEST_CASE("ragged prefill over an FP8 K / V: e4m3 and e5m2, per-head and single scales", "[gpu][varlen][fp8]") {
  FLEXJIT_REQUIRE_GPU();
  const std::vector<int> lq = {1, 17, 300, 1000, 129};
  const std::vector<int> lkv = {1, 40, 300, 1000, 200};
  for (int d : {32, 64, 128}) {
    INFO("head dim " << d);
    dsl::Spec causal = load_spec(gallery_dir() / "causal.json"), softcap = load_spec(gallery_dir() / "softcap.json");
    causal.head_dim = softcap.head_dim = d;
    run_varlen(causal, 4, 2, lq, lkv, {}, 11 + d, dsl::DType::F8E4M3);
    run_varlen(softcap, 4, 4, lq, lkv, {}, 12 + d, dsl::DType::F8E5M2, /*one_scale=*/true);
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
