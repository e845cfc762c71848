// Ring attention on the CPU backend (issue 28): R = 2, 3 and 4 virtual ranks over the in-process transport, zigzag
// and contiguous sharding of a sequence of 301 positions (no multiple of 2R), against one launch of the whole
// sequence: O and LSE of the forward, then dq, dk, dv and a learnable buffer's gradient of the backward run with the
// ring's own merged O and LSE. Causal, documents, a sliding window, ALiBi with learnable slopes and a learnable
// relative bias; GQA (4 query heads over 2 KV heads). Also the chunk layout and the argument errors.
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <random>

#include "dsl/error.h"
#include "runtime/cpu/cpu_backend.h"
#include "runtime/flexjit.hpp"
#include "runtime/ring.h"
#include "support/ring_cases.h"
#include "support/spec_loading.h"

using namespace flexjit;

namespace {

constexpr int64_t B = 1, H = 4, Hkv = 2, S = 301, D = 16, L = 2 * S - 1;
const float kNanF = std::numeric_limits<float>::quiet_NaN();
const float kNegInf = -std::numeric_limits<float>::infinity();

using Case = test::RingCase;
const std::vector<Case>& cases() { return test::ring_cases(); }

dsl::Spec make_spec(const Case& c) {
  return test::f32_spec(c.name, c.score_mod, c.mask_mod, c.buffers, {c.grad}, static_cast<int>(D));
}

// The whole sequence's operands and buffers.
struct Inputs {
  std::vector<float> q, k, v, d_o, slope, rel;
  std::vector<int32_t> doc;

  explicit Inputs(uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    auto fill = [&](std::vector<float>& x, int64_t n, float scale) {
      x.resize(static_cast<size_t>(n));
      for (float& e : x) e = scale * normal(rng);
    };
    fill(q, B * H * S * D, 0.5f);
    fill(k, B * Hkv * S * D, 0.5f);
    fill(v, B * Hkv * S * D, 1.0f);
    fill(d_o, B * H * S * D, 1.0f);
    fill(rel, L, 1.0f);
    for (int h = 0; h < H; ++h) slope.push_back(std::exp2(-2.0f * float(h + 1)));
    std::uniform_int_distribution<int> len(1, 70);  // documents cross the chunks' boundaries
    for (int32_t d = 0; static_cast<int64_t>(doc.size()) < S; ++d)
      for (int n = len(rng); n > 0 && static_cast<int64_t>(doc.size()) < S; --n) doc.push_back(d);
  }

  std::vector<std::pair<std::string, Tensor>> buffers(const dsl::Spec& spec) {
    std::vector<std::pair<std::string, Tensor>> out;
    for (const dsl::BufferDecl& b : spec.buffers) {
      if (b.name == "doc") out.push_back({b.name, Tensor::contiguous(doc.data(), DType::I32, {S})});
      if (b.name == "slope") out.push_back({b.name, Tensor::contiguous(slope.data(), DType::F32, {H})});
      if (b.name == "rel") out.push_back({b.name, Tensor::contiguous(rel.data(), DType::F32, {L})});
    }
    return out;
  }
};

// Copies between a whole-sequence [B, heads, S, d] array and one rank's shard [B, heads, rows, d] (its chunks'
// positions one after another), through the library's copies: a misplaced row would show in the comparisons.
void to_shard(std::vector<float>& whole, std::vector<float>& shard, const std::vector<RingChunk>& chunks, int64_t heads, int64_t d) {
  int64_t rows = 0;
  for (const RingChunk& c : chunks) rows += c.rows;
  shard.assign(static_cast<size_t>(B * heads * rows * d), kNanF);
  ring_copy_to_shard(Tensor::contiguous(whole.data(), DType::F32, {B, heads, S, d}),
                     Tensor::contiguous(shard.data(), DType::F32, {B, heads, rows, d}), chunks);
}
void to_whole(std::vector<float>& shard, std::vector<float>& whole, const std::vector<RingChunk>& chunks, int64_t heads, int64_t d) {
  const int64_t rows = static_cast<int64_t>(shard.size()) / (B * heads * d);
  ring_copy_to_whole(Tensor::contiguous(shard.data(), DType::F32, {B, heads, rows, d}),
                     Tensor::contiguous(whole.data(), DType::F32, {B, heads, S, d}), chunks);
}

// Every element within rel * |want| + abs, -inf where want is; NaN never passes.
void require_all_close(const std::vector<float>& got, const std::vector<float>& want, double rel, double abs, const std::string& what) {
  REQUIRE(got.size() == want.size());
  if (want.empty()) return;
  size_t misses = 0, first = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double err = std::abs(static_cast<double>(got[i]) - want[i]);
    const bool ok = want[i] == kNegInf ? got[i] == kNegInf : err <= rel * std::abs(want[i]) + abs;
    if (!ok && misses++ == 0) first = i;
  }
  INFO(what << ": " << misses << " of " << want.size() << " out of tolerance; the first, [" << first << "]: got " << got[first] << ", want "
            << want[first]);
  REQUIRE(misses == 0);
}

struct Whole {
  std::vector<float> o, lse, dq, dk, dv, grad;
  RingStats forward_blocks, backward_blocks;  // the ring's
};

// One launch of the whole sequence: forward, then the backward with its own O and LSE.
Whole whole_sequence(Kernel& kernel, Inputs& in, const Case& c) {
  Whole w;
  w.o.assign(static_cast<size_t>(B * H * S * D), kNanF);
  w.lse.assign(static_cast<size_t>(B * H * S), kNanF);
  AttentionArgs a;
  a.q = Tensor::contiguous(in.q.data(), DType::F32, {B, H, S, D});
  a.k = Tensor::contiguous(in.k.data(), DType::F32, {B, Hkv, S, D});
  a.v = Tensor::contiguous(in.v.data(), DType::F32, {B, Hkv, S, D});
  a.o = Tensor::contiguous(w.o.data(), DType::F32, {B, H, S, D});
  a.lse = Tensor::contiguous(w.lse.data(), DType::F32, {B, H, S});
  a.buffers = in.buffers(kernel.spec());
  a.device = Device::cpu();
  kernel.forward(a);
  w.dq.assign(in.q.size(), kNanF);
  w.dk.assign(in.k.size(), kNanF);
  w.dv.assign(in.v.size(), kNanF);
  BackwardArgs g;
  g.q = a.q;
  g.k = a.k;
  g.v = a.v;
  g.o = a.o;
  g.lse = a.lse;
  g.d_o = Tensor::contiguous(in.d_o.data(), DType::F32, {B, H, S, D});
  g.dq = Tensor::contiguous(w.dq.data(), DType::F32, {B, H, S, D});
  g.dk = Tensor::contiguous(w.dk.data(), DType::F32, {B, Hkv, S, D});
  g.dv = Tensor::contiguous(w.dv.data(), DType::F32, {B, Hkv, S, D});
  g.buffers = a.buffers;
  g.device = Device::cpu();
  if (!c.grad.empty()) {
    w.grad.assign(static_cast<size_t>(c.grad == "rel" ? L : H), kNanF);
    g.grads.push_back({c.grad, Tensor::contiguous(w.grad.data(), DType::F32, {static_cast<int64_t>(w.grad.size())})});
  }
  kernel.backward(g);
  return w;
}

// The ring over R virtual ranks, its results gathered back into whole-sequence arrays.
Whole ring(std::shared_ptr<Kernel> kernel, Inputs& in, const Case& c, int R, RingSharding sharding) {
  RingAttention ring(kernel, RingOptions{R, sharding, S, Device::cpu()});
  struct Host {
    std::vector<float> q, k, v, o, lse, d_o, dq, dk, dv;
  };
  std::vector<Host> host(static_cast<size_t>(R));
  RingArgs args;
  args.buffers = in.buffers(kernel->spec());
  for (int r = 0; r < R; ++r) {
    Host& h = host[size_t(r)];
    const std::vector<RingChunk> chunks = ring_chunks(S, R, r, sharding);
    const int64_t rows = ring_shard_rows(S, R, r, sharding);
    to_shard(in.q, h.q, chunks, H, D);
    to_shard(in.k, h.k, chunks, Hkv, D);
    to_shard(in.v, h.v, chunks, Hkv, D);
    to_shard(in.d_o, h.d_o, chunks, H, D);
    h.o.assign(h.q.size(), kNanF);
    h.lse.assign(static_cast<size_t>(B * H * rows), kNanF);
    h.dq.assign(h.q.size(), kNanF);
    h.dk.assign(h.k.size(), kNanF);
    h.dv.assign(h.v.size(), kNanF);
    RingShard s;
    s.q = Tensor::contiguous(h.q.data(), DType::F32, {B, H, rows, D});
    s.k = Tensor::contiguous(h.k.data(), DType::F32, {B, Hkv, rows, D});
    s.v = Tensor::contiguous(h.v.data(), DType::F32, {B, Hkv, rows, D});
    s.o = Tensor::contiguous(h.o.data(), DType::F32, {B, H, rows, D});
    s.lse = Tensor::contiguous(h.lse.data(), DType::F32, {B, H, rows});
    s.d_o = Tensor::contiguous(h.d_o.data(), DType::F32, {B, H, rows, D});
    s.dq = Tensor::contiguous(h.dq.data(), DType::F32, {B, H, rows, D});
    s.dk = Tensor::contiguous(h.dk.data(), DType::F32, {B, Hkv, rows, D});
    s.dv = Tensor::contiguous(h.dv.data(), DType::F32, {B, Hkv, rows, D});
    args.shards.push_back(s);
  }
  Whole w;
  if (!c.grad.empty()) {
    w.grad.assign(static_cast<size_t>(c.grad == "rel" ? L : H), kNanF);
    args.grads.push_back({c.grad, Tensor::contiguous(w.grad.data(), DType::F32, {static_cast<int64_t>(w.grad.size())})});
  }
  ring.forward(args);
  w.forward_blocks = ring.last_stats();
  ring.backward(args);
  w.backward_blocks = ring.last_stats();
  w.o.assign(in.q.size(), kNanF);
  w.lse.assign(static_cast<size_t>(B * H * S), kNanF);
  w.dq.assign(in.q.size(), kNanF);
  w.dk.assign(in.k.size(), kNanF);
  w.dv.assign(in.v.size(), kNanF);
  for (int r = 0; r < R; ++r) {
    Host& h = host[size_t(r)];
    const std::vector<RingChunk> chunks = ring_chunks(S, R, r, sharding);
    to_whole(h.o, w.o, chunks, H, D);
    to_whole(h.lse, w.lse, chunks, H, 1);
    to_whole(h.dq, w.dq, chunks, H, D);
    to_whole(h.dk, w.dk, chunks, Hkv, D);
    to_whole(h.dv, w.dv, chunks, Hkv, D);
  }
  return w;
}

void check_ring(const Case& c, int R, RingSharding sharding, uint32_t seed) {
  cpu::install();
  Runtime rt;
  std::shared_ptr<Kernel> kernel = rt.compile(make_spec(c));
  Inputs in(seed);
  const Whole want = whole_sequence(*kernel, in, c);
  const Whole got = ring(kernel, in, c, R, sharding);
  const std::string what = fmt::format("{}, {} ranks, {}", c.name, R, sharding == RingSharding::Zigzag ? "zigzag" : "contiguous");
  require_all_close(got.o, want.o, 1e-5, 1e-6, what + ": o");
  require_all_close(got.lse, want.lse, 1e-5, 1e-6, what + ": lse");
  require_all_close(got.dq, want.dq, 1e-5, 2e-6, what + ": dq");
  require_all_close(got.dk, want.dk, 1e-5, 2e-6, what + ": dk");
  require_all_close(got.dv, want.dv, 1e-5, 2e-6, what + ": dv");
  // A buffer gradient sums many terms that cancel: its error is bounded absolutely too.
  require_all_close(got.grad, want.grad, 1e-5, 1e-5, what + ": the gradient of " + c.grad);
  // Every (query chunk, KV chunk) pair is a block; those a causal mask empties are skipped, nothing else is.
  const int64_t chunks = sharding == RingSharding::Zigzag ? 2 * R : R;
  INFO(what << ": " << got.forward_blocks.launched << " blocks launched, " << got.forward_blocks.skipped << " skipped");
  REQUIRE(got.forward_blocks.launched + got.forward_blocks.skipped == chunks * chunks);
  REQUIRE(got.backward_blocks.launched == got.forward_blocks.launched);
  REQUIRE(got.backward_blocks.skipped == got.forward_blocks.skipped);
  REQUIRE((got.forward_blocks.skipped > 0) == c.triangular());
}

}  // namespace

TEST_CASE("ring chunks: zigzag pairs chunk r with 2R - 1 - r, lengths differ by at most one, every position once", "[cpu][ring]") {
  for (int R : {1, 2, 3, 4, 7})
    for (RingSharding sh : {RingSharding::Zigzag, RingSharding::Contiguous})
      for (int64_t seqlen : {int64_t(1), int64_t(5), int64_t(301), int64_t(4096)}) {
        std::vector<int> seen(static_cast<size_t>(seqlen), 0);
        int64_t shortest = seqlen, longest = 0;
        for (int r = 0; r < R; ++r) {
          const std::vector<RingChunk> chunks = ring_chunks(seqlen, R, r, sh);
          REQUIRE(chunks.size() == (sh == RingSharding::Zigzag ? 2u : 1u));
          int64_t local = 0;
          for (const RingChunk& c : chunks) {
            REQUIRE(c.local == local);
            local += c.rows;
            shortest = std::min(shortest, c.rows);
            longest = std::max(longest, c.rows);
            for (int64_t p = c.first; p < c.first + c.rows; ++p) ++seen[static_cast<size_t>(p)];
          }
          REQUIRE(ring_shard_rows(seqlen, R, r, sh) == local);
        }
        REQUIRE(longest - shortest <= 1);
        REQUIRE(std::count(seen.begin(), seen.end(), 1) == seqlen);
      }
  const std::vector<RingChunk> c = ring_chunks(301, 3, 1, RingSharding::Zigzag);  // 6 chunks of 51, 50, 50, ...
  REQUIRE(c[0].first == 51);
  REQUIRE(c[0].rows == 50);
  REQUIRE(c[1].first == 201);
  REQUIRE(c[1].rows == 50);
}

TEST_CASE("CPU ring attention over 2, 3 and 4 virtual ranks equals one launch of the whole sequence", "[cpu][ring][context_parallel]") {
  uint32_t seed = 2900;
  for (const Case& c : cases()) {
    for (int R : {2, 3, 4}) {
      SECTION(fmt::format("{}, {} ranks, zigzag", c.name, R)) { check_ring(c, R, RingSharding::Zigzag, seed); }
      ++seed;
    }
    SECTION(c.name + ", 3 ranks, contiguous") { check_ring(c, 3, RingSharding::Contiguous, seed); }
    ++seed;
  }
}

TEST_CASE("may_attend: a block the mask empties at its global positions, by interval arithmetic", "[cpu][ring]") {
  cpu::install();
  Runtime rt;
  Inputs in(2990);
  auto block = [&](Kernel& k, int64_t q0, int64_t rows_q, int64_t kv0, int64_t rows_kv) {
    AttentionArgs a;
    a.q = Tensor{in.q.data(), DType::F32, {B, H, rows_q, D}, {H * S * D, S * D, D, 1}};
    a.k = a.v = Tensor{in.k.data(), DType::F32, {B, Hkv, rows_kv, D}, {Hkv * S * D, S * D, D, 1}};
    a.o = a.q;
    a.buffers = in.buffers(k.spec());
    a.device = Device::cpu();
    a.q_offset = q0;
    a.kv_offset = kv0;
    a.seqlen_q = a.seqlen_kv = S;
    return k.may_attend(a);
  };
  std::shared_ptr<Kernel> causal = rt.compile(make_spec(cases()[0]));
  CHECK_FALSE(block(*causal, 0, 100, 100, 50));  // q <= 99 < kv
  CHECK(block(*causal, 0, 101, 100, 50));        // q = 100 meets kv = 100
  CHECK(block(*causal, 200, 50, 0, 50));         // every q >= kv
  std::shared_ptr<Kernel> window = rt.compile(make_spec(cases()[2]));
  CHECK_FALSE(block(*window, 200, 50, 0, 100));  // q - kv >= 101 > 40 everywhere
  CHECK(block(*window, 200, 50, 150, 60));
  std::shared_ptr<Kernel> document = rt.compile(make_spec(cases()[1]));
  CHECK(block(*document, 0, 10, 290, 10));  // reads buffers: undecided, so it may attend
  std::shared_ptr<Kernel> bias = rt.compile(make_spec(cases()[4]));
  CHECK(block(*bias, 0, 10, 290, 10));  // no mask_mod
}

TEST_CASE("CPU ring attention: argument errors say what to change", "[cpu][ring][errors]") {
  cpu::install();
  Runtime rt;
  std::shared_ptr<Kernel> kernel = rt.compile(make_spec(cases()[0]));
  using Catch::Matchers::Contains;
  REQUIRE_THROWS_WITH(RingAttention(kernel, RingOptions{0, RingSharding::Zigzag, S, Device::cpu()}), Contains("0 ranks"));
  REQUIRE_THROWS_WITH(RingAttention(kernel, RingOptions{2, RingSharding::Zigzag, 0, Device::cpu()}), Contains("0 positions"));
  REQUIRE_THROWS_WITH(ring_chunks(S, 2, 2, RingSharding::Zigzag), Contains("rank 2 is not one of the ring's 2 ranks"));
  RingAttention ring(kernel, RingOptions{2, RingSharding::Zigzag, S, Device::cpu()});
  RingArgs args;
  REQUIRE_THROWS_WITH(ring.forward(args), Contains("0 shards for a ring of 2 ranks"));
  std::vector<float> x(static_cast<size_t>(B * H * S * D));
  RingShard s;
  s.q = s.k = s.v = s.o = Tensor::contiguous(x.data(), DType::F32, {B, H, 150, D});  // rank 0 holds 151 rows
  s.lse = Tensor::contiguous(x.data(), DType::F32, {B, H, 151});
  args.shards = {s, s};
  REQUIRE_THROWS_WITH(ring.forward(args), Contains("shard 0's `q` must have 4 dims with 151 rows on axis 2"));
}
