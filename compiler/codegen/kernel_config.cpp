#include "compiler/codegen/kernel_config.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "dsl/error.h"
#include "dsl/spec.h"
#include "kernels_templates/flex_decode_params.cuh"

namespace flexjit {

std::string ForwardConfig::str() const {
  return fmt::format("d{}_m{}_n{}_w{}{}{}{}{}", head_dim, block_m, block_n, warps, hopper ? "_sm90" : "",
                     col_gemm_parts ? fmt::format("_cg{}", col_gemm_parts) : "", tma ? "_tma" : "", staged_kv_cols ? "_kvcols" : "");
}

int ForwardConfig::shared_bytes() const {
  const int padded = (head_dim + 8) * 2;  // bytes of a padded row (mma.sync tiles and the O staging tile)
  if (!hopper) return (block_m + 4 * block_n) * padded;  // Q tile + two stages of K and V
  // FlexForwardTraitsSm90: a Q region (the swizzled Q tile, 1 KB aligned; at 128 rows also the padded O staging
  // tile), dense swizzled K/V tiles (a ring of three single tiles at 64 rows and head dims above 64, else four
  // {K, V} stages), with TMA loads their three mbarriers (64 bytes), and 1 KB to align the base. With the column
  // GEMM, the [block_m][64] bf16 column block and one 1 KB diagonal per part follow the Q region. Staged mask
  // columns: two slots of 64 x 8 bytes at the end.
  const int q_tile = block_m * head_dim * 2;
  const int q_region = ((block_m == 64 ? q_tile : std::max(q_tile, block_m * padded)) + 1023) / 1024 * 1024;
  const int col_gemm_bytes = col_gemm_parts ? block_m * 64 * 2 + col_gemm_parts * 1024 : 0;
  const int kv_tiles = block_m == 64 && head_dim > 64 ? 3 : 4 * 2;
  return q_region + col_gemm_bytes + kv_tiles * block_n * head_dim * 2 + (tma ? 64 : 0) + (staged_kv_cols ? 2 * 64 * 8 : 0) + 1024;
}

bool is_hopper_arch(const std::string& arch) { return arch == "sm_90a"; }

int col_gemm_parts_for_scale(float scale) {
  if (!(scale > 0.f) || scale > 0.5f) return 0;
  const float inv = 1.f / scale;  // as the kernel computes it
  uint32_t bits = 0;
  std::memcpy(&bits, &inv, sizeof bits);
  return (bits & 0xffffu) == 0 ? 1 : 3;  // a bf16 is an fp32 whose low 16 bits are zero
}

ForwardConfig forward_config(int head_dim, const std::string& arch, bool data_dependent_mask) {
  // Head dim 80 stays on the mma.sync loop: its 32-byte swizzle made the Hopper loop slower there (H100, full
  // B4 H16 S4096: 270 vs 343 TFLOP/s; SAM ViT-H 3.26 vs 2.87 ms). 192 and 256 do not fit its registers.
  if (is_hopper_arch(arch) && head_dim <= 128 && head_dim != 80 && head_dim % 16 == 0) {
    ForwardConfig c = forward_config(head_dim);
    c.warps = 8;
    c.hopper = true;
    if (data_dependent_mask) {
      // One warpgroup per 64-row CTA: a document mask gives each query tile a few KV tiles only, so a CTA's
      // prologue and epilogue weigh; two to four CTAs per SM overlap them, and 64-row tiles visit less masked area.
      c.block_m = 64;
      c.warps = 4;
    }
    return c;
  }
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

std::string DecodeConfig::str() const { return fmt::format("d{}_mt{}_st{}{}", head_dim, m_tiles, stages, alternate ? "_alt" : ""); }

DecodeConfig decode_config(int head_dim, int rows_per_kv_head) {
  if (head_dim % 16 != 0 || head_dim < 16 || head_dim > 256)
    throw Error(fmt::format("head dim {} is not supported by the GPU decode kernel; it needs a multiple of 16 up to 256", head_dim));
  DecodeConfig c;
  c.head_dim = head_dim;
  c.m_tiles = rows_per_kv_head > 16 && head_dim <= 128 ? 2 : 1;
  // Two stages: one K/V tile in flight per CTA while the other is consumed, and 3 CTAs per SM at D128. Measured
  // 0.5-1% faster than 3 stages (2 CTAs per SM) at KV 32768 on the H100 (docs/DECODE_NOTES.md, optimisation run 1).
  c.stages = 2;
  c.alternate = flex_decode_alternate(c.head_dim, c.m_tiles, c.stages);
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
