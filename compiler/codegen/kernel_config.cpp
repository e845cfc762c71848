#include "compiler/codegen/kernel_config.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "dsl/error.h"
#include "dsl/spec.h"
#include "kernels_templates/flex_decode_params.cuh"

namespace flexjit {

std::string ForwardConfig::str() const {
  return fmt::format("d{}_m{}_n{}_w{}{}", head_dim, block_m, block_n, warps, warp_specialized ? "_ws" : "");
}

ForwardConfig forward_config(const FlexForwardPolicy& p) {
  return ForwardConfig{p.head_dim, p.block_m, p.block_n, p.threads / 32, p.kind == kFlexForwardWarpSpecialized, p.smem_bytes, p.swizzle_bytes};
}

namespace {

void check_head_dim(int head_dim) {
  const auto& dims = dsl::supported_head_dims();
  if (std::find(dims.begin(), dims.end(), head_dim) == dims.end())
    throw Error(fmt::format("head dim {} is not supported by the GPU forward kernel; supported: {}", head_dim, fmt::join(dims, ", ")));
}

}  // namespace

ForwardConfig forward_config(int head_dim) {
  check_head_dim(head_dim);
  return forward_config(flex_forward_policy_mma_sync(head_dim));
}

ForwardConfig forward_config(int head_dim, const std::string& arch, bool tma_describable, FlexVariantFeatures features) {
  check_head_dim(head_dim);
  return forward_config(flex_forward_policy(flex_forward_kind(arch_sm(arch), head_dim, tma_describable), head_dim, features));
}

bool is_hopper_arch(const std::string& arch) { return arch == "sm_90a"; }

int arch_sm(const std::string& arch) {
  if (arch == "sm_90a") return 90;
  if (arch.rfind("sm_", 0) == 0) {
    const int sm = std::atoi(arch.c_str() + 3);
    return sm == 90 ? 89 : sm;  // plain sm_90 has no wgmma: it runs what sm_89 runs
  }
  return 80;
}

std::string DecodeConfig::str() const {
  return fmt::format("d{}_mt{}_st{}{}{}", head_dim, m_tiles, stages, alternate ? "_alt" : "", kv_fp8 ? fmt::format("_{}", dsl::dtype_name(*kv_fp8)) : "");
}

DecodeConfig decode_config(int head_dim, int rows_per_kv_head, std::optional<dsl::DType> kv_fp8) {
  if (head_dim % 16 != 0 || head_dim < 16 || head_dim > 256)
    throw Error(fmt::format("head dim {} is not supported by the GPU decode kernel; it needs a multiple of 16 up to 256", head_dim));
  const FlexDecodePolicy policy = flex_decode_policy(head_dim, rows_per_kv_head, kv_fp8 ? 1 : 2);
  DecodeConfig c;
  c.head_dim = head_dim;
  c.m_tiles = policy.m_tiles;
  c.stages = policy.stages;
  c.alternate = policy.alternate;
  c.kv_fp8 = kv_fp8;
  return c;
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
