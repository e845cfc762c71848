// Host-side checks and parameter filling for one forward launch: shapes, strides, dtypes,
// symbol and parameter binding, the launch-time range obligations that pick the kernel
// variant, and the bytes of the variant's Params struct.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "compiler/bindings.h"
#include "compiler/codegen/params_layout.h"
#include "compiler/codegen/score_scales.h"
#include "compiler/passes/range_analysis.h"
#include "compiler/spec_ir.h"
#include "runtime/flexjit.hpp"

namespace flexjit::runtime {

struct LaunchShape {
  int64_t batch = 0, heads = 0, kv_heads = 0, seqlen_q = 0, seqlen_kv = 0, head_dim = 0, head_dim_v = 0;
};

// Context parallelism: where a launch's rows sit in the whole sequence (AttentionArgs::q_offset, kv_offset, seqlen_q
// and seqlen_kv; BackwardArgs the same). Lengths of 0 mean the tensors' own.
struct SequenceWindow {
  int64_t q_offset = 0, kv_offset = 0, seqlen_q = 0, seqlen_kv = 0;
  bool whole() const { return !q_offset && !kv_offset && !seqlen_q && !seqlen_kv; }
};
SequenceWindow window_of(const AttentionArgs& args);
SequenceWindow window_of(const BackwardArgs& args);

// The shape the mods, the symbols Sq / Skv and the buffer declarations see: `local` (the tensors' shape) with the
// whole sequence's lengths. Throws flexjit::Error when an offset or a length is negative or the shard's rows do
// not lie inside the sequence (offset + rows > length).
LaunchShape mods_shape(const LaunchShape& local, const SequenceWindow& window);

// Checks q, k, v, o (and lse) against each other and the spec; throws flexjit::Error saying
// which tensor, which dimension and what was expected. `gpu`: also 16-byte alignment and
// strides that are multiples of 8 elements (the kernel's vector accesses). Checks the sequence window too
// (mods_shape), so both back ends report a shard outside its sequence alike. Returns the tensors' shape.
LaunchShape validate_operands(const dsl::Spec& spec, const AttentionArgs& args, bool gpu);

// Throws when `t`'s elements span more bytes than a pointer offset can hold (a stride like INT64_MIN): such shapes
// and strides come from a caller's bug, and no launch may compute addresses from them. Other mistakes (ranks, dims
// below 1, missing data) are left to the checks that name them.
bool is_addressable(const Tensor& t);  // check_addressable's test, for callers that build the name only to throw
void check_addressable(const Tensor& t, const std::string& name);

// The captured buffers of a launch in spec order: from args, else from `bound` (same order,
// may hold null data). Throws naming a missing or mistyped buffer.
std::vector<Tensor> collect_buffers(const dsl::Spec& spec, const AttentionArgs& args, const std::vector<Tensor>& bound);

// Binds symbols (from the launch shape, mods_shape's for a shard, and buffer shapes) and parameters (args.params).
BoundValues bind_launch(const dsl::CheckedSpec& cs, const LaunchShape& shape, const std::vector<Tensor>& buffers,
                        const AttentionArgs& args);

// Which kernel variant the launch needs: conditional loads whose obligation fails for these
// values must be emitted checked, and 64-bit ints unless the int32 obligation holds.
struct VariantChoice {
  uint64_t checked_loads = 0;
  bool int32 = true;
  uint64_t unit_inner_stride = 0;  // BoundValues::unit_inner_stride
  // The warp-specialised forward may run (ForwardKernelOptions::tma_describable): false when tensor maps cannot
  // describe the launch's q, k and v (runtime/tensor_maps.h).
  bool tma = true;
  // A score_mod split with runtime factors: whether the parameter values keep the split, with or without the fixed
  // softmax maximum (ForwardKernelOptions::variant.runtime_split).
  RuntimeSplit runtime_split = RuntimeSplit::RunningMax;
  // The launch is a shard of a longer sequence (ForwardKernelOptions::shard_positions); for a ragged prefill, its
  // queries sit at the end of their sequence's KV (VarlenArgs::queries_at_kv_end), whose ranges are decode's.
  bool shard = false;
  // Runtime int parameters compiled in as constants (parameter index, value): divisors of positions
  // (compiler/specialize.h), so the variant's IR is the spec's with these values folded in.
  std::vector<std::pair<int, int64_t>> specialized;
  std::string key() const;
};
VariantChoice choose_variant(const RangeInfo& ranges, const dsl::CheckedSpec& cs, const BoundValues& values);

// Whether a K / V element type is an FP8 storage format (DType::F8E4M3 or F8E5M2).
inline bool is_fp8(DType t) { return t == DType::F8E4M3 || t == DType::F8E5M2; }

// An FP8 K / V's optional dequantisation scale: f32 [kv_heads] or [1] on `device` (-1: not checked). Returns its stride
// over KV heads (0 for one scale). `what` names the call in the errors ("decode").
int64_t check_kv_scale(const Tensor& t, const char* what, const char* name, int64_t kv_heads, int device);

// A packed operand of a ragged launch, [total, heads, dim] of `dtype` with a contiguous last dimension, 16-byte
// strides and alignment on the GPU; throws flexjit::Error naming `what` (the call) and `name`.
void check_packed_operand(const Tensor& t, const char* what, const char* name, int64_t heads, int64_t dim, DType dtype);

// A ragged launch's cu_seqlens_q / cu_seqlens_kv: contiguous i32 [B + 1], B >= 1, both of one length. Returns B.
int64_t check_cu_seqlens(const Tensor& cu_q, const Tensor& cu_kv, const char* what);

// The Params struct bytes (8 per slot) for the generated variant.
std::vector<uint64_t> fill_variant_params(const ParamsLayout& layout, const std::vector<Tensor>& buffers, const BoundValues& values,
                                          unsigned int* error_word);

}  // namespace flexjit::runtime
