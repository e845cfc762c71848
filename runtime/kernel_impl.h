// The GPU implementation of flexjit::Kernel, shared by the files that implement its launches:
// kernel_impl.cpp (forward, block masks, workspaces), backward_impl.cpp, varlen_impl.cpp and
// decode_impl.cpp.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "compiler/codegen/kernel_source.h"
#include "compiler/passes/range_analysis.h"
#include "kernels_templates/flex_params.cuh"
#include "runtime/cuda_driver.h"
#include "runtime/flexjit.hpp"
#include "runtime/forward_launch.h"
#include "runtime/kernel_compiler.h"
#include "runtime/loaded_library.h"
#include "runtime/tensor_maps.h"

namespace flexjit {

// The loaded CUDA driver; throws flexjit::Error saying why when there is none.
const runtime::CudaDriver& require_driver();

// Bytes at the start of every workspace for the error word (at offset 0) and the forward's work counter (at
// kTileCounterOffset, FlexForwardParams::tile_counter); the rest keeps what follows aligned.
constexpr size_t kErrorWordBytes = 256;
constexpr size_t kTileCounterOffset = 16;

// Where a block mask's ranked order (FlexQTileWork per query tile) starts: after the counts and index lists,
// 16-byte aligned for the kernel's vector loads.
inline size_t block_mask_order_offset(int64_t bm, int64_t hm, int64_t nq, int64_t max_kv) {
  return (static_cast<size_t>(bm * hm * nq * (2 + 2 * max_kv) * 4) + 15) / 16 * 16;
}

// Bytes of a block mask: counts, index lists and the ranked order.
inline size_t block_mask_bytes(int64_t bm, int64_t hm, int64_t nq, int64_t max_kv) {
  return block_mask_order_offset(bm, hm, nq, max_kv) + static_cast<size_t>(bm * hm * nq) * sizeof(FlexQTileWork);
}

class KernelImpl : public Kernel {
 public:
  KernelImpl(SpecIR ir, RuntimeOptions options);

  const dsl::Spec& spec() const override { return ir_.spec(); }

  void forward(const AttentionArgs& a) override;

  std::unique_ptr<BlockMask> build_block_mask(const AttentionArgs& a) override;
  bool may_attend(const AttentionArgs& a) override;

  std::unique_ptr<Workspace> make_workspace(int device, int batch, int heads, int seqlen_q, int seqlen_kv) override;

  void bind_buffer(const std::string& name, const Tensor& t) override;

  void warm_up(int device, DType dtype) override;

  void check_errors(int device, CUstream stream, Workspace* workspace) override;

  // backward_impl.cpp
  void backward(const BackwardArgs& args) override;
  std::unique_ptr<Workspace> make_backward_workspace(int device, int batch, int heads, int seqlen_q, int seqlen_kv) override;
  void backward_varlen(const VarlenBackwardArgs& args) override;

  // varlen_impl.cpp
  void forward_varlen(const VarlenArgs& args) override;

  // decode_impl.cpp
  std::unique_ptr<DecodePlan> plan_decode(const DecodePlanOptions& options) override;
  void decode(const DecodePlan& plan, const DecodeArgs& args) override;

 private:
  struct VariantState {
    KernelSource source;
    std::shared_ptr<const runtime::CompiledArtefact> artefact;
    runtime::LoadedLibrary library;
    std::map<int, CUfunction> forward_fn, mask_fn, rank_fn;  // rank_fn: data-dependent masks only
    std::map<int, CUfunction> widen_fn;                      // ragged prefill over an FP8 K / V only
  };

  int launch_device(const AttentionArgs& a) const;

  std::vector<Tensor> bound_for(int device);

  // Every pointer must live on the launch's device: a pointer from another GPU would be read
  // through peer mappings at best and crash at worst (seed 000).
  void check_pointers(const AttentionArgs& a, const std::vector<Tensor>& buffers, int device) const;

  VariantState& variant(const runtime::VariantChoice& choice, int device);
  // The forward's variant choice for a launch's values. tma: whether tensor maps can describe the launch's q, k and v
  // (runtime::tensor_maps_describe).
  // shard: the launch is a shard of a longer sequence (its variant adds the offsets to the positions).
  // ranges: the launch's own ranges (a ragged prefill's queries at the end of their KV), without value
  // specialisation; null: the spec's forward ranges.
  runtime::VariantChoice forward_choice(const BoundValues& values, bool tma, bool shard = false, const RangeInfo* ranges = nullptr);

  // Value specialisation (compiler/specialize.h). The IR of a choice whose `specialized` list is not empty is the
  // spec's with those parameter values folded in, with its own range analysis.
  struct Specialization {
    SpecIR ir;
    RangeInfo ranges;
  };
  // The first values of each divisor parameter a launch brings get their own module; later new values run the
  // generic one, so a parameter that changes every launch does not compile every launch.
  static constexpr size_t kMaxSpecializedValues = 8;
  // The (parameter, value) pairs a launch's variant compiles in, recording new values (up to the bound).
  std::vector<std::pair<int, int64_t>> specialized_params(const BoundValues& values);
  // The key of a specialisation's (parameter, value) pairs ("" for none).
  static std::string specialization_key(const std::vector<std::pair<int, int64_t>>& values);
  // The specialisation for those pairs, made on first use (never called with mutex_ held).
  const Specialization& specialization(const std::vector<std::pair<int, int64_t>>& values);
  // The IR and range analysis a choice's module is generated from.
  std::pair<const SpecIR*, const RangeInfo*> variant_ir(const runtime::VariantChoice& choice);
  // How the launch's parameter values let a score_mod split with runtime factors run (score_scales_).
  RuntimeSplit runtime_split(const BoundValues& values) const;
  // The forward's grid: one CTA per work tile, or (warp-specialised kernel) one per SM for at most `work` tiles.
  static unsigned forward_grid(const ForwardConfig& cfg, int64_t work, int device);

  // The launch's bound values and variant. Binding and the range obligations cost a few
  // microseconds per launch, so the last launch's results are reused when its sizes,
  // buffer shapes, parameters and device are the same (the steady state of a server).
  // A shard of a longer sequence (AttentionArgs::q_offset ...) binds Sq / Skv to the whole sequence's lengths.
  VariantState& variant_for_launch(const runtime::LaunchShape& shape, const std::vector<Tensor>& buffers, const AttentionArgs& a,
                                   int device, BoundValues& values);
  // A shard's KV offset against a variant whose hooks stage by 64-column tile (kTileAligned): the GPU kernels
  // keep their tiles at multiples of the launch's own rows, so the offset must be a multiple of 64 there.
  void check_shard_alignment(const VariantState& var, const AttentionArgs& a) const;
  struct LaunchMemo {
    std::vector<int64_t> key;
    BoundValues values;
    VariantState* variant = nullptr;
  };
  LaunchMemo memo_;
  runtime::TensorMapCache map_cache_;  // the forward's last tensor maps (guarded by mutex_)

  void load_library(VariantState& v, const std::string& arch);
  // Kernel options of the forward (dense or ragged) module for a variant choice on an architecture.
  ForwardKernelOptions forward_options(const runtime::VariantChoice& choice, const std::string& arch) const;
  void fill_forward_params(FlexForwardParams& p, const AttentionArgs& a, const runtime::LaunchShape& s) const;

  int mask_batch(const runtime::LaunchShape& s) const { return mask_uses_b_ ? static_cast<int>(s.batch) : 1; }
  int mask_heads(const runtime::LaunchShape& s) const { return mask_uses_h_ ? static_cast<int>(s.heads) : 1; }

  void allocate_mask(BlockMask& m, const runtime::LaunchShape& s, const ForwardConfig& cfg, int device);

  void geometry(BlockMask& m, const runtime::LaunchShape& s, const ForwardConfig& cfg, int device) const;

  // A workspace for launches up to these sizes: the error word and a block mask, then (when
  // backward_bytes > 0) the backward's scratch, in one allocation.
  // min_mask_bytes: the error word and block-mask part at least this large (a grown workspace keeps its old size).
  std::unique_ptr<Workspace> allocate_workspace(int device, const runtime::LaunchShape& s, const ForwardConfig& cfg, size_t backward_bytes = 0,
                                                size_t min_mask_bytes = 0);

  // The launch's workspace: the caller's, or this kernel's for the device, grown (outside
  // graph capture) when a launch is larger than any before.
  // `given` (the caller's, checked for size) or this kernel's own on the device; the forward,
  // decode and backward share the latter, so check_errors reads the one error word they write.
  Workspace& workspace_for(Workspace* given, CUstream stream, int device, const runtime::LaunchShape& s, const ForwardConfig& cfg,
                           size_t backward_bytes = 0);

  void check_mask(const BlockMask& m, const runtime::LaunchShape& s, const runtime::SequenceWindow& w, const ForwardConfig& cfg,
                  int device) const;

  static void set_mask(FlexBlockMask& fm, const BlockMask& m);

  // Builds m's lists with var's builder; rank_tiles: also the ranked order, where var has a ranking entry (the
  // forward's schedule; the backward does not read it).
  // w: the shard of the sequence the launch covers (its positions), recorded in m.
  void build_mask_into(BlockMask& m, VariantState& var, std::vector<uint64_t>& vparams, const runtime::LaunchShape& s,
                       const runtime::SequenceWindow& w, const ForwardConfig& cfg, int device, CUstream stream, bool rank_tiles = true);


  SpecIR ir_;
  RuntimeOptions options_;
  RangeInfo ranges_;
  std::string canonical_;
  bool mask_uses_b_ = false, mask_uses_h_ = false;
  ScoreScales score_scales_;  // the split of the score_mod (its factors may be runtime parameters)
  std::vector<int> divisor_params_;  // runtime int parameters that divide positions (compiler/specialize.h)
  std::map<int, std::set<int64_t>> specialized_values_;  // per divisor parameter, the values given their own module
  std::map<std::string, std::unique_ptr<Specialization>> specializations_;
  std::mutex mutex_;
  std::map<std::string, std::unique_ptr<VariantState>> variants_;
  std::map<int, std::unique_ptr<Workspace>> workspaces_;
  std::map<int, std::vector<Tensor>> bound_;

  // State of the other launch kinds, defined (and created on first use) by their files.
  struct BackwardState;
  std::shared_ptr<BackwardState> backward_state_;
  // backward_impl.cpp: the backward's state, created on first use.
  BackwardState& backward_state();
  struct DecodeState;
  std::shared_ptr<DecodeState> decode_state_;
  // decode_impl.cpp: the decode module for a variant choice and configuration, compiled and loaded on first use.
  struct DecodeModule;
  DecodeModule& decode_module(const runtime::VariantChoice& choice, int device, const DecodeConfig& cfg);
  // backward_impl.cpp: a ragged batch's sequences (Kernel::backward_varlen), for backward_gpu.
  struct RaggedBatch {
    Tensor cu_seqlens_q, cu_seqlens_kv;
    int64_t batch = 0;
    int64_t max_seqlen_q = 0, max_seqlen_kv = 0;
  };
  // The GPU backward of a dense launch, or of a ragged batch whose packed tensors `a` holds as [1, H, total, D] views.
  void backward_gpu(const BackwardArgs& a, const RaggedBatch* ragged);
  // varlen_impl.cpp: the ragged-prefill module of a variant choice (forward_fn holds its kernel; widen_fn the widening
  // pass when K and V are stored in the FP8 format fp8_kv), on first use.
  struct VarlenState;
  // varlen_impl.cpp: the ranges of ragged launches whose queries sit at the end of their KV, computed on first use.
  const RangeInfo& varlen_kv_end_ranges();
  std::shared_ptr<VarlenState> varlen_state_;
  VariantState& varlen_variant(const runtime::VariantChoice& choice, int device, std::optional<DType> fp8_kv);
};

}  // namespace flexjit
