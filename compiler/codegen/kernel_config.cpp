#include "compiler/codegen/kernel_config.h"

#include <fmt/format.h>

#include "dsl/error.h"
#include "dsl/spec.h"

namespace flexjit {

std::string ForwardConfig::str() const { return fmt::format("d{}_m{}_n{}_w{}", head_dim, block_m, block_n, warps); }

ForwardConfig forward_config(int head_dim) {
  switch (head_dim) {
    case 32: return {32, 128, 64, 4};
    case 64: return {64, 128, 64, 4};
    case 80: return {80, 128, 64, 4};
    case 96: return {96, 128, 64, 4};
    case 128: return {128, 128, 64, 4};
    case 192: return {192, 128, 64, 8};
    case 256: return {256, 128, 64, 8};
    default: break;
  }
  throw Error(fmt::format("head dim {} is not supported by the GPU forward kernel; supported: {}", head_dim,
                          fmt::join(dsl::supported_head_dims(), ", ")));
}

const char* cuda_element_type(dsl::DType t) {
  switch (t) {
    case dsl::DType::BF16: return "__nv_bfloat16";
    case dsl::DType::F16: return "__half";
    default: break;
  }
  throw Error(fmt::format("element type {} is not supported on the GPU; use bf16 or f16", dsl::dtype_name(t)));
}

}  // namespace flexjit
