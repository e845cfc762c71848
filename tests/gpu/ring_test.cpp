// Ring attention on one GPU (issue 28): R = 2, 3 and 4 virtual ranks on R streams of the device, zigzag and contiguous
// sharding of a 301-position sequence (no multiple of 2R), bf16, against one unsharded launch of the whole sequence:
// O and LSE of the ring's forward, then dq, dk, dv and a learnable buffer's gradient of its backward (run with the
// ring's own merged O and LSE) against the unsharded backward. Causal, documents, a sliding window, ALiBi with learnable
// slopes and a learnable relative bias; GQA (4 query heads over 2 KV heads); one case with [B, S, H, D] shards (strided
// rows and packets). The inputs are sharded and gathered by the library's device copies, every output is poisoned with
// NaN before each run, and every element is checked (NaN never passes). Also the NCCL transport as a ring of one
// process, where NCCL is installed.
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "gpu_harness.h"
#include "runtime/nccl.h"
#include "runtime/ring.h"
#include "runtime/ring_nccl.h"
#include "support/ring_cases.h"

using namespace flexjit;
using namespace flexjit::test;

namespace {

constexpr int64_t B = 1, H = 4, Hkv = 2, S = 301, D = 64, L = 2 * S - 1;
constexpr double kNegInf = -std::numeric_limits<double>::infinity();

using Case = test::RingCase;
const std::vector<Case>& cases() { return test::ring_cases(); }

std::shared_ptr<Kernel> compile(Runtime& rt, const Case& c) {
  dsl::Spec spec = f32_spec(c.name, c.score_mod, c.mask_mod, c.buffers, {c.grad}, static_cast<int>(D));
  spec.dtype = DType::BF16;
  return rt.compile(spec);
}

runtime::DeviceBuffer upload(const void* data, size_t bytes) {
  runtime::DeviceBuffer m(0, bytes);
  m.upload(data, bytes);
  return m;
}

// A [B, heads, rows, width] bf16 device tensor, C-ordered or [B, rows, heads, width] (bshd), poisoned with NaN.
struct DeviceTensor {
  runtime::DeviceBuffer mem;
  Tensor t;
};
DeviceTensor device_tensor(DType dtype, std::vector<int64_t> shape, bool bshd = false) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  DeviceTensor out{runtime::DeviceBuffer(0, size_t(n) * dsl::dtype_size(dtype)), {}};
  out.mem.fill_bytes(0xff);
  out.t = Tensor::contiguous(out.mem.data(), dtype, shape);
  if (bshd && shape.size() == 4) out.t.strides = {shape[2] * shape[1] * shape[3], shape[3], shape[1] * shape[3], 1};
  return out;
}

std::vector<float> download_floats(const DeviceTensor& d) {
  int64_t n = 1;
  for (int64_t x : d.t.shape) n *= x;
  std::vector<float> out(static_cast<size_t>(n));
  if (d.t.dtype == DType::F32) {
    d.mem.download(out.data(), out.size() * 4);
  } else {
    std::vector<uint16_t> raw(out.size());
    d.mem.download(raw.data(), raw.size() * 2);
    for (size_t i = 0; i < raw.size(); ++i) out[i] = bf16_to_float(raw[i]);
  }
  return out;
}

// The whole sequence on the device: q, k, v, dO (bf16, C-ordered) and the buffers.
struct Problem {
  DeviceTensor q, k, v, d_o;
  std::vector<std::pair<std::string, runtime::DeviceBuffer>> memory;
  std::vector<std::pair<std::string, Tensor>> buffers;
  std::vector<int64_t> grad_shape;
  float v_max = 0;  // max |v|: what a block's partial O is bounded by

  Problem(const Case& c, uint32_t seed) {
    std::mt19937 rng(seed);
    auto tensor = [&](int64_t heads, float sd, float* max_abs = nullptr) {
      std::vector<uint16_t> bits;
      for (float x : random_rounded(size_t(B * heads * S * D), DType::BF16, rng, bits, sd))
        if (max_abs) *max_abs = std::max(*max_abs, std::abs(x));
      DeviceTensor t{upload(bits.data(), bits.size() * 2), {}};
      t.t = Tensor::contiguous(t.mem.data(), DType::BF16, {B, heads, S, D});
      return t;
    };
    q = tensor(H, 0.5f);
    k = tensor(Hkv, 0.5f);
    v = tensor(Hkv, 1.0f, &v_max);
    d_o = tensor(H, 1.0f);
    std::normal_distribution<float> normal(0.f, 1.f);
    for (const std::string& decl : c.buffers) {
      const std::string name = decl.substr(0, decl.find(':'));
      if (name == "doc") {
        std::vector<int32_t> doc;
        std::uniform_int_distribution<int> len(1, 70);  // documents cross the chunks' boundaries
        for (int32_t id = 0; int64_t(doc.size()) < S; ++id)
          for (int n = len(rng); n > 0 && int64_t(doc.size()) < S; --n) doc.push_back(id);
        add(name, doc.data(), doc.size() * 4, DType::I32, {S});
      } else if (name == "slope") {
        std::vector<float> slope;
        for (int h = 0; h < H; ++h) slope.push_back(std::exp2(-2.0f * float(h + 1)) * (1.0f + 0.1f * normal(rng)));
        add(name, slope.data(), slope.size() * 4, DType::F32, {H});
      } else {
        std::vector<float> rel(static_cast<size_t>(L));
        for (float& x : rel) x = normal(rng);
        add(name, rel.data(), rel.size() * 4, DType::F32, {L});
      }
    }
    if (!c.grad.empty()) grad_shape = {c.grad == "rel" ? L : H};
  }
  void add(const std::string& name, const void* data, size_t bytes, DType t, std::vector<int64_t> shape) {
    memory.emplace_back(name, upload(data, bytes));
    buffers.push_back({name, Tensor{memory.back().second.data(), t, std::move(shape), {}}});
  }
};

struct Results {
  std::vector<float> o, lse, dq, dk, dv, grad;
  RingStats forward_blocks, backward_blocks;
};

// One launch of the whole sequence: forward, then the backward with its own O and LSE.
Results unsharded(Kernel& kernel, const Problem& pb) {
  DeviceTensor o = device_tensor(DType::BF16, {B, H, S, D}), lse = device_tensor(DType::F32, {B, H, S});
  AttentionArgs a;
  a.q = pb.q.t, a.k = pb.k.t, a.v = pb.v.t, a.o = o.t, a.lse = lse.t;
  a.buffers = pb.buffers;
  kernel.forward(a);
  DeviceTensor dq = device_tensor(DType::BF16, {B, H, S, D}), dk = device_tensor(DType::BF16, {B, Hkv, S, D}),
               dv = device_tensor(DType::BF16, {B, Hkv, S, D});
  DeviceTensor grad = device_tensor(DType::F32, pb.grad_shape.empty() ? std::vector<int64_t>{1} : pb.grad_shape);
  BackwardArgs g;
  g.q = a.q, g.k = a.k, g.v = a.v, g.o = a.o, g.lse = a.lse, g.d_o = pb.d_o.t;
  g.dq = dq.t, g.dk = dk.t, g.dv = dv.t;
  g.buffers = pb.buffers;
  if (!pb.grad_shape.empty()) g.grads.push_back({pb.buffers.back().first, grad.t});
  kernel.backward(g);
  kernel.check_errors(0, nullptr);
  Results r{download_floats(o), download_floats(lse), download_floats(dq), download_floats(dk), download_floats(dv), {}, {}, {}};
  if (!pb.grad_shape.empty()) r.grad = download_floats(grad);
  return r;
}

// The ring over R virtual ranks (or one process over `transport`), its outputs gathered back into whole-sequence
// tensors (themselves poisoned first) by the library's device copies.
Results ring(RingAttention& attention, const Problem& pb, bool bshd) {
  const int R = attention.options().ranks;
  const RingSharding sharding = attention.options().sharding;
  struct Shard {
    DeviceTensor q, k, v, o, lse, d_o, dq, dk, dv;
  };
  std::vector<Shard> shards;
  RingArgs args;
  args.buffers = pb.buffers;
  const Device dev = Device::cuda(0);
  for (int r = 0; r < R; ++r) {
    const std::vector<RingChunk> chunks = ring_chunks(S, R, r, sharding);
    const int64_t rows = ring_shard_rows(S, R, r, sharding);
    auto input = [&](const DeviceTensor& whole, int64_t heads) {
      DeviceTensor t = device_tensor(DType::BF16, {B, heads, rows, D}, bshd);
      ring_copy_to_shard(whole.t, t.t, chunks, dev);
      return t;
    };
    shards.push_back(Shard{input(pb.q, H), input(pb.k, Hkv), input(pb.v, Hkv), device_tensor(DType::BF16, {B, H, rows, D}, bshd),
                           device_tensor(DType::F32, {B, H, rows}), input(pb.d_o, H), device_tensor(DType::BF16, {B, H, rows, D}, bshd),
                           device_tensor(DType::BF16, {B, Hkv, rows, D}, bshd), device_tensor(DType::BF16, {B, Hkv, rows, D}, bshd)});
    const Shard& s = shards.back();
    args.shards.push_back(RingShard{s.q.t, s.k.t, s.v.t, s.o.t, s.lse.t, s.d_o.t, s.dq.t, s.dk.t, s.dv.t});
  }
  DeviceTensor grad = device_tensor(DType::F32, pb.grad_shape.empty() ? std::vector<int64_t>{1} : pb.grad_shape);
  if (!pb.grad_shape.empty()) args.grads.push_back({pb.buffers.back().first, grad.t});
  Results out;
  attention.forward(args);
  out.forward_blocks = attention.last_stats();
  attention.backward(args);
  out.backward_blocks = attention.last_stats();
  attention.check_errors();
  auto gather = [&](Tensor RingShard::*field, DType dtype, int64_t heads, bool lse) {
    DeviceTensor whole = lse ? device_tensor(dtype, {B, heads, S}) : device_tensor(dtype, {B, heads, S, D});
    for (int r = 0; r < R; ++r) ring_copy_to_whole(args.shards[size_t(r)].*field, whole.t, ring_chunks(S, R, r, sharding), dev);
    return download_floats(whole);  // synchronises
  };
  out.o = gather(&RingShard::o, DType::BF16, H, false);
  out.lse = gather(&RingShard::lse, DType::F32, H, true);
  out.dq = gather(&RingShard::dq, DType::BF16, H, false);
  out.dk = gather(&RingShard::dk, DType::BF16, Hkv, false);
  out.dv = gather(&RingShard::dv, DType::BF16, Hkv, false);
  if (!pb.grad_shape.empty()) out.grad = download_floats(grad);
  return out;
}

// Every element within rtol * |want| + atol * rms(want) + abs_tol and the whole within rel_l2; -inf where want is; NaN
// never passes.
void require_close(const std::vector<float>& got, const std::vector<float>& want, double rtol, double atol, double rel_l2,
                   const std::string& what, double abs_tol = 0) {
  REQUIRE(got.size() == want.size());
  if (want.empty()) return;  // no buffer gradient in this case
  double sq = 0;
  size_t finite = 0;
  for (float w : want)
    if (std::isfinite(w)) sq += double(w) * w, ++finite;
  const double rms = finite ? std::sqrt(sq / double(finite)) : 0.0;
  size_t misses = 0, first = 0;
  double num = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double g = got[i], w = want[i];
    bool ok;
    if (w == kNegInf) {
      ok = g == kNegInf;
    } else {
      const double err = std::abs(g - w);
      ok = err <= rtol * std::abs(w) + atol * rms + abs_tol;  // false for NaN
      if (std::isfinite(err)) num += err * err;
    }
    if (!ok && misses++ == 0) first = i;
  }
  const double rel = sq > 0 ? std::sqrt(num / sq) : std::sqrt(num);
  INFO(what << ": " << misses << " of " << want.size() << " out of tolerance (the first, [" << first << "]: got " << got[first]
            << ", want " << want[first] << "); relative L2 error " << rel);
  REQUIRE(misses == 0);
  REQUIRE(rel <= rel_l2);
}

void check(const Results& got, const Results& want, const Problem& pb, const std::string& what) {
  // O: each block's partial O is rounded to bf16 before the fp32 merge. A partial's entries are weighted averages of V
  // rows, so at most max|v| even where the merged O cancels to near 0: each rounding is up to 2^-9 max|v| absolute,
  // and the merge's weights sum to 1. Hence 2^-8 max|v| absolute beside the final roundings' relative error (a bound
  // relative to O's own size fails on those near-0 entries).
  require_close(got.o, want.o, 2e-2, 1e-2, 1e-2, what + ": o", std::ldexp(double(pb.v_max), -8));
  require_close(got.lse, want.lse, 2e-3, 2e-3, 1e-3, what + ": lse");
  // Gradients: a bf16 rounding per block before the fp32 sums, and the backward run from the ring's own bf16 O (its
  // delta = rowsum(dO * O) differs from the unsharded one's at bf16 level, which dS = P (dP - delta) amplifies where
  // dP is close to delta). A misplaced row or a lost block is wrong by its whole size.
  require_close(got.dq, want.dq, 5e-2, 5e-2, 3e-2, what + ": dq");
  require_close(got.dk, want.dk, 5e-2, 5e-2, 3e-2, what + ": dk");
  require_close(got.dv, want.dv, 5e-2, 5e-2, 3e-2, what + ": dv");
  // A buffer gradient sums every pair's dS, which cancel: bounded by its size too.
  require_close(got.grad, want.grad, 1e-1, 5e-2, 5e-2, what + ": the buffer gradient");
}

void check_ring(const Case& c, int R, RingSharding sharding, bool bshd, uint32_t seed) {
  Runtime rt;
  std::shared_ptr<Kernel> kernel = compile(rt, c);
  const Problem pb(c, seed);
  const Results want = unsharded(*kernel, pb);
  RingAttention attention(kernel, RingOptions{R, sharding, S, Device::cuda(0)});
  const Results got = ring(attention, pb, bshd);
  const std::string what = fmt::format("{}, {} ranks, {}{}", c.name, R, sharding == RingSharding::Zigzag ? "zigzag" : "contiguous",
                                       bshd ? ", [B, S, H, D] shards" : "");
  check(got, want, pb, what);
  // Every (query chunk, KV chunk) pair is a block; those a causal mask empties are skipped, nothing else is.
  const int64_t chunks = sharding == RingSharding::Zigzag ? 2 * R : R;
  INFO(what << ": " << got.forward_blocks.launched << " blocks launched, " << got.forward_blocks.skipped << " skipped");
  REQUIRE(got.forward_blocks.launched + got.forward_blocks.skipped == chunks * chunks);
  REQUIRE(got.backward_blocks.launched == got.forward_blocks.launched);
  REQUIRE((got.forward_blocks.skipped > 0) == c.triangular());
}

}  // namespace

TEST_CASE("GPU ring attention over 2, 3 and 4 virtual ranks equals one unsharded launch (bf16)", "[gpu][ring][context_parallel]") {
  FLEXJIT_REQUIRE_GPU();
  uint32_t seed = 3100;
  for (const Case& c : cases()) {
    for (int R : {2, 3, 4}) {
      SECTION(fmt::format("{}, {} ranks, zigzag", c.name, R)) { check_ring(c, R, RingSharding::Zigzag, false, seed); }
      ++seed;
    }
    SECTION(c.name + ", 3 ranks, contiguous") { check_ring(c, 3, RingSharding::Contiguous, false, seed); }
    ++seed;
  }
  SECTION("causal, 2 ranks, zigzag, [B, S, H, D] shards") { check_ring(cases()[0], 2, RingSharding::Zigzag, true, seed); }
}

TEST_CASE("GPU ring attention: a plan reused for new inputs gives what a fresh plan gives", "[gpu][ring][context_parallel]") {
  FLEXJIT_REQUIRE_GPU();
  Runtime rt;
  const Case& c = cases()[3];  // learnable ALiBi: masked blocks and a buffer gradient
  std::shared_ptr<Kernel> kernel = compile(rt, c);
  const RingOptions o{3, RingSharding::Zigzag, S, Device::cuda(0)};
  RingAttention reused(kernel, o);
  const Problem first(c, 3190), second(c, 3191);
  check(ring(reused, first, false), unsharded(*kernel, first), first, "a plan's first inputs");
  const Results again = ring(reused, second, false);  // its accumulators, packets and workspaces from the first call
  RingAttention fresh(kernel, o);
  // The blocks' float atomics may sum in another order; the ring adds no other difference.
  check(again, ring(fresh, second, false), second, "a reused plan against a fresh one");
}

TEST_CASE("GPU ring attention over the NCCL transport: a ring of one process equals the unsharded launch",
          "[gpu][ring][context_parallel][nccl]") {
  FLEXJIT_REQUIRE_GPU();
  std::string why;
  if (!runtime::nccl_available(&why)) {
    WARN("skipped: " << why);
    return;
  }
  Runtime rt;
  const Case& c = cases()[4];  // relative bias: every block runs, and a gradient summed by the all-reduce
  std::shared_ptr<Kernel> kernel = compile(rt, c);
  const Problem pb(c, 3191);
  const Results want = unsharded(*kernel, pb);
  NcclRingOptions o;
  o.ranks = 1;
  o.rank = 0;
  o.device = 0;
  auto transport = std::make_shared<NcclRingTransport>(o, nccl_unique_id());
  CHECK(transport->ranks() == 1);
  CHECK(transport->copies_packets());
  RingAttention attention(kernel, RingOptions{1, RingSharding::Zigzag, S, Device::cuda(0)}, transport);
  CHECK(attention.local_ranks() == std::vector<int>{0});
  check(ring(attention, pb, false), want, pb, "NCCL, one process");
}
