// Ring attention (context parallelism, issue 28): one long sequence sharded over R ranks. Every rank keeps its
// query shard; the K/V shards travel around the ring, one hop per step, so after R steps every rank has attended
// its queries to the whole sequence. Each (query chunk, KV chunk) block is one launch with the chunks' global
// positions (AttentionArgs::q_offset, kv_offset, seqlen_*), so the mods mean the same on every rank.
//   forward:  the blocks' partial O and LSE are merged exactly in fp32: LSE = log sum_s exp(LSE_s),
//             O = sum_s exp(LSE_s - LSE) O_s (an all-masked block has LSE = -inf and weighs nothing).
//   backward: every block runs with the merged O and LSE (the global ones, so the block gradients add up to the
//             unsplit ones); dq is summed in fp32 on its rank, dK / dV in fp32 accumulators that travel with their
//             K/V shard and are back with their owner after R hops, buffer gradients summed over all blocks and
//             ranks.
// Buffers are passed whole to every rank: they are indexed by global position, and position-indexed buffers are
// small next to K/V (docs/notes/RING_NOTES.md).
//
// One schedule (ring.cpp) runs on two back ends: the CPU backend's (host loops, runtime/ring_host.cpp) and a CUDA
// device's (runtime/ring_device.cpp: the packets, accumulators and merges in device memory, launches stream-ordered
// on one stream per local rank, no host synchronisation). The communication is a RingTransport: R virtual ranks in one
// process (InProcessRingTransport, on either back end: a hop hands the packets' memory on, and on a GPU events order
// each packet's use after its previous holder's launches), or one process per GPU over NCCL (runtime/ring_nccl.h,
// written but not yet run on a multi-GPU machine).
#pragma once
#include <cuda.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/flexjit.hpp"

namespace flexjit {

class RingBackend;

enum class RingSharding {
  Contiguous,  // R chunks; rank r holds chunk r
  Zigzag,      // 2R chunks; rank r holds chunks r and 2R - 1 - r, so a causal mask gives every rank the same work
};

// A run of consecutive positions of the whole sequence held by one rank.
struct RingChunk {
  int64_t first = 0;  // its first position in the whole sequence
  int64_t rows = 0;
  int64_t local = 0;  // its first row in the rank's shard tensors (a rank's chunks are stored one after another)
};

// The chunks rank `rank` of `ranks` holds of a sequence of `seqlen` positions. Chunk lengths differ by at most one
// (the first seqlen % chunks chunks are the longer ones); a chunk is empty when seqlen is below the chunk count.
std::vector<RingChunk> ring_chunks(int64_t seqlen, int ranks, int rank, RingSharding sharding);
// Rows of rank `rank`'s shard tensors: the sum of its chunks' rows.
int64_t ring_shard_rows(int64_t seqlen, int ranks, int rank, RingSharding sharding);

// Copies rank `rank`'s rows between a tensor of the whole sequence ([B, heads, seqlen, ...] or [B, H, seqlen]: rows
// on axis 2) and the rank's shard tensor (the same but ring_shard_rows rows), any strides, the same dtype. Host
// memory for Device::cpu(); device memory of a CUDA device otherwise, enqueued on `stream` (nothing synchronises).
void ring_copy_to_shard(const Tensor& whole, const Tensor& shard, const std::vector<RingChunk>& chunks, const Device& device = Device::cpu(),
                        CUstream stream = nullptr);
void ring_copy_to_whole(const Tensor& shard, const Tensor& whole, const std::vector<RingChunk>& chunks, const Device& device = Device::cpu(),
                        CUstream stream = nullptr);

// One rank's tensors, [B, heads, rows, D] with rows = ring_shard_rows, in ring_chunks order, any strides the launches
// take (on a GPU: the last dim contiguous, the others multiples of 8 elements).
struct RingShard {
  Tensor q, k, v;
  Tensor o;    // forward: written; backward: the forward's merged output, read
  Tensor lse;  // f32 [B, H, rows]; forward: written; backward: read
  Tensor d_o;  // backward: read
  Tensor dq, dk, dv;  // backward: written
};

struct RingArgs {
  // One per rank this process runs (RingAttention::local_ranks: every rank for virtual ranks, one for a process per
  // GPU), in that order.
  std::vector<RingShard> shards;
  float scale = 0;                // softmax scale; 0 means 1 / sqrt(D)
  std::vector<std::pair<std::string, Tensor>> buffers;  // whole buffers, the same for every rank
  std::vector<std::pair<std::string, double>> params;
  // Backward: an f32 contiguous tensor of the buffer's shape per buffer marked `grad`, written with the gradient
  // summed over every block of every rank (all ranks' processes get the same sum).
  std::vector<std::pair<std::string, Tensor>> grads;
  // CUDA: the ring's work runs after what `stream` holds, and what is queued on it later runs after the ring's.
  CUstream stream = nullptr;
};

struct RingOptions {
  int ranks = 2;
  RingSharding sharding = RingSharding::Zigzag;
  int64_t seqlen = 0;  // the whole sequence's length
  // Where the shards live: a CUDA device (index -1: the one shard 0's q is on) or the CPU backend.
  Device device;
};

// What travels: one rank's K/V shard and, in the backward, the fp32 gradients accumulated for it so far, in the
// memory of the ring's device (host memory on the CPU backend). Views of the owner's rows.
struct RingPacket {
  int owner = 0;
  Tensor k, v;    // [B, Hkv, rows of the owner's shard, D]
  Tensor dk, dv;  // backward: f32, the same shapes; forward: no data
};

// The parts of a packet a hop moves (RingTransport::start's `parts`, or'ed).
enum RingParts : unsigned {
  kRingKv = 1,     // k and v
  kRingGrads = 2,  // dk and dv
};

// The packets the ranks of this process hold, and where their launches run.
struct RingHeld {
  Device device;
  std::vector<CUstream> streams;    // one per local rank on a CUDA device; empty on the CPU backend
  std::vector<RingPacket> packets;  // packets[i]: the one local rank i holds
};

// The ring's communication: each hop, every rank hands (parts of) the packet it holds to rank + 1 and takes rank - 1's.
class RingTransport {
 public:
  virtual ~RingTransport() = default;
  // The ranks of a ring of `ranks` that this process runs, ascending. Throws when the transport cannot be part of
  // such a ring (a communicator of another size).
  virtual std::vector<int> local_ranks(int ranks) const = 0;
  // True when a hop copies the packets' bytes: their tensors must then be dense buffers [B, Hkv, capacity, D] of the
  // same capacity on every rank (room for the longest shard; RingAttention makes them so), of which the views show
  // the owner's rows. False when it hands the packets' memory on (then views of the shards themselves serve).
  virtual bool copies_packets() const = 0;
  // Called before a forward's or backward's first hop with the packets it will move: room for copies, events.
  virtual void attach(RingHeld& held) = 0;
  // Starts a hop of `parts` of every held packet. It may return while the data is in flight: launches enqueued on
  // held.streams before the call may keep reading the packets in hand, and later ones may too, until finish.
  // start(kRingKv) early and start(kRingGrads) once the step's gradients are added: finish ends both.
  virtual void start(RingHeld& held, unsigned parts) = 0;
  // Ends the hop: held.packets[i] is the packet local rank i's predecessor held (its owner and the started parts;
  // the parts not started are stale), whole for launches enqueued on held.streams[i] after the call.
  virtual void finish(RingHeld& held) = 0;
  // Sums a contiguous f32 tensor over the ring's processes in place (the buffer gradients), ordered on `stream`.
  virtual void all_reduce(const Tensor& t, const Device& device, CUstream stream) = 0;
};

// R virtual ranks in one process: a hop moves the packets between the ranks' slots (no copy). On a CUDA device each
// rank's stream first waits for an event recorded after its predecessor's launches on the packet it takes.
class InProcessRingTransport final : public RingTransport {
 public:
  InProcessRingTransport() = default;
  ~InProcessRingTransport() override;
  InProcessRingTransport(const InProcessRingTransport&) = delete;
  InProcessRingTransport& operator=(const InProcessRingTransport&) = delete;
  std::vector<int> local_ranks(int ranks) const override;
  bool copies_packets() const override { return false; }
  void attach(RingHeld& held) override;
  void start(RingHeld&, unsigned) override {}
  void finish(RingHeld& held) override;
  // One process holds every rank: the ring's own sum over them is already the total.
  void all_reduce(const Tensor&, const Device&, CUstream) override {}

 private:
  void release_events();
  int device_ = -1;
  std::vector<CUevent> events_;  // one per local rank, on device_
};

// Blocks of the last forward or backward: launched, and skipped because the mask empties them (Kernel::may_attend;
// causal masks empty about a quarter of a zigzag ring's blocks). A skipped block's packet still travels, so no rank
// waits on another.
struct RingStats {
  int64_t launched = 0, skipped = 0;
};

// The ring schedule over a compiled kernel: forward and backward for the ranks this process runs. On a CUDA device the
// plan keeps its streams, scratch memory and per-rank workspaces between calls (allocated on first use, grown when a
// call needs more); destroying it waits for its work.
class RingAttention {
 public:
  // transport: null for R virtual ranks of this process (InProcessRingTransport).
  RingAttention(std::shared_ptr<Kernel> kernel, RingOptions options, std::shared_ptr<RingTransport> transport = nullptr);
  ~RingAttention();
  RingAttention(RingAttention&&) noexcept;
  RingAttention& operator=(RingAttention&&) noexcept;
  const RingOptions& options() const { return options_; }
  const RingStats& last_stats() const { return stats_; }
  // The ranks whose shards RingArgs::shards holds, in that order.
  const std::vector<int>& local_ranks() const { return local_; }
  // Writes every shard's o and lse.
  void forward(const RingArgs& args);
  // Writes every shard's dq, dk, dv and args.grads, from its o, lse and d_o (the merged forward's).
  void backward(const RingArgs& args);
  // CUDA: synchronises the ring's streams and throws flexjit::Error naming the buffer and expression if a checked load
  // of its launches was clamped (Kernel::check_errors of each rank's workspace). Nothing to do on the CPU backend.
  void check_errors();

 private:
  RingBackend& backend_for(const RingArgs& args);

  std::shared_ptr<Kernel> kernel_;
  RingOptions options_;
  std::shared_ptr<RingTransport> transport_;
  std::vector<int> local_;
  std::unique_ptr<RingBackend> backend_;
  RingStats stats_;
};

}  // namespace flexjit
