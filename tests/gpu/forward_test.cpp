// GPU forward tests (label gpu): every case runs through Runtime::compile + Kernel::forward
// and is compared element by element with the float64 reference; outputs are poisoned first.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <cstring>
#include <limits>

#include "gpu/gpu_harness.h"

using namespace flexjit;
using namespace flexjit::test;

namespace {

CaseResult run_case(const dsl::Spec& spec_in, const CaseOptions& c, std::map<std::string, int64_t> extra_symbols = {}) {
  dsl::Spec spec = spec_in;
  spec.dtype = c.dtype;
  const int dev = c.device;
  std::mt19937 rng(c.seed);
  const int64_t D = spec.head_dim, Dv = spec.value_head_dim();
  std::vector<uint16_t> qb, kb, vb;
  std::vector<float> q = random_rounded(size_t(c.B * c.H * c.Sq * D), c.dtype, rng, qb);
  std::vector<float> k = random_rounded(size_t(c.B * c.Hkv * c.Skv * D), c.dtype, rng, kb);
  std::vector<float> v = random_rounded(size_t(c.B * c.Hkv * c.Skv * Dv), c.dtype, rng, vb);
  if (c.kv_batch_broadcast) {  // every batch a copy of batch 0, as the reference reads it
    REQUIRE(!c.bshd);
    const size_t kn = size_t(c.Hkv * c.Skv * D), vn = size_t(c.Hkv * c.Skv * Dv);
    for (int64_t b = 1; b < c.B; ++b) {
      std::copy(k.begin(), k.begin() + kn, k.begin() + b * kn), std::copy(kb.begin(), kb.begin() + kn, kb.begin() + b * kn);
      std::copy(v.begin(), v.begin() + vn, v.begin() + b * vn), std::copy(vb.begin(), vb.begin() + vn, vb.begin() + b * vn);
    }
  }
  DeviceTensor4 dq = upload4(dev, qb, c.dtype, c.B, c.H, c.Sq, D, c.bshd);
  DeviceTensor4 dk = upload4(dev, kb, c.dtype, c.B, c.Hkv, c.Skv, D, c.bshd);
  DeviceTensor4 dv = upload4(dev, vb, c.dtype, c.B, c.Hkv, c.Skv, Dv, c.bshd);
  if (c.kv_batch_broadcast) {
    dk.tensor.strides = {0, c.Skv * D, D, 1};
    dv.tensor.strides = {0, c.Skv * Dv, Dv, 1};
  }
  std::vector<uint16_t> zeros(size_t(c.B * c.H * c.Sq * Dv), 0);
  DeviceTensor4 dout = upload4(dev, zeros, c.dtype, c.B, c.H, c.Sq, Dv, c.bshd);
  dout.mem.fill_bytes(0xff);  // NaN poison: every element must be written
  runtime::DeviceBuffer dlse(dev, size_t(c.B * c.H * c.Sq) * 4);
  dlse.fill_bytes(0xff);

  std::map<std::string, int64_t> sym = {{"B", c.B}, {"H", c.H}, {"Hkv", c.Hkv}, {"Sq", c.Sq}, {"Skv", c.Skv}, {"D", D},
                                        {"L", 2 * c.Skv - 1}, {"N", 64}};
  for (auto& [k2, v2] : extra_symbols) sym[k2] = v2;
  std::vector<HostDeviceBuffer> bufs = make_buffers(spec, sym, dev, rng, 8);
  std::vector<std::vector<int64_t>> buf_strides(bufs.size());
  for (size_t i = 0; i < bufs.size(); ++i) {
    NpyArray& h = bufs[i].host;
    if (c.edit_buffer) {
      c.edit_buffer(spec.buffers[i].name, h);
      bufs[i].mem.upload(h.data.data(), h.data.size());
    }
    if (c.buffer_row_pad > 0 && h.shape.size() >= 2) {  // the same values in longer rows: a strided view
      const int64_t cols = h.shape.back(), rows = h.numel() / cols, row_len = cols + c.buffer_row_pad;
      const size_t es = dsl::dtype_size(h.dtype);
      std::vector<unsigned char> padded(size_t(rows * row_len) * es, 0xff);
      for (int64_t r = 0; r < rows; ++r) std::memcpy(&padded[size_t(r * row_len) * es], &h.data[size_t(r * cols) * es], size_t(cols) * es);
      bufs[i].mem = runtime::DeviceBuffer(dev, padded.size());
      bufs[i].mem.upload(padded.data(), padded.size());
      std::vector<int64_t> st(h.shape.size());
      int64_t step = row_len;
      st.back() = 1;
      for (size_t d = h.shape.size() - 1; d-- > 0;) {
        st[d] = step;
        step *= h.shape[d];
      }
      buf_strides[i] = st;
    }
  }

  Runtime rt;
  std::shared_ptr<Kernel> own;
  Kernel* kernel = c.kernel;
  if (!kernel) {
    own = rt.compile(spec);
    kernel = own.get();
  }
  AttentionArgs a;
  a.q = dq.tensor;
  a.k = dk.tensor;
  a.v = dv.tensor;
  a.o = dout.tensor;
  a.lse = Tensor{dlse.data(), dsl::DType::F32, {c.B, c.H, c.Sq}, {}};
  a.params = c.params;
  a.scale = static_cast<float>(c.scale);
  for (size_t i = 0; i < bufs.size(); ++i) {
    const Tensor t{bufs[i].mem.data(), bufs[i].host.dtype, bufs[i].host.shape, buf_strides[i]};
    if (c.bind_buffers) kernel->bind_buffer(spec.buffers[i].name, t);
    else a.buffers.emplace_back(spec.buffers[i].name, t);
  }
  kernel->forward(a);
  kernel->check_errors(dev, nullptr);

  std::vector<float> o = download4(dout, c.dtype);
  std::vector<float> lse(size_t(c.B * c.H * c.Sq));
  dlse.download(lse.data(), lse.size() * 4);

  SpecIR ir = build_spec_ir(spec);
  EvalEnv env = reference_env(ir, sym, c.params);
  for (const HostDeviceBuffer& b : bufs) env.buffers.push_back(BufferView{b.host.dtype, b.host.data.data(), b.host.shape, contiguous_strides(b.host.shape)});
  const double scale = c.scale > 0 ? static_cast<double>(static_cast<float>(c.scale)) : 1.0 / std::sqrt(double(D));
  const RefShape shape{c.B, c.H, c.Hkv, c.Sq, c.Skv, D, Dv};
  if (c.sample_rows == 0) {
    RefResult ref = reference_attention(ir, shape, q, k, v, env, scale);
    return CaseResult{compare(o, ref.o), compare(lse, ref.lse)};
  }
  std::vector<int64_t> rows;
  std::uniform_int_distribution<int64_t> any_row(0, c.B * c.H * c.Sq - 1);
  for (int64_t i = 0; i < c.sample_rows; ++i) rows.push_back(any_row(rng));
  for (int64_t bh = 0; bh < c.B * c.H; ++bh) rows.push_back((bh + 1) * c.Sq - 1);
  RefResult ref = reference_attention_rows(ir, shape, q, k, v, env, scale, rows);
  std::vector<float> o_rows, lse_rows;
  for (int64_t row : rows) {
    o_rows.insert(o_rows.end(), o.begin() + row * Dv, o.begin() + (row + 1) * Dv);
    lse_rows.push_back(lse[size_t(row)]);
  }
  return CaseResult{compare(o_rows, ref.o), compare(lse_rows, ref.lse)};
}

void expect_close(const CaseResult& r, double bound = 1.5e-2) {
  INFO("O: rel_l2 " << r.o.rel_l2 << " max_abs " << r.o.max_abs << " bad " << r.o.bad << " (first " << r.o.first_bad << ")");
  INFO("LSE: rel_l2 " << r.lse.rel_l2 << " max_abs " << r.lse.max_abs << " bad " << r.lse.bad << " (first " << r.lse.first_bad << ")");
  CHECK(r.o.bad == 0);
  CHECK(r.lse.bad == 0);
  CHECK(r.o.rel_l2 < bound);
  CHECK(r.lse.max_abs < 5e-2);
}

dsl::Spec inline_spec(const std::string& name, std::optional<std::string> score, std::optional<std::string> mask, int d = 64,
                      std::vector<std::string> buffers = {}, std::vector<std::string> params = {}) {
  dsl::Spec s;
  s.name = name;
  s.score_mod = score;
  s.mask_mod = mask;
  s.head_dim = d;
  dsl::Diagnostics diags;
  for (auto& b : buffers) dsl::add_buffer(s, b, "test", diags);
  for (auto& p : params) dsl::add_param(s, p, "test", diags);
  REQUIRE(!diags.has_errors());
  return s;
}

}  // namespace

TEST_CASE("gallery specs match the float64 reference (bf16, Sq != Skv)", "[gpu]") {
  FLEXJIT_REQUIRE_GPU();
  for (const auto& path : gallery_specs()) {
    dsl::Spec spec = load_spec(path);
    INFO(spec.name);
    CaseOptions c;
    c.Sq = 190;
    c.Skv = 260;
    if (spec.name == "sliding_window") c.params = {{"window", 40}};
    if (spec.name == "prefix_lm") c.params = {{"prefix", 70}};
    // doc: i32[Sq] is indexed by kv too: only in range when Skv <= Sq (flexjit reports the
    // out-of-range loads otherwise, which the next test case checks).
    if (spec.name == "document") c.Skv = c.Sq;
    expect_close(run_case(spec, c));
  }
}

TEST_CASE("fp16 inputs", "[gpu]") {
  FLEXJIT_REQUIRE_GPU();
  CaseOptions c;
  c.dtype = dsl::DType::F16;
  for (const char* name : {"causal", "softcap", "alibi"}) {
    INFO(name);
    expect_close(run_case(load_spec(gallery_dir() / (std::string(name) + ".json")), c));
  }
}

TEST_CASE("every head dim, natively", "[gpu]") {
  FLEXJIT_REQUIRE_GPU();
  for (int d : {32, 64, 80, 96, 128, 192, 256}) {
    INFO("head dim " << d);
    CaseOptions c;
    c.B = 1;
    c.H = 2;
    c.Hkv = 2;
    c.Sq = 150;
    c.Skv = 170;
    expect_close(run_case(inline_spec("causal_d", std::nullopt, "q >= kv", d), c));
    expect_close(run_case(inline_spec("plain_d", std::nullopt, std::nullopt, d), c));
    // Soft-capping runs split (score_mod_core with its constants folded into the kernel's multiplies) on both
    // main loops, and at D128 with part of the exponentials on the FMA pipe.
    expect_close(run_case(inline_spec("softcap_d", std::string("30 * tanh(score / 30)"), std::nullopt, d), c));
  }
}

// The mods the warp-specialised kernel's tests sweep: plain, causal, a mask whose kept blocks are 64-aligned (the
// tile policy keeps such masks on 64-multiple KV tiles), a data-dependent mask (its dense block mask and ranked
// schedule), SAM's decomposed relative-position bias (per-tile and per-column hoisted state) and its rel_h term
// alone (per-tile state only, which the policy gives wider tiles).
std::vector<dsl::Spec> kernel_sweep_specs(int d) {
  return {inline_spec("full_sweep", std::nullopt, std::nullopt, d), inline_spec("causal_sweep", std::nullopt, "q >= kv", d),
          inline_spec("block_causal_sweep", std::nullopt, "kv // 64 <= q // 64", d),
          inline_spec("document_sweep", std::nullopt, "doc[q] == doc[kv]", d, {"doc: i32[Sq]"}),
          inline_spec("sam_sweep", std::string("score + rel_h[b, h, q, kv // 64] + rel_w[b, h, q, kv % 64]"), std::nullopt, d,
                      {"rel_h: bf16[B, H, Sq, 64]", "rel_w: bf16[B, H, Sq, 64]"}),
          inline_spec("rel_h_sweep", std::string("score + rel_h[b, h, q, kv // 64]"), std::nullopt, d, {"rel_h: bf16[B, H, Sq, 64]"})};
}

TEST_CASE("every head dim x {full, causal, block-causal, document, SAM, rel_h} x {bf16, fp16}", "[gpu]") {
  FLEXJIT_REQUIRE_GPU();
  // Lengths that fill no tile: 300 rows is 2 x 128 + 44, and 300 columns no multiple of any KV tile (64 .. 192).
  for (int d : {64, 80, 96, 128, 192, 256}) {
    for (dsl::DType dtype : {dsl::DType::BF16, dsl::DType::F16}) {
      for (const dsl::Spec& spec : kernel_sweep_specs(d)) {
        INFO(spec.name << " head dim " << d << (dtype == dsl::DType::BF16 ? " bf16" : " fp16"));
        CaseOptions c;
        c.B = 2;
        c.H = 2;
        c.Hkv = 2;
        c.Sq = c.Skv = 300;
        c.dtype = dtype;
        expect_close(run_case(spec, c));
      }
    }
  }
}

TEST_CASE("GQA 8:1 and [B, S, H, D] strides at every head dim", "[gpu]") {
  FLEXJIT_REQUIRE_GPU();
  for (int d : {64, 80, 96, 128, 192, 256}) {
    INFO("head dim " << d);
    CaseOptions c;
    c.B = 1;
    c.H = 8;
    c.Hkv = 1;
    c.Sq = 257;
    c.Skv = 390;
    expect_close(run_case(inline_spec("alibi_gqa", std::string("score + 0.25 * float(h) * float(kv - q)"), "q + 133 >= kv", d), c));
    c.bshd = true;
    c.Hkv = 2;
    expect_close(run_case(inline_spec("plain_bshd", std::nullopt, std::nullopt, d), c));
  }
}

TEST_CASE("odd lengths with Sq != Skv on every kind of tile", "[gpu]") {
  FLEXJIT_REQUIRE_GPU();
  // Bottom-right causal alignment (q + Skv - Sq >= kv) covers rows that see nothing (Sq > Skv) and tiles cut by Skv.
  for (auto [sq, skv] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {127, 129}, {129, 1000}, {1000, 177}, {4097, 333}, {333, 4097}}) {
    for (int d : {32, 64, 128, 256}) {
      INFO("Sq " << sq << " Skv " << skv << " head dim " << d);
      CaseOptions c;
      c.B = 1;
      c.H = 2;
      c.Hkv = 1;
      c.Sq = sq;
      c.Skv = skv;
      expect_close(run_case(inline_spec("plain_odd", std::nullopt, std::nullopt, d), c));
      expect_close(run_case(inline_spec("causal_odd", std::nullopt, "q + Skv - Sq >= kv", d), c));
      expect_close(run_case(inline_spec("softcap_odd", std::string("30 * tanh(score / 30)"), std::nullopt, d), c));
      // Index-only mods run past Skv on the tile that crosses it (kEvaluablePastSkv), their results replaced after.
      expect_close(run_case(inline_spec("sinks_window_odd", std::nullopt, "kv < 4 || (q + Skv - Sq >= kv && q + Skv - Sq - kv < 100)", d), c));
    }
  }
}

TEST_CASE("a 64k-token causal launch (sampled rows against the float64 reference)", "[gpu]") {
  FLEXJIT_REQUIRE_GPU();
  CaseOptions c;
  c.B = 1;
  c.H = 2;
  c.Hkv = 1;
  c.Sq = c.Skv = 65536;
  c.sample_rows = 192;
  expect_close(run_case(inline_spec("causal_64k", std::nullopt, "q >= kv", 128), c));
}

TEST_CASE("soft-capping with a runtime cap matches the constant form", "[gpu]") {
  FLEXJIT_REQUIRE_GPU();
  for (int d : {64, 128}) {
    for (double cap : {30.0, 5.0, 60.0}) {
      INFO("head dim " << d << " cap " << cap);
      CaseOptions c;
      c.params = {{"cap", cap}};
      expect_close(run_case(inline_spec("softcap_param", std::string("cap * tanh(score / cap)"), std::nullopt, d, {}, {"cap: float"}), c));
      expect_close(
          run_case(inline_spec("softcap_param_causal", std::string("cap * tanh(score / cap)"), "q >= kv", d, {}, {"cap: float = 30"}), c));
    }
  }
}

// kv // W and kv % W with a runtime int W go through the launch's divisor multiplier (flex_int_divisor.cuh): every
// sign and size of divisor, in a mask and a score_mod, and SAM's decomposed bias with a runtime window width.
TEST_CASE("division by a runtime int parameter: divisors of every sign and size, and SAM with a runtime width", "[gpu]") {
  FLEXJIT_REQUIRE_GPU();
  const dsl::Spec spec = inline_spec("int_divisor", std::string("score + 0.01 * (kv % W)"), "(kv // W) % 3 != 1", 64, {}, {"W: int"});
  // One kernel for every W: the first Kernel's eight values get modules with W compiled in (compiler/specialize.h),
  // the last two run the generic module, which divides by the launch's multiplier.
  Runtime rt;
  dsl::Spec bf16_spec = spec;
  bf16_spec.dtype = dsl::DType::BF16;
  const std::shared_ptr<Kernel> kernel = rt.compile(bf16_spec);
  for (double w : {1.0, 3.0, 16.0, 64.0, 1000.0, 1099511627776.0, -1.0, -7.0, -1099511627776.0, 5.0}) {
    INFO("W = " << w);
    CaseOptions c;
    c.params = {{"W", w}};
    c.kernel = kernel.get();
    expect_close(run_case(spec, c));
  }
  for (int d : {64, 128}) {
    INFO("SAM with a runtime width, head dim " << d);
    CaseOptions c;
    c.Sq = c.Skv = 256;
    c.params = {{"W", 16.0}};
    expect_close(run_case(inline_spec("sam_runtime_width", std::string("score + rel_h[b, h, q, kv // W] + rel_w[b, h, q, kv % W]"), std::nullopt, d,
                                      {"rel_h: bf16[B, H, Sq, 16]", "rel_w: bf16[B, H, Sq, 16]"}, {"W: int"}),
                          c));
  }
}

TEST_CASE("split score terms: ALiBi and per-row biases on both main loops, and ALiBi over 32k tokens", "[gpu]") {
  FLEXJIT_REQUIRE_GPU();
  // The forward kernels add row terms to the LSE and take column terms relative to an anchor row
  // (compiler/codegen/row_terms.h): O and the LSE must match the whole score_mod's. Head dim 32 runs the mma.sync loop.
  for (int d : {32, 64, 128}) {
    INFO("head dim " << d);
    CaseOptions c;
    c.Sq = 300;
    c.Skv = 517;
    expect_close(run_case(inline_spec("alibi_split", std::string("score + slope[h] * (kv - q)"), "q + 217 >= kv", d, {"slope: f32[H]"}), c));
    expect_close(run_case(inline_spec("row_bias", std::string("score - 2 * bias[offset[q]] + bias[h]"), std::nullopt, d,
                                      {"bias: f32[N]", "offset: i32[Sq]"}),
                          c));
  }
  // A row term of -inf masks its row fully (O = 0, LSE = -inf), as it does when added to each score.
  CaseOptions padded;
  padded.edit_buffer = [](const std::string& name, NpyArray& h) {
    if (name != "pad") return;
    for (int64_t i = 3; i < h.numel(); i += 7) h.as<float>()[i] = -std::numeric_limits<float>::infinity();
  };
  const CaseResult pr = run_case(inline_spec("row_pad", std::string("score + pad[q]"), "q >= kv", 128, {"pad: f32[Sq]"}), padded);
  expect_close(pr);
  CHECK(pr.lse.bad == 0);
  CaseOptions c;
  c.B = 1;
  c.H = 2;
  c.Hkv = 1;
  c.Sq = c.Skv = 32768;
  c.sample_rows = 128;
  expect_close(run_case(inline_spec("alibi_32k", std::string("score + slope[h] * (kv - q)"), "q >= kv", 128, {"slope: f32[H]"}), c), 1e-2);
}

TEST_CASE("a bounded score_mod's fixed softmax maximum: rows far below the bound, fully masked rows, bf16 and fp16", "[gpu]") {
  FLEXJIT_REQUIRE_GPU();
  // tanh(score - 3) puts every score near -30 while the kernels subtract the bound +30 (bf16): P near 2^-86 must
  // still give O and the LSE. fp16 keeps the running maximum. Rows q < 40 are fully masked.
  for (int d : {64, 128, 256}) {
    for (dsl::DType dtype : {dsl::DType::BF16, dsl::DType::F16}) {
      INFO("head dim " << d << (dtype == dsl::DType::BF16 ? " bf16" : " fp16"));
      CaseOptions c;
      c.B = 1;
      c.H = 2;
      c.Hkv = 1;
      c.Sq = 190;
      c.Skv = 230;
      c.dtype = dtype;
      expect_close(run_case(inline_spec("softcap_low", std::string("30 * tanh(score / 30 - 3)"), std::string("kv <= q - 40"), d), c));
      expect_close(run_case(inline_spec("softcap_plain", std::string("30 * tanh(score / 30)"), std::nullopt, d), c));
    }
  }
}

TEST_CASE("lengths 1, 17, 1000 and 4097 with Sq != Skv", "[gpu]") {
  FLEXJIT_REQUIRE_GPU();
  for (auto [sq, skv] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {1, 17}, {17, 1}, {17, 1000}, {1000, 17}, {1000, 4097}, {4097, 1000}}) {
    INFO("Sq " << sq << " Skv " << skv);
    CaseOptions c;
    c.B = 1;
    c.H = 1;
    c.Hkv = 1;
    c.Sq = sq;
    c.Skv = skv;
    expect_close(run_case(inline_spec("plain_len", std::nullopt, std::nullopt, 64), c));
    expect_close(run_case(inline_spec("causal_len", "score * 0.5", "q >= kv", 64), c));
  }
}

TEST_CASE("GQA 4:1 and 8:1", "[gpu]") {
  FLEXJIT_REQUIRE_GPU();
  for (int64_t group : {4, 8}) {
    CaseOptions c;
    c.H = 8;
    c.Hkv = 8 / group;
    expect_close(run_case(load_spec(gallery_dir() / "alibi_causal.json"), c));
    expect_close(run_case(inline_spec("gqa_kvhead", "score + float(kv_head)", "q >= kv", 64), c));
  }
}

TEST_CASE("fully masked rows give O = 0 and LSE = -inf", "[gpu]") {
  FLEXJIT_REQUIRE_GPU();
  CaseOptions c;
  // Rows q < 50 see nothing; later rows see a causal window.
  CaseResult r = run_case(inline_spec("masked_rows", std::nullopt, "q >= 50 && kv <= q - 50", 64), c);
  expect_close(r);
  CaseResult all = run_case(inline_spec("all_masked", std::nullopt, "kv > q + 1000000", 64), c);
  CHECK(all.o.bad == 0);
  CHECK(all.lse.bad == 0);
  CHECK(all.o.max_abs == 0);
}

TEST_CASE("[B, S, H, D] strides work without a copy", "[gpu]") {
  FLEXJIT_REQUIRE_GPU();
  CaseOptions c;
  c.bshd = true;
  c.H = 4;
  c.Hkv = 2;
  expect_close(run_case(load_spec(gallery_dir() / "sam_relpos.json"), c));
  c.Skv = c.Sq;
  expect_close(run_case(load_spec(gallery_dir() / "document.json"), c));
}

TEST_CASE("k and v broadcast over the batch (stride 0) under a document mask", "[gpu]") {
  // A zero stride over a longer dimension has no tensor map, so on sm_90a these launches take the mma.sync kernel
  // instead of the warp-specialised one.
  FLEXJIT_REQUIRE_GPU();
  for (int d : {96, 128}) {
    INFO("head dim " << d);
    CaseOptions c;
    c.B = 3;
    c.Sq = c.Skv = 700;
    c.kv_batch_broadcast = true;
    dsl::Spec spec = load_spec(gallery_dir() / "document.json");
    spec.head_dim = d;
    expect_close(run_case(spec, c));
  }
}

TEST_CASE("SAM's decomposed bias: scales, -inf entries, strided rows, head dims", "[gpu]") {
  // rel_h[b, h, q, kv // 64] is hoisted per row and 64-column part of a KV tile, rel_w[b, h, q, kv % 64] per row and
  // column of a part (flex::FragmentMods); the kernels' KV tiles of 128 and 192 columns hold two and three parts.
  FLEXJIT_REQUIRE_GPU();
  const dsl::Spec sam = load_spec(gallery_dir() / "sam_relpos.json");
  CaseOptions base;
  base.Sq = 200;  // a partial last query tile and KV tile
  base.Skv = 300;
  for (double scale : {0.0, 0.125, 0.1, 0.3, 0.02, 0.5, 0.7, 2.0}) {
    INFO("scale " << scale);
    CaseOptions c = base;
    c.scale = scale;
    expect_close(run_case(sam, c));
  }
  SECTION("-inf and the lowest finite bf16 in rel_w mask their elements only; a row of -inf is fully masked") {
    CaseOptions c = base;
    c.edit_buffer = [](const std::string& name, NpyArray& h) {
      if (name != "rel_w") return;
      uint16_t* x = h.as<uint16_t>();
      for (int64_t i = 0; i < h.numel(); i += 7) x[i] = 0xff80;  // -inf
      for (int64_t i = 3; i < h.numel(); i += 11) x[i] = 0xff7f;  // -3.39e38
      for (int64_t i = 5 * 64; i < 6 * 64; ++i) x[i] = 0xff80;   // (b 0, h 0, q 5): every kv % 64 masked
    };
    CaseResult r = run_case(sam, c);
    expect_close(r);
    CHECK(r.lse.bad == 0);
  }
  SECTION("rows 65 elements apart (plain loads) and 72 apart (aligned copies)") {
    for (int64_t pad : {1, 8}) {
      INFO("row pad " << pad);
      CaseOptions c = base;
      c.buffer_row_pad = pad;
      expect_close(run_case(sam, c));
    }
  }
  SECTION("head dims 32 (the mma.sync kernel), 96 and 128, GQA 2:1, a Tile-free spec") {
    for (int d : {32, 96, 128}) {
      INFO("head dim " << d);
      CaseOptions c = base;
      c.Hkv = 2;
      dsl::Spec s = sam;
      s.head_dim = d;
      expect_close(run_case(s, c));
    }
    expect_close(run_case(inline_spec("col_only", std::string("score + r[h, q, kv % 64]"), std::string("kv <= q + 40"), 64,
                                      {"r: bf16[H, Sq, 64]"}),
                          base));
  }
  SECTION("rel_h alone (a value per row and KV tile): -inf blocks in it, a mask, a row constant") {
    const dsl::Spec relh = inline_spec("relh_only", std::string("score + rel_h[b, h, q, kv // 64]"), std::nullopt, 64, {"rel_h: bf16[B, H, Sq, 64]"});
    for (int d : {64, 128}) {
      INFO("head dim " << d);
      dsl::Spec s = relh;
      s.head_dim = d;
      CaseOptions c = base;
      c.edit_buffer = [](const std::string&, NpyArray& h) {
        uint16_t* x = h.as<uint16_t>();
        for (int64_t i = 0; i < h.numel(); i += 5) x[i] = 0xff80;  // whole (row, 64-column tile) blocks masked
        for (int64_t i = 7 * 64; i < 8 * 64; ++i) x[i] = 0xff80;   // (b 0, h 0, q 7): every tile masked
      };
      expect_close(run_case(s, c));
      c.scale = 0.3;
      expect_close(run_case(s, c));
    }
    expect_close(run_case(inline_spec("relh_masked", std::string("score + rel_h[b, h, q, kv // 64]"), std::string("kv <= q + 40"), 64,
                                      {"rel_h: bf16[B, H, Sq, 64]"}),
                          base));
    expect_close(run_case(inline_spec("row_bias", std::string("score + 0.25 * float(h)"), std::string("q >= kv"), 64), base));
  }
  SECTION("the lowest finite bf16 in rel_h for a row's first KV tile: a finite row max whose scaled value overflows") {
    // The first tile of rows q % 4 == 0 holds scores near -3.39e38: the online softmax's first max is finite but
    // scales to -inf, which once made alpha NaN and the whole row NaN (its later tiles are ordinary).
    for (int d : {64, 128}) {
      INFO("head dim " << d);
      dsl::Spec s = sam;
      s.head_dim = d;
      CaseOptions c = base;
      c.edit_buffer = [](const std::string& name, NpyArray& h) {
        if (name != "rel_h") return;
        uint16_t* x = h.as<uint16_t>();
        for (int64_t i = 0; i < h.numel(); i += 4 * 64) x[i] = 0xff7f;  // rel_h[.., q, 0] for q % 4 == 0
      };
      CaseResult r = run_case(s, c);
      expect_close(r);
      CHECK(r.lse.bad == 0);
    }
  }
}

// Document ids per batch for the ranked schedule's test: segments of 1 to 700 rows, a query tile whose rows
// match nothing (an item without KV tiles), one that matches a single KV tile and one that matches two, and rows
// of id -1 that match nothing (fully masked rows). dq and dk differ only where noted.
void plant_documents(const std::string& name, NpyArray& h, int64_t seqlen, unsigned seed) {
  std::mt19937 rng(seed);
  const int64_t batches = h.numel() / seqlen;
  for (int64_t b = 0; b < batches; ++b) {
    int32_t* ids = h.as<int32_t>() + b * seqlen;
    int32_t id = 0;
    for (int64_t i = 0; i < seqlen;) {
      const int64_t len = std::uniform_int_distribution<int64_t>(1, 700)(rng);
      for (int64_t j = i; j < std::min(seqlen, i + len); ++j) ids[j] = id;
      i += len;
      ++id;
    }
    const bool query = name == "dq";
    if (seqlen >= 1024) {
      for (int64_t j = 256; j < 384; ++j) ids[j] = query ? 100000 : ids[j];  // query tile 2: no match anywhere
      for (int64_t j = 384; j < 512; ++j) ids[j] = query ? 100001 : ids[j];  // query tile 3: KV 70 .. 90 only
      for (int64_t j = 70; j < 91; ++j) ids[j] = query ? ids[j] : 100001;
      for (int64_t j = 512; j < 640; ++j) ids[j] = query ? 100002 : ids[j];  // query tile 4: KV 600 .. 700 (2 tiles)
      for (int64_t j = 600; j < 701; ++j) ids[j] = query ? ids[j] : 100002;
    }
    for (int64_t j = 5 + b; j < seqlen; j += 97) ids[j] = query ? -1 : ids[j];  // rows matching nothing
  }
}

// dq[b, q] == dk[b, kv] over plant_documents' ids, against the reference.
void expect_documents(int head_dim, int64_t B, int64_t H, int64_t Hkv, int64_t Sq, int64_t Skv, unsigned seed,
                      std::optional<std::string> score = std::nullopt) {
  INFO("head dim " << head_dim << ", B " << B << " H " << H << " Hkv " << Hkv << " Sq " << Sq << " Skv " << Skv);
  CaseOptions c;
  c.B = B;
  c.H = H;
  c.Hkv = Hkv;
  c.Sq = Sq;
  c.Skv = Skv;
  c.edit_buffer = [&](const std::string& name, NpyArray& h) { plant_documents(name, h, name == "dq" ? Sq : Skv, seed); };
  expect_close(run_case(inline_spec("docs_ranked", score, "dq[b, q] == dk[b, kv]", head_dim, {"dq: i32[B, Sq]", "dk: i32[B, Skv]"}), c));
}

TEST_CASE("a data-dependent mask's ranked order: items of 0, 1 and 2 tiles", "[gpu]") {
  FLEXJIT_REQUIRE_GPU();
  // Sq and Skv are not tile multiples; the light items (no tiles, one, two) come last in the ranked order, and the
  // persistent CTAs of the warp-specialised kernel meet them after heavier ones (the producer runs a tile ahead).
  SECTION("head dims 32, 64, 96 and 128, GQA 2:1") {
    for (int d : {32, 64, 96, 128}) expect_documents(d, 2, 6, 3, 4100, 1900, 3);
  }
  SECTION("twelve heads: a full group of eight interleaved heads and a partial one of four, GQA 3:1") {
    expect_documents(128, 2, 12, 4, 1000, 1100, 5);
  }
  SECTION("a launch smaller than one wave: four query tiles") {
    expect_documents(64, 1, 1, 1, 200, 300, 4);
  }
  SECTION("head dims 80 and 256") {
    for (int d : {80, 256}) expect_documents(d, 1, 2, 2, 1100, 1300, 9);
  }
  SECTION("one batch and head, with a score_mod") {
    expect_documents(128, 1, 1, 1, 1500, 1500, 5, "score * 0.5");
  }
}

TEST_CASE("a mask of two per-column buffers: an int and a bool per column", "[gpu]") {
  FLEXJIT_REQUIRE_GPU();
  // dk[b, kv] and w[kv] > 0.5 per column of a partial tile. Skv is no tile multiple, and about half the columns of
  // every document are dropped by w.
  for (int d : {32, 64, 96, 128}) {
    INFO("head dim " << d);
    CaseOptions c;
    c.B = 2;
    c.H = 4;
    c.Hkv = 2;
    c.Sq = 1300;
    c.Skv = 1100;
    c.edit_buffer = [&](const std::string& name, NpyArray& h) {
      if (name != "w") plant_documents(name, h, name == "dq" ? c.Sq : c.Skv, 11);
    };
    expect_close(run_case(inline_spec("docs_staged", std::nullopt, "dq[b, q] == dk[b, kv] && w[kv] > 0.5", d,
                                      {"dq: i32[B, Sq]", "dk: i32[B, Skv]", "w: f32[Skv]"}),
                          c));
  }
}

TEST_CASE("a document mask indexed past its buffer is reported, not read out of bounds", "[gpu]") {
  FLEXJIT_REQUIRE_GPU();
  CaseOptions c;
  c.Sq = 100;
  c.Skv = 300;  // doc: i32[Sq] indexed by kv up to 299
  try {
    run_case(load_spec(gallery_dir() / "document.json"), c);
    FAIL("the out-of-range doc[kv] loads were not reported");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("doc[kv]") != std::string::npos);
  }
}

// q, k, v and o of one [1, 1, 64, 64] bf16 launch on `device` (random, not checked): for launches that must fail.
struct SmallOperands {
  DeviceTensor4 q, k, v, o;
  explicit SmallOperands(int device, unsigned seed) {
    std::mt19937 rng(seed);
    std::vector<uint16_t> bits;
    random_rounded(64 * 64, dsl::DType::BF16, rng, bits);
    q = upload4(device, bits, dsl::DType::BF16, 1, 1, 64, 64, false);
    k = upload4(device, bits, dsl::DType::BF16, 1, 1, 64, 64, false);
    v = upload4(device, bits, dsl::DType::BF16, 1, 1, 64, 64, false);
    o = upload4(device, bits, dsl::DType::BF16, 1, 1, 64, 64, false);
  }
  AttentionArgs args() const {
    AttentionArgs a;
    a.q = q.tensor, a.k = k.tensor, a.v = v.tensor, a.o = o.tensor;
    return a;
  }
};

TEST_CASE("a pointer on the wrong device is an error naming the buffer", "[gpu]") {
  FLEXJIT_REQUIRE_GPU();
  dsl::Spec spec = load_spec(gallery_dir() / "document.json");
  spec.head_dim = 64;
  Runtime rt;
  auto kernel = rt.compile(spec);
  const SmallOperands ops(0, 3);
  std::vector<int32_t> host_doc(64, 0);
  AttentionArgs a = ops.args();
  a.buffers = {{"doc", Tensor{host_doc.data(), dsl::DType::I32, {64}, {}}}};
  try {
    kernel->forward(a);
    FAIL("a host pointer was accepted as a device buffer");
  } catch (const Error& e) {
    std::string msg = e.what();
    INFO(msg);
    CHECK(msg.find("buffer `doc`") != std::string::npos);
    CHECK(msg.find("cuda:0") != std::string::npos);
  }
  if (runtime::device_count() >= 2) {
    runtime::DeviceBuffer other(1, 64 * 4);
    a.buffers = {{"doc", Tensor{other.data(), dsl::DType::I32, {64}, {}}}};
    try {
      kernel->forward(a);
      FAIL("a buffer on cuda:1 was accepted for a launch on cuda:0");
    } catch (const Error& e) {
      std::string msg = e.what();
      CHECK(msg.find("lives on cuda:1") != std::string::npos);
    }
  }
}

TEST_CASE("one compiled spec serves two GPUs: a module and bound buffer replicas per device", "[gpu][multi_gpu]") {
  FLEXJIT_REQUIRE_GPU();
  if (runtime::device_count() < 2) {
    WARN("one GPU: the two-GPU launches did not run");
    return;
  }
  // The document mask's doc[] is bound once per device (a replica each); the same Kernel launches on cuda:1
  // first (its module loaded there on first use), then on cuda:0, then on cuda:1 again; all against float64.
  dsl::Spec spec = load_spec(gallery_dir() / "document.json");
  spec.head_dim = 64;
  Runtime rt;
  auto kernel = rt.compile(spec);
  for (int dev : {1, 0, 1}) {
    CaseOptions c;
    c.device = dev;
    c.kernel = kernel.get();
    c.bind_buffers = true;
    c.Sq = 333;
    c.Skv = 333;
    c.seed = 11 + dev;
    INFO("cuda:" << dev);
    expect_close(run_case(spec, c));
  }
  // A user's report (a mask captured on one GPU crashed a kernel launched on another): a mask buffer on cuda:0
  // passed to a launch on cuda:1 is an error naming
  // the buffer and both devices, not a crash or a silent wrong answer.
  const SmallOperands ops(1, 5);
  runtime::DeviceBuffer doc0(0, 64 * 4);
  AttentionArgs a = ops.args();
  a.buffers = {{"doc", Tensor{doc0.data(), dsl::DType::I32, {64}, {}}}};
  try {
    kernel->forward(a);
    FAIL("a buffer on cuda:0 was accepted for a launch on cuda:1");
  } catch (const Error& e) {
    const std::string msg = e.what();
    INFO(msg);
    CHECK(msg.find("buffer `doc`") != std::string::npos);
    CHECK(msg.find("lives on cuda:0") != std::string::npos);
    CHECK(msg.find("runs on cuda:1") != std::string::npos);
  }
}

TEST_CASE("an out-of-range load is clamped and reported", "[gpu]") {
  FLEXJIT_REQUIRE_GPU();
  CaseOptions c;
  dsl::Spec spec = inline_spec("oob", "score + bias[offset[q]]", std::nullopt, 64, {"bias: f32[N]", "offset: i32[Sq]"});
  // offsets up to 7 but N = 4: some loads are out of range.
  try {
    run_case(spec, c, {{"N", 4}});
    FAIL("no error was reported");
  } catch (const Error& e) {
    std::string msg = e.what();
    INFO(msg);
    CHECK(msg.find("buffer `bias`") != std::string::npos);
    CHECK(msg.find("clamped") != std::string::npos);
  }
}
