// GPU decode tests (label gpu): Kernel::plan_decode + Kernel::decode over contiguous and paged KV caches
// against a float64 reference with per-sequence KV lengths; a decode captured in a CUDA graph replays while
// the sequences grow. Unused cache slots and pages hold NaN, so any stray read shows up in O.
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <thread>

#include "gpu/gpu_harness.h"

using namespace flexjit;
using namespace flexjit::test;

namespace {

dsl::Spec make_spec(const std::string& name, std::optional<std::string> score, std::optional<std::string> mask, int d = 128,
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

constexpr uint16_t kNaNBits = 0x7fc0;  // a quiet NaN in bf16 and in f16

float element_to_float(dsl::DType t, uint16_t bits) { return t == dsl::DType::BF16 ? bf16_to_float(bits) : half_to_float(bits); }

struct DecodeCase {
  dsl::Spec spec;
  int H = 8, Hkv = 2, Sq = 1;
  std::vector<int> kv_lens;     // per sequence
  std::vector<int> capacity;    // per sequence cache capacity (empty: = kv_lens; slots past kv_len are NaN)
  std::vector<int> q_lens;      // empty: Sq for every sequence
  int page_size = 0;
  bool head_major = false;
  int num_splits = 0;
  int max_seqlen_kv = 0;        // 0: the longest capacity
  std::vector<std::pair<std::string, double>> params;
  unsigned seed = 1;
  int doc_len = 0;              // > 0: a `doc` buffer [B, Skv] of documents of about this length
  int masked_doc_seq = -1;      // this sequence's last document gets id -1 (its rows see nothing when the mask says doc >= 0)
  // An FP8 cache of this type: random codes (every finite one, subnormals included) times per-KV-head scales (one
  // scale for the cache when !per_head_scale); the reference dequantises the same bytes.
  std::optional<dsl::DType> kv_fp8;
  bool per_head_scale = true;
};

DecodeCase with_spec(dsl::Spec spec) {
  DecodeCase c;
  c.spec = std::move(spec);
  return c;
}

// Host data, device cache and the plan of one case; run() decodes with given KV lengths and checks.
struct DecodeProblem {
  DecodeCase c;
  int B = 0, D = 0, max_kv = 0;
  std::vector<std::vector<float>> k, v;  // per sequence [Hkv, cap, D] (FP8: the dequantised values)
  std::vector<float> k_scale, v_scale;   // FP8: [Hkv], or [1]
  std::vector<float> q;                  // [B, H, Sq, D]
  std::vector<uint16_t> qb;
  runtime::DeviceBuffer dq, dk, dv, dout, dlse, dtable, dkvlens, dqlens, ddoc, dslope, dkscale, dvscale;
  std::vector<int32_t> doc;
  std::vector<float> slope;  // ALiBi slopes [H] when the spec has a `slope` buffer
  int num_pages = 0, max_pages = 0;
  std::shared_ptr<Kernel> kernel;
  std::unique_ptr<DecodePlan> plan;
  SpecIR ir;
  Runtime rt;

  explicit DecodeProblem(DecodeCase cs) : c(std::move(cs)), ir(build_spec_ir(c.spec)) {
    B = static_cast<int>(c.kv_lens.size());
    D = c.spec.head_dim;
    if (c.capacity.empty()) c.capacity = c.kv_lens;
    max_kv = c.max_seqlen_kv ? c.max_seqlen_kv : *std::max_element(c.capacity.begin(), c.capacity.end());
    std::mt19937 rng(c.seed);
    std::vector<uint16_t> bits;
    q = random_rounded(size_t(B) * c.H * c.Sq * D, c.spec.dtype, rng, qb);
    std::vector<std::vector<uint16_t>> kb(B), vb(B);
    std::vector<std::vector<uint8_t>> kb8(B), vb8(B);
    if (!c.kv_fp8) {
      for (int b = 0; b < B; ++b) {
        k.push_back(random_rounded(size_t(c.Hkv) * c.capacity[b] * D, c.spec.dtype, rng, kb[b]));
        v.push_back(random_rounded(size_t(c.Hkv) * c.capacity[b] * D, c.spec.dtype, rng, vb[b]));
      }
    } else {
      // Uniform codes: every magnitude the format has, so the scales keep the scores O(1) (E[x^2] is dominated by
      // the top binade: e4m3 up to 448, e5m2 up to 57344).
      const double base = *c.kv_fp8 == dsl::DType::F8E4M3 ? 1.0 / 64 : 1.0 / 8192;
      for (int h = 0; h < (c.per_head_scale ? c.Hkv : 1); ++h) {
        k_scale.push_back(static_cast<float>(base * (1 + 0.25 * h)));
        v_scale.push_back(static_cast<float>(base * (1.5 - 0.125 * h)));
      }
      std::uniform_int_distribution<int> code(0, 255);
      auto finite = [&] {
        for (;;) {
          const uint8_t x = static_cast<uint8_t>(code(rng));
          if (std::isfinite(fp8_to_float(x, *c.kv_fp8))) return x;
        }
      };
      for (int b = 0; b < B; ++b) {
        const size_t n = size_t(c.Hkv) * c.capacity[b] * D;
        k.emplace_back(n), v.emplace_back(n);
        kb8[b].resize(n), vb8[b].resize(n);
        for (size_t e = 0; e < n; ++e) {
          const int h = static_cast<int>(e / (size_t(c.capacity[b]) * D)) % (c.per_head_scale ? c.Hkv : 1);
          kb8[b][e] = finite(), vb8[b][e] = finite();
          k[b][e] = static_cast<float>(double(k_scale[h]) * fp8_to_float(kb8[b][e], *c.kv_fp8));
          v[b][e] = static_cast<float>(double(v_scale[h]) * fp8_to_float(vb8[b][e], *c.kv_fp8));
        }
      }
    }
    const int dev = 0;
    dq = runtime::DeviceBuffer(dev, qb.size() * 2);
    dq.upload(qb.data(), qb.size() * 2);
    if (c.kv_fp8) {
      std::vector<uint8_t> kc, vc;
      // Poison: the largest finite code (448 or 57344 times the scale), which a stray read turns into a huge score.
      lay_out_cache(kc, vc, kb8, vb8, uint8_t{*c.kv_fp8 == dsl::DType::F8E4M3 ? uint8_t{0x7e} : uint8_t{0x7b}}, rng);
      dk = runtime::DeviceBuffer(dev, kc.size());
      dk.upload(kc.data(), kc.size());
      dv = runtime::DeviceBuffer(dev, vc.size());
      dv.upload(vc.data(), vc.size());
      dkscale = runtime::DeviceBuffer(dev, k_scale.size() * 4);
      dkscale.upload(k_scale.data(), k_scale.size() * 4);
      dvscale = runtime::DeviceBuffer(dev, v_scale.size() * 4);
      dvscale.upload(v_scale.data(), v_scale.size() * 4);
    } else {
      std::vector<uint16_t> kc, vc;
      lay_out_cache(kc, vc, kb, vb, kNaNBits, rng);
      dk = runtime::DeviceBuffer(dev, kc.size() * 2);
      dk.upload(kc.data(), kc.size() * 2);
      dv = runtime::DeviceBuffer(dev, vc.size() * 2);
      dv.upload(vc.data(), vc.size() * 2);
    }
    finish_setup(rng);
  }

  // The cache in the case's layout (contiguous, or pages in a shuffled order), `poison` wherever no valid
  // position lives (a stray read shows up in O); builds the page table too.
  template <class T>
  void lay_out_cache(std::vector<T>& kc, std::vector<T>& vc, const std::vector<std::vector<T>>& kb, const std::vector<std::vector<T>>& vb,
                     T poison, std::mt19937& rng) {
    const int dev = 0;
    auto put = [&](std::vector<T>& dst, size_t off, const T* src) { std::copy(src, src + D, dst.begin() + off); };
    if (c.page_size == 0) {
      kc.assign(size_t(B) * c.Hkv * max_kv * D, poison);
      vc = kc;
      for (int b = 0; b < B; ++b)
        for (int h = 0; h < c.Hkv; ++h)
          for (int p = 0; p < c.capacity[b]; ++p) {
            size_t off = ((size_t(b) * c.Hkv + h) * max_kv + p) * D, src = (size_t(h) * c.capacity[b] + p) * D;
            put(kc, off, &kb[b][src]);
            put(vc, off, &vb[b][src]);
          }
    } else {
      const int ps = c.page_size;
      max_pages = (max_kv + ps - 1) / ps;
      std::vector<int> pages_of(B);
      for (int b = 0; b < B; ++b) {
        pages_of[b] = (c.capacity[b] + ps - 1) / ps;
        num_pages += pages_of[b];
      }
      const int spare = num_pages;  // a poisoned page for unused table entries
      num_pages += 1;
      std::vector<int> perm(spare);
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      std::vector<int32_t> table(size_t(B) * max_pages, spare);
      kc.assign(size_t(num_pages) * ps * c.Hkv * D, poison);
      vc = kc;
      int next = 0;
      for (int b = 0; b < B; ++b)
        for (int pg = 0; pg < pages_of[b]; ++pg) table[size_t(b) * max_pages + pg] = perm[next++];
      for (int b = 0; b < B; ++b)
        for (int p = 0; p < c.capacity[b]; ++p) {
          const int page = table[size_t(b) * max_pages + p / ps], slot = p % ps;
          for (int h = 0; h < c.Hkv; ++h) {
            size_t off = c.head_major ? ((size_t(page) * c.Hkv + h) * ps + slot) * D : ((size_t(page) * ps + slot) * c.Hkv + h) * D;
            size_t src = (size_t(h) * c.capacity[b] + p) * D;
            put(kc, off, &kb[b][src]);
            put(vc, off, &vb[b][src]);
          }
        }
      dtable = runtime::DeviceBuffer(dev, table.size() * 4);
      dtable.upload(table.data(), table.size() * 4);
    }
  }

  // Outputs, lengths, buffers, the kernel and its plan.
  void finish_setup(std::mt19937& rng) {
    const int dev = 0;
    dout = runtime::DeviceBuffer(dev, q.size() * 2);
    dlse = runtime::DeviceBuffer(dev, size_t(B) * c.H * c.Sq * 4);
    dkvlens = runtime::DeviceBuffer(dev, size_t(B) * 4);
    if (!c.q_lens.empty()) {
      dqlens = runtime::DeviceBuffer(dev, size_t(B) * 4);
      dqlens.upload(c.q_lens.data(), size_t(B) * 4);
    }
    if (c.doc_len > 0) {
      doc.assign(size_t(B) * max_kv, 0);
      for (int b = 0; b < B; ++b) {
        int id = 0, left = c.doc_len / 2 + int(rng() % unsigned(c.doc_len));
        for (int p = 0; p < max_kv; ++p) {
          doc[size_t(b) * max_kv + p] = id;
          if (--left == 0) ++id, left = c.doc_len / 2 + int(rng() % unsigned(c.doc_len));
        }
        if (b == c.masked_doc_seq) {
          int last = doc[size_t(b) * max_kv + c.kv_lens[b] - 1];
          for (int p = 0; p < max_kv; ++p)
            if (doc[size_t(b) * max_kv + p] == last) doc[size_t(b) * max_kv + p] = -1;
        }
      }
      ddoc = runtime::DeviceBuffer(dev, doc.size() * 4);
      ddoc.upload(doc.data(), doc.size() * 4);
    }
    for (const dsl::BufferDecl& bd : c.spec.buffers)
      if (bd.name == "slope") {
        for (int h = 0; h < c.H; ++h) slope.push_back(std::exp2(-8.0f * float(h + 1) / float(c.H)));
        dslope = runtime::DeviceBuffer(dev, slope.size() * 4);
        dslope.upload(slope.data(), slope.size() * 4);
      }
    kernel = rt.compile(c.spec);
    DecodePlanOptions o;
    o.device = Device::cuda(0);
    o.batch = B;
    o.heads = c.H;
    o.kv_heads = c.Hkv;
    o.max_seqlen_q = c.Sq;
    o.max_seqlen_kv = max_kv;
    o.page_size = c.page_size;
    o.head_major_pages = c.head_major;
    o.num_splits = c.num_splits;
    o.kv_dtype = c.kv_fp8;
    plan = kernel->plan_decode(o);
  }

  DecodeArgs args(CUstream stream = nullptr) const {
    DecodeArgs a;
    a.q = Tensor{dq.data(), c.spec.dtype, {B, c.H, c.Sq, D}, {}};
    const dsl::DType kv = c.kv_fp8.value_or(c.spec.dtype);
    if (c.page_size == 0) {
      a.k = Tensor{dk.data(), kv, {B, c.Hkv, max_kv, D}, {}};
      a.v = Tensor{dv.data(), kv, {B, c.Hkv, max_kv, D}, {}};
    } else {
      std::vector<int64_t> shape = c.head_major ? std::vector<int64_t>{num_pages, c.Hkv, c.page_size, D}
                                                : std::vector<int64_t>{num_pages, c.page_size, c.Hkv, D};
      a.k = Tensor{dk.data(), kv, shape, {}};
      a.v = Tensor{dv.data(), kv, shape, {}};
      a.page_table = Tensor{dtable.data(), dsl::DType::I32, {B, max_pages}, {}};
    }
    a.kv_lens = Tensor{dkvlens.data(), dsl::DType::I32, {B}, {}};
    if (!c.q_lens.empty()) a.q_lens = Tensor{dqlens.data(), dsl::DType::I32, {B}, {}};
    a.o = Tensor{dout.data(), c.spec.dtype, {B, c.H, c.Sq, D}, {}};
    a.lse = Tensor{dlse.data(), dsl::DType::F32, {B, c.H, c.Sq}, {}};
    if (c.kv_fp8) {
      a.k_scale = Tensor{dkscale.data(), dsl::DType::F32, {int64_t(k_scale.size())}, {}};
      a.v_scale = Tensor{dvscale.data(), dsl::DType::F32, {int64_t(v_scale.size())}, {}};
    }
    a.params = c.params;
    for (const dsl::BufferDecl& bd : c.spec.buffers) {
      if (bd.name == "doc") a.buffers.emplace_back("doc", Tensor{ddoc.data(), dsl::DType::I32, {B, max_kv}, {}});
      if (bd.name == "slope") a.buffers.emplace_back("slope", Tensor{dslope.data(), dsl::DType::F32, {c.H}, {}});
    }
    a.stream = stream;
    return a;
  }

  void set_kv_lens(const std::vector<int>& lens) {
    c.kv_lens = lens;
    dkvlens.upload(lens.data(), lens.size() * 4);
  }
  void poison() {
    dout.fill_bytes(0xff);
    dlse.fill_bytes(0xff);
  }

  // The interpreter's environment of the case: symbols (Sq, Skv = the plan's bounds), params and buffers.
  EvalEnv eval_env() const {
    EvalEnv base;
    const std::map<std::string, int64_t> sym = {{"B", B}, {"H", c.H}, {"Hkv", c.Hkv}, {"Sq", c.Sq}, {"Skv", max_kv}, {"D", D}};
    base.symbols.resize(ir.checked.symbols.size());
    for (size_t i = 0; i < ir.checked.symbols.size(); ++i) base.symbols[i] = sym.count(ir.checked.symbols[i]) ? sym.at(ir.checked.symbols[i]) : 1;
    base.params.resize(c.spec.params.size());
    for (size_t i = 0; i < c.spec.params.size(); ++i) {
      const dsl::ParamDecl& p = c.spec.params[i];
      Value val;
      val.type = p.type == dsl::ValueType::Float ? ir::Type::Float : p.type == dsl::ValueType::Bool ? ir::Type::Bool : ir::Type::Int;
      double x = p.type == dsl::ValueType::Float ? p.float_value : p.type == dsl::ValueType::Bool ? double(p.bool_value) : double(p.int_value);
      for (auto& [n, pv] : c.params)
        if (n == p.name) x = pv;
      val.i = static_cast<int64_t>(x);
      val.f = static_cast<float>(x);
      val.b = x != 0;
      base.params[i] = val;
    }
    for (const dsl::BufferDecl& bd : c.spec.buffers) {
      if (bd.name == "doc") base.buffers.push_back(BufferView{dsl::DType::I32, doc.data(), {B, max_kv}, {max_kv, 1}});
      if (bd.name == "slope") base.buffers.push_back(BufferView{dsl::DType::F32, slope.data(), {c.H}, {1}});
    }
    return base;
  }

  // The KV tiles (64 positions) of each list that some of its rows keep: [B][Hkv] when the mask reads the head,
  // else [B], as DecodePlan::listed_tiles() reports them.
  std::vector<int> expected_listed_tiles(bool per_head) const {
    EvalEnv env = eval_env();
    const int G = c.H / c.Hkv, lists = per_head ? c.Hkv : 1;
    std::vector<int> counts;
    for (int b = 0; b < B; ++b)
      for (int w = 0; w < lists; ++w) {
        const int L = c.kv_lens[b], ql = c.q_lens.empty() ? c.Sq : c.q_lens[b];
        int kept_tiles = 0;
        for (int t = 0; t * 64 < L; ++t) {
          bool kept = false;
          for (int h = per_head ? w * G : 0; h < (per_head ? w * G + G : c.H) && !kept; ++h)
            for (int i = 0; i < ql && !kept; ++i)
              for (int kv = t * 64; kv < std::min(L, t * 64 + 64) && !kept; ++kv) {
                env.vars[int(dsl::VarId::B)] = b;
                env.vars[int(dsl::VarId::H)] = h;
                env.vars[int(dsl::VarId::KvHead)] = h / G;
                env.vars[int(dsl::VarId::Q)] = L - ql + i;
                env.vars[int(dsl::VarId::KV)] = kv;
                kept = evaluate(ir.mask_mod, env).b;
              }
          kept_tiles += kept;
        }
        counts.push_back(kept_tiles);
      }
    return counts;
  }

  // Compares every valid row (i < q_len(b)) with the float64 reference.
  std::pair<Comparison, Comparison> check() {
    std::vector<uint16_t> raw(q.size());
    dout.download(raw.data(), raw.size() * 2);
    std::vector<float> lse_dev(size_t(B) * c.H * c.Sq);
    dlse.download(lse_dev.data(), lse_dev.size() * 4);
    const EvalEnv base = eval_env();
    const double scale = 1.0 / std::sqrt(double(D));
    const int G = c.H / c.Hkv;
    std::vector<int> rows;  // (b * H + h) * Sq + i of valid rows
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < c.H; ++h)
        for (int i = 0; i < (c.q_lens.empty() ? c.Sq : c.q_lens[b]); ++i) rows.push_back((b * c.H + h) * c.Sq + i);
    std::vector<double> ro(rows.size() * D), rl(rows.size());
    std::vector<float> go(rows.size() * D), gl(rows.size());
    auto work = [&](size_t first, size_t last) {
      EvalEnv env = base;
      std::vector<double> s;
      for (size_t n = first; n < last; ++n) {
        const int row = rows[n], b = row / (c.H * c.Sq), h = (row / c.Sq) % c.H, i = row % c.Sq;
        const int hkv = h / G, L = c.kv_lens[b], ql = c.q_lens.empty() ? c.Sq : c.q_lens[b], qpos = L - ql + i, cap = c.capacity[b];
        const float* qp = &q[size_t(row) * D];
        s.assign(L, 0.0);
        double mx = -std::numeric_limits<double>::infinity();
        for (int kv = 0; kv < L; ++kv) {
          const float* kp = &k[b][(size_t(hkv) * cap + kv) * D];
          double dot = 0;
          for (int d = 0; d < D; ++d) dot += double(qp[d]) * kp[d];
          double sc = dot * scale;
          env.vars[int(dsl::VarId::B)] = b;
          env.vars[int(dsl::VarId::H)] = h;
          env.vars[int(dsl::VarId::KvHead)] = hkv;
          env.vars[int(dsl::VarId::Q)] = qpos;
          env.vars[int(dsl::VarId::KV)] = kv;
          if (ir.score_mod) {
            env.score = static_cast<float>(sc);
            sc = evaluate(ir.score_mod, env).f;
          }
          if (ir.mask_mod && !evaluate(ir.mask_mod, env).b) sc = -std::numeric_limits<double>::infinity();
          s[kv] = sc;
          mx = std::max(mx, sc);
        }
        double* op = &ro[n * D];
        std::fill(op, op + D, 0.0);
        rl[n] = -std::numeric_limits<double>::infinity();
        if (mx != -std::numeric_limits<double>::infinity()) {
          double sum = 0;
          for (double& x : s) sum += (x = std::exp(x - mx));
          for (int kv = 0; kv < L; ++kv) {
            if (s[kv] == 0) continue;
            const float* vp = &v[b][(size_t(hkv) * cap + kv) * D];
            for (int d = 0; d < D; ++d) op[d] += s[kv] * vp[d];
          }
          for (int d = 0; d < D; ++d) op[d] /= sum;
          rl[n] = mx + std::log(sum);
        }
        for (int d = 0; d < D; ++d) go[n * D + d] = element_to_float(c.spec.dtype, raw[size_t(row) * D + d]);
        gl[n] = lse_dev[row];
      }
    };
    int threads = std::max(1u, std::min(32u, std::thread::hardware_concurrency()));
    std::vector<std::thread> pool;
    size_t chunk = (rows.size() + threads - 1) / threads;
    for (int t = 0; t < threads; ++t) {
      size_t a0 = t * chunk, e = std::min(rows.size(), a0 + chunk);
      if (a0 < e) pool.emplace_back(work, a0, e);
    }
    for (auto& th : pool) th.join();
    return {compare(go, ro), compare(gl, rl)};
  }
};

// Runs a case and checks every valid row against the float64 reference. listed: the tile counts the run must
// report (DecodePlan::listed_tiles); by default, for a masked spec, exactly the tiles its mask keeps.
void run_and_expect(DecodeCase c, const std::string& what, std::optional<std::vector<int>> listed = std::nullopt) {
  DecodeProblem p(std::move(c));
  p.set_kv_lens(p.c.kv_lens);
  p.poison();
  p.kernel->decode(*p.plan, p.args());
  p.kernel->check_errors(0, nullptr);
  auto [o, l] = p.check();
  INFO(what << ": splits " << p.plan->num_splits());
  if (p.ir.mask_mod) {
    const std::vector<int> got = p.plan->listed_tiles();
    CHECK(got == listed.value_or(p.expected_listed_tiles(got.size() == size_t(p.B) * p.c.Hkv && p.c.Hkv > 1)));
  }
  INFO("O: rel_l2 " << o.rel_l2 << " max_abs " << o.max_abs << " bad " << o.bad << " (first " << o.first_bad << ")");
  INFO("LSE: rel_l2 " << l.rel_l2 << " max_abs " << l.max_abs << " bad " << l.bad << " (first " << l.first_bad << ")");
  CHECK(o.bad == 0);
  CHECK(l.bad == 0);
  CHECK(o.rel_l2 < 1.5e-2);
  CHECK(l.max_abs < 1e-3);
}

const std::vector<int> kMixedLens = {1, 17, 64, 65, 1000, 4097, 32768, 8191};

}  // namespace

TEST_CASE("decode: page sizes and mixed KV lengths match the float64 reference", "[gpu][decode]") {
  FLEXJIT_REQUIRE_GPU();
  dsl::Spec plain = make_spec("plain", std::nullopt, std::nullopt);
  for (int ps : {0, 1, 16, 64, 256}) {
    DecodeCase c = with_spec(plain);
    c.kv_lens = kMixedLens;
    c.page_size = ps;
    c.seed = 10 + ps;
    run_and_expect(c, "page size " + std::to_string(ps));
  }
  DecodeCase c = with_spec(plain);
  c.kv_lens = {5, 300, 2049};
  c.page_size = 16;
  c.head_major = true;
  run_and_expect(c, "head-major pages");
  c.head_major = false;
  c.page_size = 48;  // not a power of two
  run_and_expect(c, "page size 48");
}

// kv_lens outside q_len..max_seqlen_kv would give the mods query positions outside [0, Skv - 1] (here doc[b, q], a
// load the range analysis proved in range for valid lengths) and read past a sequence's pages: such a sequence runs
// with no KV positions (O = 0, LSE = -inf, no mod evaluated) and check_errors reports it.
TEST_CASE("decode: a sequence whose KV length is outside q_len..max_seqlen_kv is skipped and reported", "[gpu][decode]") {
  FLEXJIT_REQUIRE_GPU();
  DecodeCase c = with_spec(make_spec("doc_rows", std::nullopt, "doc[b, q] >= 0", 128, {"doc: i32[B, Skv]"}));
  c.capacity = {300, 600, 100};
  c.kv_lens = {300, 0, 100};
  c.max_seqlen_kv = 512;
  c.page_size = 16;
  c.doc_len = 64;
  DecodeProblem p(c);
  for (const std::vector<int>& lens : {std::vector<int>{300, 0, 100}, std::vector<int>{300, 600, 100}}) {
    INFO("kv_lens " << lens[0] << ", " << lens[1] << ", " << lens[2]);
    p.set_kv_lens(lens);
    p.poison();
    p.kernel->decode(*p.plan, p.args());
    CHECK_THROWS_WITH(p.kernel->check_errors(0, nullptr), Catch::Contains("outside the launch's bounds"));
    p.set_kv_lens({300, 0, 100});  // the reference of a skipped sequence: no KV positions
    auto [o, l] = p.check();
    CHECK(o.bad == 0);
    CHECK(l.bad == 0);
    CHECK(o.rel_l2 < 1.5e-2);
  }
  p.set_kv_lens({300, 1, 100});  // valid again: nothing reported
  p.kernel->decode(*p.plan, p.args());
  CHECK_NOTHROW(p.kernel->check_errors(0, nullptr));
}

TEST_CASE("decode: GQA 1, 4, 8 and several query rows", "[gpu][decode]") {
  FLEXJIT_REQUIRE_GPU();
  dsl::Spec plain = make_spec("plain", std::nullopt, std::nullopt);
  for (int g : {1, 4, 8})
    for (int sq : {1, 4, 16}) {
      DecodeCase c = with_spec(plain);
      c.H = 2 * g;
      c.Hkv = 2;
      c.Sq = sq;
      c.kv_lens = {sq, 100, 3000};
      if (sq == 4) c.q_lens = {4, 1, 3};
      c.page_size = 16;
      c.seed = 100 + g * 20 + sq;
      run_and_expect(c, "GQA " + std::to_string(g) + " Sq " + std::to_string(sq));
    }
  DecodeCase c = with_spec(make_spec("plain64", std::nullopt, std::nullopt, 64));
  c.kv_lens = {7, 700};
  c.num_splits = 1;  // direct path, no combine
  run_and_expect(c, "D64, one split");
}

TEST_CASE("decode: mods see logical positions (causal, window, ALiBi, softcap, documents)", "[gpu][decode]") {
  FLEXJIT_REQUIRE_GPU();
  {
    DecodeCase c = with_spec(load_spec(gallery_dir() / "causal.json"));
    c.Sq = 4;
    c.kv_lens = {4, 70, 1000, 32768};
    c.page_size = 16;
    run_and_expect(c, "causal with offset");
  }
  {
    DecodeCase c = with_spec(load_spec(gallery_dir() / "sliding_window.json"));
    c.kv_lens = {1, 200, 1500, 32768};
    c.page_size = 16;
    c.params = {{"window", 300}};
    run_and_expect(c, "sliding window 300");
    c.Sq = 3;
    c.kv_lens[0] = 3;  // a sequence's KV positions include its query rows (kv_len >= q_len)
    c.page_size = 0;
    run_and_expect(c, "sliding window 300, 3 rows, contiguous");
  }
  {
    DecodeCase c = with_spec(load_spec(gallery_dir() / "alibi.json"));
    c.kv_lens = kMixedLens;
    c.page_size = 64;
    run_and_expect(c, "ALiBi");
  }
  {
    DecodeCase c = with_spec(load_spec(gallery_dir() / "softcap.json"));
    c.kv_lens = kMixedLens;
    c.page_size = 256;
    run_and_expect(c, "softcap");
  }
  {
    DecodeCase c = with_spec(make_spec("doc_paged", std::nullopt, "doc[b, kv] == doc[b, q] && doc[b, kv] >= 0", 128, {"doc: i32[B, Skv]"}));
    c.kv_lens = {50, 3000, 9000, 20000};
    c.Sq = 2;
    c.page_size = 16;
    c.doc_len = 700;
    c.masked_doc_seq = 1;  // all rows of sequence 1 are masked: O = 0, LSE = -inf
    c.num_splits = 32;     // most splits of a sequence see only other documents
    run_and_expect(c, "document mask, all-masked splits and rows");
  }
  {
    // Scores near -3e38 at positions 0 .. 63: the first split's first max is finite but scales past the fp32 range
    // (the online softmax once made such rows NaN). Every row also sees ordinary scores (kv_len > 64).
    DecodeCase c = with_spec(make_spec("huge_negative", std::string("score - 3.0e38 * float(kv < 64)"), std::nullopt, 128, {}));
    c.kv_lens = {65, 200, 3000, 9000};
    c.page_size = 16;
    c.num_splits = 8;
    run_and_expect(c, "scores near -3e38 in the first tile");
  }
}

TEST_CASE("decode: only the tiles a mask keeps are read (sinks + window, dilated window, documents over pages)", "[gpu][decode]") {
  FLEXJIT_REQUIRE_GPU();
  const std::vector<int> lens = {1, 4, 63, 64, 65, 1030, 5000, 32768};
  const dsl::Spec sinks = make_spec("sinks_window", std::nullopt, "kv < sinks || q - kv < window", 128, {}, {"sinks: int = 4", "window: int = 1024"});
  // Each case over page sizes 1, 16 and 256 and GQA groups 1, 4 and 8 (two KV heads).
  auto over_pages_and_groups = [&](const dsl::Spec& spec, const std::string& what, unsigned seed, auto&& adjust) {
    for (int ps : {1, 16, 256})
      for (int g : {1, 4, 8}) {
        DecodeCase c = with_spec(spec);
        c.kv_lens = lens;
        c.H = 2 * g;
        c.page_size = ps;
        c.seed = seed + ps + g;
        adjust(c);
        run_and_expect(c, what + ", page size " + std::to_string(ps) + ", GQA " + std::to_string(g));
      }
  };
  over_pages_and_groups(sinks, "sinks + window", 300, [](DecodeCase&) {});
  {
    DecodeCase c = with_spec(sinks);
    c.kv_lens = lens;
    c.Sq = 3;
    c.q_lens = {1, 2, 3, 3, 1, 2, 3, 2};
    c.page_size = 16;
    c.params = {{"sinks", 70}, {"window", 100}};
    run_and_expect(c, "sinks 70 + window 100, up to 3 rows");
  }
  {
    DecodeCase c = with_spec(make_spec("dilated", std::nullopt, "q - kv < 8192 && kv // 256 % 2 == q // 256 % 2"));
    c.kv_lens = lens;
    c.page_size = 16;
    run_and_expect(c, "dilated window");
  }
  {
    DecodeCase c = with_spec(make_spec("per_head_window", std::nullopt, "q - kv < 200 * (h + 1) || kv < 1"));
    c.kv_lens = lens;
    c.H = 8;
    c.page_size = 16;
    run_and_expect(c, "a window per query head (a list per KV head)");
  }
  const dsl::Spec doc = make_spec("doc_lists", std::nullopt, "doc[b, kv] == doc[b, q] && doc[b, kv] >= 0", 128, {"doc: i32[B, Skv]"});
  over_pages_and_groups(doc, "documents", 400, [](DecodeCase& c) {
    c.doc_len = 2048;
    c.masked_doc_seq = 5;  // every row of sequence 5 is masked: nothing listed, O = 0, LSE = -inf
    c.num_splits = c.page_size == 16 ? 16 : 0;
  });
  {
    // A mask that reads the head, 4 heads x 8 rows per list: more rows than the per-element classification
    // takes, so every tile below the KV length is listed, as partial.
    DecodeCase c = with_spec(make_spec("doc_heads", std::nullopt, "doc[b, kv] == doc[b, q] || h > 100", 128, {"doc: i32[B, Skv]"}));
    c.kv_lens = {3000, 9000};
    c.H = 8;
    c.Sq = 8;
    c.page_size = 16;
    c.doc_len = 700;
    run_and_expect(c, "documents, 32 rows per list", std::vector<int>{47, 47, 141, 141});
  }
}

TEST_CASE("decode: FP8 KV caches (e4m3, e5m2) match a float64 reference that dequantises the same bytes", "[gpu][decode]") {
  FLEXJIT_REQUIRE_GPU();
  dsl::Spec plain = make_spec("plain", std::nullopt, std::nullopt);
  for (dsl::DType kv : {dsl::DType::F8E4M3, dsl::DType::F8E5M2})
    for (int ps : {0, 1, 16, 256}) {
      DecodeCase c = with_spec(plain);
      c.kv_fp8 = kv;
      c.kv_lens = kMixedLens;
      c.page_size = ps;
      c.per_head_scale = ps != 16;
      c.seed = 900 + ps;
      run_and_expect(c, fmt::format("{} page size {}", dsl::dtype_name(kv), ps));
    }
  for (int g : {1, 4, 8}) {
    DecodeCase c = with_spec(plain);
    c.kv_fp8 = dsl::DType::F8E4M3;
    c.H = 2 * g;
    c.Sq = 4;
    c.q_lens = {4, 1, 3};
    c.kv_lens = {4, 100, 3000};
    c.page_size = 16;
    c.seed = 950 + g;
    run_and_expect(c, "GQA " + std::to_string(g));
  }
  {
    DecodeCase c = with_spec(load_spec(gallery_dir() / "softcap.json"));
    c.kv_fp8 = dsl::DType::F8E4M3;
    c.kv_lens = {1, 2000, 32768};
    c.page_size = 16;
    run_and_expect(c, "softcap");
  }
  {
    // Sinks + window (tile lists) and a document mask whose last document is all masked (O = 0, LSE = -inf).
    DecodeCase c = with_spec(make_spec("sinks_window", std::nullopt, std::string("kv < 4 || q - kv < 1024")));
    c.kv_fp8 = dsl::DType::F8E5M2;
    c.kv_lens = {3, 1500, 32768};
    c.page_size = 16;
    run_and_expect(c, "sinks + window");
    DecodeCase d = with_spec(make_spec("doc", std::nullopt, std::string("doc[b, q] == doc[b, kv] && doc[b, kv] >= 0"), 128,
                                       {"doc: i32[B, Skv]"}));
    d.kv_fp8 = dsl::DType::F8E4M3;
    d.kv_lens = {700, 5000, 20000};
    d.doc_len = 900;
    d.masked_doc_seq = 1;
    d.page_size = 1;
    run_and_expect(d, "documents, one all masked");
  }
  {
    DecodeCase c = with_spec(make_spec("plain64", std::nullopt, std::nullopt, 64));
    c.kv_fp8 = dsl::DType::F8E4M3;
    c.kv_lens = {7, 700};
    c.num_splits = 1;
    run_and_expect(c, "D64, one split");
  }
  // f16 queries: Q @ K^T on f16 fragments too (sm_89+ converts e4m3 K in one instruction); D 256 and D 64.
  for (dsl::DType kv : {dsl::DType::F8E4M3, dsl::DType::F8E5M2})
    for (int d : {64, 256}) {
      DecodeCase c = with_spec(make_spec("plain_f16", std::nullopt, std::nullopt, d));
      c.spec.dtype = dsl::DType::F16;
      c.kv_fp8 = kv;
      c.kv_lens = {1, 300, 5000};
      c.page_size = 16;
      c.seed = 970 + d;
      run_and_expect(c, fmt::format("f16 {} D{}", dsl::dtype_name(kv), d));
    }
}

TEST_CASE("decode: every finite FP8 code widens exactly (one KV position: O is V)", "[gpu][decode]") {
  FLEXJIT_REQUIRE_GPU();
  // With one KV position the softmax weight is exactly 1, so O must equal v_scale * V bit for bit: every e4m3 and
  // e5m2 value, subnormals included, is a bf16 and an f16 value. Codes 0..255 over two KV heads of D = 128.
  for (dsl::DType element : {dsl::DType::BF16, dsl::DType::F16})
  for (dsl::DType kv : {dsl::DType::F8E4M3, dsl::DType::F8E5M2}) {
    DecodeCase c = with_spec(make_spec("plain", std::nullopt, std::nullopt));
    c.spec.dtype = element;
    c.kv_fp8 = kv;
    c.per_head_scale = false;
    c.H = 2;
    c.kv_lens = {1};
    c.num_splits = 1;
    DecodeProblem p(c);
    std::vector<uint8_t> codes(2 * 128);
    std::iota(codes.begin(), codes.end(), 0);
    p.dv.upload(codes.data(), codes.size());  // contiguous [1, Hkv=2, 1, 128]: head h holds codes 128 h ..
    const float one = 1.f;
    p.dvscale.upload(&one, 4);
    p.set_kv_lens({1});
    p.poison();
    p.kernel->decode(*p.plan, p.args());
    std::vector<uint16_t> out(2 * 128);
    p.dout.download(out.data(), out.size() * 2);
    int wrong = 0;
    for (int x = 0; x < 256; ++x) {
      const float want = fp8_to_float(static_cast<uint8_t>(x), kv);
      if (!std::isfinite(want)) continue;  // NaN / inf codes: a cache holding them is corrupt (flex_fp8.cuh)
      const float got = element_to_float(element, out[x]);
      if (got != want) {  // -0 may come back as +0 (0 + -0 in the accumulator)
        ++wrong;
        UNSCOPED_INFO(dsl::dtype_name(element) << " " << dsl::dtype_name(kv) << " code " << x << ": got " << got << ", want " << want);
      }
    }
    CHECK(wrong == 0);
  }
}

TEST_CASE("decode captured in a CUDA graph replays while the sequences grow", "[gpu][decode]") {
  FLEXJIT_REQUIRE_GPU();
  const runtime::CudaDriver& d = *runtime::cuda_driver();
  runtime::ScopedDevice scope(0);
  DecodeCase c = with_spec(load_spec(gallery_dir() / "sliding_window.json"));
  c.params = {{"window", 500}};
  c.kv_lens = {10, 300, 1000, 2000};
  c.capacity = {4096, 4096, 4096, 4096};
  c.page_size = 16;
  DecodeProblem p(c);
  p.set_kv_lens(c.kv_lens);
  CUstream stream = nullptr;
  runtime::check_cu(d.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  p.kernel->decode(*p.plan, p.args(stream));  // warm: compiles and loads outside the capture
  runtime::check_cu(d.cuStreamSynchronize(stream), "sync");
  runtime::check_cu(d.cuStreamBeginCapture_v2(stream, CU_STREAM_CAPTURE_MODE_GLOBAL), "cuStreamBeginCapture");
  p.kernel->decode(*p.plan, p.args(stream));
  CUgraph graph = nullptr;
  runtime::check_cu(d.cuStreamEndCapture(stream, &graph), "cuStreamEndCapture");
  CUgraphExec exec = nullptr;
  runtime::check_cu(d.cuGraphInstantiateWithFlags(&exec, graph, 0), "cuGraphInstantiate");
  std::vector<int> lens = c.kv_lens;
  for (int step = 0; step < 4; ++step) {
    for (size_t b = 0; b < lens.size(); ++b) lens[b] = std::min(4096, lens[b] + 1 + step * 300 + int(b) * 7);
    p.set_kv_lens(lens);
    p.poison();
    runtime::check_cu(d.cuGraphLaunch(exec, stream), "cuGraphLaunch");
    runtime::check_cu(d.cuStreamSynchronize(stream), "sync");
    auto [o, l] = p.check();
    INFO("step " << step << " O rel_l2 " << o.rel_l2 << " bad " << o.bad << "; LSE max_abs " << l.max_abs << " bad " << l.bad);
    CHECK(p.plan->listed_tiles() == p.expected_listed_tiles(false));  // the replay listed the grown windows' tiles
    CHECK(o.bad == 0);
    CHECK(l.bad == 0);
    CHECK(o.rel_l2 < 1.5e-2);
    CHECK(l.max_abs < 1e-3);
  }
  p.kernel->check_errors(0, stream);
  d.cuGraphExecDestroy(exec);
  d.cuGraphDestroy(graph);
  d.cuStreamDestroy_v2(stream);
}

namespace {

// Median time of one decode step after a 256 MB memset that evicts L2 (as triton's do_bench does).
struct DecodeBench {
  std::string name;
  dsl::Spec spec;
  int L = 8192, page_size = 0;
};

void time_decode(const DecodeBench& c) {
  const runtime::CudaDriver& d = *runtime::cuda_driver();
  runtime::ScopedDevice scope(0);
  const int B = 8, H = 32, Hkv = 8, D = 128;
  const int64_t per_seq = c.page_size ? (c.L + c.page_size - 1) / c.page_size : 0, pages = B * per_seq;
  const size_t kv_elems = size_t(B) * Hkv * c.L * D + size_t(c.page_size ? pages * c.page_size - int64_t(B) * c.L : 0) * Hkv * D;
  runtime::DeviceBuffer dq(0, size_t(B) * H * D * 2), dk(0, kv_elems * 2), dv(0, kv_elems * 2), dout(0, size_t(B) * H * D * 2),
      dlse(0, size_t(B) * H * 4), dlens(0, size_t(B) * 4), dtable(0, size_t(std::max<int64_t>(pages, 1)) * 4), dslope(0, size_t(H) * 4),
      flush(0, size_t(256) << 20);
  // Non-zero contents (bf16 pairs around 0.1); timing does not depend on the values.
  runtime::check_cu(d.cuMemsetD32_v2(reinterpret_cast<CUdeviceptr>(dq.data()), 0x3dcd3e4du, dq.bytes() / 4), "fill");
  runtime::check_cu(d.cuMemsetD32_v2(reinterpret_cast<CUdeviceptr>(dk.data()), 0x3dcd3c4du, dk.bytes() / 4), "fill");
  runtime::check_cu(d.cuMemsetD32_v2(reinterpret_cast<CUdeviceptr>(dv.data()), 0x3e4d3dcdu, dv.bytes() / 4), "fill");
  std::vector<int32_t> lens(B, c.L), table(size_t(std::max<int64_t>(pages, 1)));
  std::iota(table.begin(), table.end(), 0);
  std::mt19937 rng(5);
  std::shuffle(table.begin(), table.end(), rng);
  dlens.upload(lens.data(), lens.size() * 4);
  dtable.upload(table.data(), table.size() * 4);
  std::vector<float> slope(H);
  for (int h = 0; h < H; ++h) slope[h] = std::exp2(-8.0f * float(h + 1) / float(H));
  dslope.upload(slope.data(), slope.size() * 4);
  Runtime rt;
  auto kernel = rt.compile(c.spec);
  DecodePlanOptions o;
  o.device = Device::cuda(0);
  o.batch = B, o.heads = H, o.kv_heads = Hkv, o.max_seqlen_q = 1, o.max_seqlen_kv = c.L, o.page_size = c.page_size;
  auto plan = kernel->plan_decode(o);
  DecodeArgs a;
  a.q = Tensor{dq.data(), dsl::DType::BF16, {B, H, 1, D}, {}};
  std::vector<int64_t> shape = c.page_size ? std::vector<int64_t>{pages, c.page_size, Hkv, D} : std::vector<int64_t>{B, Hkv, c.L, D};
  a.k = Tensor{dk.data(), dsl::DType::BF16, shape, {}};
  a.v = Tensor{dv.data(), dsl::DType::BF16, shape, {}};
  if (c.page_size) a.page_table = Tensor{dtable.data(), dsl::DType::I32, {B, per_seq}, {}};
  a.kv_lens = Tensor{dlens.data(), dsl::DType::I32, {B}, {}};
  a.o = Tensor{dout.data(), dsl::DType::BF16, {B, H, 1, D}, {}};
  a.lse = Tensor{dlse.data(), dsl::DType::F32, {B, H, 1}, {}};
  for (const dsl::BufferDecl& bd : c.spec.buffers)
    if (bd.name == "slope") a.buffers.emplace_back("slope", Tensor{dslope.data(), dsl::DType::F32, {H}, {}});
  for (int i = 0; i < 10; ++i) kernel->decode(*plan, a);
  CUevent start, stop;
  runtime::check_cu(d.cuEventCreate(&start, 0), "cuEventCreate");
  runtime::check_cu(d.cuEventCreate(&stop, 0), "cuEventCreate");
  std::vector<float> ms;
  for (int i = 0; i < 50; ++i) {
    runtime::check_cu(d.cuMemsetD8Async(reinterpret_cast<CUdeviceptr>(flush.data()), 0, flush.bytes(), nullptr), "flush");
    runtime::check_cu(d.cuEventRecord(start, nullptr), "cuEventRecord");
    kernel->decode(*plan, a);
    runtime::check_cu(d.cuEventRecord(stop, nullptr), "cuEventRecord");
    runtime::check_cu(d.cuEventSynchronize(stop), "cuEventSynchronize");
    float t = 0;
    runtime::check_cu(d.cuEventElapsedTime_v2(&t, start, stop), "cuEventElapsedTime");
    ms.push_back(t);
  }
  d.cuEventDestroy_v2(start);
  d.cuEventDestroy_v2(stop);
  kernel->check_errors(0, nullptr);
  std::sort(ms.begin(), ms.end());
  const double med = ms[ms.size() / 2];
  std::printf("DECODE_BENCH | %s | %.4f ms | %.2f TB/s | splits %d |\n", c.name.c_str(), med, 4.0 * B * Hkv * c.L * D / (med * 1e-3) / 1e12,
              plan->num_splits());
  std::fflush(stdout);
}

}  // namespace

// Hidden (run with "[decode_bench]"): the decode targets, B8 H32/8 D128 bf16, one token.
TEST_CASE("decode timings of the issue's target shapes", "[.][decode_bench]") {
  FLEXJIT_REQUIRE_GPU();
  dsl::Spec plain = make_spec("plain", std::nullopt, std::nullopt);
  std::vector<DecodeBench> cases;
  for (int L : {8192, 32768}) {
    cases.push_back({"decode " + std::to_string(L), plain, L, 0});
    cases.push_back({"paged ps16 " + std::to_string(L), plain, L, 16});
    cases.push_back({"decode alibi " + std::to_string(L), load_spec(gallery_dir() / "alibi.json"), L, 0});
    cases.push_back({"decode softcap " + std::to_string(L), load_spec(gallery_dir() / "softcap.json"), L, 0});
  }
  for (int ps : {1, 64, 256}) cases.push_back({"paged ps" + std::to_string(ps) + " 32768", plain, 32768, ps});
  cases.push_back({"paged ps16 window 1024 over 32768", make_spec("window", std::nullopt, "Skv - 1 - kv < 1024"), 32768, 16});
  cases.push_back({"decode causal 32768", load_spec(gallery_dir() / "causal.json"), 32768, 0});
  for (const DecodeBench& c : cases) time_decode(c);
}
