// Zero-copy views of the arrays a Python caller passes (any DLPack producer: numpy, torch,
// cupy, ...) as flexjit::Tensor, and the check that one launch's arrays share a device.
#pragma once
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/ndarray.h>

#include <string>
#include <vector>

#include "runtime/flexjit.hpp"

namespace flexjit::python {

namespace nb = nanobind;

// The views of one launch. Every array must live where the first one does (the CPU, or one
// CUDA device): the CPU backend would otherwise read device memory as host memory.
class TensorViews {
 public:
  // Views `obj`; `what` names it in errors ("q", "buffer `rel_h`"). Throws flexjit::Error
  // for anything that is not an array, or an array of an unsupported dtype, layout or device.
  Tensor view(nb::handle obj, const std::string& what);
  // None gives an empty tensor (no data): optional operands such as the LSE.
  Tensor view_optional(nb::handle obj, const std::string& what);

  // Where the launch runs: the device of the first array viewed (or expected).
  Device device() const;
  // Requires every array to be on `d`; `what` names the reason in errors ("the decode plan").
  void place(Device d, const std::string& what);

 private:
  Tensor torch_view(nb::handle obj, const std::string& what);

  std::vector<nb::ndarray<nb::ro>> imports_;  // DLPack imports, alive for the call
  bool placed_ = false;
  Device device_;
  std::string first_;
};

// Registers torch.Tensor and the torch dtypes flexjit supports, so torch tensors are read
// through their attributes (a few hundred nanoseconds) instead of a DLPack export (several
// microseconds, and refused for tensors that require grad). `dtypes` maps a torch dtype to a
// flexjit dtype name ("bf16", ...).
void register_torch(nb::handle tensor_type, nb::dict dtypes);

}  // namespace flexjit::python
