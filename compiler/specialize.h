// Value specialisation of runtime int parameters that divide positions (`kv // W`, `kv % W`).
//
// Why: the staging passes hoist a term like rel_h[b, h, q, kv // 64] per KV tile and rel_w[b, h, q, kv % 64] per
// column only when the divisor is known at compile time. With a runtime W every element loads its own bias values
// (SAM ViT-B at B8 H12 S4096 D64 on an H100: 26 ms against 1.28 ms with a constant 64). A runtime launch therefore
// compiles a module with the parameter's value folded in, as if it were `const`, the first few times it sees a new
// value (the runtime bounds how many per parameter, so a parameter that changes every launch does not compile every
// launch; past the bound the generic module divides by a launch-computed multiplier).
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "compiler/spec_ir.h"

namespace flexjit {

// The runtime int parameters (indices into the spec's params) that appear in the divisor of a `//` or `%` whose
// divisor reads no index variable, buffer or shape symbol: the ones whose value decides how the mods can be staged.
std::vector<int> divisor_params(const SpecIR& ir);

// `ir` lowered and optimised again with each (parameter index, value) pair made a `const` of that value.
SpecIR specialize_params(const SpecIR& ir, const std::vector<std::pair<int, int64_t>>& values);

}  // namespace flexjit
