// The public C++ API: compile a spec once, launch it on any device of the process with raw
// device pointers, shapes and strides on the caller's stream. Thread-safe.
//
//   flexjit::Runtime rt;
//   auto kernel = rt.compile(spec);                 // parse, check, optimize (NVRTC later, per arch)
//   flexjit::AttentionArgs a;
//   a.q = flexjit::Tensor::contiguous(q, flexjit::DType::BF16, {B, H, S, D});  ... k, v, o
//   a.buffers = {{"doc", flexjit::Tensor::contiguous(doc, flexjit::DType::I32, {S})}};
//   a.stream = stream;
//   kernel->forward(a);                             // never allocates or synchronises once warm
//   kernel->check_errors(0, stream);                // optional: synchronises, reports clamped loads
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dsl/spec.h"

typedef struct CUstream_st* CUstream;

namespace flexjit {

using dsl::DType;

// A strided view of memory: device memory for GPU launches, host memory for the CPU backend.
struct Tensor {
  void* data = nullptr;
  DType dtype = DType::BF16;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;  // in elements; empty means C-contiguous

  static Tensor contiguous(void* data, DType dtype, std::vector<int64_t> shape);
  std::vector<int64_t> effective_strides() const;
  int64_t stride(size_t dim) const;  // effective_strides()[dim], without building the vector
};

class BlockMask;
class Workspace;
class DecodePlan;

// Where a launch runs: a CUDA device, or the CPU backend.
struct Device {
  enum class Kind { Cuda, Cpu } kind = Kind::Cuda;
  int index = -1;  // CUDA ordinal; -1: the device q lives on
  static Device cuda(int i) { return {Kind::Cuda, i}; }
  static Device cpu() { return {Kind::Cpu, 0}; }
  std::string str() const;
};

struct AttentionArgs {
  Tensor q;    // [B, H, Sq, D]
  Tensor k;    // [B, Hkv, Skv, D]
  Tensor v;    // [B, Hkv, Skv, Dv]
  Tensor o;    // [B, H, Sq, Dv], written
  Tensor lse;  // optional [B, H, Sq] f32 natural-log LSE, written (fully masked rows: -inf)
  float scale = 0;  // softmax scale; 0 means 1 / sqrt(D)
  std::vector<std::pair<std::string, Tensor>> buffers;  // captured buffers by name
  std::vector<std::pair<std::string, double>> params;   // runtime parameters by name (ints and bools as exact doubles)
  const BlockMask* block_mask = nullptr;  // reuse a mask built with Kernel::build_block_mask; null: built per launch
  Workspace* workspace = nullptr;         // null: the kernel's own per-device workspace (one stream at a time)
  CUstream stream = nullptr;
  Device device;
  // Context parallelism (ring attention): this launch computes one shard of a longer sequence. The mods see query
  // row i at position q_offset + i and KV row j at kv_offset + j, and the symbols Sq and Skv (in the mods and in
  // buffer declarations, so `doc: i32[Skv]` is the whole sequence's) are seqlen_q and seqlen_kv, the whole
  // sequence's lengths; 0 means the tensors' own. A shard must lie inside the sequence (offset + rows <= length).
  // Merge the shards' O and LSE by log-sum-exp. GPU forward launches take them too (KV offsets a multiple of 64
  // when the mods index by kv // 64 or kv % 64); the GPU backward does not yet (issue 28).
  int64_t q_offset = 0, kv_offset = 0;
  int64_t seqlen_q = 0, seqlen_kv = 0;
};

// Gradients of attention (docs/BACKWARD.md). q, k, v, o, lse and the mods' buffers and
// parameters are those of the forward launch; d_o is the gradient of the loss with respect
// to o. lse may be the forward's or a merged global LSE (a sequence split into KV chunks:
// forward per chunk, merge by LSE, backward per chunk with the merged LSE and the merged o
// gives the gradients of the unsplit attention).
// How the backward computes dq (docs/BACKWARD.md, "dQ strategy"). The environment variable
// FLEXJIT_BWD_DQ=atomic|qmajor|auto overrides the field (for benchmarking).
enum class BackwardDqMode {
  Auto,        // QueryMajor when the spec has row-owned buffer gradients (SAM's rel_h / rel_w), else Atomic
  Atomic,      // the KV-major kernel adds dQ into an fp32 (or fixed-point) accumulator with atomics
  QueryMajor,  // a query-major pass recomputes the scores per query tile: dq without atomics; it also takes the
               // buffer gradients whose target a query row owns. Falls back to Atomic where it cannot run
               // (a block mask of another geometry, or too little shared memory for the head dim)
};

struct BackwardArgs {
  Tensor q, k, v;  // as in AttentionArgs
  Tensor o;        // [B, H, Sq, Dv], the forward's output (or the merged output)
  Tensor d_o;      // [B, H, Sq, Dv], same dtype as o
  Tensor lse;      // [B, H, Sq] f32, required
  Tensor dq;       // [B, H, Sq, D], written, dtype of q
  Tensor dk;       // [B, Hkv, Skv, D], written (summed over the query heads of a KV head)
  Tensor dv;       // [B, Hkv, Skv, Dv], written
  float scale = 0;
  std::vector<std::pair<std::string, Tensor>> buffers;
  std::vector<std::pair<std::string, double>> params;
  // Gradients of captured buffers: an f32 tensor of the buffer's shape per buffer the spec
  // marks `grad`, overwritten. A marked buffer without an entry gets no gradient.
  std::vector<std::pair<std::string, Tensor>> grads;
  bool deterministic = false;             // fixed summation order, no float atomics (bitwise reproducible)
  BackwardDqMode dq_mode = BackwardDqMode::Auto;
  const BlockMask* block_mask = nullptr;  // the forward's mask for these sizes (128 x 64 tiles); null: built per launch
  Workspace* workspace = nullptr;         // null: the kernel's own per-device workspace
  CUstream stream = nullptr;
  Device device;
  // Context parallelism, as in AttentionArgs: the shard's first query and KV positions and the whole sequence's
  // lengths (0: the tensors' own). With the merged O and LSE, the shard pairs' dq summed per query shard and dk, dv
  // summed per KV shard are the whole sequence's gradients (sum them in fp32); so are the buffer gradients, summed.
  int64_t q_offset = 0, kv_offset = 0;
  int64_t seqlen_q = 0, seqlen_kv = 0;
};

// Ragged prefill: a batch of sequences of different lengths packed without padding.
// Sequence b owns query rows [cu_seqlens_q[b], cu_seqlens_q[b+1]) and KV rows
// [cu_seqlens_kv[b], cu_seqlens_kv[b+1]); the mods see `b` = the sequence index and `q`, `kv`
// = positions within the sequence (0-based).
struct VarlenArgs {
  Tensor q;   // [total_q, H, D] (any strides, D innermost)
  Tensor k;   // [total_kv, Hkv, D]: the spec's dtype, or FP8 (DType::F8E4M3 or F8E5M2, v the same) with k_scale / v_scale
  Tensor v;   // [total_kv, Hkv, Dv]
  Tensor o;   // [total_q, H, Dv], written
  Tensor lse; // optional [H, total_q] f32, written
  Tensor cu_seqlens_q;   // I32 [B + 1], on the launch's device, non-decreasing, starting at 0
  Tensor cu_seqlens_kv;  // I32 [B + 1]
  int max_seqlen_q = 0;   // bounds of the per-sequence lengths (host values, for grid sizes and
  int max_seqlen_kv = 0;  // the launch-time range checks, which use them as Sq and Skv). The kernel checks
                          // each sequence against them and the packed tensors' rows: one outside is skipped
                          // (its outputs are not written) and Kernel::check_errors reports it.
  float scale = 0;
  // Where the queries sit: false, query row i of a sequence is position i (the mods see q = i); true, it is position
  // kv_len - q_len + i, the sequence's last q_len KV positions, as in decode: a chunked prefill whose earlier tokens
  // are in the KV (a causal mask `q >= kv` then lets each new token see the whole prefix). Then q_len <= kv_len for
  // every sequence (a sequence that breaks it is skipped and reported like lengths outside the bounds), and Sq in
  // the mods stays max_seqlen_q, the query rows' bound, while positions reach max_seqlen_kv - 1.
  bool queries_at_kv_end = false;
  // FP8 K and V only (optional; absent = 1): f32 dequantisation scales on the launch's device, [Hkv] (one per KV head)
  // or [1], so that K = k_scale * stored value and V likewise. Each launch first widens K and V into the spec's dtype
  // (one rounding of the scaled value) in the workspace, which then holds 2 * total_kv * Hkv * (D + Dv) bytes more.
  Tensor k_scale, v_scale;
  std::vector<std::pair<std::string, Tensor>> buffers;
  std::vector<std::pair<std::string, double>> params;
  Workspace* workspace = nullptr;
  CUstream stream = nullptr;
  Device device;
};

// The backward of a ragged prefill (Kernel::forward_varlen without queries_at_kv_end): the gradients of the packed
// q, k, v, and of the buffers the spec marks `grad`, for the same sequences, lengths and bounds as the forward.
struct VarlenBackwardArgs {
  Tensor q, k, v;  // as VarlenArgs: [total_q, H, D], [total_kv, Hkv, D], [total_kv, Hkv, Dv] (the spec's dtype)
  Tensor o;        // [total_q, H, Dv]: the forward's output
  Tensor d_o;      // [total_q, H, Dv]: the gradient of o
  Tensor lse;      // [H, total_q] f32: the forward's LSE (required)
  Tensor dq, dk, dv;  // written: the shapes and dtype of q, k, v (rows of a skipped sequence are left alone)
  Tensor cu_seqlens_q, cu_seqlens_kv;   // I32 [B + 1] on the launch's device, as the forward's
  int max_seqlen_q = 0, max_seqlen_kv = 0;  // as the forward's: a sequence outside them (or outside the packed
                                            // rows) is skipped and reported by Kernel::check_errors
  float scale = 0;
  std::vector<std::pair<std::string, Tensor>> buffers;
  std::vector<std::pair<std::string, double>> params;
  // Gradients of captured buffers, as BackwardArgs::grads: summed over every sequence of the batch.
  std::vector<std::pair<std::string, Tensor>> grads;
  bool deterministic = false;  // fixed summation order, no float atomics (bitwise reproducible)
  Workspace* workspace = nullptr;
  CUstream stream = nullptr;
  Device device;
};

// What a decode plan is made for: the largest batch a run may use, the head counts, the
// most query rows (1..16) and KV positions per sequence, and the KV cache layout.
struct DecodePlanOptions {
  Device device;
  int batch = 0;
  int heads = 0;
  int kv_heads = 0;
  int max_seqlen_q = 1;   // query rows per sequence, 1..16 (speculative decoding: > 1)
  int max_seqlen_kv = 0;  // bound of every run's KV lengths; also the value of Skv for the mods
  int page_size = 0;      // 0: contiguous KV cache; 1..256: paged
  bool head_major_pages = false;  // pages are [num_pages, Hkv, page_size, D] instead of [num_pages, page_size, Hkv, D]
  int num_splits = 0;     // 0: chosen from the device's SM count, the batch and max_seqlen_kv
  // The KV cache's element type: the spec's dtype (bf16 / f16; the default), or FP8, DType::F8E4M3 or F8E5M2,
  // whose values times DecodeArgs::k_scale / v_scale are K and V (Q, O and the softmax keep their precision).
  std::optional<DType> kv_dtype;
};

// Decoding with a KV cache. The KV lengths and page tables live on the device, so a CUDA
// graph captured once replays while the sequences grow. Query row i of sequence b sits at
// position kv_lens[b] - q_len(b) + i: that is the `q` the mods see, and `kv` is the position
// in the sequence.
struct DecodeArgs {
  Tensor q;           // [B, H, Sq, D] (any strides, D innermost), Sq <= the plan's max_seqlen_q
  Tensor k, v;        // contiguous [B, Hkv, Skv_cap, D]; paged [num_pages, page_size, Hkv, D]
                      // (head-major: [num_pages, Hkv, page_size, D])
  Tensor page_table;  // I32 [B, max_pages_per_seq] when the plan is paged
  Tensor kv_lens;     // I32 [B]: KV positions of each sequence, the new tokens included (q_len..max_seqlen_kv;
                      // a sequence outside gets O = 0, LSE = -inf, and Kernel::check_errors reports it)
  Tensor q_lens;      // optional I32 [B]: query rows of each sequence, 1..Sq (absent: Sq)
  Tensor o;           // [B, H, Sq, Dv], written (rows past q_len(b) are left alone)
  Tensor lse;         // optional [B, H, Sq] f32
  // FP8 caches only (optional; absent = 1): f32 dequantisation scales on the plan's device (on the host for the
  // CPU backend), [Hkv] (one per KV head) or [1] (one for the cache). K = k_scale * stored value, V likewise.
  Tensor k_scale, v_scale;
  float scale = 0;
  std::vector<std::pair<std::string, Tensor>> buffers;
  std::vector<std::pair<std::string, double>> params;
  CUstream stream = nullptr;
};

// A decode plan: split count and workspace fixed for one batch shape, reused by every run
// (runs never allocate or synchronise, so they can be captured in CUDA graphs).
class DecodePlan {
 public:
  virtual ~DecodePlan() = default;
  virtual const DecodePlanOptions& options() const = 0;
  virtual int num_splits() const = 0;  // 1 on the CPU
  // For tests and diagnostics: how many KV tiles (of 64 positions) the last run visits per sequence and tile list
  // ([B][Hkv] when the mask reads the head, else [B]), read back from the device (synchronous). Empty when every
  // tile below the KV length is visited (no mask_mod, or the CPU backend).
  virtual std::vector<int> listed_tiles() const { return {}; }
};

// Per-(b, h, query tile) lists of partial and full KV tiles, on one device. Immutable once
// built; may be shared by many launches with the same B, H, Sq, Skv (and parameters).
// Its tiles are the forward kernel's (flex_tile_policy.cuh: 128 x 64 on the mma.sync kernel; on the
// Hopper one 128 rows by the policy's KV tile). The backward reads 128 x 64 tiles: given a mask of
// other tiles (the forward's, reused for both passes), it checks it against the launch and builds
// its own, as it does when given none. A forward launch refuses a mask of other tiles.
class BlockMask {
 public:
  ~BlockMask();
  int device() const { return device_; }
  int batch_extent() const { return bm_; }  // 1 when the mask does not depend on b
  int head_extent() const { return hm_; }   // 1 when the mask does not depend on h
  int num_q_tiles() const { return num_q_tiles_; }
  int max_kv_tiles() const { return max_kv_tiles_; }
  int q_tile() const { return q_tile_; }
  int kv_tile() const { return kv_tile_; }
  int seqlen_q() const { return sq_; }
  int seqlen_kv() const { return skv_; }
  // The positions of the launch's query row 0 and KV row 0 it was built for (a shard of a longer sequence; else 0).
  int64_t q_offset() const { return q_offset_; }
  int64_t kv_offset() const { return kv_offset_; }
  // Whether the builder also ranked the query tiles by work (data-dependent masks; the kernel's schedule).
  bool ranked() const { return ranked_; }
  // Copies the lists to the host (synchronises): for tests and inspection.
  struct HostLists {
    std::vector<int> num_partial, partial, num_full, full;
    // Per mask row, its query tiles heaviest first (the kernel's schedule); empty unless ranked().
    std::vector<int> order;
  };
  HostLists to_host() const;

 private:
  friend class KernelImpl;
  friend class Workspace;
  BlockMask() = default;
  int device_ = 0, bm_ = 1, hm_ = 1, num_q_tiles_ = 0, max_kv_tiles_ = 0, q_tile_ = 0, kv_tile_ = 0, sq_ = 0, skv_ = 0;
  int64_t q_offset_ = 0, kv_offset_ = 0, seqlen_q_whole_ = 0, seqlen_kv_whole_ = 0;
  uint64_t memory_ = 0;  // one allocation: counts, index lists and the ranked order (block_mask_bytes)
  bool owns_ = true;
  bool ranked_ = false;
};

// Device memory a launch needs besides its operands (error word, per-launch block mask),
// reserved once so launches never allocate and can be captured in CUDA graphs.
class Workspace {
 public:
  ~Workspace();
  int device() const { return device_; }

 private:
  friend class KernelImpl;
  Workspace() = default;
  int device_ = 0;
  uint64_t memory_ = 0;
  size_t bytes_ = 0;
  std::unique_ptr<BlockMask> mask_;
  // The backward's scratch (dQ accumulator, rowsum(dO*O), transposed block mask), laid out
  // by the backward launcher; 0 until a backward needs it.
  uint64_t backward_memory_ = 0;
  size_t backward_bytes_ = 0;
};

// A checked spec, compiled per architecture on first use and loaded per device. Its modules are unloaded when the
// last reference goes: keep the Kernel alive while its launches run and while a CUDA graph that captured them exists.
class Kernel {
 public:
  virtual ~Kernel() = default;
  virtual const dsl::Spec& spec() const = 0;

  // O (and LSE) = attention with the spec's mods. Checks shapes, strides, dtypes and that
  // every pointer lives on the launch's device; enqueues on args.stream. Throws flexjit::Error.
  virtual void forward(const AttentionArgs& args) = 0;

  // dq, dk, dv (and the gradients of marked buffers) of a forward launch. Throws flexjit::Error.
  virtual void backward(const BackwardArgs& args) = 0;

  // Ragged prefill over packed sequences (VarlenArgs).
  virtual void forward_varlen(const VarlenArgs& args) = 0;
  // Its backward (VarlenBackwardArgs). Throws flexjit::Error.
  virtual void backward_varlen(const VarlenBackwardArgs& args) = 0;

  // Plans decode runs for a batch shape (allocates the plan's workspace once).
  virtual std::unique_ptr<DecodePlan> plan_decode(const DecodePlanOptions& options) = 0;
  // One decode step within `plan`: never allocates or synchronises.
  virtual void decode(const DecodePlan& plan, const DecodeArgs& args) = 0;

  // Builds the block mask of the spec's mask_mod for these sizes (and the given buffers and
  // parameters) on the device, on `stream`. Requires a mask_mod.
  virtual std::unique_ptr<BlockMask> build_block_mask(const AttentionArgs& shape_and_buffers) = 0;

  // Whether the mask may keep any (q, kv) of this launch: interval arithmetic over the launch's positions (a
  // shard's global ones) at its parameters, on the host, reading no tensor data. False means every element is
  // masked, so the launch would give O = 0 and LSE = -inf (and no gradients): a ring skips such blocks. True when
  // undecided (masks that read buffers) or without a mask_mod.
  virtual bool may_attend(const AttentionArgs& shape_and_buffers) = 0;

  // A workspace for launches up to these sizes on `device` (for CUDA graphs or concurrent streams).
  virtual std::unique_ptr<Workspace> make_workspace(int device, int batch, int heads, int seqlen_q, int seqlen_kv) = 0;
  // The same with room for backward launches too.
  virtual std::unique_ptr<Workspace> make_backward_workspace(int device, int batch, int heads, int seqlen_q, int seqlen_kv) = 0;

  // Binds a captured buffer on the device its memory lives on: launches on that device may
  // omit it (one spec serving every GPU of a pipeline).
  virtual void bind_buffer(const std::string& name, const Tensor& tensor) = 0;

  // Compiles (or loads from the caches) every kernel a launch needs for the device.
  virtual void warm_up(int device, DType dtype) = 0;

  // Synchronises `stream` and throws flexjit::Error naming the buffer and expression if a
  // checked load was clamped (or an integer division met a zero divisor) since the last call.
  virtual void check_errors(int device, CUstream stream, Workspace* workspace = nullptr) = 0;
};

struct RuntimeOptions {
  bool checked = true;  // set error flags on clamped loads (the clamp itself is never off)
};

class Runtime {
 public:
  explicit Runtime(RuntimeOptions options = {});
  // Parses, checks and optimizes; throws CompileError with every diagnostic.
  std::shared_ptr<Kernel> compile(const dsl::Spec& spec);
  static int device_count();

 private:
  RuntimeOptions options_;
};

}  // namespace flexjit
