// Reading one launch's Python arguments (mods, arrays, buffer and parameter dicts) into the
// spec request that picks its kernel and the views its C++ arguments hold.
#pragma once
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <string>

#include "kernel_cache.h"
#include "tensor_views.h"

namespace flexjit::python {

struct LaunchArgs {
  TensorViews views;
  SpecRequest request;

  // score_mod / mask_mod: a str or None.
  void read_mods(nb::handle score_mod, nb::handle mask_mod);
  // A dict {name: array} (an entry may also be (array, "B, H, L"): the declaration's
  // dimensions, for extents that name no launch size) or None.
  void read_buffers(nb::handle buffers, const LaunchSizes& sizes);
  // A dict {name: bool | int | float | flexjit.const(value)} or None.
  void read_params(nb::handle params);
  // An iterable of buffer names or None.
  void read_grads(nb::handle grads);
  // The element type and head dims of a launch whose q is [..., D] and v [..., Dv].
  void set_operands(const Tensor& q, const Tensor& v);
};

// Checks an operand's rank before its dimensions are read; `layout` names them ("[B, H, Sq, D]").
void require_rank(const Tensor& t, size_t rank, const char* name, const char* layout);

// The CUstream of a Python stream handle (an int; 0 is the legacy default stream).
CUstream stream_of(uintptr_t handle);

}  // namespace flexjit::python
