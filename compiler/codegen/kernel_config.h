// The forward kernels' launch geometry, read off the tile policy (kernels_templates/flex_tile_policy.cuh: the one
// place tuning choices are made; the generated source instantiates the templates that read the same policy, and
// static_asserts that host and template agree on the shared memory).
#pragma once
#include <cmath>
#include <optional>
#include <string>

#include "dsl/builtins.h"
#include "kernels_templates/flex_decode_params.cuh"
#include "kernels_templates/flex_tile_policy.cuh"

namespace flexjit {

struct ForwardConfig {
  int head_dim = 0;
  int block_m = 0;  // query rows per work tile (a block mask's q_tile)
  int block_n = 0;  // KV rows per tile (a block mask's kv_tile)
  int warps = 0;
  // The warp-specialised sm_90a kernel (flex_forward_kernel_sm90.cuh): a persistent grid of one CTA per SM and the
  // launch's tensor maps as a third parameter. false: the mma.sync kernel, one CTA per work tile.
  bool warp_specialized = false;
  int smem = 0;  // dynamic shared memory per CTA
  int swizzle_bytes = 0;  // warp-specialised: the swizzle of its shared-memory tiles, which the tensor maps' boxes follow
  std::string str() const;
  int shared_bytes() const { return smem; }
  int threads() const { return warps * 32; }
};

ForwardConfig forward_config(const FlexForwardPolicy& policy);

// The mma.sync kernel's configuration at a head dim (the backward and the ragged prefill share its tiles). Throws
// flexjit::Error naming the supported dims for an unsupported head dim.
ForwardConfig forward_config(int head_dim);

// Which forward kernel a launch runs and with what tiles: `arch` is the NVRTC target ("sm_90a", "sm_80"; empty: the
// portable mma.sync kernel), tma_describable whether tensor maps can describe the launch's q, k and v
// (runtime/tensor_maps.h), features the generated variant's (GeneratedVariant::features).
ForwardConfig forward_config(int head_dim, const std::string& arch, bool tma_describable, FlexVariantFeatures features);

// The softmax scale a launch that passes none uses: 1 / sqrt(head dim), in fp32.
inline float default_softmax_scale(int head_dim) { return static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim))); }

// True for the architectures the Hopper kernels compile for (wgmma and setmaxnreg need exactly sm_90a).
bool is_hopper_arch(const std::string& arch);

// The compute capability (80, 90, ...) an NVRTC target names; 90 only for sm_90a, the target with wgmma and setmaxnreg.
int arch_sm(const std::string& arch);

// Configuration of the decode kernel (kernels_templates/flex_decode.cuh, FlexDecodeTraits): 16 * m_tiles
// packed query rows per CTA, 64-row KV tiles, `stages` K/V stages, 4 warps.
struct DecodeConfig {
  int head_dim = 128;
  int m_tiles = 1;         // 1 or 2 (2 only for head dims up to 128)
  int stages = 2;          // K/V shared-memory stages (2..4)
  bool alternate = false;  // FlexDecodeTraits::kAlternate: 128-row K and V loads in turn (stages == 2 only)
  // The cache's element type when it is FP8 (F8E4M3 or F8E5M2: FlexDecodeTraits' KvElement); else the cache
  // holds the kernel's element type.
  std::optional<dsl::DType> kv_fp8;
  std::string str() const;
  int block_m() const { return 16 * m_tiles; }
  int kv_bytes() const { return kv_fp8 ? 1 : 2; }
  // FlexDecodeTraits::kSmemBytes (the decode policy's count).
  int shared_bytes() const { return flex_decode_smem_bytes(head_dim, m_tiles, stages, kv_bytes()); }
};

// The decode configuration for G * max_q_len packed rows per KV head (G = H / Hkv), as the decode policy
// (flex_decode_policy) chooses it; further rows go to more row blocks. Throws for head dims the decode kernel does
// not support (multiples of 16 up to 256). kv_fp8: an FP8 cache's type.
DecodeConfig decode_config(int head_dim, int rows_per_kv_head, std::optional<dsl::DType> kv_fp8 = std::nullopt);

// "__nv_bfloat16" / "__half" for the kernel's element type.
const char* cuda_element_type(dsl::DType t);

}  // namespace flexjit
