// Prints a staged term's row accessor for a generated variant: a device function returning flex::StagedRows
// (kernels_templates/flex_staged_rows.cuh) with the buffer's element [lead..., 0, 0], its row and column strides,
// its last dim and the offset of that element in the buffer's contiguous gradient. The Hopper backward's staged
// terms (staged_col / staged_tile) read their blocks through it.
#pragma once
#include <string>

#include "compiler/codegen/codegen_cuda.h"
#include "compiler/codegen/staged_terms.h"

namespace flexjit {

// `  __device__ static __forceinline__ flex::StagedRows <name>(const Params& p, int b, int h, int hkv) { ... }`
std::string staged_rows_function(const SpecIR& ir, const RangeInfo& ranges, const VariantOptions& options, const StagedTerm& term,
                                 const std::string& name);

}  // namespace flexjit
