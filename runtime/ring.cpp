#include "runtime/ring.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "dsl/error.h"
#include "runtime/npy.h"

namespace flexjit {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// ---- host tensors: strided element access in fp32 ----------------------------------------------------------

float load_float(const void* base, DType t, int64_t i) {
  switch (t) {
    case DType::F32: return static_cast<const float*>(base)[i];
    case DType::BF16: return bf16_to_float(static_cast<const uint16_t*>(base)[i]);
    case DType::F16: return half_to_float(static_cast<const uint16_t*>(base)[i]);
    default: break;
  }
  throw Error(fmt::format("ring attention: tensors of {} are not floating point; use f32, bf16 or f16", dsl::dtype_name(t)));
}

void store_float(void* base, DType t, int64_t i, float x) {
  switch (t) {
    case DType::F32: static_cast<float*>(base)[i] = x; return;
    case DType::BF16: static_cast<uint16_t*>(base)[i] = float_to_bf16(x); return;
    case DType::F16: static_cast<uint16_t*>(base)[i] = float_to_half(x); return;
    default: break;
  }
  throw Error(fmt::format("ring attention: tensors of {} are not floating point; use f32, bf16 or f16", dsl::dtype_name(t)));
}

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// f(i, off): element i in C order of t's shape lives at element offset off from t.data.
template <class F>
void for_each_element(const Tensor& t, F f) {
  const std::vector<int64_t> strides = t.effective_strides();
  const size_t rank = t.shape.size();
  const int64_t n = numel(t.shape);
  std::vector<int64_t> idx(rank, 0);
  int64_t off = 0;
  for (int64_t i = 0; i < n; ++i) {
    f(i, off);
    for (size_t d = rank; d-- > 0;) {  // odometer: the last axis fastest
      if (++idx[d] < t.shape[d]) {
        off += strides[d];
        break;
      }
      off -= strides[d] * (t.shape[d] - 1);
      idx[d] = 0;
    }
  }
}

// Rows [first, first + rows) of axis 2 of a [B, heads, rows, D] or [B, H, rows] tensor.
Tensor row_view(const Tensor& t, int64_t first, int64_t rows) {
  Tensor v = t;
  v.strides = t.effective_strides();
  v.data = static_cast<unsigned char*>(t.data) + first * v.strides[2] * dsl::dtype_size(t.dtype);
  v.shape[2] = rows;
  return v;
}

// A C-ordered copy of t's bytes.
std::vector<unsigned char> gather(const Tensor& t) {
  const int size = dsl::dtype_size(t.dtype);
  std::vector<unsigned char> out(static_cast<size_t>(numel(t.shape) * size));
  for_each_element(t, [&](int64_t i, int64_t off) {
    std::memcpy(out.data() + i * size, static_cast<const unsigned char*>(t.data) + off * size, static_cast<size_t>(size));
  });
  return out;
}

// dst = src, element for element (the same shape and dtype, any strides).
void copy_tensor(const Tensor& src, const Tensor& dst) {
  if (src.dtype != dst.dtype || src.shape != dst.shape)
    throw Error(fmt::format("ring attention: copying a {} [{}] tensor into a {} [{}] one; the whole sequence's and the shards' tensors "
                            "must agree in dtype and in every dim but the rows",
                            dsl::dtype_name(src.dtype), fmt::join(src.shape, ", "), dsl::dtype_name(dst.dtype), fmt::join(dst.shape, ", ")));
  const std::vector<unsigned char> bytes = gather(src);
  const int size = dsl::dtype_size(dst.dtype);
  for_each_element(dst, [&](int64_t i, int64_t off) {
    std::memcpy(static_cast<unsigned char*>(dst.data) + off * size, bytes.data() + i * size, static_cast<size_t>(size));
  });
}

// sum[.., local + r, ..] += part[.., r, ..] for a C-ordered part of `rows` rows into a C-ordered fp32 sum of
// `total` rows (axis 2 of [outer, rows, inner]).
void add_rows(std::vector<float>& sum, int64_t total, int64_t local, const Tensor& part) {
  const int64_t outer = part.shape[0] * part.shape[1], rows = part.shape[2], inner = part.shape[3];
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t e = 0; e < inner; ++e)
        sum[static_cast<size_t>((o * total + local + r) * inner + e)] += load_float(part.data, part.dtype, (o * rows + r) * inner + e);
}

// Writes a C-ordered fp32 array into t (any strides), converting to t's dtype.
void scatter(const std::vector<float>& src, const Tensor& t) {
  for_each_element(t, [&](int64_t i, int64_t off) { store_float(t.data, t.dtype, off, src[static_cast<size_t>(i)]); });
}

// The shard of one rank's forward: its queries' partial results merged so far, fp32 [B, H, rows, Dv] and [B, H, rows].
struct Merged {
  std::vector<float> o, lse;
};

// Merges one block's partial (o: [B, H, rows, Dv] in its dtype, lse: f32 [B, H, rows], both C-ordered) into the
// rows [local, local + rows) of m (of `total` rows): LSE = log(exp(LSE_m) + exp(LSE_p)), O weighted by each side's
// share. A partial row with LSE = -inf (all masked in this block) weighs nothing; NaN propagates.
void merge_block(Merged& m, int64_t total, int64_t local, const Tensor& o, const std::vector<float>& lse) {
  const int64_t bh_count = o.shape[0] * o.shape[1], rows = o.shape[2], dv = o.shape[3];
  for (int64_t bh = 0; bh < bh_count; ++bh)
    for (int64_t r = 0; r < rows; ++r) {
      const float lp = lse[static_cast<size_t>(bh * rows + r)];
      if (lp == kNegInf) continue;
      const size_t row = static_cast<size_t>(bh * total + local + r);
      const float lm = m.lse[row];
      double wm = 0, wp = 1, l = lp;
      if (lm != kNegInf) {
        const double mx = std::max<double>(lm, lp);
        wm = std::exp(lm - mx);
        wp = std::exp(lp - mx);
        l = mx + std::log(wm + wp);
      }
      const double inv = 1.0 / (wm + wp);
      m.lse[row] = static_cast<float>(l);
      for (int64_t d = 0; d < dv; ++d) {
        float& acc = m.o[row * static_cast<size_t>(dv) + static_cast<size_t>(d)];
        const double part = load_float(o.data, o.dtype, (bh * rows + r) * dv + d);
        acc = static_cast<float>((wm * acc + wp * part) * inv);
      }
    }
}

}  // namespace

// ---- the schedule -------------------------------------------------------------------------------------------

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

void ring_copy_to_shard(const Tensor& whole, const Tensor& shard, const std::vector<RingChunk>& chunks) {
  for (const RingChunk& c : chunks)
    if (c.rows > 0) copy_tensor(row_view(whole, c.first, c.rows), row_view(shard, c.local, c.rows));
}

void ring_copy_to_whole(const Tensor& shard, const Tensor& whole, const std::vector<RingChunk>& chunks) {
  for (const RingChunk& c : chunks)
    if (c.rows > 0) copy_tensor(row_view(shard, c.local, c.rows), row_view(whole, c.first, c.rows));
}

void InProcessRingTransport::shift(std::vector<RingPacket>& held) {
  if (held.size() > 1) std::rotate(held.rbegin(), held.rbegin() + 1, held.rend());
}

RingAttention::RingAttention(std::shared_ptr<Kernel> kernel, RingOptions options) : kernel_(std::move(kernel)), options_(options) {
  if (!kernel_) throw Error("ring attention: no kernel; pass the one Runtime::compile returned");
  ring_chunks(options_.seqlen, options_.ranks, 0, options_.sharding);  // validates ranks and seqlen
}

namespace {

struct Dims {
  int64_t B = 0, H = 0, Hkv = 0, D = 0, Dv = 0;
};

// The shards' shapes against the ring's: rank r's tensors hold ring_shard_rows rows; the launches check the rest.
Dims check_shards(const RingArgs& args, const RingOptions& o, bool backward) {
  if (static_cast<int>(args.shards.size()) != o.ranks)
    throw Error(fmt::format("ring attention: {} shards for a ring of {} ranks; pass one RingShard per rank", args.shards.size(), o.ranks));
  Dims d;
  for (int r = 0; r < o.ranks; ++r) {
    const RingShard& s = args.shards[size_t(r)];
    const int64_t rows = ring_shard_rows(o.seqlen, o.ranks, r, o.sharding);
    auto check = [&](const Tensor& t, const char* name, size_t dims) {
      if (t.data == nullptr) throw Error(fmt::format("ring attention: shard {} has no `{}` tensor", r, name));
      if (t.shape.size() != dims || t.shape[2] != rows)
        throw Error(fmt::format("ring attention: shard {}'s `{}` must have {} dims with {} rows on axis 2 (ring_shard_rows of a "
                                "{}-position sequence), got shape [{}]",
                                r, name, dims, rows, o.seqlen, fmt::join(t.shape, ", ")));
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
    if (r == 0) d = here;
    if (here.B != d.B || here.H != d.H || here.Hkv != d.Hkv || here.D != d.D || here.Dv != d.Dv)
      throw Error(fmt::format("ring attention: shard {} has B, H, Hkv, D, Dv = {}, {}, {}, {}, {}; shard 0 has {}, {}, {}, {}, {}", r, here.B,
                              here.H, here.Hkv, here.D, here.Dv, d.B, d.H, d.Hkv, d.D, d.Dv));
    if (s.k.dtype != args.shards[0].k.dtype || s.v.dtype != args.shards[0].v.dtype)
      throw Error(fmt::format("ring attention: shard {}'s k / v dtype differs from shard 0's", r));
  }
  return d;
}

// A launch's global positions: query chunk qc against KV chunk kc of a seqlen-long sequence.
template <class Args>
void set_positions(Args& a, const RingChunk& qc, const RingChunk& kc, int64_t seqlen) {
  a.q_offset = qc.first;
  a.kv_offset = kc.first;
  a.seqlen_q = seqlen;
  a.seqlen_kv = seqlen;
  a.device = Device::cpu();
}

// One step of the ring: f(r, packet, kv_rows, qc, kc, k, v) for every rank r and every pair of a query chunk of r and
// a KV chunk of the packet r holds (kv_rows: the packet's rows; k, v: the KV chunk's rows of the packet) that has
// rows and that the mask may attend (Kernel::may_attend; an emptied block gives O = 0, LSE = -inf and no gradient,
// which the merges and sums would ignore). stats counts both.
template <class F>
void each_block(Kernel& kernel, const RingArgs& args, const RingOptions& o, const Dims& d, std::vector<RingPacket>& held, RingStats& stats,
                F f) {
  const DType kt = args.shards[0].k.dtype, vt = args.shards[0].v.dtype;
  for (int r = 0; r < o.ranks; ++r) {
    const RingShard& s = args.shards[size_t(r)];
    RingPacket& p = held[size_t(r)];
    const int64_t kv_rows = ring_shard_rows(o.seqlen, o.ranks, p.owner, o.sharding);
    const Tensor k = Tensor::contiguous(p.k.data(), kt, {d.B, d.Hkv, kv_rows, d.D});
    const Tensor v = Tensor::contiguous(p.v.data(), vt, {d.B, d.Hkv, kv_rows, d.Dv});
    for (const RingChunk& qc : ring_chunks(o.seqlen, o.ranks, r, o.sharding))
      for (const RingChunk& kc : ring_chunks(o.seqlen, o.ranks, p.owner, o.sharding)) {
        if (qc.rows == 0 || kc.rows == 0) continue;
        AttentionArgs block;
        block.q = row_view(s.q, qc.local, qc.rows);
        block.k = row_view(k, kc.local, kc.rows);
        block.v = row_view(v, kc.local, kc.rows);
        block.o = row_view(s.o, qc.local, qc.rows);
        block.buffers = args.buffers;
        block.params = args.params;
        set_positions(block, qc, kc, o.seqlen);
        if (!kernel.may_attend(block)) {
          ++stats.skipped;
          continue;
        }
        ++stats.launched;
        f(r, p, kv_rows, qc, kc, block.k, block.v);
      }
  }
}

}  // namespace

void RingAttention::forward(const RingArgs& args) {
  const Dims d = check_shards(args, options_, /*backward=*/false);
  const int R = options_.ranks;
  std::vector<RingPacket> held(static_cast<size_t>(R));
  std::vector<Merged> merged(static_cast<size_t>(R));
  for (int r = 0; r < R; ++r) {
    const RingShard& s = args.shards[size_t(r)];
    held[size_t(r)].owner = r;
    held[size_t(r)].k = gather(s.k);
    held[size_t(r)].v = gather(s.v);
    merged[size_t(r)].o.assign(static_cast<size_t>(d.B * d.H * s.q.shape[2] * d.Dv), 0.0f);
    merged[size_t(r)].lse.assign(static_cast<size_t>(d.B * d.H * s.q.shape[2]), kNegInf);
  }
  const DType ot = args.shards[0].o.dtype;
  std::vector<unsigned char> o_part;
  std::vector<float> lse_part;
  stats_ = {};
  for (int step = 0; step < R; ++step) {
    each_block(*kernel_, args, options_, d, held, stats_,
               [&](int r, RingPacket&, int64_t, const RingChunk& qc, const RingChunk& kc, const Tensor& k, const Tensor& v) {
                 const RingShard& s = args.shards[size_t(r)];
                 o_part.assign(static_cast<size_t>(d.B * d.H * qc.rows * d.Dv * dsl::dtype_size(ot)), 0);
                 lse_part.assign(static_cast<size_t>(d.B * d.H * qc.rows), 0.0f);
                 AttentionArgs a;
                 a.q = row_view(s.q, qc.local, qc.rows);
                 a.k = k;
                 a.v = v;
                 a.o = Tensor::contiguous(o_part.data(), ot, {d.B, d.H, qc.rows, d.Dv});
                 a.lse = Tensor::contiguous(lse_part.data(), DType::F32, {d.B, d.H, qc.rows});
                 a.scale = args.scale;
                 a.buffers = args.buffers;
                 a.params = args.params;
                 set_positions(a, qc, kc, options_.seqlen);
                 kernel_->forward(a);
                 merge_block(merged[size_t(r)], s.q.shape[2], qc.local, a.o, lse_part);
               });
    if (step + 1 < R) transport_.shift(held);
  }
  for (int r = 0; r < R; ++r) {
    scatter(merged[size_t(r)].o, args.shards[size_t(r)].o);
    scatter(merged[size_t(r)].lse, args.shards[size_t(r)].lse);
  }
}

void RingAttention::backward(const RingArgs& args) {
  const Dims d = check_shards(args, options_, /*backward=*/true);
  const int R = options_.ranks;
  const dsl::Spec& spec = kernel_->spec();
  for (const auto& [name, t] : args.grads) {
    const auto it = std::find_if(spec.buffers.begin(), spec.buffers.end(), [&](const dsl::BufferDecl& b) { return b.name == name; });
    if (it == spec.buffers.end() || !it->requires_grad)
      throw Error(fmt::format("ring attention: a gradient for `{}`, which is not a buffer the spec marks `grad`", name));
    if (t.dtype != DType::F32) throw Error(fmt::format("ring attention: the gradient of `{}` must be f32", name));
  }
  std::vector<RingPacket> held(static_cast<size_t>(R));
  std::vector<std::vector<float>> dq(static_cast<size_t>(R));
  for (int r = 0; r < R; ++r) {
    const RingShard& s = args.shards[size_t(r)];
    RingPacket& p = held[size_t(r)];
    p.owner = r;
    p.k = gather(s.k);
    p.v = gather(s.v);
    p.dk.assign(static_cast<size_t>(d.B * d.Hkv * s.k.shape[2] * d.D), 0.0f);
    p.dv.assign(static_cast<size_t>(d.B * d.Hkv * s.k.shape[2] * d.Dv), 0.0f);
    dq[size_t(r)].assign(static_cast<size_t>(d.B * d.H * s.q.shape[2] * d.D), 0.0f);
  }
  std::vector<std::vector<float>> grad_sum(args.grads.size()), grad_part(args.grads.size());
  for (size_t i = 0; i < args.grads.size(); ++i) grad_sum[i].assign(static_cast<size_t>(numel(args.grads[i].second.shape)), 0.0f);
  const DType qt = args.shards[0].q.dtype, kt = args.shards[0].k.dtype, vt = args.shards[0].v.dtype;
  std::vector<unsigned char> dq_part, dk_part, dv_part;
  stats_ = {};
  // R hops: after each step's blocks the packets move on, and the last hop brings each home with its gradients.
  for (int step = 0; step < R; ++step) {
    each_block(*kernel_, args, options_, d, held, stats_,
               [&](int r, RingPacket& p, int64_t kv_rows, const RingChunk& qc, const RingChunk& kc, const Tensor& k, const Tensor& v) {
                 const RingShard& s = args.shards[size_t(r)];
                 dq_part.assign(static_cast<size_t>(d.B * d.H * qc.rows * d.D * dsl::dtype_size(qt)), 0);
                 dk_part.assign(static_cast<size_t>(d.B * d.Hkv * kc.rows * d.D * dsl::dtype_size(kt)), 0);
                 dv_part.assign(static_cast<size_t>(d.B * d.Hkv * kc.rows * d.Dv * dsl::dtype_size(vt)), 0);
                 BackwardArgs a;
                 a.q = row_view(s.q, qc.local, qc.rows);
                 a.k = k;
                 a.v = v;
                 a.o = row_view(s.o, qc.local, qc.rows);
                 a.d_o = row_view(s.d_o, qc.local, qc.rows);
                 a.lse = row_view(s.lse, qc.local, qc.rows);
                 a.dq = Tensor::contiguous(dq_part.data(), qt, {d.B, d.H, qc.rows, d.D});
                 a.dk = Tensor::contiguous(dk_part.data(), kt, {d.B, d.Hkv, kc.rows, d.D});
                 a.dv = Tensor::contiguous(dv_part.data(), vt, {d.B, d.Hkv, kc.rows, d.Dv});
                 a.scale = args.scale;
                 a.buffers = args.buffers;
                 a.params = args.params;
                 for (size_t i = 0; i < args.grads.size(); ++i) {
                   grad_part[i].assign(grad_sum[i].size(), 0.0f);
                   a.grads.push_back({args.grads[i].first, Tensor::contiguous(grad_part[i].data(), DType::F32, args.grads[i].second.shape)});
                 }
                 set_positions(a, qc, kc, options_.seqlen);
                 kernel_->backward(a);
                 add_rows(dq[size_t(r)], s.q.shape[2], qc.local, a.dq);
                 add_rows(p.dk, kv_rows, kc.local, a.dk);
                 add_rows(p.dv, kv_rows, kc.local, a.dv);
                 for (size_t i = 0; i < grad_sum.size(); ++i)
                   for (size_t e = 0; e < grad_sum[i].size(); ++e) grad_sum[i][e] += grad_part[i][e];
               });
    transport_.shift(held);
  }
  for (int r = 0; r < R; ++r) {
    const RingShard& s = args.shards[size_t(r)];
    const RingPacket& p = held[size_t(r)];
    if (p.owner != r) throw Error(fmt::format("ring attention: internal error, rank {} ended holding rank {}'s gradients", r, p.owner));
    scatter(dq[size_t(r)], s.dq);
    scatter(p.dk, s.dk);
    scatter(p.dv, s.dv);
  }
  for (size_t i = 0; i < args.grads.size(); ++i) scatter(grad_sum[i], args.grads[i].second);
}

}  // namespace flexjit
