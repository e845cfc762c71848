// What ring attention's schedule (ring.cpp) needs of the memory it runs on: scratch tensors, the block launches, and
// the element-wise steps of the merges and sums. Two implementations: host loops for the CPU backend
// (ring_host.cpp) and device kernels on one stream per local rank for a CUDA device (ring_device.cpp).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "runtime/flexjit.hpp"

namespace flexjit {

// An element-wise step between two views of the same shape.
enum class RingCopy {
  Assign,  // dst = src, converted to dst's dtype (bit for bit when the dtypes agree)
  Add,     // dst += src, dst f32, src any floating type
};

// The sizes a forward or backward launches at most, for the per-rank workspaces.
struct RingLaunchSizes {
  int64_t batch = 0, heads = 0;
  int64_t rows = 0;  // the longest chunk's
  bool backward = false;
};

// Lane i is local rank i's: on a GPU, its stream. kCaller is the stream RingArgs::stream names.
class RingBackend {
 public:
  static constexpr int kCaller = -1;
  virtual ~RingBackend() = default;
  virtual Device device() const = 0;
  // Before a forward or backward over `lanes` local ranks: their work runs after what `stream` holds.
  virtual void begin(Kernel& kernel, int lanes, CUstream stream, const RingLaunchSizes& sizes) = 0;
  // After it: what the caller's stream holds later runs after every lane's work.
  virtual void join() = 0;
  // One per lane (empty on the host), for the transport.
  virtual std::vector<CUstream> streams() const = 0;
  // A C-ordered tensor of the backend's memory, valid until the next call for the same (lane, slot); contents
  // undefined. Growing a slot synchronises the device first.
  virtual Tensor scratch(int lane, int slot, DType dtype, std::vector<int64_t> shape) = 0;
  // Every element of a C-ordered f32 tensor set to `value`.
  virtual void fill(const Tensor& t, float value, int lane) = 0;
  // Up to four dims, any strides.
  virtual void copy(const Tensor& src, const Tensor& dst, RingCopy mode, int lane) = 0;
  // Merges a block's partial o_part ([B, H, rows, Dv], any floating dtype) and lse_part (f32 [B, H, rows]) into the
  // running f32 o_acc and lse_acc of the same shapes: lse = log(exp(lse_acc) + exp(lse_part)), o weighted by each
  // side's share; a partial row at -inf weighs nothing, NaN propagates.
  virtual void merge(const Tensor& o_part, const Tensor& lse_part, const Tensor& o_acc, const Tensor& lse_acc, int lane) = 0;
  // The launches, with the lane's device, stream and workspace set.
  virtual void forward(Kernel& kernel, AttentionArgs& a, int lane) = 0;
  virtual void backward(Kernel& kernel, BackwardArgs& a, int lane) = 0;
  // Synchronises and reports clamped loads of the lanes' launches (Kernel::check_errors).
  virtual void check_errors(Kernel& kernel) = 0;
};

std::unique_ptr<RingBackend> make_host_ring_backend();
// Throws flexjit::Error without a CUDA driver or for a device that does not exist.
std::unique_ptr<RingBackend> make_device_ring_backend(int device);

// A tensor of one to four dims as four: leading dims of size 1 (stride 0).
struct RingView4 {
  void* data = nullptr;
  DType dtype = DType::F32;
  int64_t shape[4] = {1, 1, 1, 1};
  int64_t stride[4] = {0, 0, 0, 0};
};
RingView4 ring_view4(const Tensor& t);
// Throws unless `mode` applies between the two (the same shapes; a conversion or sum between floating types only,
// a sum into f32).
void check_ring_copy(const Tensor& src, const Tensor& dst, RingCopy mode);

// The host back end's element-wise step, also serving ring_copy_to_shard / ring_copy_to_whole on host memory.
void host_ring_copy(const Tensor& src, const Tensor& dst, RingCopy mode);

}  // namespace flexjit
