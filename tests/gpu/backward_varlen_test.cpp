// GPU ragged-backward tests (label gpu): Kernel::forward_varlen then Kernel::backward_varlen over packed sequences of
// lengths 0 to 1000, every gradient (dq, dk, dv and the marked buffers', summed over the sequences) compared element
// by element with the float64 reference backward run per sequence (the mods see b = the sequence and positions within
// it), outputs poisoned with NaN first.
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "gpu/gpu_harness.h"
#include "support/attention_reference_backward.h"

using namespace flexjit;
using namespace flexjit::test;

namespace {

std::filesystem::path backward_data(const char* name) { return source_dir() / "tests" / "data" / "backward" / name; }

struct RaggedCase {
  int H = 4, Hkv = 2;
  std::vector<int> lq, lkv;
  dsl::DType dtype = dsl::DType::BF16;
  unsigned seed = 1;
  bool deterministic = false;
  int max_q = 0, max_kv = 0;  // the launches' bounds; 0: the longest sequence's
};

struct RaggedGrads {
  std::vector<float> dq, dk, dv;
  std::vector<std::vector<float>> grads;  // per spec buffer; empty unless marked
};

float to_float(uint16_t bits, dsl::DType dt) { return dt == dsl::DType::BF16 ? bf16_to_float(bits) : half_to_float(bits); }

std::vector<float> download_elements(const runtime::DeviceBuffer& m, size_t n, dsl::DType dt) {
  std::vector<uint16_t> raw(n);
  m.download(raw.data(), n * 2);
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = to_float(raw[i], dt);
  return out;
}

// The packed problem on the host and the device, its forward run, and backward launches of it.
struct RaggedProblem {
  dsl::Spec spec;
  RaggedCase c;
  int B = 0, D = 0, tq = 0, tk = 0, max_q = 0, max_kv = 0;
  std::vector<int32_t> cq, ck;
  std::vector<float> q, k, v, d_o;  // packed [total, heads, D]
  std::vector<NpyArray> bufs;       // per spec buffer
  std::vector<runtime::DeviceBuffer> dbufs;
  runtime::DeviceBuffer dq_in, dk_in, dv_in, ddo, dcq, dck, o, lse;
  std::vector<float> o_host, lse_host;
  std::shared_ptr<Kernel> kernel;

  RaggedProblem(const dsl::Spec& s, const RaggedCase& rc) : spec(s), c(rc) {
    spec.dtype = c.dtype;
    B = static_cast<int>(c.lq.size());
    D = spec.head_dim;
    cq.assign(size_t(B) + 1, 0);
    ck.assign(size_t(B) + 1, 0);
    for (int b = 0; b < B; ++b) {
      cq[b + 1] = cq[b] + c.lq[b];
      ck[b + 1] = ck[b] + c.lkv[b];
    }
    tq = cq[B], tk = ck[B];
    max_q = c.max_q ? c.max_q : *std::max_element(c.lq.begin(), c.lq.end());
    max_kv = c.max_kv ? c.max_kv : *std::max_element(c.lkv.begin(), c.lkv.end());
    std::mt19937 rng(c.seed);
    std::vector<uint16_t> qb, kb, vb, ob;
    q = random_rounded(size_t(tq) * c.H * D, c.dtype, rng, qb);
    k = random_rounded(size_t(tk) * c.Hkv * D, c.dtype, rng, kb);
    v = random_rounded(size_t(tk) * c.Hkv * D, c.dtype, rng, vb);
    d_o = random_rounded(size_t(tq) * c.H * D, c.dtype, rng, ob);
    auto up = [](const std::vector<uint16_t>& bits) {
      runtime::DeviceBuffer m(0, std::max<size_t>(2, bits.size() * 2));
      m.upload(bits.data(), bits.size() * 2);
      return m;
    };
    dq_in = up(qb), dk_in = up(kb), dv_in = up(vb), ddo = up(ob);
    dcq = runtime::DeviceBuffer(0, cq.size() * 4);
    dck = runtime::DeviceBuffer(0, ck.size() * 4);
    dcq.upload(cq.data(), cq.size() * 4);
    dck.upload(ck.data(), ck.size() * 4);
    // Buffers: documents of 1 to 120 positions per sequence, a learnable bias over q - kv, learnable slopes, others random.
    std::normal_distribution<float> nd(0.f, 0.5f);
    for (const dsl::BufferDecl& bd : spec.buffers) {
      NpyArray a;
      if (bd.name == "doc") {
        a.dtype = dsl::DType::I32;
        a.shape = {B, max_kv};
        std::vector<int32_t> doc(size_t(B) * max_kv);
        std::uniform_int_distribution<int> doc_len(1, 120);
        for (int b = 0; b < B; ++b)
          for (int j = 0, id = 0, left = doc_len(rng); j < max_kv; ++j, --left) {
            if (left == 0) ++id, left = doc_len(rng);
            doc[size_t(b) * max_kv + j] = id;
          }
        a.data.resize(doc.size() * 4);
        std::memcpy(a.data.data(), doc.data(), a.data.size());
      } else if (bd.name != "bias" && bd.name != "slope") {
        // Any other buffer (SAM's rel_h, rel_w): the harness's random contents, its shape over the batch's symbols.
        a = random_buffer(bd, {{"B", B}, {"H", c.H}, {"Hkv", c.Hkv}, {"Sq", max_q}, {"Skv", max_kv}}, rng, 2);
      } else {
        a.dtype = dsl::DType::F32;
        a.shape = bd.name == "bias" ? std::vector<int64_t>{c.H, 2 * max_kv - 1} : std::vector<int64_t>{c.H};
        std::vector<float> x(size_t(a.numel()));
        for (float& e : x) e = nd(rng);
        a.data.resize(x.size() * 4);
        std::memcpy(a.data.data(), x.data(), a.data.size());
      }
      dbufs.emplace_back(0, a.data.size());
      dbufs.back().upload(a.data.data(), a.data.size());
      bufs.push_back(std::move(a));
    }
    Runtime rt;
    kernel = rt.compile(spec);
    forward();
  }

  std::vector<std::pair<std::string, Tensor>> buffer_args() const {
    std::vector<std::pair<std::string, Tensor>> out;
    for (size_t i = 0; i < bufs.size(); ++i) out.emplace_back(spec.buffers[i].name, Tensor{dbufs[i].data(), bufs[i].dtype, bufs[i].shape, {}});
    return out;
  }
  Tensor packed(const runtime::DeviceBuffer& m, int rows, int heads) const { return Tensor{m.data(), spec.dtype, {rows, heads, D}, {}}; }
  Tensor cu(const runtime::DeviceBuffer& m) const { return Tensor{m.data(), dsl::DType::I32, {B + 1}, {}}; }

  void forward() {
    o = runtime::DeviceBuffer(0, std::max<size_t>(2, size_t(tq) * c.H * D * 2));
    lse = runtime::DeviceBuffer(0, std::max<size_t>(4, size_t(c.H) * tq * 4));
    o.fill_bytes(0xff);
    lse.fill_bytes(0xff);
    VarlenArgs a;
    a.q = packed(dq_in, tq, c.H);
    a.k = packed(dk_in, tk, c.Hkv);
    a.v = packed(dv_in, tk, c.Hkv);
    a.o = packed(o, tq, c.H);
    a.lse = Tensor{lse.data(), dsl::DType::F32, {c.H, tq}, {}};
    a.cu_seqlens_q = cu(dcq);
    a.cu_seqlens_kv = cu(dck);
    a.max_seqlen_q = max_q;
    a.max_seqlen_kv = max_kv;
    a.buffers = buffer_args();
    kernel->forward_varlen(a);
    kernel->check_errors(0, nullptr);
    o_host = download_elements(o, size_t(tq) * c.H * D, c.dtype);
    lse_host.resize(size_t(c.H) * tq);
    lse.download(lse_host.data(), lse_host.size() * 4);
  }

  // The arguments of a backward launch into dq / dk / dv and the marked buffers' gradients (grad_mem), all poisoned.
  VarlenBackwardArgs backward_args(runtime::DeviceBuffer& gq, runtime::DeviceBuffer& gk, runtime::DeviceBuffer& gv,
                                   std::vector<runtime::DeviceBuffer>& grad_mem) const {
    gq = runtime::DeviceBuffer(0, std::max<size_t>(2, size_t(tq) * c.H * D * 2));
    gk = runtime::DeviceBuffer(0, std::max<size_t>(2, size_t(tk) * c.Hkv * D * 2));
    gv = runtime::DeviceBuffer(0, std::max<size_t>(2, size_t(tk) * c.Hkv * D * 2));
    gq.fill_bytes(0xff);
    gk.fill_bytes(0xff);
    gv.fill_bytes(0xff);
    VarlenBackwardArgs a;
    a.q = packed(dq_in, tq, c.H);
    a.k = packed(dk_in, tk, c.Hkv);
    a.v = packed(dv_in, tk, c.Hkv);
    a.o = packed(o, tq, c.H);
    a.d_o = packed(ddo, tq, c.H);
    a.lse = Tensor{lse.data(), dsl::DType::F32, {c.H, tq}, {}};
    a.dq = packed(gq, tq, c.H);
    a.dk = packed(gk, tk, c.Hkv);
    a.dv = packed(gv, tk, c.Hkv);
    a.cu_seqlens_q = cu(dcq);
    a.cu_seqlens_kv = cu(dck);
    a.max_seqlen_q = max_q;
    a.max_seqlen_kv = max_kv;
    a.buffers = buffer_args();
    a.deterministic = c.deterministic;
    grad_mem.clear();
    grad_mem.reserve(bufs.size());
    for (size_t i = 0; i < bufs.size(); ++i) {
      if (!spec.buffers[i].requires_grad) continue;
      grad_mem.emplace_back(0, size_t(bufs[i].numel()) * 4);
      grad_mem.back().fill_bytes(0xff);
      a.grads.emplace_back(spec.buffers[i].name, Tensor{grad_mem.back().data(), dsl::DType::F32, bufs[i].shape, {}});
    }
    return a;
  }

  RaggedGrads backward() const {
    runtime::DeviceBuffer gq, gk, gv;
    std::vector<runtime::DeviceBuffer> grad_mem;
    kernel->backward_varlen(backward_args(gq, gk, gv, grad_mem));
    kernel->check_errors(0, nullptr);
    RaggedGrads g;
    g.dq = download_elements(gq, size_t(tq) * c.H * D, c.dtype);
    g.dk = download_elements(gk, size_t(tk) * c.Hkv * D, c.dtype);
    g.dv = download_elements(gv, size_t(tk) * c.Hkv * D, c.dtype);
    g.grads.resize(bufs.size());
    for (size_t i = 0, m = 0; i < bufs.size(); ++i) {
      if (!spec.buffers[i].requires_grad) continue;
      g.grads[i].resize(size_t(bufs[i].numel()));
      grad_mem[m++].download(g.grads[i].data(), g.grads[i].size() * 4);
    }
    return g;
  }

  // The float64 reference per sequence, laid out as the packed gradients; buffer gradients summed over the sequences.
  RefBackward reference() const {
    SpecIR ir = build_spec_ir(spec);
    std::map<std::string, int64_t> sym = {{"B", B}, {"H", c.H}, {"Hkv", c.Hkv}, {"Sq", max_q}, {"Skv", max_kv}, {"D", D}, {"L", 2 * max_kv - 1}};
    EvalEnv env = reference_env(ir, sym, {});
    for (const NpyArray& a : bufs) env.buffers.push_back(BufferView{a.dtype, a.data.data(), a.shape, contiguous_strides(a.shape)});
    RefBackward out;
    out.dq.assign(size_t(tq) * c.H * D, 0.0);
    out.dk.assign(size_t(tk) * c.Hkv * D, 0.0);
    out.dv.assign(out.dk.size(), 0.0);
    out.grads.resize(bufs.size());
    for (size_t i = 0; i < bufs.size(); ++i)
      if (spec.buffers[i].requires_grad) out.grads[i].assign(size_t(bufs[i].numel()), 0.0);
    const double scale = 1.0 / std::sqrt(double(D));
    for (int b = 0; b < B; ++b) {
      const int lq = c.lq[b], lk = c.lkv[b];
      // Sequence b as [1, heads, len, D]: packed row r, head h is row h * len + r.
      auto gather = [&](const auto& src, int first, int len, int heads) {
        std::vector<typename std::decay_t<decltype(src)>::value_type> out_rows(size_t(heads) * len * D);
        for (int h = 0; h < heads; ++h)
          for (int r = 0; r < len; ++r)
            for (int d = 0; d < D; ++d) out_rows[(size_t(h) * len + r) * D + d] = src[(size_t(first + r) * heads + h) * D + d];
        return out_rows;
      };
      const std::vector<float> qs = gather(q, cq[b], lq, c.H), dos = gather(d_o, cq[b], lq, c.H), ks = gather(k, ck[b], lk, c.Hkv),
                               vs = gather(v, ck[b], lk, c.Hkv), os = gather(o_host, cq[b], lq, c.H);
      std::vector<double> ls(size_t(c.H) * lq);
      for (int h = 0; h < c.H; ++h)
        for (int r = 0; r < lq; ++r) ls[size_t(h) * lq + r] = lse_host[size_t(h) * tq + cq[b] + r];
      RefBackward r = reference_backward(ir, RefShape{1, c.H, c.Hkv, lq, lk, D, D}, qs, ks, vs, dos, std::vector<double>(os.begin(), os.end()),
                                         ls, env, scale, /*batch_offset=*/b);
      for (int h = 0; h < c.H; ++h)
        for (int i = 0; i < lq; ++i)
          for (int d = 0; d < D; ++d) out.dq[(size_t(cq[b] + i) * c.H + h) * D + d] = r.dq[(size_t(h) * lq + i) * D + d];
      for (int h = 0; h < c.Hkv; ++h)
        for (int j = 0; j < lk; ++j)
          for (int d = 0; d < D; ++d) {
            out.dk[(size_t(ck[b] + j) * c.Hkv + h) * D + d] = r.dk[(size_t(h) * lk + j) * D + d];
            out.dv[(size_t(ck[b] + j) * c.Hkv + h) * D + d] = r.dv[(size_t(h) * lk + j) * D + d];
          }
      for (size_t i = 0; i < bufs.size(); ++i)
        for (size_t e = 0; e < out.grads[i].size(); ++e) out.grads[i][e] += r.grads[i][e];
    }
    return out;
  }
};

void expect_match(const std::string& what, const std::vector<float>& got, const std::vector<double>& ref, double bound = 2e-2) {
  Comparison cmp = compare(got, ref);
  std::printf("  %-22s rel_l2 %.2e max_abs %.2e bad %lld\n", what.c_str(), cmp.rel_l2, cmp.max_abs, static_cast<long long>(cmp.bad));
  INFO(what << ": rel_l2 " << cmp.rel_l2 << " max_abs " << cmp.max_abs << " bad " << cmp.bad << " (first " << cmp.first_bad << ")");
  CHECK(cmp.bad == 0);
  CHECK(cmp.rel_l2 < bound);
}

void expect_reference(const RaggedProblem& pr, const RaggedGrads& g) {
  const RefBackward ref = pr.reference();
  expect_match("dq", g.dq, ref.dq);
  expect_match("dk", g.dk, ref.dk);
  expect_match("dv", g.dv, ref.dv);
  for (size_t i = 0; i < pr.bufs.size(); ++i)
    if (pr.spec.buffers[i].requires_grad) expect_match("grad " + pr.spec.buffers[i].name, g.grads[i], ref.grads[i]);
}

RaggedGrads check_ragged(const dsl::Spec& spec, const RaggedCase& c) {
  RaggedProblem pr(spec, c);
  std::printf("%s D%d %s H%d/%d, %zu sequences%s\n", spec.name.c_str(), pr.D, dsl::dtype_name(c.dtype), c.H, c.Hkv, c.lq.size(),
              c.deterministic ? ", deterministic" : "");
  INFO(spec.name << " D" << pr.D << " " << dsl::dtype_name(c.dtype) << " H" << c.H << "/" << c.Hkv << (c.deterministic ? " deterministic" : ""));
  RaggedGrads g = pr.backward();
  expect_reference(pr, g);
  return g;
}

dsl::Spec with_dim(dsl::Spec s, int d) {
  s.head_dim = d;
  return s;
}

// Documents per sequence and position (doc: i32[B, Skv]), as a ragged batch stores them.
dsl::Spec sequence_documents(int head_dim) {
  dsl::Spec spec = load_spec(gallery_dir() / "document.json");
  spec.buffers.clear();
  dsl::Diagnostics diags;
  dsl::add_buffer(spec, "doc: i32[B, Skv]", "test", diags);
  REQUIRE(!diags.has_errors());
  spec.mask_mod = "doc[b, q] == doc[b, kv]";
  spec.head_dim = head_dim;
  return spec;
}

// Lengths 0 (no queries: its dk, dv are 0), 1, one tile and one row more, a long one; KV lengths that differ.
const std::vector<int> kLq = {1, 0, 64, 65, 1000, 200, 129, 7};
const std::vector<int> kLkv = {1, 50, 64, 65, 1000, 260, 129, 300};

}  // namespace

TEST_CASE("ragged backward: packed sequences of lengths 0 to 1000 match the float64 reference", "[gpu][varlen][backward]") {
  FLEXJIT_REQUIRE_GPU();
  check_ragged(load_spec(gallery_dir() / "causal.json"), {.H = 4, .Hkv = 2, .lq = kLq, .lkv = kLkv});
  check_ragged(with_dim(load_spec(gallery_dir() / "causal.json"), 64), {.H = 8, .Hkv = 1, .lq = kLq, .lkv = kLkv, .dtype = dsl::DType::F16, .seed = 2});
  check_ragged(sequence_documents(128), {.H = 2, .Hkv = 2, .lq = kLq, .lkv = kLq, .seed = 3});
  check_ragged(sequence_documents(64), {.H = 4, .Hkv = 1, .lq = kLq, .lkv = kLq, .dtype = dsl::DType::F16, .seed = 4});
  check_ragged(with_dim(load_spec(gallery_dir() / "softcap.json"), 96), {.H = 2, .Hkv = 2, .lq = kLq, .lkv = kLkv, .seed = 5});
}

TEST_CASE("ragged backward: learnable buffers' gradients summed over the sequences", "[gpu][varlen][backward]") {
  FLEXJIT_REQUIRE_GPU();
  check_ragged(load_spec(backward_data("learnable_bias.json")), {.H = 4, .Hkv = 2, .lq = kLq, .lkv = kLkv, .seed = 6});
  check_ragged(with_dim(load_spec(backward_data("alibi_learnable.json")), 64), {.H = 4, .Hkv = 4, .lq = kLq, .lkv = kLkv, .seed = 7});
  // SAM's rel_h, rel_w: unstaged in a ragged module, so the Hopper kernel is the warp-specialised one.
  check_ragged(load_spec(backward_data("sam_learnable.json")), {.H = 2, .Hkv = 2, .lq = kLq, .lkv = kLkv, .seed = 9});
}

TEST_CASE("ragged backward: deterministic mode is bitwise reproducible", "[gpu][varlen][backward]") {
  FLEXJIT_REQUIRE_GPU();
  const RaggedCase c{.H = 4, .Hkv = 2, .lq = kLq, .lkv = kLkv, .seed = 8, .deterministic = true};
  RaggedProblem pr(load_spec(backward_data("learnable_bias.json")), c);
  const RaggedGrads first = pr.backward();
  expect_reference(pr, first);
  for (int run = 1; run < 5; ++run) {
    INFO("run " << run + 1 << " against run 1");
    const RaggedGrads g = pr.backward();
    CHECK(std::memcmp(g.dq.data(), first.dq.data(), g.dq.size() * 4) == 0);
    CHECK(std::memcmp(g.dk.data(), first.dk.data(), g.dk.size() * 4) == 0);
    CHECK(std::memcmp(g.dv.data(), first.dv.data(), g.dv.size() * 4) == 0);
    CHECK(std::memcmp(g.grads[0].data(), first.grads[0].data(), g.grads[0].size() * 4) == 0);
  }
}

TEST_CASE("ragged backward: a sequence outside the launch's bounds is skipped and reported", "[gpu][varlen][backward]") {
  FLEXJIT_REQUIRE_GPU();
  RaggedProblem pr(load_spec(gallery_dir() / "causal.json"), {.H = 2, .Hkv = 2, .lq = {100, 300}, .lkv = {100, 300}});
  runtime::DeviceBuffer gq, gk, gv;
  std::vector<runtime::DeviceBuffer> grad_mem;
  VarlenBackwardArgs a = pr.backward_args(gq, gk, gv, grad_mem);
  a.max_seqlen_q = a.max_seqlen_kv = 200;  // the second sequence is longer
  pr.kernel->backward_varlen(a);
  CHECK_THROWS_WITH(pr.kernel->check_errors(0, nullptr), Catch::Matchers::Contains("outside the launch's bounds"));
  // The first sequence's gradients are whole; the second's rows are left alone (still the NaN poison).
  const std::vector<float> dk = download_elements(gk, size_t(pr.tk) * 2 * pr.D, pr.c.dtype);
  CHECK(std::all_of(dk.begin(), dk.begin() + 100 * 2 * pr.D, [](float x) { return std::isfinite(x); }));
  CHECK(std::all_of(dk.begin() + 100 * 2 * pr.D, dk.end(), [](float x) { return std::isnan(x); }));
}

TEST_CASE("ragged backward: argument errors are clear", "[gpu][varlen][backward]") {
  FLEXJIT_REQUIRE_GPU();
  RaggedProblem pr(load_spec(gallery_dir() / "causal.json"), {.H = 2, .Hkv = 2, .lq = {10, 20}, .lkv = {10, 20}});
  runtime::DeviceBuffer gq, gk, gv;
  std::vector<runtime::DeviceBuffer> grad_mem;
  {
    VarlenBackwardArgs a = pr.backward_args(gq, gk, gv, grad_mem);
    a.lse = Tensor{};
    CHECK_THROWS_WITH(pr.kernel->backward_varlen(a), Catch::Matchers::Contains("lse is required"));
  }
  {
    VarlenBackwardArgs a = pr.backward_args(gq, gk, gv, grad_mem);
    a.dk.shape[0] -= 1;
    CHECK_THROWS_WITH(pr.kernel->backward_varlen(a), Catch::Matchers::Contains("as many rows as k"));
  }
  {
    VarlenBackwardArgs a = pr.backward_args(gq, gk, gv, grad_mem);
    a.cu_seqlens_kv.shape = {2};
    CHECK_THROWS_WITH(pr.kernel->backward_varlen(a), Catch::Matchers::Contains("same length"));
  }
  {
    VarlenBackwardArgs a = pr.backward_args(gq, gk, gv, grad_mem);
    a.d_o.dtype = dsl::DType::F16;
    CHECK_THROWS_WITH(pr.kernel->backward_varlen(a), Catch::Matchers::Contains("d_o must be bf16"));
  }
}
