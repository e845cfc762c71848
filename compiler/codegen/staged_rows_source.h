// Prints a staged term's accessor for a generated variant. Col and Tile: a row accessor: a device function returning flex::StagedRows
// (kernels_templates/flex_staged_rows.cuh) with the buffer's element [lead..., 0, 0], its row and column strides,
// its last two dims and the offset of that element in the buffer's contiguous gradient. The Hopper backward's staged
// terms (staged_col / staged_tile) read their blocks through it. Diag: the term's value per diagonal (staged_diag).
#pragma once
#include <string>

#include "compiler/codegen/codegen_cuda.h"
#include "compiler/codegen/staged_terms.h"

namespace flexjit {

// `  __device__ static __forceinline__ flex::StagedRows <name>(const Params& p, int b, int h, int hkv) { ... }`
std::string staged_rows_function(const SpecIR& ir, const RangeInfo& ranges, const VariantOptions& options, const StagedTerm& term,
                                 const std::string& name);

// A Diag term's band accessor: `  __device__ static __forceinline__ float staged_diag(const Params& p, int b, int h, int
// hkv, int d) { ... }`, the term's value on diagonal d = q - kv (its index printed with q = d and kv = 0), or 0 where
// the last index falls outside the buffer: a band's ends reach diagonals that only rows past Sq or columns past Skv
// have, where the term's proof of range does not hold.
std::string staged_diag_function(const SpecIR& ir, const RangeInfo& ranges, const VariantOptions& options, const StagedTerm& term);

}  // namespace flexjit
