// Tile configurations of the forward kernel per head dim: the host-side mirror of the table
// at the top of kernels_templates/flex_forward.cuh (the generated wrapper instantiates the
// template with exactly these values, so the two cannot drift apart silently).
#pragma once
#include <string>

#include "dsl/builtins.h"

namespace flexjit {

struct ForwardConfig {
  int head_dim;
  int block_m;  // query rows per CTA
  int block_n;  // KV rows per tile (the tile size the staging pass and block masks use)
  int warps;
  std::string str() const;
  // Dynamic shared memory of the forward kernel: Q tile plus two stages of K and V tiles,
  // rows padded by 8 elements (flex_forward.cuh's FlexForwardTraits::kSmemBytes).
  int shared_bytes() const { return (block_m + 4 * block_n) * (head_dim + 8) * 2; }
  int threads() const { return warps * 32; }
};

// Throws flexjit::Error naming the supported dims for an unsupported head dim.
ForwardConfig forward_config(int head_dim);

// "__nv_bfloat16" / "__half" for the kernel's element type.
const char* cuda_element_type(dsl::DType t);

}  // namespace flexjit
