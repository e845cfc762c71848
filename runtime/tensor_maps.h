// TMA tensor maps of a forward launch (kernels_templates/flex_tma.cuh reads them): q, k and v described as
// rank-4 tensors {D, S, heads, B} with the launch's strides, encoded by the driver (cuTensorMapEncodeTiled).
#pragma once
#include "compiler/codegen/kernel_config.h"
#include "kernels_templates/flex_params.cuh"
#include "runtime/cuda_driver.h"
#include "runtime/flexjit.hpp"

namespace flexjit::runtime {

// Whether tensor maps can describe q, k and v: every stride over batch, heads and positions positive (or zero
// over a dimension of size 1) and below 2^40 bytes. Alignment and multiples of 16 bytes are checked by
// validate_operands already. A launch where this is false takes the cp.async kernel.
bool tensor_maps_describe(const AttentionArgs& a);

// The maps for a kernel with cfg.tma: one box per swizzle region of the 64-row tiles (FlexForwardTraitsSm90).
// Throws flexjit::Error with the driver's message if the driver refuses one.
FlexForwardTmaMaps encode_forward_tensor_maps(const CudaDriver& d, const AttentionArgs& a, const ForwardConfig& cfg);

}  // namespace flexjit::runtime
