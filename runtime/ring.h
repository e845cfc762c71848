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
// What runs today: R virtual ranks in one process over the in-process transport, on the CPU backend (the merges and
// sums are host loops). The GPU forward takes global positions and NCCL loads at run time (runtime/nccl.h); the GPU
// backward with global positions, device-side merges and the NCCL transport are not written yet.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/flexjit.hpp"

namespace flexjit {

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
// on axis 2) and the rank's shard tensor (the same but ring_shard_rows rows), any strides, the same dtype.
void ring_copy_to_shard(const Tensor& whole, const Tensor& shard, const std::vector<RingChunk>& chunks);
void ring_copy_to_whole(const Tensor& shard, const Tensor& whole, const std::vector<RingChunk>& chunks);

// One rank's tensors, [B, heads, rows, D] with rows = ring_shard_rows, in ring_chunks order.
struct RingShard {
  Tensor q, k, v;
  Tensor o;    // forward: written; backward: the forward's merged output, read
  Tensor lse;  // f32 [B, H, rows]; forward: written; backward: read
  Tensor d_o;  // backward: read
  Tensor dq, dk, dv;  // backward: written
};

struct RingArgs {
  std::vector<RingShard> shards;  // one per rank, rank order
  float scale = 0;                // softmax scale; 0 means 1 / sqrt(D)
  std::vector<std::pair<std::string, Tensor>> buffers;  // whole buffers, the same for every rank
  std::vector<std::pair<std::string, double>> params;
  // Backward: an f32 tensor of the buffer's shape per buffer marked `grad`, written with the gradient summed over
  // every block of every rank (what an all-reduce across the ranks gives each of them).
  std::vector<std::pair<std::string, Tensor>> grads;
};

struct RingOptions {
  int ranks = 2;
  RingSharding sharding = RingSharding::Zigzag;
  int64_t seqlen = 0;  // the whole sequence's length
};

// What travels: one rank's K/V shard (bytes in the kernel's element type) and, in the backward, the fp32
// gradients accumulated for it so far.
struct RingPacket {
  int owner = 0;
  std::vector<unsigned char> k, v;
  std::vector<float> dk, dv;
};

// The ring's communication: after each step every rank hands the packet it holds to rank + 1 and takes rank - 1's.
class RingTransport {
 public:
  virtual ~RingTransport() = default;
  // held[r]: the packet rank r holds; on return held[r] is the one rank r - 1 held.
  virtual void shift(std::vector<RingPacket>& held) = 0;
};

// R virtual ranks in one process: a hop is a move between the ranks' slots.
class InProcessRingTransport final : public RingTransport {
 public:
  void shift(std::vector<RingPacket>& held) override;
};

// Blocks of the last forward or backward: launched, and skipped because the mask empties them (Kernel::may_attend;
// causal masks empty about a quarter of a zigzag ring's blocks). A skipped block's packet still travels, so no rank
// waits on another.
struct RingStats {
  int64_t launched = 0, skipped = 0;
};

// The ring schedule over a compiled kernel: forward and backward for all R ranks of one process.
class RingAttention {
 public:
  RingAttention(std::shared_ptr<Kernel> kernel, RingOptions options);
  const RingOptions& options() const { return options_; }
  const RingStats& last_stats() const { return stats_; }
  // Writes every shard's o and lse.
  void forward(const RingArgs& args);
  // Writes every shard's dq, dk, dv and args.grads, from its o, lse and d_o (the merged forward's).
  void backward(const RingArgs& args);

 private:
  std::shared_ptr<Kernel> kernel_;
  RingOptions options_;
  InProcessRingTransport transport_;
  RingStats stats_;
};

}  // namespace flexjit
