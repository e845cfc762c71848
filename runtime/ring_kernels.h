// Ring attention's element-wise steps on a CUDA device (kernels_templates/flex_ring.cuh): the module's source, compiled
// once per architecture through the kernel caches (memory, disk, NVRTC) and loaded once per device, and its launches.
#pragma once
#include "compiler/codegen/kernel_source.h"
#include "runtime/loaded_library.h"
#include "runtime/ring_backend.h"

namespace flexjit::runtime {

inline constexpr const char* kRingCopyEntry = "flexjit_ring_copy";
inline constexpr const char* kRingMergeEntry = "flexjit_ring_merge";

// The module: both entries, no spec in it (its cache key's IR is a constant).
KernelSource ring_kernel_source();
// The text standing in for a spec's canonical IR in the module's cache key.
inline constexpr const char* kRingModuleIr = "ring attention: element-wise steps, no spec";

class RingKernels {
 public:
  // The module loaded on `device`, compiled for its architecture on first use. Throws flexjit::Error without a
  // driver or for a device that does not exist.
  static const RingKernels& on(int device);
  RingKernels(const RingKernels&) = delete;
  RingKernels& operator=(const RingKernels&) = delete;

  // RingBackend::copy and merge on this device's memory, enqueued on `stream`.
  void copy(const Tensor& src, const Tensor& dst, RingCopy mode, CUstream stream) const;
  void merge(const Tensor& o_part, const Tensor& lse_part, const Tensor& o_acc, const Tensor& lse_acc, CUstream stream) const;

 private:
  explicit RingKernels(int device);
  int device_ = 0;
  int sm_count_ = 1;
  LoadedLibrary library_;
  CUfunction copy_ = nullptr, merge_ = nullptr;
};

}  // namespace flexjit::runtime
