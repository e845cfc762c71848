// Ragged prefill (VarlenArgs) and decode (DecodeArgs) on the CPU: argument checks, binding
// (Sq / Skv bind to the launch's bounds), then the forward driver once per sequence on
// strided slices, with b = the sequence index and the query positions offset for decode (and for a
// ragged prefill with VarlenArgs::queries_at_kv_end).
// Paged KV caches are gathered into a contiguous copy per sequence; FP8 K and V (a decode's
// DecodePlanOptions::kv_dtype, a ragged prefill's f8e4m3 / f8e5m2 k and v, with k_scale /
// v_scale) are dequantised into an f32 copy (scale * value) per sequence the same way, while q
// and o keep the spec's dtype.
#pragma once
#include "runtime/cpu/forward_common.h"

namespace flexjit::cpu {

// Both throw flexjit::Error (arguments, or the mods' load errors after writing the outputs).
void launch_varlen(const SpecState& st, const SpecIR& ir, const VarlenArgs& args);
void launch_decode(const SpecState& st, const SpecIR& ir, const DecodePlanOptions& plan, const DecodeArgs& args);

}  // namespace flexjit::cpu
