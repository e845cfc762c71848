// Assembles the decode module of a spec: the generated variant spliced into flex_decode.cuh, with the
// split-KV decode kernel, its LSE combine and (for masked specs) the per-sequence tile-list kernel.
#pragma once
#include "compiler/codegen/kernel_source.h"

namespace flexjit {

// Entry points of a decode module.
inline constexpr const char* kDecodeEntry = "flexjit_decode";
inline constexpr const char* kDecodeCombineEntry = "flexjit_decode_combine";
inline constexpr const char* kDecodeTilesEntry = "flexjit_decode_tiles";  // only when decode_has_tile_list()

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

// Whether the module holds the tile-list kernel (kernels_templates/flex_decode_tiles.cuh): the spec has a mask_mod.
// It classifies tiles by interval arithmetic when the mask loads no buffer, else by evaluating it per element.
bool decode_has_tile_list(const SpecIR& ir);

// One module: decode + combine (+ tile list). `ranges` must come from analyze_decode_ranges.
KernelSource decode_kernel_source(const SpecIR& ir, const RangeInfo& ranges, const DecodeKernelOptions& options);

}  // namespace flexjit
