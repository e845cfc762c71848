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
};

class BlockMask;
class Workspace;

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
};

// Per-(b, h, query tile) lists of partial and full KV tiles, on one device. Immutable once
// built; may be shared by many launches with the same B, H, Sq, Skv (and parameters).
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
  // Copies the lists to the host (synchronises): for tests and inspection.
  struct HostLists {
    std::vector<int> num_partial, partial, num_full, full;
  };
  HostLists to_host() const;

 private:
  friend class KernelImpl;
  friend class Workspace;
  BlockMask() = default;
  int device_ = 0, bm_ = 1, hm_ = 1, num_q_tiles_ = 0, max_kv_tiles_ = 0, q_tile_ = 0, kv_tile_ = 0, sq_ = 0, skv_ = 0;
  uint64_t memory_ = 0;  // one allocation: counts and index lists
  bool owns_ = true;
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
};

// A checked spec, compiled per architecture on first use and loaded per device.
class Kernel {
 public:
  virtual ~Kernel() = default;
  virtual const dsl::Spec& spec() const = 0;

  // O (and LSE) = attention with the spec's mods. Checks shapes, strides, dtypes and that
  // every pointer lives on the launch's device; enqueues on args.stream. Throws flexjit::Error.
  virtual void forward(const AttentionArgs& args) = 0;

  // Builds the block mask of the spec's mask_mod for these sizes (and the given buffers and
  // parameters) on the device, on `stream`. Requires a mask_mod.
  virtual std::unique_ptr<BlockMask> build_block_mask(const AttentionArgs& shape_and_buffers) = 0;

  // A workspace for launches up to these sizes on `device` (for CUDA graphs or concurrent streams).
  virtual std::unique_ptr<Workspace> make_workspace(int device, int batch, int heads, int seqlen_q, int seqlen_kv) = 0;

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
