#include "tools/ring_run.h"

#include <fmt/format.h>

#include <list>
#include <vector>

#include "dsl/error.h"
#include "runtime/cuda_driver.h"
#include "runtime/device.h"
#include "runtime/device_memory.h"

namespace flexjit::tools {

RingSharding parse_ring_sharding(const std::string& name) {
  if (name == "zigzag") return RingSharding::Zigzag;
  if (name == "contiguous") return RingSharding::Contiguous;
  throw Error(fmt::format("--ring-sharding `{}`: use zigzag or contiguous", name));
}

namespace {

// Memory of the shards' tensors where the launch runs: host bytes for the CPU backend, device memory otherwise; lists,
// so that tensors keep pointing at their bytes.
class ShardMemory {
 public:
  explicit ShardMemory(const Device& device) : device_(device) {}
  // An empty C-ordered tensor like `like` but with `rows` rows on axis 2 (dtype `dtype`, or like's).
  Tensor make(const Tensor& like, int64_t rows) { return make(like, rows, like.dtype); }
  Tensor make(const Tensor& like, int64_t rows, DType dtype) {
    std::vector<int64_t> shape = like.shape;
    shape[2] = rows;
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    const size_t bytes = static_cast<size_t>(n * dsl::dtype_size(dtype));
    void* data = nullptr;
    if (device_.kind == Device::Kind::Cpu) {
      data = host_.emplace_back(bytes, 0).data();
    } else {
      data = device_memory_.emplace_back(device_.index, bytes).data();
    }
    return Tensor::contiguous(data, dtype, shape);
  }
  // A shard of `whole`: the rows of `chunks`, copied.
  Tensor copy(const Tensor& whole, const std::vector<RingChunk>& chunks, int64_t rows) {
    Tensor t = make(whole, rows);
    ring_copy_to_shard(whole, t, chunks, device_);
    return t;
  }

 private:
  Device device_;
  std::list<std::vector<unsigned char>> host_;
  std::list<runtime::DeviceBuffer> device_memory_;
};

// The device a run's tensors live on (cuda:-1 resolved from q's memory).
Device resolve(const Device& device, const Tensor& q) {
  if (device.kind == Device::Kind::Cpu || device.index >= 0) return device;
  const int index = runtime::pointer_device(q.data);
  if (index < 0) throw Error("--ring: q is not device memory; use --device cpu for host tensors");
  return Device::cuda(index);
}

RingAttention make_ring(const std::shared_ptr<Kernel>& kernel, const RingRun& ring, const Tensor& q, const Tensor& k, const Device& device) {
  if (q.shape.size() != 4 || k.shape.size() != 4 || q.shape[2] != k.shape[2])
    throw Error(fmt::format("--ring shards one sequence: q [B, H, S, D] and k [B, Hkv, S, D] need the same length S; got q [{}], k [{}]",
                            fmt::join(q.shape, ", "), fmt::join(k.shape, ", ")));
  return RingAttention(kernel, RingOptions{ring.ranks, ring.sharding, q.shape[2], device});
}

// The ring's arguments with each rank's q, k and v shards copied from the whole tensors; `more(shard, chunks,
// rows)` adds the rest of a shard.
template <class Whole, class More>
RingArgs shard_args(const RingOptions& o, ShardMemory& memory, const Whole& whole, More more) {
  RingArgs args;
  args.scale = whole.scale;
  args.buffers = whole.buffers;
  args.params = whole.params;
  for (int r = 0; r < o.ranks; ++r) {
    const std::vector<RingChunk> chunks = ring_chunks(o.seqlen, o.ranks, r, o.sharding);
    const int64_t rows = ring_shard_rows(o.seqlen, o.ranks, r, o.sharding);
    RingShard s;
    s.q = memory.copy(whole.q, chunks, rows);
    s.k = memory.copy(whole.k, chunks, rows);
    s.v = memory.copy(whole.v, chunks, rows);
    more(s, chunks, rows);
    args.shards.push_back(s);
  }
  return args;
}

// Copies each rank's tensor `field` of the shards back into `whole`.
void gather_back(const RingOptions& o, const RingArgs& args, Tensor RingShard::*field, const Tensor& whole, const Device& device) {
  for (int r = 0; r < o.ranks; ++r)
    ring_copy_to_whole(args.shards[size_t(r)].*field, whole, ring_chunks(o.seqlen, o.ranks, r, o.sharding), device);
}

// On a GPU: the ring's checked loads, and its copies back done before the shards' memory goes.
void finish(RingAttention& attention, const Device& device) {
  if (device.kind == Device::Kind::Cpu) return;
  attention.check_errors();
  runtime::ScopedDevice scope(device.index);
  runtime::check_cu(runtime::cuda_driver()->cuCtxSynchronize(), "synchronising after the ring");
}

}  // namespace

void ring_forward(const std::shared_ptr<Kernel>& kernel, const RingRun& ring, const AttentionArgs& whole) {
  const Device device = resolve(whole.device, whole.q);
  ShardMemory memory(device);
  RingAttention attention = make_ring(kernel, ring, whole.q, whole.k, device);
  const RingOptions& o = attention.options();
  const Tensor lse_like = Tensor::contiguous(nullptr, DType::F32, {whole.q.shape[0], whole.q.shape[1], o.seqlen});
  RingArgs args = shard_args(o, memory, whole, [&](RingShard& s, const std::vector<RingChunk>&, int64_t rows) {
    s.o = memory.make(whole.o, rows);
    s.lse = memory.make(lse_like, rows);
  });
  attention.forward(args);
  gather_back(o, args, &RingShard::o, whole.o, device);
  if (whole.lse.data != nullptr) gather_back(o, args, &RingShard::lse, whole.lse, device);
  finish(attention, device);
}

void ring_backward(const std::shared_ptr<Kernel>& kernel, const RingRun& ring, const BackwardArgs& whole) {
  const Device device = resolve(whole.device, whole.q);
  ShardMemory memory(device);
  RingAttention attention = make_ring(kernel, ring, whole.q, whole.k, device);
  const RingOptions& o = attention.options();
  RingArgs args = shard_args(o, memory, whole, [&](RingShard& s, const std::vector<RingChunk>& chunks, int64_t rows) {
    s.o = memory.copy(whole.o, chunks, rows);
    s.lse = memory.copy(whole.lse, chunks, rows);
    s.d_o = memory.copy(whole.d_o, chunks, rows);
    s.dq = memory.make(whole.dq, rows);
    s.dk = memory.make(whole.dk, rows);
    s.dv = memory.make(whole.dv, rows);
  });
  args.grads = whole.grads;  // whole buffers: the ring writes their gradients summed over the ranks
  attention.backward(args);
  gather_back(o, args, &RingShard::dq, whole.dq, device);
  gather_back(o, args, &RingShard::dk, whole.dk, device);
  gather_back(o, args, &RingShard::dv, whole.dv, device);
  finish(attention, device);
}

}  // namespace flexjit::tools
