// TMA tensor maps of a warp-specialised forward launch (kernels_templates/flex_tma.cuh reads them): q, k and v
// described as rank-4 tensors {D, S, heads, B} with the launch's strides, encoded by the driver
// (cuTensorMapEncodeTiled).
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "compiler/codegen/kernel_config.h"
#include "kernels_templates/flex_backward_params.cuh"
#include "kernels_templates/flex_params.cuh"
#include "runtime/cuda_driver.h"
#include "runtime/flexjit.hpp"

namespace flexjit::runtime {

// Whether tensor maps can describe q, k and v given as [B, heads, S, D] (or packed [total, heads, D], read as
// B = 1): every stride over batch, heads and positions positive (or zero over a dimension of size 1) and below 2^40
// bytes. Alignment and multiples of 16 bytes are checked by validate_operands already. A launch where this is false
// takes the mma.sync kernel.
bool tensor_maps_describe(const Tensor& q, const Tensor& k, const Tensor& v);
// The same for one tensor (the backward's d_o).
bool tensor_map_describes(const Tensor& t);

// The maps for cfg's kernel: boxes of one swizzle region (the policy's tile head dim decides the swizzle) by
// cfg.block_m rows for q and cfg.block_n rows for k and v; columns past the head dim arrive as zeros. Throws
// flexjit::Error with the driver's message if the driver refuses one.
FlexForwardTmaMaps encode_forward_tensor_maps(const CudaDriver& d, const Tensor& q, const Tensor& k, const Tensor& v, const ForwardConfig& cfg);

// The maps of a warp-specialised backward launch (flex_backward_sm90.cuh kProducer): boxes of one swizzle region
// (the backward policy's) by block_m rows for q and d_o, block_n rows for k and v.
FlexBackwardTmaMaps encode_backward_tensor_maps(const CudaDriver& d, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& d_o,
                                                int block_m, int block_n, int swizzle_bytes);

// The last maps encoded, reused while a launch has the same tensors and tiles (the steady state of a server or a
// training loop): encoding three maps costs the host about a microsecond per launch. Not thread-safe: the caller locks.
class TensorMapCache {
 public:
  const FlexForwardTmaMaps& get(const CudaDriver& d, const Tensor& q, const Tensor& k, const Tensor& v, const ForwardConfig& cfg);

 private:
  using Key = std::array<int64_t, 4 + 3 * 10>;  // the config, then per tensor: pointer, dtype and rank, shape, strides
  Key key_{};
  bool valid_ = false;
  FlexForwardTmaMaps maps_{};
};

}  // namespace flexjit::runtime
