// Ragged prefill (VarlenArgs) and decode (DecodeArgs) on the CPU: argument checks, binding
// (Sq / Skv bind to the launch's bounds), then the forward driver once per sequence on
// strided slices, with b = the sequence index and the query positions offset for decode (and for a
// ragged prefill with VarlenArgs::queries_at_kv_end); the ragged backward the same way, with the
// backward driver.
// Paged KV caches are gathered into a contiguous copy per sequence; FP8 K and V (a decode's
// DecodePlanOptions::kv_dtype, a ragged prefill's f8e4m3 / f8e5m2 k and v, with k_scale /
// v_scale) are dequantised into an f32 copy (scale * value) per sequence the same way, while q
// and o keep the spec's dtype.
#pragma once
#include "runtime/cpu/backward_launch.h"
#include "runtime/cpu/forward_common.h"

namespace flexjit::cpu {

// All throw flexjit::Error (arguments, or the mods' load errors after writing the outputs).
void launch_varlen(const SpecState& st, const SpecIR& ir, const VarlenArgs& args);
// The backward of a ragged prefill (VarlenBackwardArgs): the same checks and bindings as
// launch_varlen, then one backward job per sequence (b = its index), the buffer gradients summed
// over the sequences. `bs` is make_backward_spec of an IR with ir's backward_cache_key.
void launch_backward_varlen(const SpecIR& ir, const BackwardSpec& bs, const VarlenBackwardArgs& args);
void launch_decode(const SpecState& st, const SpecIR& ir, const DecodePlanOptions& plan, const DecodeArgs& args);

}  // namespace flexjit::cpu
