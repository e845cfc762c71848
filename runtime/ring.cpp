#include "runtime/ring.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "dsl/error.h"
#include "runtime/device.h"
#include "runtime/ring_backend.h"
#include "runtime/ring_kernels.h"

namespace flexjit {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

bool is_floating(DType t) { return t == DType::F32 || t == DType::BF16 || t == DType::F16; }

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// Rows [first, first + rows) of axis 2 of a [B, heads, rows, D] or [B, H, rows] tensor.
Tensor row_view(const Tensor& t, int64_t first, int64_t rows) {
  Tensor v = t;
  v.strides = t.effective_strides();
  v.data = static_cast<unsigned char*>(t.data) + first * v.strides[2] * dsl::dtype_size(t.dtype);
  v.shape[2] = rows;
  return v;
}

// The first `rows` rows of axis 2 of t, keeping t's strides (a packet buffer's capacity layout).
Tensor with_rows(const Tensor& t, int64_t rows) { return row_view(t, 0, rows); }

// A C-ordered view of `shape` at the start of a scratch tensor with room for it.
Tensor prefix(const Tensor& scratch, std::vector<int64_t> shape) { return Tensor::contiguous(scratch.data, scratch.dtype, std::move(shape)); }

// dst = src for one chunk's rows of ring_copy_to_shard / ring_copy_to_whole.
void copy_rows(const Tensor& src, const Tensor& dst, const Device& device, CUstream stream) {
  if (src.dtype != dst.dtype || src.shape != dst.shape)
    throw Error(fmt::format("ring attention: copying a {} [{}] tensor into a {} [{}] one; the whole sequence's and the shards' tensors "
                            "must agree in dtype and in every dim but the rows",
                            dsl::dtype_name(src.dtype), fmt::join(src.shape, ", "), dsl::dtype_name(dst.dtype), fmt::join(dst.shape, ", ")));
  if (device.kind == Device::Kind::Cpu) {
    host_ring_copy(src, dst, RingCopy::Assign);
    return;
  }
  int index = device.index;
  if (index < 0) index = runtime::pointer_device(src.data);
  if (index < 0) throw Error("ring attention: copying shard rows of host memory on a CUDA device; pass device tensors, or Device::cpu()");
  runtime::RingKernels::on(index).copy(src, dst, RingCopy::Assign, stream);
}

void copy_chunks(const Tensor& whole, const Tensor& shard, const std::vector<RingChunk>& chunks, bool to_shard, const Device& device,
                 CUstream stream) {
  for (const RingChunk& c : chunks) {
    if (c.rows == 0) continue;
    const Tensor w = row_view(whole, c.first, c.rows), s = row_view(shard, c.local, c.rows);
    if (to_shard) copy_rows(w, s, device, stream);
    else copy_rows(s, w, device, stream);
  }
}

}  // namespace

// ---- what both back ends share -------------------------------------------------------------------------------

RingView4 ring_view4(const Tensor& t) {
  const size_t rank = t.shape.size();
  if (rank < 1 || rank > 4) throw Error(fmt::format("ring attention: a tensor of {} dims; the ring's steps take 1 to 4", rank));
  RingView4 v;
  v.data = t.data;
  v.dtype = t.dtype;
  const std::vector<int64_t> strides = t.effective_strides();
  for (size_t i = 0; i < rank; ++i) {
    v.shape[4 - rank + i] = t.shape[i];
    v.stride[4 - rank + i] = strides[i];
  }
  return v;
}

void check_ring_copy(const Tensor& src, const Tensor& dst, RingCopy mode) {
  if (src.shape != dst.shape)
    throw Error(fmt::format("ring attention: internal error, an element-wise step from [{}] into [{}]", fmt::join(src.shape, ", "),
                            fmt::join(dst.shape, ", ")));
  const bool converts = mode == RingCopy::Add || src.dtype != dst.dtype;
  for (DType t : {src.dtype, dst.dtype})
    if (converts && !is_floating(t))
      throw Error(fmt::format("ring attention: tensors of {} are not floating point; use f32, bf16 or f16", dsl::dtype_name(t)));
  if (mode == RingCopy::Add && dst.dtype != DType::F32)
    throw Error(fmt::format("ring attention: internal error, a sum into a {} tensor (the ring's sums are f32)", dsl::dtype_name(dst.dtype)));
}

// ---- the chunks ----------------------------------------------------------------------------------------------

std::vector<RingChunk> ring_chunks(int64_t seqlen, int ranks, int rank, RingSharding sharding) {
  if (ranks < 1) throw Error(fmt::format("ring attention: {} ranks; a ring needs at least one", ranks));
  if (rank < 0 || rank >= ranks) throw Error(fmt::format("ring attention: rank {} is not one of the ring's {} ranks", rank, ranks));
  if (seqlen < 1) throw Error(fmt::format("ring attention: the sequence has {} positions; it needs at least one", seqlen));
  const int64_t n = sharding == RingSharding::Zigzag ? 2 * int64_t(ranks) : ranks;
  auto chunk = [&](int64_t c) {
    const int64_t base = seqlen / n, extra = seqlen % n;
    return RingChunk{c * base + std::min(c, extra), base + (c < extra ? 1 : 0), 0};
  };
  std::vector<RingChunk> out{chunk(rank)};
  if (sharding == RingSharding::Zigzag) {
    RingChunk tail = chunk(n - 1 - rank);
    tail.local = out[0].rows;
    out.push_back(tail);
  }
  return out;
}

int64_t ring_shard_rows(int64_t seqlen, int ranks, int rank, RingSharding sharding) {
  int64_t rows = 0;
  for (const RingChunk& c : ring_chunks(seqlen, ranks, rank, sharding)) rows += c.rows;
  return rows;
}

void ring_copy_to_shard(const Tensor& whole, const Tensor& shard, const std::vector<RingChunk>& chunks, const Device& device, CUstream stream) {
  copy_chunks(whole, shard, chunks, /*to_shard=*/true, device, stream);
}

void ring_copy_to_whole(const Tensor& shard, const Tensor& whole, const std::vector<RingChunk>& chunks, const Device& device, CUstream stream) {
  copy_chunks(whole, shard, chunks, /*to_shard=*/false, device, stream);
}

// ---- the plan ------------------------------------------------------------------------------------------------

RingAttention::RingAttention(std::shared_ptr<Kernel> kernel, RingOptions options, std::shared_ptr<RingTransport> transport)
    : kernel_(std::move(kernel)), options_(options), transport_(std::move(transport)) {
  if (!kernel_) throw Error("ring attention: no kernel; pass the one Runtime::compile returned");
  ring_chunks(options_.seqlen, options_.ranks, 0, options_.sharding);  // validates ranks and seqlen
  if (!transport_) transport_ = std::make_shared<InProcessRingTransport>();
  local_ = transport_->local_ranks(options_.ranks);
  if (options_.device.kind == Device::Kind::Cpu && transport_->copies_packets())
    throw Error("ring attention: this transport moves device memory between processes, and the CPU backend runs virtual ranks only; "
                "leave the transport null (InProcessRingTransport) for the CPU backend");
}

RingAttention::~RingAttention() = default;
RingAttention::RingAttention(RingAttention&&) noexcept = default;
RingAttention& RingAttention::operator=(RingAttention&&) noexcept = default;

RingBackend& RingAttention::backend_for(const RingArgs& args) {
  Device device = Device::cpu();
  if (options_.device.kind == Device::Kind::Cuda) {
    device = options_.device;
    if (device.index < 0 && !args.shards.empty()) device.index = runtime::pointer_device(args.shards[0].q.data);
    if (device.index < 0)
      throw Error("ring attention: shard 0's q is not CUDA device memory; pass device tensors, or set RingOptions::device to "
                  "Device::cpu() for the CPU backend");
  }
  if (!backend_ || backend_->device().kind != device.kind || backend_->device().index != device.index)
    backend_ = device.kind == Device::Kind::Cpu ? make_host_ring_backend() : make_device_ring_backend(device.index);
  return *backend_;
}

void RingAttention::check_errors() {
  if (backend_) backend_->check_errors(*kernel_);
}

namespace {

struct Dims {
  int64_t B = 0, H = 0, Hkv = 0, D = 0, Dv = 0;
};

// The shards' shapes against the ring's: local rank i's tensors hold ring_shard_rows rows of rank local[i]; the
// launches check the rest.
Dims check_shards(const RingArgs& args, const RingOptions& o, const std::vector<int>& local, bool backward) {
  if (args.shards.size() != local.size())
    throw Error(local.size() == size_t(o.ranks)
                    ? fmt::format("ring attention: {} shards for a ring of {} ranks; pass one RingShard per rank", args.shards.size(), o.ranks)
                    : fmt::format("ring attention: {} shards, but this process runs {} of the ring's {} ranks; pass one RingShard per local rank",
                                  args.shards.size(), local.size(), o.ranks));
  Dims d;
  for (size_t i = 0; i < local.size(); ++i) {
    const int r = local[i];
    const RingShard& s = args.shards[i];
    const int64_t rows = ring_shard_rows(o.seqlen, o.ranks, r, o.sharding);
    auto check = [&](const Tensor& t, const char* name, size_t dims) {
      if (t.data == nullptr) throw Error(fmt::format("ring attention: shard {} has no `{}` tensor", r, name));
      if (t.shape.size() != dims || t.shape[2] != rows)
        throw Error(fmt::format("ring attention: shard {}'s `{}` must have {} dims with {} rows on axis 2 (ring_shard_rows of a "
                                "{}-position sequence), got shape [{}]",
                                r, name, dims, rows, o.seqlen, fmt::join(t.shape, ", ")));
      if (!t.strides.empty() && t.strides.size() != dims)
        throw Error(fmt::format("ring attention: shard {}'s `{}` has {} strides for {} dims", r, name, t.strides.size(), dims));
    };
    check(s.q, "q", 4);
    check(s.k, "k", 4);
    check(s.v, "v", 4);
    check(s.o, "o", 4);
    check(s.lse, "lse", 3);
    if (backward) {
      check(s.d_o, "d_o", 4);
      check(s.dq, "dq", 4);
      check(s.dk, "dk", 4);
      check(s.dv, "dv", 4);
    }
    const Dims here{s.q.shape[0], s.q.shape[1], s.k.shape[1], s.q.shape[3], s.v.shape[3]};
    if (i == 0) d = here;
    if (here.B != d.B || here.H != d.H || here.Hkv != d.Hkv || here.D != d.D || here.Dv != d.Dv)
      throw Error(fmt::format("ring attention: shard {} has B, H, Hkv, D, Dv = {}, {}, {}, {}, {}; shard {} has {}, {}, {}, {}, {}", r, here.B,
                              here.H, here.Hkv, here.D, here.Dv, local[0], d.B, d.H, d.Hkv, d.D, d.Dv));
    if (s.k.dtype != args.shards[0].k.dtype || s.v.dtype != args.shards[0].v.dtype)
      throw Error(fmt::format("ring attention: shard {}'s k / v dtype differs from shard {}'s", r, local[0]));
  }
  return d;
}

// The longest chunk (a block's rows) and the longest shard (a packet's capacity).
struct Geometry {
  int64_t chunk_rows = 0, capacity = 0;
};
Geometry geometry(const RingOptions& o) {
  Geometry g;
  for (int r = 0; r < o.ranks; ++r) {
    g.capacity = std::max(g.capacity, ring_shard_rows(o.seqlen, o.ranks, r, o.sharding));
    for (const RingChunk& c : ring_chunks(o.seqlen, o.ranks, r, o.sharding)) g.chunk_rows = std::max(g.chunk_rows, c.rows);
  }
  return g;
}

// Scratch slots of a lane (RingBackend::scratch). A buffer gradient j takes kGradSlots + 2j (a block's) and
// kGradSlots + 2j + 1 (the lane's sum).
enum Slot : int { kAccO, kAccLse, kPartO, kPartLse, kAccDq, kPartDq, kPartDk, kPartDv, kPacketK, kPacketV, kPacketDk, kPacketDv, kGradSlots };

// Each local rank's packet to start with: its own K/V (views of the shard, or copies in the capacity layout when the
// transport copies bytes) and, for the backward, zeroed fp32 dK / dV accumulators.
RingHeld make_held(RingBackend& be, RingTransport& transport, const RingArgs& args, const RingOptions& o, const std::vector<int>& local,
                   const Dims& d, int64_t capacity, bool grads) {
  RingHeld held;
  held.device = be.device();
  held.streams = be.streams();
  for (size_t i = 0; i < local.size(); ++i) {
    const int lane = static_cast<int>(i);
    const RingShard& s = args.shards[i];
    const int64_t rows = ring_shard_rows(o.seqlen, o.ranks, local[i], o.sharding);
    RingPacket p;
    p.owner = local[i];
    if (transport.copies_packets()) {
      p.k = with_rows(be.scratch(lane, kPacketK, s.k.dtype, {d.B, d.Hkv, capacity, d.D}), rows);
      p.v = with_rows(be.scratch(lane, kPacketV, s.v.dtype, {d.B, d.Hkv, capacity, d.Dv}), rows);
      be.copy(s.k, p.k, RingCopy::Assign, lane);
      be.copy(s.v, p.v, RingCopy::Assign, lane);
    } else {
      p.k = s.k;
      p.v = s.v;
    }
    if (grads) {
      const Tensor dk = be.scratch(lane, kPacketDk, DType::F32, {d.B, d.Hkv, capacity, d.D});
      const Tensor dv = be.scratch(lane, kPacketDv, DType::F32, {d.B, d.Hkv, capacity, d.Dv});
      be.fill(dk, 0.0f, lane);
      be.fill(dv, 0.0f, lane);
      p.dk = with_rows(dk, rows);
      p.dv = with_rows(dv, rows);
    }
    held.packets.push_back(p);
  }
  transport.attach(held);
  return held;
}

// After a hop: the views show the new owner's rows.
void finish_hop(RingTransport& transport, RingHeld& held, const RingOptions& o) {
  transport.finish(held);
  for (RingPacket& p : held.packets) {
    const int64_t rows = ring_shard_rows(o.seqlen, o.ranks, p.owner, o.sharding);
    for (Tensor* t : {&p.k, &p.v, &p.dk, &p.dv})
      if (t->data) *t = with_rows(*t, rows);
  }
}

// A launch's global positions: query chunk qc against KV chunk kc of a seqlen-long sequence.
template <class Args>
void set_positions(Args& a, const RingChunk& qc, const RingChunk& kc, int64_t seqlen) {
  a.q_offset = qc.first;
  a.kv_offset = kc.first;
  a.seqlen_q = seqlen;
  a.seqlen_kv = seqlen;
}

// One step of the ring: f(lane, packet, qc, kc, block) for every local rank and every pair of a query chunk of it
// and a KV chunk of the packet it holds that has rows and that the mask may attend (Kernel::may_attend; an emptied
// block gives O = 0, LSE = -inf and no gradient, which the merges and sums would ignore). block: the pair's q, k, v
// and (for may_attend's checks) o rows, the buffers, parameters and global positions. stats counts both.
template <class F>
void each_block(Kernel& kernel, const RingArgs& args, const RingOptions& o, const std::vector<int>& local, RingHeld& held, RingStats& stats,
                F f) {
  for (size_t i = 0; i < local.size(); ++i) {
    const RingShard& s = args.shards[i];
    RingPacket& p = held.packets[i];
    for (const RingChunk& qc : ring_chunks(o.seqlen, o.ranks, local[i], o.sharding))
      for (const RingChunk& kc : ring_chunks(o.seqlen, o.ranks, p.owner, o.sharding)) {
        if (qc.rows == 0 || kc.rows == 0) continue;
        AttentionArgs block;
        block.q = row_view(s.q, qc.local, qc.rows);
        block.k = row_view(p.k, kc.local, kc.rows);
        block.v = row_view(p.v, kc.local, kc.rows);
        block.o = row_view(s.o, qc.local, qc.rows);
        block.buffers = args.buffers;
        block.params = args.params;
        block.scale = args.scale;
        block.device = held.device;
        set_positions(block, qc, kc, o.seqlen);
        if (!kernel.may_attend(block)) {
          ++stats.skipped;
          continue;
        }
        ++stats.launched;
        f(static_cast<int>(i), p, qc, kc, block);
      }
  }
}

// A buffer the spec marks `grad`: every backward launch gets a gradient for it (the GPU kernels would otherwise take
// scratch from the workspace), and the ring sums those the caller asked for.
struct MarkedBuffer {
  std::string name;
  std::vector<int64_t> shape;
  int requested = -1;  // its index in RingArgs::grads, or -1
};

std::vector<MarkedBuffer> marked_buffers(const dsl::Spec& spec, const RingArgs& args) {
  for (const auto& [name, t] : args.grads) {
    const auto it = std::find_if(spec.buffers.begin(), spec.buffers.end(), [&](const dsl::BufferDecl& b) { return b.name == name; });
    if (it == spec.buffers.end() || !it->requires_grad)
      throw Error(fmt::format("ring attention: a gradient for `{}`, which is not a buffer the spec marks `grad`", name));
    if (t.dtype != DType::F32) throw Error(fmt::format("ring attention: the gradient of `{}` must be f32", name));
    if (t.data == nullptr && numel(t.shape) > 0) throw Error(fmt::format("ring attention: the gradient of `{}` has no data", name));
    if (!t.strides.empty() && t.strides != Tensor::contiguous(nullptr, t.dtype, t.shape).effective_strides())
      throw Error(fmt::format("ring attention: the gradient of `{}` must be contiguous", name));
  }
  std::vector<MarkedBuffer> out;
  for (const dsl::BufferDecl& b : spec.buffers) {
    if (!b.requires_grad) continue;
    MarkedBuffer m{b.name, {}, -1};
    for (size_t j = 0; j < args.grads.size(); ++j)
      if (args.grads[j].first == b.name) m.requested = static_cast<int>(j), m.shape = args.grads[j].second.shape;
    if (m.requested < 0) {
      const auto it = std::find_if(args.buffers.begin(), args.buffers.end(), [&](const auto& nb) { return nb.first == b.name; });
      if (it == args.buffers.end())
        throw Error(fmt::format("ring attention: pass buffer `{}` in RingArgs::buffers: it is marked `grad`, and the blocks' gradients of "
                                "it take its shape",
                                b.name));
      m.shape = it->second.shape;
    }
    out.push_back(std::move(m));
  }
  return out;
}

}  // namespace

void RingAttention::forward(const RingArgs& args) {
  const Dims d = check_shards(args, options_, local_, /*backward=*/false);
  RingBackend& be = backend_for(args);
  const int R = options_.ranks, lanes = static_cast<int>(local_.size());
  const Geometry g = geometry(options_);
  const DType ot = kernel_->spec().dtype;
  be.begin(*kernel_, lanes, args.stream, RingLaunchSizes{d.B, d.H, g.chunk_rows, false});
  std::vector<Tensor> acc_o, acc_lse, part_o, part_lse;
  for (int i = 0; i < lanes; ++i) {
    const int64_t rows = args.shards[size_t(i)].q.shape[2];
    acc_o.push_back(be.scratch(i, kAccO, DType::F32, {d.B, d.H, rows, d.Dv}));
    acc_lse.push_back(be.scratch(i, kAccLse, DType::F32, {d.B, d.H, rows}));
    part_o.push_back(be.scratch(i, kPartO, ot, {d.B, d.H, g.chunk_rows, d.Dv}));
    part_lse.push_back(be.scratch(i, kPartLse, DType::F32, {d.B, d.H, g.chunk_rows}));
    be.fill(acc_o.back(), 0.0f, i);
    be.fill(acc_lse.back(), kNegInf, i);
  }
  RingHeld held = make_held(be, *transport_, args, options_, local_, d, g.capacity, /*grads=*/false);
  stats_ = {};
  for (int step = 0; step < R; ++step) {
    const bool hop = step + 1 < R;  // the next packet travels while this one's blocks run
    if (hop) transport_->start(held, kRingKv);
    each_block(*kernel_, args, options_, local_, held, stats_,
               [&](int i, RingPacket&, const RingChunk& qc, const RingChunk&, AttentionArgs& a) {
                 a.o = prefix(part_o[size_t(i)], {d.B, d.H, qc.rows, d.Dv});
                 a.lse = prefix(part_lse[size_t(i)], {d.B, d.H, qc.rows});
                 be.forward(*kernel_, a, i);
                 be.merge(a.o, a.lse, row_view(acc_o[size_t(i)], qc.local, qc.rows), row_view(acc_lse[size_t(i)], qc.local, qc.rows), i);
               });
    if (hop) finish_hop(*transport_, held, options_);
  }
  for (int i = 0; i < lanes; ++i) {
    be.copy(acc_o[size_t(i)], args.shards[size_t(i)].o, RingCopy::Assign, i);
    be.copy(acc_lse[size_t(i)], args.shards[size_t(i)].lse, RingCopy::Assign, i);
  }
  be.join();
}

void RingAttention::backward(const RingArgs& args) {
  const Dims d = check_shards(args, options_, local_, /*backward=*/true);
  const std::vector<MarkedBuffer> marked = marked_buffers(kernel_->spec(), args);
  RingBackend& be = backend_for(args);
  const int R = options_.ranks, lanes = static_cast<int>(local_.size());
  const Geometry g = geometry(options_);
  const DType qt = args.shards[0].q.dtype, kt = args.shards[0].k.dtype, vt = args.shards[0].v.dtype;
  be.begin(*kernel_, lanes, args.stream, RingLaunchSizes{d.B, d.H, g.chunk_rows, true});
  std::vector<Tensor> acc_dq, part_dq, part_dk, part_dv;
  std::vector<std::vector<Tensor>> grad_part(static_cast<size_t>(lanes)), grad_sum(static_cast<size_t>(lanes));
  for (int i = 0; i < lanes; ++i) {
    acc_dq.push_back(be.scratch(i, kAccDq, DType::F32, {d.B, d.H, args.shards[size_t(i)].q.shape[2], d.D}));
    be.fill(acc_dq.back(), 0.0f, i);
    part_dq.push_back(be.scratch(i, kPartDq, qt, {d.B, d.H, g.chunk_rows, d.D}));
    part_dk.push_back(be.scratch(i, kPartDk, kt, {d.B, d.Hkv, g.chunk_rows, d.D}));
    part_dv.push_back(be.scratch(i, kPartDv, vt, {d.B, d.Hkv, g.chunk_rows, d.Dv}));
    for (size_t j = 0; j < marked.size(); ++j) {
      grad_part[size_t(i)].push_back(be.scratch(i, kGradSlots + 2 * int(j), DType::F32, marked[j].shape));
      Tensor sum;
      if (marked[j].requested >= 0) {
        sum = be.scratch(i, kGradSlots + 2 * int(j) + 1, DType::F32, marked[j].shape);
        be.fill(sum, 0.0f, i);
      }
      grad_sum[size_t(i)].push_back(sum);
    }
  }
  RingHeld held = make_held(be, *transport_, args, options_, local_, d, g.capacity, /*grads=*/true);
  stats_ = {};
  // R hops: after each step's blocks the packets move on, and the last hop brings each home with its gradients.
  for (int step = 0; step < R; ++step) {
    if (step + 1 < R) transport_->start(held, kRingKv);  // in flight while the blocks run
    each_block(*kernel_, args, options_, local_, held, stats_,
               [&](int i, RingPacket& p, const RingChunk& qc, const RingChunk& kc, const AttentionArgs& block) {
                 const RingShard& s = args.shards[size_t(i)];
                 BackwardArgs a;
                 a.q = block.q;
                 a.k = block.k;
                 a.v = block.v;
                 a.o = row_view(s.o, qc.local, qc.rows);
                 a.d_o = row_view(s.d_o, qc.local, qc.rows);
                 a.lse = row_view(s.lse, qc.local, qc.rows);
                 a.dq = prefix(part_dq[size_t(i)], {d.B, d.H, qc.rows, d.D});
                 a.dk = prefix(part_dk[size_t(i)], {d.B, d.Hkv, kc.rows, d.D});
                 a.dv = prefix(part_dv[size_t(i)], {d.B, d.Hkv, kc.rows, d.Dv});
                 a.scale = block.scale;
                 a.buffers = block.buffers;
                 a.params = block.params;
                 for (size_t j = 0; j < marked.size(); ++j) a.grads.push_back({marked[j].name, grad_part[size_t(i)][j]});
                 set_positions(a, qc, kc, options_.seqlen);
                 be.backward(*kernel_, a, i);
                 be.copy(a.dq, row_view(acc_dq[size_t(i)], qc.local, qc.rows), RingCopy::Add, i);
                 be.copy(a.dk, row_view(p.dk, kc.local, kc.rows), RingCopy::Add, i);
                 be.copy(a.dv, row_view(p.dv, kc.local, kc.rows), RingCopy::Add, i);
                 for (size_t j = 0; j < marked.size(); ++j)
                   if (marked[j].requested >= 0) be.copy(grad_part[size_t(i)][j], grad_sum[size_t(i)][j], RingCopy::Add, i);
               });
    transport_->start(held, kRingGrads);  // this step's sums are in: the accumulators move on
    finish_hop(*transport_, held, options_);
  }
  for (int i = 0; i < lanes; ++i) {
    const RingShard& s = args.shards[size_t(i)];
    const RingPacket& p = held.packets[size_t(i)];
    if (p.owner != local_[size_t(i)])
      throw Error(fmt::format("ring attention: internal error, rank {} ended holding rank {}'s gradients", local_[size_t(i)], p.owner));
    be.copy(acc_dq[size_t(i)], s.dq, RingCopy::Assign, i);
    be.copy(p.dk, s.dk, RingCopy::Assign, i);
    be.copy(p.dv, s.dv, RingCopy::Assign, i);
  }
  be.join();
  // The buffer gradients: the local ranks' sums, then the other processes' (the transport's all-reduce).
  for (size_t j = 0; j < marked.size(); ++j) {
    if (marked[j].requested < 0) continue;
    const Tensor& out = args.grads[size_t(marked[j].requested)].second;
    for (int i = 0; i < lanes; ++i) be.copy(grad_sum[size_t(i)][j], out, i == 0 ? RingCopy::Assign : RingCopy::Add, RingBackend::kCaller);
    transport_->all_reduce(out, be.device(), args.stream);
  }
}

}  // namespace flexjit
