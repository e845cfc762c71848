// Assembles the decode module of a spec: the generated variant spliced into flex_decode.cuh, with the
// split-KV decode kernel, its LSE combine and (for buffer-free masks) the per-sequence tile-window kernel.
#pragma once
#include "compiler/codegen/kernel_source.h"

namespace flexjit {

// Entry points of a decode module.
inline constexpr const char* kDecodeEntry = "flexjit_decode";
inline constexpr const char* kDecodeCombineEntry = "flexjit_decode_combine";
inline constexpr const char* kDecodeWindowEntry = "flexjit_decode_window";  // only when decode_has_window()

struct DecodeKernelOptions {
  dsl::DType dtype = dsl::DType::BF16;
  DecodeConfig config;
  VariantOptions variant;
};

// The index domains of decode launches. Query row i of sequence b sits at position kv_len(b) - q_len(b) + i
// and the per-sequence KV lengths are only known on the device, so q ranges over [0, Skv - 1] like kv,
// where the symbols Sq and Skv are bound to the plan's max_seqlen_q and max_seqlen_kv.
VarDomains decode_var_domains(const dsl::CheckedSpec& spec);

// analyze_ranges over the spec's mods with decode_var_domains.
RangeInfo analyze_decode_ranges(const SpecIR& ir);

// Whether the module holds the tile-window kernel: the spec has a mask_mod that interval arithmetic can
// classify (it loads no buffer). Other masks visit every tile below the KV length, all as partial tiles.
bool decode_has_window(const SpecIR& ir);

// One module: decode + combine (+ window). `ranges` must come from analyze_decode_ranges.
KernelSource decode_kernel_source(const SpecIR& ir, const RangeInfo& ranges, const DecodeKernelOptions& options);

}  // namespace flexjit
