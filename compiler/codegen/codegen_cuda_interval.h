// Prints a buffer-free mask_mod as CUDA interval arithmetic (kernels_templates/flex_interval.cuh):
// a device function that classifies a whole box of indices (one query tile by one KV tile)
// as empty, full or partial, so block masks are built without a dense pass.
#pragma once
#include <string>

#include "compiler/spec_ir.h"

namespace flexjit {

// True if the mask can be classified by intervals: it loads no buffer.
bool mask_is_interval_classifiable(const SpecIR& ir);
// True if the spec has a mask that loads a buffer (documents): the dense builder classifies it, and the Hopper
// forward gives it 64-row tiles (forward_config).
bool mask_is_data_dependent(const SpecIR& ir);

// `struct <name> { __device__ static int classify(const Variant::Params& p, fji::I b, fji::I h,
// fji::I hkv, fji::I q, fji::I kv); };` returning 0 empty, 1 full, 2 partial. Requires
// mask_is_interval_classifiable(ir).
std::string generate_cuda_interval_classifier(const SpecIR& ir, const std::string& variant_name, const std::string& name);

}  // namespace flexjit
