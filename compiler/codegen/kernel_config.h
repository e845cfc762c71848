// Tile configurations of the forward kernel per head dim: the host-side mirror of the table
// at the top of kernels_templates/flex_forward.cuh (the generated wrapper instantiates the
// template with exactly these values, so the two cannot drift apart silently).
#pragma once
#include <cmath>
#include <string>

#include "dsl/builtins.h"

namespace flexjit {

struct ForwardConfig {
  int head_dim;
  int block_m;  // query rows per CTA
  int block_n;  // KV rows per tile (the tile size the staging pass and block masks use)
  int warps;
  // The Hopper main loop (kernels_templates/flex_forward_sm90.cuh: wgmma, two warpgroups) instead of the
  // mma.sync one. Same block_m x block_n, so block masks and the staging pass do not depend on it.
  bool hopper = false;
  // Hopper only: a bf16 score_mod term buf[.., q, kv % 64] is added by the S GEMM (flex_forward_sm90.cuh, the
  // column GEMM; compiler/codegen/staged_terms.h, find_forward_col_gemm) in this many bf16 parts of 1 / scale
  // (1 or 3; 0: no column GEMM).
  int col_gemm_parts = 0;
  // Hopper, 64-row CTAs with the K/V tile ring (head dims above 64): Q, K and V are loaded by TMA from tensor maps
  // the launch passes as a third kernel parameter (FlexForwardTmaMaps); false: cp.async by every thread.
  bool tma = false;
  // Hopper, 64-row CTAs: the variant's per-column mask values (FlexVariant::KvCol) are staged in shared memory once
  // per partial tile (two 512-byte slots after the K/V tiles).
  bool staged_kv_cols = false;
  std::string str() const;
  // Dynamic shared memory of the forward kernel (the generated source static_asserts that it equals the
  // template's Traits::kSmemBytes).
  int shared_bytes() const;
  int threads() const { return warps * 32; }
};

// Throws flexjit::Error naming the supported dims for an unsupported head dim. `arch` is the NVRTC target
// ("sm_90a", "sm_80"); empty means the portable mma.sync kernel.
// data_dependent_mask: the spec's mask_mod is classified by the dense block-mask builder (it reads buffers), which
// picks 64-row tiles for the Hopper loop.
ForwardConfig forward_config(int head_dim, const std::string& arch = "", bool data_dependent_mask = false);

// The column GEMM's parts for a launch's softmax scale (FlexForwardTraitsSm90::kColGemmParts): 1 when 1 / scale (in
// fp32) is a bf16 value, 3 otherwise, 0 (the per-element path) for scale > 0.5, where a -inf term would not
// overflow back to -inf.
int col_gemm_parts_for_scale(float scale);

// The softmax scale a launch that passes none uses: 1 / sqrt(head dim), in fp32.
inline float default_softmax_scale(int head_dim) { return static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim))); }

// True for the architectures the Hopper main loops compile for (wgmma needs exactly sm_90a).
bool is_hopper_arch(const std::string& arch);

// Configuration of the decode kernel (kernels_templates/flex_decode.cuh, FlexDecodeTraits): 16 * m_tiles
// packed query rows per CTA, 64-row KV tiles, `stages` K/V stages, 4 warps.
struct DecodeConfig {
  int head_dim = 128;
  int m_tiles = 1;         // 1 or 2 (2 only for head dims up to 128)
  int stages = 2;          // K/V shared-memory stages (2..4)
  bool alternate = false;  // FlexDecodeTraits::kAlternate: 128-row K and V loads in turn (stages == 2 only)
  std::string str() const;
  int block_m() const { return 16 * m_tiles; }
  // FlexDecodeTraits::kSmemBytes: Q tile plus max(stages of K and V, the end-of-CTA merge buffers). The
  // alternating pipeline's 128-row K and V buffers fill exactly the two stages' space.
  int shared_bytes() const {
    const int stride = head_dim + 8;
    const int q = block_m() * stride * 2, stage = 2 * 64 * stride * 2, merge = 4 * block_m() * (stride + 2) * 4;
    return q + (stages * stage > merge ? stages * stage : merge);
  }
};

// The decode configuration for G * max_q_len packed rows per KV head (G = H / Hkv): one m-tile when they
// fit in 16 rows, else two (head dims up to 128); further rows go to more row blocks; two stages, alternating
// where flex_decode_alternate() says so. Throws for head dims the decode kernel does not support (multiples of
// 16 up to 256).
DecodeConfig decode_config(int head_dim, int rows_per_kv_head);

// "__nv_bfloat16" / "__half" for the kernel's element type.
const char* cuda_element_type(dsl::DType t);

}  // namespace flexjit
