// Ring attention's host-side machinery that needs no launch: the in-process transport's hops, the host element-wise
// steps (conversions, fp32 sums, the log-sum-exp merge), the plan's checks of devices and transports, and the NCCL
// transport's construction errors (the multi-GPU runs themselves are left: docs/notes/RING_NOTES.md).
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "dsl/error.h"
#include "runtime/cuda_driver.h"
#include "runtime/nccl.h"
#include "runtime/npy.h"
#include "runtime/ring.h"
#include "runtime/ring_backend.h"
#include "runtime/ring_nccl.h"
#include "support/spec_loading.h"

using namespace flexjit;
using Catch::Matchers::Contains;

namespace {

const float kNegInf = -std::numeric_limits<float>::infinity();
const float kNan = std::numeric_limits<float>::quiet_NaN();

// A transport standing for one rank of a ring of processes that copies the packets' bytes.
class OneRankTransport final : public RingTransport {
 public:
  explicit OneRankTransport(int rank) : rank_(rank) {}
  std::vector<int> local_ranks(int) const override { return {rank_}; }
  bool copies_packets() const override { return true; }
  void attach(RingHeld&) override {}
  void start(RingHeld&, unsigned) override {}
  void finish(RingHeld&) override {}
  void all_reduce(const Tensor&, const Device&, CUstream) override {}

 private:
  int rank_;
};

std::shared_ptr<Kernel> causal_kernel() {
  static Runtime rt;
  return rt.compile(test::f32_spec("causal", "", "q >= kv", {}, {}, 16));
}

}  // namespace

TEST_CASE("in-process transport: a hop hands every packet to the next rank, its memory with it", "[ring][transport]") {
  InProcessRingTransport t;
  CHECK(t.local_ranks(3) == std::vector<int>{0, 1, 2});
  CHECK_THROWS_WITH(t.local_ranks(0), Contains("0 ranks"));
  CHECK_FALSE(t.copies_packets());
  std::vector<float> memory(3 * 8);
  RingHeld held;
  held.device = Device::cpu();
  for (int r = 0; r < 3; ++r) {
    RingPacket p;
    p.owner = r;
    p.k = Tensor::contiguous(memory.data() + 8 * r, DType::F32, {1, 1, 2, 4});
    p.dk = p.k;
    held.packets.push_back(p);
  }
  t.attach(held);  // host memory: no events to make
  for (int hop = 1; hop <= 3; ++hop) {
    t.start(held, kRingKv | kRingGrads);
    t.finish(held);
    for (int r = 0; r < 3; ++r) {
      const int owner = ((r - hop) % 3 + 3) % 3;
      CHECK(held.packets[size_t(r)].owner == owner);
      CHECK(held.packets[size_t(r)].k.data == memory.data() + 8 * owner);
      CHECK(held.packets[size_t(r)].dk.data == memory.data() + 8 * owner);
    }
  }
  // R hops bring every packet home.
  for (int r = 0; r < 3; ++r) CHECK(held.packets[size_t(r)].owner == r);
}

TEST_CASE("host ring steps: conversions, fp32 sums over strided views, raw copies", "[ring]") {
  // A [1, 2, 3, 2] bf16 tensor read through [B, S, H, D]-like strides into a contiguous f32 one.
  std::vector<uint16_t> src(12);
  for (size_t i = 0; i < src.size(); ++i) src[i] = float_to_bf16(0.25f * float(i) - 1.0f);
  const Tensor s{src.data(), DType::BF16, {1, 2, 3, 2}, {12, 2, 4, 1}};
  std::vector<float> dst(12, kNan);
  const Tensor d = Tensor::contiguous(dst.data(), DType::F32, {1, 2, 3, 2});
  host_ring_copy(s, d, RingCopy::Assign);
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t r = 0; r < 3; ++r)
      for (int64_t e = 0; e < 2; ++e) CHECK(dst[size_t((h * 3 + r) * 2 + e)] == bf16_to_float(src[size_t(r * 4 + h * 2 + e)]));
  host_ring_copy(s, d, RingCopy::Add);
  CHECK(dst[5] == 2 * bf16_to_float(src[size_t(2 * 4 + 0 * 2 + 1)]));
  // Integers copy bit for bit; they neither convert nor sum.
  std::vector<int32_t> a{1, 2, 3}, b(3, 0);
  host_ring_copy(Tensor::contiguous(a.data(), DType::I32, {3}), Tensor::contiguous(b.data(), DType::I32, {3}), RingCopy::Assign);
  CHECK(b == a);
  std::vector<float> f(3);
  CHECK_THROWS_WITH(host_ring_copy(Tensor::contiguous(a.data(), DType::I32, {3}), Tensor::contiguous(f.data(), DType::F32, {3}), RingCopy::Add),
                    Contains("i32 are not floating point"));
}

TEST_CASE("host ring merge: exact log-sum-exp, an all-masked block weighs nothing, NaN propagates", "[ring]") {
  std::unique_ptr<RingBackend> be = make_host_ring_backend();
  // Four rows of [1, 1, 4, 2]: a normal merge, a masked partial, a first partial into an empty row, a NaN partial.
  std::vector<float> o_acc{1, 2, 3, 4, 0, 0, 5, 6}, lse_acc{0.5f, 1.0f, kNegInf, 0.0f};
  std::vector<float> o_part{3, 4, 9, 9, 7, 8, 1, 1}, lse_part{1.5f, kNegInf, 2.0f, kNan};
  be->merge(Tensor::contiguous(o_part.data(), DType::F32, {1, 1, 4, 2}), Tensor::contiguous(lse_part.data(), DType::F32, {1, 1, 4}),
            Tensor::contiguous(o_acc.data(), DType::F32, {1, 1, 4, 2}), Tensor::contiguous(lse_acc.data(), DType::F32, {1, 1, 4}), 0);
  const double l = std::log(std::exp(0.5) + std::exp(1.5)), wa = std::exp(0.5 - l), wb = std::exp(1.5 - l);
  CHECK(lse_acc[0] == Approx(l).epsilon(1e-6));
  CHECK(o_acc[0] == Approx(wa * 1 + wb * 3).epsilon(1e-6));
  CHECK(o_acc[1] == Approx(wa * 2 + wb * 4).epsilon(1e-6));
  CHECK(lse_acc[1] == 1.0f);  // masked partial: untouched
  CHECK(o_acc[2] == 3.0f);
  CHECK(lse_acc[2] == 2.0f);  // the first partial of a row
  CHECK(o_acc[4] == 7.0f);
  CHECK(std::isnan(lse_acc[3]));
  CHECK(std::isnan(o_acc[6]));
}

TEST_CASE("ring plan: devices and transports are checked before anything runs", "[ring][errors]") {
  std::shared_ptr<Kernel> kernel = causal_kernel();
  // A transport that copies device memory cannot serve the CPU backend.
  CHECK_THROWS_WITH(RingAttention(kernel, RingOptions{2, RingSharding::Zigzag, 100, Device::cpu()}, std::make_shared<OneRankTransport>(1)),
                    Contains("the CPU backend runs virtual ranks only"));
  // One rank of a ring of processes takes one shard.
  RingAttention one(kernel, RingOptions{3, RingSharding::Zigzag, 100, Device::cuda(0)}, std::make_shared<OneRankTransport>(1));
  CHECK(one.local_ranks() == std::vector<int>{1});
  std::vector<float> x(4 * 100 * 16);
  RingShard s;
  const int64_t rows = ring_shard_rows(100, 3, 1, RingSharding::Zigzag);
  s.q = s.k = s.v = s.o = Tensor::contiguous(x.data(), DType::F32, {1, 1, rows, 16});
  s.lse = Tensor::contiguous(x.data(), DType::F32, {1, 1, rows});
  RingArgs args;
  args.shards = {s, s};
  CHECK_THROWS_WITH(one.forward(args), Contains("this process runs 1 of the ring's 3 ranks"));
  // Host tensors on a plan for the GPU the shards live on.
  RingAttention ring(kernel, RingOptions{2, RingSharding::Zigzag, 100, Device::cuda(-1)});  // the GPU shard 0 is on
  const int64_t rows0 = ring_shard_rows(100, 2, 0, RingSharding::Zigzag);
  s.q = s.k = s.v = s.o = Tensor::contiguous(x.data(), DType::F32, {1, 1, rows0, 16});
  s.lse = Tensor::contiguous(x.data(), DType::F32, {1, 1, rows0});
  args.shards = {s, s};
  CHECK_THROWS_WITH(ring.forward(args), Contains("shard 0's q is not CUDA device memory"));
  // A gradient must be one the spec marks.
  RingShard b = s;
  b.d_o = b.dq = b.dk = b.dv = s.q;
  args.shards = {b, b};
  args.grads = {{"bias", Tensor::contiguous(x.data(), DType::F32, {4})}};
  CHECK_THROWS_WITH(ring.backward(args), Contains("not a buffer the spec marks `grad`"));
}

TEST_CASE("NCCL ring transport: construction errors say what to change", "[ring][nccl][errors]") {
  runtime::NcclUniqueId id{};
  auto make = [&](int ranks, int rank, int device, const std::string& library = "") {
    NcclRingOptions o;
    o.ranks = ranks;
    o.rank = rank;
    o.device = device;
    o.library = library;
    NcclRingTransport t(o, id);
  };
  CHECK_THROWS_WITH(make(0, 0, 0), Contains("0 ranks; a ring needs at least one process"));
  CHECK_THROWS_WITH(make(2, 2, 0), Contains("rank 2 is not one of the ring's 2 ranks (0 to 1)"));
  CHECK_THROWS_WITH(make(2, -1, 0), Contains("rank -1 is not one of the ring's 2 ranks"));
  CHECK_THROWS_WITH(make(2, 0, -1), Contains("give this process's GPU"));
  // A library that is not there, by name: the fix is in the message.
  CHECK_THROWS_WITH(make(2, 0, 0, "/nonexistent/libnccl.so.2"), Contains("dlopen(\"/nonexistent/libnccl.so.2\") failed"));
  CHECK_THROWS_WITH(make(2, 0, 0, "/nonexistent/libnccl.so.2"), Contains("FLEXJIT_NCCL_LIBRARY"));
  CHECK_THROWS_WITH(nccl_unique_id("/nonexistent/libnccl.so.2"), Contains("NCCL 2.10 or later"));
  CHECK_THROWS_WITH(NcclRingTransport(NcclRingOptions{0, -1, 0, ""}, runtime::NcclComm{nullptr}), Contains("no communicator"));
  // With the process's library: without it, its reason; without a driver (this machine), the driver's.
  std::string why;
  if (!runtime::nccl_available(&why)) {
    CHECK_THROWS_WITH(make(2, 0, 0), why);
  } else if (!runtime::cuda_driver()) {
    CHECK_THROWS_WITH(make(2, 0, 0), Contains("no CUDA driver"));
  }
}
