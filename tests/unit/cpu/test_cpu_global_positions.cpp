// Context parallelism on the CPU backend (issue 28, first slice): a launch given q_offset, kv_offset and the whole
// sequence's lengths computes one (query shard, KV shard) block of a longer sequence with the mods seeing global
// positions. Every shard pair of a sequence of 300 cut at uneven places (not multiples of the 64-wide tiles) is
// launched; the partial O and LSE are merged by log-sum-exp and compared element by element with one launch of the
// whole sequence, then the backward per pair with the merged O and LSE, summed, with the whole backward (dq, dk,
// dv and buffer gradients). Masks and biases by position (causal, documents, relative bias, ALiBi-like, and
// kv // 64, kv % 8 loads, which rely on tiles aligned in the whole sequence), and the argument errors.
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "compiler/frontend.h"
#include "dsl/error.h"
#include "runtime/cpu/block_classifier.h"
#include "runtime/cpu/cpu_backend.h"
#include "runtime/flexjit.hpp"
#include "runtime/forward_launch.h"
#include "support/spec_loading.h"

using namespace flexjit;

namespace {

constexpr int64_t B = 1, H = 2, Hkv = 1, S = 300, D = 32, L = 2 * S - 1;
const float kNanF = std::numeric_limits<float>::quiet_NaN();
const float kNegInf = -std::numeric_limits<float>::infinity();
// Shard boundaries: KV shards start 26, 37 and 38 positions past a multiple of 64.
const std::vector<int64_t> kQueryCuts{0, 37, 150, 211, 300};
const std::vector<int64_t> kKvCuts{0, 90, 101, 230, 300};

struct Case {
  std::string name, score_mod, mask_mod;
  std::vector<std::string> buffers, grad;
};

const std::vector<Case>& cases() {
  static const std::vector<Case> all{
      {"causal", "", "q >= kv", {}, {}},
      {"document", "", "doc[q] == doc[kv]", {"doc: i32[Skv]"}, {}},
      {"relative_bias", "score + rel[q - kv + Skv - 1]", "", {"rel: f32[L]"}, {"rel"}},
      {"alibi_causal", "score + 0.1 * (kv - q)", "q >= kv", {}, {}},
      {"aligned_loads", "score + col[kv % 8] + tile[kv // 64]", "q + 20 >= kv", {"col: f32[8]", "tile: f32[5]"}, {"col", "tile"}},
  };
  return all;
}

dsl::Spec make_spec(const Case& c) { return test::f32_spec(c.name, c.score_mod, c.mask_mod, c.buffers, c.grad, static_cast<int>(D)); }

// Random operands of the whole sequence and the buffers of every case.
struct Inputs {
  std::vector<float> q, k, v, d_o;
  std::vector<int32_t> doc;
  std::vector<float> rel, col, tile;

  explicit Inputs(uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    auto fill = [&](std::vector<float>& x, size_t n, float scale) {
      x.resize(n);
      for (float& e : x) e = scale * normal(rng);
    };
    fill(q, B * H * S * D, 0.5f);
    fill(k, B * Hkv * S * D, 0.5f);
    fill(v, B * Hkv * S * D, 1.0f);
    fill(d_o, B * H * S * D, 1.0f);
    fill(rel, L, 1.0f);
    fill(col, 8, 1.0f);
    fill(tile, 5, 1.0f);
    // Documents of random lengths 1..80, so boundaries fall inside shards and tiles.
    std::uniform_int_distribution<int> len(1, 80);
    for (int32_t d = 0; static_cast<int64_t>(doc.size()) < S; ++d)
      for (int n = len(rng); n > 0 && static_cast<int64_t>(doc.size()) < S; --n) doc.push_back(d);
  }

  std::vector<std::pair<std::string, Tensor>> buffers(const dsl::Spec& spec) {
    std::vector<std::pair<std::string, Tensor>> out;
    for (const dsl::BufferDecl& b : spec.buffers) {
      if (b.name == "doc") out.push_back({b.name, Tensor::contiguous(doc.data(), DType::I32, {S})});
      if (b.name == "rel") out.push_back({b.name, Tensor::contiguous(rel.data(), DType::F32, {L})});
      if (b.name == "col") out.push_back({b.name, Tensor::contiguous(col.data(), DType::F32, {8})});
      if (b.name == "tile") out.push_back({b.name, Tensor::contiguous(tile.data(), DType::F32, {5})});
    }
    return out;
  }
};

// Rows [first, first + rows) of a [B, heads, S, d] tensor of the whole sequence, as a strided view.
Tensor rows_of(std::vector<float>& whole, int64_t heads, int64_t d, int64_t first, int64_t rows) {
  Tensor t;
  t.data = whole.data() + first * d;
  t.dtype = DType::F32;
  t.shape = {B, heads, rows, d};
  t.strides = {heads * S * d, S * d, d, 1};
  return t;
}

// The same for a [B, H, S] LSE.
Tensor lse_rows(std::vector<float>& whole, int64_t first, int64_t rows) {
  Tensor t;
  t.data = whole.data() + first;
  t.dtype = DType::F32;
  t.shape = {B, H, rows};
  t.strides = {H * S, S, 1};
  return t;
}

struct Span {
  int64_t first = 0, rows = S;
};

std::vector<Span> spans(const std::vector<int64_t>& cuts) {
  std::vector<Span> out;
  for (size_t i = 0; i + 1 < cuts.size(); ++i) out.push_back({cuts[i], cuts[i + 1] - cuts[i]});
  return out;
}

// The inputs of a launch (AttentionArgs or BackwardArgs) of query rows `qs` against KV rows `ks`; `shard`: with
// their offsets and the whole sequence's lengths (else a plain launch of whole tensors).
template <class Args>
void set_inputs(Args& a, Kernel& kernel, Inputs& in, Span qs, Span ks, bool shard) {
  a.q = rows_of(in.q, H, D, qs.first, qs.rows);
  a.k = rows_of(in.k, Hkv, D, ks.first, ks.rows);
  a.v = rows_of(in.v, Hkv, D, ks.first, ks.rows);
  a.buffers = in.buffers(kernel.spec());
  a.device = Device::cpu();
  if (shard) {
    a.q_offset = qs.first;
    a.kv_offset = ks.first;
    a.seqlen_q = S;
    a.seqlen_kv = S;
  }
}

// A launch's outputs: o [B, H, rows, D] and lse [B, H, rows], poisoned before the launch.
struct Partial {
  std::vector<float> o, lse;
};

Partial forward(Kernel& kernel, Inputs& in, Span qs, Span ks, bool shard) {
  Partial p;
  p.o.assign(static_cast<size_t>(B * H * qs.rows * D), kNanF);
  p.lse.assign(static_cast<size_t>(B * H * qs.rows), kNanF);
  AttentionArgs a;
  set_inputs(a, kernel, in, qs, ks, shard);
  a.o = Tensor::contiguous(p.o.data(), DType::F32, {B, H, qs.rows, D});
  a.lse = Tensor::contiguous(p.lse.data(), DType::F32, {B, H, qs.rows});
  kernel.forward(a);
  return p;
}

// Gradients of one launch: dq [B, H, rows, D], dk and dv [B, Hkv, rows, D], and the buffer gradients in spec order
// (empty for buffers without one), poisoned before the launch.
struct Grads {
  std::vector<float> dq, dk, dv;
  std::vector<std::vector<float>> buffers;
};

Grads backward(Kernel& kernel, Inputs& in, std::vector<float>& o, std::vector<float>& lse, Span qs, Span ks, bool shard) {
  Grads g;
  g.dq.assign(static_cast<size_t>(B * H * qs.rows * D), kNanF);
  g.dk.assign(static_cast<size_t>(B * Hkv * ks.rows * D), kNanF);
  g.dv.assign(static_cast<size_t>(B * Hkv * ks.rows * D), kNanF);
  BackwardArgs a;
  set_inputs(a, kernel, in, qs, ks, shard);
  a.o = rows_of(o, H, D, qs.first, qs.rows);
  a.d_o = rows_of(in.d_o, H, D, qs.first, qs.rows);
  a.lse = lse_rows(lse, qs.first, qs.rows);
  a.dq = Tensor::contiguous(g.dq.data(), DType::F32, {B, H, qs.rows, D});
  a.dk = Tensor::contiguous(g.dk.data(), DType::F32, {B, Hkv, ks.rows, D});
  a.dv = Tensor::contiguous(g.dv.data(), DType::F32, {B, Hkv, ks.rows, D});
  const std::vector<dsl::BufferDecl>& decls = kernel.spec().buffers;
  g.buffers.resize(decls.size());
  for (size_t i = 0; i < decls.size(); ++i) {
    if (!decls[i].requires_grad) continue;
    const Tensor& t = a.buffers[i].second;
    g.buffers[i].assign(static_cast<size_t>(t.shape[0]), kNanF);
    a.grads.push_back({decls[i].name, Tensor::contiguous(g.buffers[i].data(), DType::F32, t.shape)});
  }
  kernel.backward(a);
  return g;
}

// Every element within rel * |want| + abs of want, or -inf where want is; NaN never passes. Reports the first miss.
void require_all_close(const std::vector<float>& got, const std::vector<float>& want, double rel, double abs, const std::string& what) {
  REQUIRE(got.size() == want.size());
  if (want.empty()) return;
  size_t misses = 0, first = 0;
  double worst = 0;  // the largest error in units of the tolerance
  for (size_t i = 0; i < want.size(); ++i) {
    const double err = std::abs(static_cast<double>(got[i]) - want[i]), tol = rel * std::abs(want[i]) + abs;
    const bool ok = want[i] == kNegInf ? got[i] == kNegInf : err <= tol;
    if (!ok && misses++ == 0) first = i;
    if (ok && want[i] != kNegInf) worst = std::max(worst, err / tol);
  }
  INFO(what << ": " << misses << " of " << want.size() << " elements out of tolerance; the first, [" << first << "]: got " << got[first]
            << ", want " << want[first] << "; largest error / tolerance of the others " << worst);
  REQUIRE(misses == 0);
}

// Every element finite, and with `zero` exactly 0.
void require_finite(const std::vector<float>& x, bool zero, const std::string& what) {
  size_t bad = 0;
  for (float e : x) bad += !std::isfinite(e) || (zero && e != 0.0f);
  INFO(what << ": " << bad << " of " << x.size() << " elements are " << (zero ? "not 0" : "not finite"));
  REQUIRE(bad == 0);
}

// Merges the KV shards' partials of each query shard by LSE into O and LSE of the whole sequence:
// lse = log sum_s exp(lse_s), o = sum_s exp(lse_s - lse) o_s; partials with lse -inf weigh nothing.
void merge(const std::vector<std::vector<Partial>>& parts, const std::vector<Span>& qspans, std::vector<float>& o, std::vector<float>& lse) {
  o.assign(static_cast<size_t>(B * H * S * D), kNanF);
  lse.assign(static_cast<size_t>(B * H * S), kNanF);
  for (size_t qi = 0; qi < qspans.size(); ++qi) {
    const Span qs = qspans[qi];
    for (int64_t bh = 0; bh < B * H; ++bh) {
      for (int64_t r = 0; r < qs.rows; ++r) {
        const size_t local = static_cast<size_t>(bh * qs.rows + r), global = static_cast<size_t>(bh * S + qs.first + r);
        double mx = -std::numeric_limits<double>::infinity();
        for (const Partial& p : parts[qi]) mx = std::max<double>(mx, p.lse[local]);
        double l = mx;
        if (std::isfinite(mx)) {
          double sum = 0;
          for (const Partial& p : parts[qi]) sum += std::exp(p.lse[local] - mx);
          l = mx + std::log(sum);
        }
        lse[global] = static_cast<float>(l);
        for (int64_t d = 0; d < D; ++d) {
          double acc = 0;
          for (const Partial& p : parts[qi])
            if (p.lse[local] != kNegInf) acc += std::exp(p.lse[local] - l) * p.o[local * D + static_cast<size_t>(d)];
          o[global * D + static_cast<size_t>(d)] = static_cast<float>(acc);
        }
      }
    }
  }
}

// Whether `c`'s mask excludes every (q, kv) of the two shards (known for the masks here by their form).
bool pair_fully_masked(const Case& c, Span qs, Span ks) {
  if (c.mask_mod == "q >= kv") return qs.first + qs.rows - 1 < ks.first;
  if (c.mask_mod == "q + 20 >= kv") return qs.first + qs.rows - 1 + 20 < ks.first;
  return false;
}

void check_sharded_equals_whole(const Case& c, uint32_t seed) {
  cpu::install();
  Runtime rt;
  std::shared_ptr<Kernel> kernel = rt.compile(make_spec(c));
  Inputs in(seed);
  const std::vector<Span> qspans = spans(kQueryCuts), kspans = spans(kKvCuts);

  // Forward per shard pair; a pair the mask empties gives O = 0 and LSE = -inf.
  std::vector<std::vector<Partial>> parts(qspans.size());
  int empty_pairs = 0;
  for (size_t qi = 0; qi < qspans.size(); ++qi) {
    for (const Span ks : kspans) {
      parts[qi].push_back(forward(*kernel, in, qspans[qi], ks, /*shard=*/true));
      const Partial& p = parts[qi].back();
      const std::string what = fmt::format("{}: o of q [{}, +{}) x kv [{}, +{})", c.name, qspans[qi].first, qspans[qi].rows, ks.first, ks.rows);
      const bool empty = pair_fully_masked(c, qspans[qi], ks);
      require_finite(p.o, empty, what);
      if (empty) {
        ++empty_pairs;
        require_all_close(p.lse, std::vector<float>(p.lse.size(), kNegInf), 0, 0, what + ": lse");
      }
    }
  }
  if (c.mask_mod == "q >= kv") REQUIRE(empty_pairs > 0);

  std::vector<float> o, lse;
  merge(parts, qspans, o, lse);
  const Partial whole = forward(*kernel, in, {}, {}, /*shard=*/false);
  require_all_close(lse, whole.lse, 1e-6, 2e-6, c.name + ": merged lse");
  require_all_close(o, whole.o, 1e-5, 1e-6, c.name + ": merged o");

  // Backward per pair with the merged O and LSE, summed in fp32 per query shard (dq), per KV shard (dk, dv) and
  // over all pairs (buffer gradients); the whole backward takes the same merged O and LSE.
  std::vector<float> dq(static_cast<size_t>(B * H * S * D), 0.0f), dk(static_cast<size_t>(B * Hkv * S * D), 0.0f), dv(dk.size(), 0.0f);
  std::vector<std::vector<float>> grads;
  for (const Span qs : qspans) {
    for (const Span ks : kspans) {
      Grads g = backward(*kernel, in, o, lse, qs, ks, /*shard=*/true);
      const bool empty = pair_fully_masked(c, qs, ks);
      auto add = [&](const std::vector<float>& part, std::vector<float>& sum, int64_t heads, Span rows, const char* name) {
        require_finite(part, empty, fmt::format("{}: {} of q [{}, +{}) x kv [{}, +{})", c.name, name, qs.first, qs.rows, ks.first, ks.rows));
        for (int64_t bh = 0; bh < B * heads; ++bh)
          for (int64_t r = 0; r < rows.rows; ++r)
            for (int64_t d = 0; d < D; ++d)
              sum[static_cast<size_t>((bh * S + rows.first + r) * D + d)] += part[static_cast<size_t>((bh * rows.rows + r) * D + d)];
      };
      add(g.dq, dq, H, qs, "dq");
      add(g.dk, dk, Hkv, ks, "dk");
      add(g.dv, dv, Hkv, ks, "dv");
      grads.resize(g.buffers.size());
      for (size_t i = 0; i < g.buffers.size(); ++i) {
        require_finite(g.buffers[i], false, c.name + ": a buffer gradient of a shard pair");
        grads[i].resize(g.buffers[i].size(), 0.0f);
        for (size_t e = 0; e < g.buffers[i].size(); ++e) grads[i][e] += g.buffers[i][e];
      }
    }
  }
  const Grads ref = backward(*kernel, in, o, lse, {}, {}, /*shard=*/false);
  require_all_close(dq, ref.dq, 1e-5, 2e-6, c.name + ": dq");
  require_all_close(dk, ref.dk, 1e-5, 2e-6, c.name + ": dk");
  require_all_close(dv, ref.dv, 1e-5, 2e-6, c.name + ": dv");
  size_t checked = 0;
  for (size_t b = 0; b < ref.buffers.size(); ++b) {
    // A buffer gradient sums many dS terms that cancel, so its error is bounded absolutely too.
    require_all_close(grads[b], ref.buffers[b], 1e-5, 1e-5, c.name + ": the gradient of " + kernel->spec().buffers[b].name);
    checked += ref.buffers[b].size();
  }
  REQUIRE(checked == (c.grad.empty() ? 0u : c.name == "relative_bias" ? static_cast<size_t>(L) : 13u));
}

struct SettingsGuard {
  cpu::CpuSettings saved = cpu::settings();
  ~SettingsGuard() { cpu::configure(saved); }
};

}  // namespace

TEST_CASE("CPU context parallelism: shards with global positions merge into the whole sequence", "[cpu][context_parallel]") {
  uint32_t seed = 2800;
  for (const Case& c : cases()) {
    SECTION(c.name) { check_sharded_equals_whole(c, seed); }
    ++seed;
  }
}

TEST_CASE("CPU context parallelism: other tile sizes, one tile per product", "[cpu][context_parallel][tiles]") {
  // 32-wide tiles and products of one tile: the padded first tile of a shard fills a product by itself.
  SettingsGuard guard;
  cpu::CpuSettings s = cpu::settings();
  s.block_m = 16;
  s.block_n = 32;
  s.chunk_n = 32;
  cpu::configure(s);
  check_sharded_equals_whole(cases()[4], 2810);
  check_sharded_equals_whole(cases()[1], 2811);
}

TEST_CASE("CPU context parallelism: block classes use global positions", "[cpu][context_parallel][sparsity]") {
  // A causal mask's classes are exact under interval arithmetic: each (query tile, KV tile) of a shard is empty
  // exactly when q < kv everywhere in it and full exactly when q >= kv everywhere, at global positions.
  dsl::Spec spec = make_spec(cases()[0]);
  SpecIR ir = build_spec_ir(spec);
  Inputs in(2820);
  const int64_t q0 = 150, sq = 61, k0 = 101, skv = 129, bm = 16, bn = 64;
  AttentionArgs a;
  a.q = rows_of(in.q, H, D, q0, sq);
  a.k = rows_of(in.k, Hkv, D, k0, skv);
  a.v = rows_of(in.v, Hkv, D, k0, skv);
  runtime::LaunchShape local{B, H, Hkv, sq, skv, D, D};
  BoundValues values = runtime::bind_launch(ir.checked, runtime::mods_shape(local, {q0, k0, S, S}), {}, a);
  cpu::BlockSparsity sparsity;
  sparsity.ir = &ir;
  sparsity.values = &values;
  sparsity.uses_b = sparsity.uses_h = false;
  cpu::BlockClassifier classifier(sparsity, cpu::BlockGrid{B, H, Hkv, sq, skv, bm, bn, 0, q0, k0});
  // KV tiles on the global grid: [101, 128), [128, 192), [192, 230).
  const std::vector<std::pair<int64_t, int64_t>> kv_tiles{{101, 127}, {128, 191}, {192, 229}};
  int seen[3] = {0, 0, 0};
  for (int64_t qt = 0; qt < (sq + bm - 1) / bm; ++qt) {
    const int64_t q_lo = q0 + qt * bm, q_hi = q0 + std::min(sq, (qt + 1) * bm) - 1;
    for (size_t kt = 0; kt < kv_tiles.size(); ++kt) {
      const auto [kv_lo, kv_hi] = kv_tiles[kt];
      const uint8_t want = q_hi < kv_lo ? cpu::kTileEmpty : q_lo >= kv_hi ? cpu::kTileFull : cpu::kTilePartial;
      INFO("query tile " << qt << " (q " << q_lo << ".." << q_hi << "), KV tile " << kt << " (kv " << kv_lo << ".." << kv_hi << ")");
      REQUIRE(cpu::BlockClassifier::classify(&classifier, 0, 0, qt, static_cast<int64_t>(kt)) == want);
      ++seen[want];
    }
  }
  // Every class occurs, so the check above tells local positions from global ones.
  REQUIRE(seen[cpu::kTileEmpty] > 0);
  REQUIRE(seen[cpu::kTileFull] > 0);
  REQUIRE(seen[cpu::kTilePartial] > 0);
}

TEST_CASE("CPU context parallelism: a shard outside its sequence is an error", "[cpu][context_parallel][errors]") {
  cpu::install();
  Runtime rt;
  std::shared_ptr<Kernel> kernel = rt.compile(make_spec(cases()[1]));
  Inputs in(2830);
  std::vector<float> o(static_cast<size_t>(B * H * 100 * D)), lse(static_cast<size_t>(B * H * 100));
  auto args = [&] {
    AttentionArgs a;
    a.q = rows_of(in.q, H, D, 0, 100);
    a.k = rows_of(in.k, Hkv, D, 0, 100);
    a.v = rows_of(in.v, Hkv, D, 0, 100);
    a.o = Tensor::contiguous(o.data(), DType::F32, {B, H, 100, D});
    a.lse = Tensor::contiguous(lse.data(), DType::F32, {B, H, 100});
    a.buffers = in.buffers(kernel->spec());
    a.device = Device::cpu();
    a.seqlen_q = S;
    a.seqlen_kv = S;
    return a;
  };
  using Catch::Matchers::Contains;
  AttentionArgs a = args();
  a.q_offset = 250;  // rows 250..349 of a sequence of 300
  REQUIRE_THROWS_WITH(kernel->forward(a), Contains("q_offset (250) + the 100 rows of q exceed seqlen_q = 300") && Contains("set seqlen_q"));
  a = args();
  a.kv_offset = 201;
  REQUIRE_THROWS_WITH(kernel->forward(a), Contains("kv_offset (201) + the 100 rows of k exceed seqlen_kv = 300"));
  a = args();
  a.seqlen_kv = 0;  // the tensors' own 100 rows
  a.kv_offset = 1;
  REQUIRE_THROWS_WITH(kernel->forward(a), Contains("exceed seqlen_kv = 100 (k's own rows)"));
  a = args();
  a.q_offset = -1;
  REQUIRE_THROWS_WITH(kernel->forward(a), Contains("q_offset is -1") && Contains("must be >= 0"));
  a = args();
  a.seqlen_q = -5;
  REQUIRE_THROWS_WITH(kernel->forward(a), Contains("seqlen_q is -5"));
  a = args();
  a.seqlen_kv = 0;  // doc is declared i32[Skv]: the whole sequence's 300 positions, not these 100
  REQUIRE_THROWS_WITH(kernel->forward(a), Contains("doc"));

  // The backward checks the same.
  std::vector<float> dq(o.size()), dk(o.size() / H), dv(o.size() / H);
  BackwardArgs b;
  AttentionArgs f = args();
  b.q = f.q, b.k = f.k, b.v = f.v, b.o = f.o, b.d_o = f.o, b.lse = f.lse, b.buffers = f.buffers, b.device = f.device;
  b.dq = Tensor::contiguous(dq.data(), DType::F32, {B, H, 100, D});
  b.dk = Tensor::contiguous(dk.data(), DType::F32, {B, Hkv, 100, D});
  b.dv = Tensor::contiguous(dv.data(), DType::F32, {B, Hkv, 100, D});
  b.seqlen_q = S;
  b.seqlen_kv = S;
  b.kv_offset = 250;
  REQUIRE_THROWS_WITH(kernel->backward(b), Contains("kv_offset (250) + the 100 rows of k exceed seqlen_kv = 300"));
}
