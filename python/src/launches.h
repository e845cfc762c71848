// The launches Python calls: each reads its arrays, buffers and parameters, finds (or
// compiles) the kernel of its spec and runs it on the arrays' device, on the given stream.
// Outputs are arrays the caller allocated; nothing is copied.
#pragma once
#include <nanobind/nanobind.h>

#include <memory>
#include <string>

#include "block_masks.h"
#include "runtime/flexjit.hpp"

namespace flexjit::python {

namespace nb = nanobind;

// The mods and captures every launch names.
struct ModArgs {
  nb::handle score_mod, mask_mod;  // str or None
  nb::handle buffers, params;      // dict or None
  nb::handle grads;                // iterable of buffer names or None
};

// q [B, H, Sq, D], k [B, Hkv, Skv, D], v [B, Hkv, Skv, Dv]; o [B, H, Sq, Dv] and lse [B, H, Sq] f32 (or None) are written.
void forward(const ModArgs& mods, nb::handle q, nb::handle k, nb::handle v, nb::handle o, nb::handle lse, float scale, BlockMasks* block_mask,
             uintptr_t stream);

// The host time of one forward launch in microseconds, over `iterations` launches with these
// arguments read once (the C++ launch cost the Python layer is measured against; the launch
// does not synchronise, so on a GPU this is the enqueue time while the queue keeps up).
double time_forward(const ModArgs& mods, nb::handle q, nb::handle k, nb::handle v, nb::handle o, nb::handle lse, float scale,
                    uintptr_t stream, int iterations);

// The spec a forward launch with these arguments compiles, as JSON.
std::string forward_spec(const ModArgs& mods, nb::handle q, nb::handle k, nb::handle v);

// Writes dq, dk, dv and, for each entry of grad_outputs ({buffer name: f32 array of its shape}), that buffer's gradient.
void backward(const ModArgs& mods, nb::handle q, nb::handle k, nb::handle v, nb::handle o, nb::handle lse, nb::handle d_o, nb::handle dq,
              nb::handle dk, nb::handle dv, nb::handle grad_outputs, float scale, bool deterministic, BlockMasks* block_mask, uintptr_t stream);

// Packed sequences: q [total_q, H, D], k / v [total_kv, Hkv, D(v)] (FP8 with k_scale / v_scale: torch float8 tensors, or uint8
// bytes in the format kv_dtype names), cu_seqlens i32 [batch + 1]; lse [H, total_q]. queries_at_kv_end: VarlenArgs'.
void forward_varlen(const ModArgs& mods, nb::handle q, nb::handle k, nb::handle v, nb::handle o, nb::handle lse, nb::handle cu_seqlens_q,
                    nb::handle cu_seqlens_kv, int max_seqlen_q, int max_seqlen_kv, nb::handle k_scale, nb::handle v_scale, const std::string& kv_dtype,
                    bool queries_at_kv_end, float scale, uintptr_t stream);

// Its backward: the forward's packed operands, sequences and bounds, lse [H, total_q] (required) and grad_out like o; writes dq, dk,
// dv (like q, k, v) and, per grad_outputs entry, that buffer's gradient summed over the sequences.
void backward_varlen(const ModArgs& mods, nb::handle q, nb::handle k, nb::handle v, nb::handle o, nb::handle lse, nb::handle d_o, nb::handle dq,
                     nb::handle dk, nb::handle dv, nb::handle cu_seqlens_q, nb::handle cu_seqlens_kv, int max_seqlen_q, int max_seqlen_kv,
                     nb::handle grad_outputs, float scale, bool deterministic, uintptr_t stream);

// A decode plan with the kernel it was made for.
struct DecodeSession {
  std::shared_ptr<Kernel> kernel;
  std::unique_ptr<DecodePlan> plan;
};

struct DecodeShape {
  std::string dtype;     // "bf16", "f16", "f32"
  std::string kv_dtype;  // the KV cache's ("" = dtype): "fp8" / "f8e4m3" / "float8_e4m3fn", "f8e5m2" / "float8_e5m2", ...
  int head_dim = 0, head_dim_v = 0;
  DecodePlanOptions options;
};

std::unique_ptr<DecodeSession> plan_decode(const ModArgs& mods, const DecodeShape& shape);

// k / v of an FP8 plan may also be uint8 arrays (numpy has no FP8): their bytes are the plan's FP8 format.
void decode(DecodeSession& session, nb::handle buffers, nb::handle params, nb::handle q, nb::handle k, nb::handle v, nb::handle o, nb::handle lse,
            nb::handle page_table, nb::handle kv_lens, nb::handle q_lens, nb::handle k_scale, nb::handle v_scale, float scale, uintptr_t stream);

// The element type of the plan's KV cache ("bf16", "f8e4m3", ...).
std::string decode_kv_dtype(const DecodeSession& session);

// Parses and checks the mods with buffers declared for these sizes; throws CompileError.
void check_mods(const ModArgs& mods, int64_t batch, int64_t heads, int64_t seqlen_q, int64_t seqlen_kv);

// Synchronises `stream` and reports clamped loads of every kernel launched on CUDA `device`.
void check_errors(int device, uintptr_t stream);

}  // namespace flexjit::python
