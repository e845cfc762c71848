// Context parallelism on the GPU forward (issue 28): a launch given q_offset, kv_offset and the whole sequence's
// lengths computes one (query shard, KV shard) block of a longer sequence with the mods seeing global positions.
// Every shard pair of a 300-position sequence cut at uneven places is launched (bf16, head dims 128 and 64 on the
// warp-specialised kernel where the GPU has it, 32 on the mma.sync kernel), the partial O and LSE are merged by
// log-sum-exp on the host and compared element by element with one launch of the whole sequence. Masks and biases
// by position (causal, documents, a relative bias, ALiBi-like), a variant that stages by 64-column tile (KV cuts at
// multiples of 64, and the error for other cuts) and prebuilt block masks of a shard. The backward of shards:
// tests/gpu/backward_test.cpp.
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "gpu_harness.h"

using namespace flexjit;
using namespace flexjit::test;

namespace {

constexpr int64_t B = 1, H = 4, Hkv = 2, S = 300, L = 2 * S - 1;
constexpr double kNegInf = -std::numeric_limits<double>::infinity();

struct Case {
  std::string name, score_mod, mask_mod;
  std::vector<std::string> buffers;
  std::vector<int64_t> kv_cuts;  // empty: the default uneven cuts
};

const std::vector<Case>& cases() {
  static const std::vector<Case> all{
      {"causal", "", "q >= kv", {}, {}},
      {"document", "", "doc[q] == doc[kv]", {"doc: i32[Skv]"}, {}},
      {"relative_bias", "score + rel[q - kv + Skv - 1]", "", {"rel: f32[L]"}, {}},
      {"alibi_causal", "score + 0.1 * (kv - q)", "q >= kv", {}, {}},
      {"aligned_loads", "score + col[kv % 8] + tile[kv // 64]", "q + 20 >= kv", {"col: f32[8]", "tile: f32[5]"}, {0, 64, 192, 300}},
  };
  return all;
}

const std::vector<int64_t> kQueryCuts{0, 37, 150, 211, 300};
const std::vector<int64_t> kKvCuts{0, 90, 101, 230, 300};

struct Span {
  int64_t first, rows;
};
std::vector<Span> spans(const std::vector<int64_t>& cuts) {
  std::vector<Span> out;
  for (size_t i = 0; i + 1 < cuts.size(); ++i) out.push_back({cuts[i], cuts[i + 1] - cuts[i]});
  return out;
}

// The whole sequence on the device: q [B, H, S, D], k / v [B, Hkv, S, D] bf16, and the buffers.
struct Problem {
  int64_t D;
  std::vector<uint16_t> qb, kb, vb;
  runtime::DeviceBuffer q, k, v;
  std::vector<std::pair<std::string, runtime::DeviceBuffer>> bufs;
  std::vector<std::pair<std::string, Tensor>> buffers;

  Problem(const dsl::Spec& spec, int64_t d, uint32_t seed) : D(d) {
    std::mt19937 rng(seed);
    random_rounded(size_t(B * H * S * D), dsl::DType::BF16, rng, qb, 0.5f);
    random_rounded(size_t(B * Hkv * S * D), dsl::DType::BF16, rng, kb, 0.5f);
    random_rounded(size_t(B * Hkv * S * D), dsl::DType::BF16, rng, vb);
    q = upload(qb.data(), qb.size() * 2);
    k = upload(kb.data(), kb.size() * 2);
    v = upload(vb.data(), vb.size() * 2);
    std::normal_distribution<float> normal(0.f, 1.f);
    for (const dsl::BufferDecl& b : spec.buffers) {
      if (b.name == "doc") {
        std::vector<int32_t> doc;
        std::uniform_int_distribution<int> len(1, 80);  // boundaries inside shards and tiles
        for (int32_t id = 0; int64_t(doc.size()) < S; ++id)
          for (int n = len(rng); n > 0 && int64_t(doc.size()) < S; --n) doc.push_back(id);
        add(b.name, doc.data(), doc.size() * 4, DType::I32, {S});
      } else {
        const int64_t n = b.name == "rel" ? L : b.name == "col" ? 8 : 5;
        std::vector<float> x(static_cast<size_t>(n));
        for (float& e : x) e = normal(rng);
        add(b.name, x.data(), x.size() * 4, DType::F32, {n});
      }
    }
  }
  static runtime::DeviceBuffer upload(const void* data, size_t bytes) {
    runtime::DeviceBuffer m(0, bytes);
    m.upload(data, bytes);
    return m;
  }
  void add(const std::string& name, const void* data, size_t bytes, DType t, std::vector<int64_t> shape) {
    bufs.emplace_back(name, upload(data, bytes));
    buffers.push_back({name, Tensor{bufs.back().second.data(), t, std::move(shape), {}}});
  }
  // Rows [first, first + rows) of a [B, heads, S, D] device tensor, as a strided view.
  Tensor rows_of(const runtime::DeviceBuffer& m, int64_t heads, Span s) const {
    return Tensor{static_cast<char*>(m.data()) + s.first * D * 2, DType::BF16, {B, heads, s.rows, D}, {heads * S * D, S * D, D, 1}};
  }
};

// One launch's O (as floats) and LSE.
struct Partial {
  std::vector<float> o, lse;
};

Partial forward(Kernel& kernel, Problem& pb, Span qs, Span ks, bool shard, const BlockMask* mask = nullptr) {
  runtime::DeviceBuffer o(0, size_t(B * H * qs.rows * pb.D) * 2), lse(0, size_t(B * H * qs.rows) * 4);
  std::vector<uint16_t> poison(size_t(B * H * qs.rows * pb.D), 0x7fc0);
  o.upload(poison.data(), poison.size() * 2);
  AttentionArgs a;
  a.q = pb.rows_of(pb.q, H, qs);
  a.k = pb.rows_of(pb.k, Hkv, ks);
  a.v = pb.rows_of(pb.v, Hkv, ks);
  a.o = Tensor{o.data(), DType::BF16, {B, H, qs.rows, pb.D}, {}};
  a.lse = Tensor{lse.data(), DType::F32, {B, H, qs.rows}, {}};
  a.buffers = pb.buffers;
  a.block_mask = mask;
  if (shard) {
    a.q_offset = qs.first;
    a.kv_offset = ks.first;
    a.seqlen_q = S;
    a.seqlen_kv = S;
  }
  kernel.forward(a);
  kernel.check_errors(0, nullptr);
  Partial p;
  std::vector<uint16_t> raw(poison.size());
  o.download(raw.data(), raw.size() * 2);
  for (uint16_t x : raw) p.o.push_back(bf16_to_float(x));
  p.lse.resize(size_t(B * H * qs.rows));
  lse.download(p.lse.data(), p.lse.size() * 4);
  return p;
}

void check_sharded_equals_whole(const Case& c, int64_t D, uint32_t seed) {
  dsl::Spec spec = f32_spec(c.name, c.score_mod, c.mask_mod, c.buffers, {}, static_cast<int>(D));
  spec.dtype = DType::BF16;
  Runtime rt;
  std::shared_ptr<Kernel> kernel = rt.compile(spec);
  Problem pb(spec, D, seed);
  const std::vector<Span> qspans = spans(kQueryCuts), kspans = spans(c.kv_cuts.empty() ? kKvCuts : c.kv_cuts);
  const Partial whole = forward(*kernel, pb, {0, S}, {0, S}, /*shard=*/false);

  // Merge each query shard's partials: lse = log sum exp(lse_s), o = sum exp(lse_s - lse) o_s.
  size_t bad_o = 0, bad_lse = 0, first_bad = 0;
  double worst = 0;
  for (const Span qs : qspans) {
    std::vector<Partial> parts;
    for (const Span ks : kspans) {
      parts.push_back(forward(*kernel, pb, qs, ks, /*shard=*/true));
      // A mask-emptied pair gives O = 0 and LSE = -inf, never NaN.
      const size_t not_finite = size_t(std::count_if(parts.back().o.begin(), parts.back().o.end(), [](float x) { return !std::isfinite(x); }));
      INFO(c.name << " D" << D << ": q [" << qs.first << ", +" << qs.rows << ") x kv [" << ks.first << ", +" << ks.rows << ")");
      REQUIRE(not_finite == 0);
    }
    for (int64_t bh = 0; bh < B * H; ++bh)
      for (int64_t r = 0; r < qs.rows; ++r) {
        const size_t local = size_t(bh * qs.rows + r), global = size_t(bh * S + qs.first + r);
        double mx = kNegInf;
        for (const Partial& p : parts) mx = std::max<double>(mx, p.lse[local]);
        double l = mx;
        if (std::isfinite(mx)) {
          double sum = 0;
          for (const Partial& p : parts) sum += std::exp(p.lse[local] - mx);
          l = mx + std::log(sum);
        }
        const double want_l = whole.lse[global];
        if (!(want_l == kNegInf ? l == kNegInf : std::abs(l - want_l) <= 2e-3 * std::max(1.0, std::abs(want_l)))) bad_lse++;
        for (int64_t d = 0; d < D; ++d) {
          double o = 0;
          for (const Partial& p : parts)
            if (p.lse[local] != -INFINITY) o += std::exp(p.lse[local] - l) * p.o[local * size_t(D) + size_t(d)];
          const double want = whole.o[global * size_t(D) + size_t(d)], err = std::abs(o - want);
          // Two bf16 roundings (each partial's O and the whole launch's) and the merge's sum.
          const double tol = 2e-2 * std::abs(want) + 1e-2;
          if (!(err <= tol) && bad_o++ == 0) first_bad = global * size_t(D) + size_t(d);
          if (err <= tol) worst = std::max(worst, err / tol);
        }
      }
  }
  INFO(c.name << " D" << D << ": " << bad_o << " O elements out of tolerance (first at " << first_bad << "), " << bad_lse
                << " LSE rows; largest error / tolerance of the rest " << worst);
  CHECK(bad_lse == 0);
  CHECK(bad_o == 0);
}

}  // namespace

TEST_CASE("forward: shards with global positions merge into the whole sequence (bf16, D 128, 64, 32)", "[gpu][context_parallel]") {
  FLEXJIT_REQUIRE_GPU();
  uint32_t seed = 2800;
  for (int64_t D : {128, 64, 32})
    for (const Case& c : cases()) {
      SECTION(fmt::format("{} D{}", c.name, D)) { check_sharded_equals_whole(c, D, seed); }
      ++seed;
    }
}

TEST_CASE("forward: a shard's block mask is its own; tile-staged mods need KV cuts at multiples of 64",
          "[gpu][context_parallel][errors]") {
  FLEXJIT_REQUIRE_GPU();
  using Catch::Matchers::Contains;
  Runtime rt;
  {
    // A prebuilt mask of a shard serves that shard's launch and is refused for another shard of the same size.
    dsl::Spec spec = f32_spec("causal", "", "q >= kv", {}, {}, 128);
    spec.dtype = DType::BF16;
    std::shared_ptr<Kernel> kernel = rt.compile(spec);
    Problem pb(spec, 128, 2850);
    runtime::DeviceBuffer o(0, size_t(B * H * 100 * 128) * 2);
    AttentionArgs a;
    a.o = Tensor{o.data(), DType::BF16, {B, H, 100, 128}, {}};
    a.q = pb.rows_of(pb.q, H, {100, 100});
    a.k = pb.rows_of(pb.k, Hkv, {50, 100});
    a.v = pb.rows_of(pb.v, Hkv, {50, 100});
    a.q_offset = 100;
    a.kv_offset = 50;
    a.seqlen_q = a.seqlen_kv = S;
    std::unique_ptr<BlockMask> mask = kernel->build_block_mask(a);
    CHECK(mask->q_offset() == 100);
    CHECK(mask->kv_offset() == 50);
    const Partial with_mask = forward(*kernel, pb, {100, 100}, {50, 100}, true, mask.get());
    const Partial without = forward(*kernel, pb, {100, 100}, {50, 100}, true);
    CHECK(with_mask.o == without.o);
    REQUIRE_THROWS_WITH(forward(*kernel, pb, {100, 100}, {150, 100}, true, mask.get()), Contains("the block mask was built for q_offset=100 kv_offset=50"));
  }
  {
    const Case& c = cases()[4];  // kv // 64 and kv % 8, staged per 64-column tile
    dsl::Spec spec = f32_spec(c.name, c.score_mod, c.mask_mod, c.buffers, {}, 128);
    spec.dtype = DType::BF16;
    std::shared_ptr<Kernel> kernel = rt.compile(spec);
    Problem pb(spec, 128, 2851);
    REQUIRE_THROWS_WITH(forward(*kernel, pb, {0, 100}, {90, 100}, true), Contains("kv_offset = 90 is not a multiple of 64"));
  }
}
