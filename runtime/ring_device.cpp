// Ring attention's back end on a CUDA device: one stream per local rank (forked from the caller's stream by an event,
// joined back into it by one event per rank), scratch in device memory kept between calls, a workspace per rank (the
// kernel's own serves one stream at a time), and the element-wise steps as flex_ring.cuh's kernels. Nothing here
// synchronises the host but growing the memory (a call larger than every earlier one) and destruction.
#include <fmt/format.h>

#include <cstring>
#include <map>

#include "dsl/error.h"
#include "runtime/cuda_driver.h"
#include "runtime/device.h"
#include "runtime/device_memory.h"
#include "runtime/ring_backend.h"
#include "runtime/ring_kernels.h"

namespace flexjit {

namespace {

using runtime::check_cu;

class DeviceRingBackend final : public RingBackend {
 public:
  explicit DeviceRingBackend(int device) : device_(device), kernels_(&runtime::RingKernels::on(device)) {
    runtime::ScopedDevice scope(device_);
    check_cu(drv().cuEventCreate(&fork_, CU_EVENT_DISABLE_TIMING), "creating the ring's events");
  }

  ~DeviceRingBackend() override {
    const runtime::CudaDriver* d = runtime::cuda_driver();
    if (!d) return;
    runtime::ScopedDevice scope(device_);
    d->cuCtxSynchronize();  // the lanes' work may still read and write the memory freed below
    for (Lane& l : lanes_) {
      d->cuEventDestroy_v2(l.done);
      d->cuStreamDestroy_v2(l.stream);
    }
    d->cuEventDestroy_v2(fork_);
  }

  Device device() const override { return Device::cuda(device_); }

  void begin(Kernel& kernel, int lanes, CUstream stream, const RingLaunchSizes& sizes) override {
    runtime::ScopedDevice scope(device_);
    caller_ = stream;
    used_ = lanes;
    while (static_cast<int>(lanes_.size()) < lanes) {
      Lane l;
      check_cu(drv().cuStreamCreate(&l.stream, CU_STREAM_NON_BLOCKING), "creating a ring rank's stream");
      check_cu(drv().cuEventCreate(&l.done, CU_EVENT_DISABLE_TIMING), "creating the ring's events");
      lanes_.push_back(std::move(l));
    }
    for (int i = 0; i < lanes; ++i) {
      Lane& l = lanes_[size_t(i)];
      const bool fits = l.workspace && sizes.batch <= l.sizes.batch && sizes.heads <= l.sizes.heads && sizes.rows <= l.sizes.rows &&
                        (!sizes.backward || l.sizes.backward);
      if (fits) continue;
      if (l.workspace) check_cu(drv().cuCtxSynchronize(), "synchronising before growing a ring rank's workspace");
      RingLaunchSizes want = sizes;
      if (l.workspace) {
        want.batch = std::max(want.batch, l.sizes.batch);
        want.heads = std::max(want.heads, l.sizes.heads);
        want.rows = std::max(want.rows, l.sizes.rows);
        want.backward = want.backward || l.sizes.backward;
      }
      const int b = static_cast<int>(want.batch), h = static_cast<int>(want.heads), rows = static_cast<int>(std::max<int64_t>(want.rows, 1));
      l.workspace = want.backward ? kernel.make_backward_workspace(device_, b, h, rows, rows) : kernel.make_workspace(device_, b, h, rows, rows);
      l.sizes = want;
    }
    check_cu(drv().cuEventRecord(fork_, stream), "recording the ring's start");
    for (int i = 0; i < lanes; ++i) check_cu(drv().cuStreamWaitEvent(lanes_[size_t(i)].stream, fork_, 0), "ordering a ring rank's stream");
  }

  void join() override {
    runtime::ScopedDevice scope(device_);
    for (int i = 0; i < used_; ++i) {
      Lane& l = lanes_[size_t(i)];
      check_cu(drv().cuEventRecord(l.done, l.stream), "recording a ring rank's end");
      check_cu(drv().cuStreamWaitEvent(caller_, l.done, 0), "ordering the caller's stream after the ring");
    }
  }

  std::vector<CUstream> streams() const override {
    std::vector<CUstream> out;
    for (int i = 0; i < used_; ++i) out.push_back(lanes_[size_t(i)].stream);
    return out;
  }

  Tensor scratch(int lane, int slot, DType dtype, std::vector<int64_t> shape) override {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    const size_t bytes = static_cast<size_t>(n * dsl::dtype_size(dtype));
    runtime::DeviceBuffer& buffer = memory_[{lane, slot}];
    if (buffer.bytes() < bytes || !buffer.data()) {
      if (buffer.data()) {
        runtime::ScopedDevice scope(device_);
        check_cu(drv().cuCtxSynchronize(), "synchronising before growing the ring's memory");
      }
      buffer = runtime::DeviceBuffer(device_, bytes);
    }
    return Tensor::contiguous(buffer.data(), dtype, std::move(shape));
  }

  void fill(const Tensor& t, float value, int lane) override {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    if (n == 0) return;
    unsigned bits = 0;
    std::memcpy(&bits, &value, 4);
    runtime::ScopedDevice scope(device_);
    check_cu(drv().cuMemsetD32Async(reinterpret_cast<CUdeviceptr>(t.data), bits, static_cast<size_t>(n), stream(lane)),
             "clearing a ring accumulator");
  }

  void copy(const Tensor& src, const Tensor& dst, RingCopy mode, int lane) override { kernels_->copy(src, dst, mode, stream(lane)); }

  void merge(const Tensor& o_part, const Tensor& lse_part, const Tensor& o_acc, const Tensor& lse_acc, int lane) override {
    kernels_->merge(o_part, lse_part, o_acc, lse_acc, stream(lane));
  }

  void forward(Kernel& kernel, AttentionArgs& a, int lane) override {
    place(a, lane);
    kernel.forward(a);
  }
  void backward(Kernel& kernel, BackwardArgs& a, int lane) override {
    place(a, lane);
    kernel.backward(a);
  }

  void check_errors(Kernel& kernel) override {
    for (Lane& l : lanes_) kernel.check_errors(device_, l.stream, l.workspace.get());
  }

 private:
  struct Lane {
    CUstream stream = nullptr;
    CUevent done = nullptr;
    std::unique_ptr<Workspace> workspace;
    RingLaunchSizes sizes;
  };

  static const runtime::CudaDriver& drv() {
    const runtime::CudaDriver* d = runtime::cuda_driver();
    if (!d) throw Error("no CUDA driver: " + runtime::cuda_driver_unavailable_reason());
    return *d;
  }

  CUstream stream(int lane) const { return lane == kCaller ? caller_ : lanes_.at(size_t(lane)).stream; }

  template <class Args>
  void place(Args& a, int lane) {
    a.device = Device::cuda(device_);
    a.stream = stream(lane);
    a.workspace = lanes_.at(size_t(lane)).workspace.get();
  }

  int device_;
  const runtime::RingKernels* kernels_;
  CUevent fork_ = nullptr;
  CUstream caller_ = nullptr;
  int used_ = 0;
  std::vector<Lane> lanes_;
  std::map<std::pair<int, int>, runtime::DeviceBuffer> memory_;
};

}  // namespace

std::unique_ptr<RingBackend> make_device_ring_backend(int device) { return std::make_unique<DeviceRingBackend>(device); }

}  // namespace flexjit
