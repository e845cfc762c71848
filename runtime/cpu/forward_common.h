// What the CPU forward launches (dense, ragged, decode) share: the per-spec state, the
// operand dtype, attaching the JIT-compiled mods to an attention job (the mods' parameters and job
// fields the backward takes too), and error messages.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "compiler/bindings.h"
#include "compiler/passes/range_analysis.h"
#include "compiler/spec_ir.h"
#include "runtime/cpu/attention_cpu.h"
#include "runtime/cpu/cpu_backend.h"
#include "runtime/cpu/mod_jit.h"
#include "runtime/flexjit.hpp"

namespace flexjit::cpu {

// What every launch of one spec shares, computed once per spec (by canonical IR text).
struct SpecState {
  SpecIR ir;  // the first caller's IR; any later IR with the same canonical text is identical
  std::string canonical;
  RangeInfo ranges;
  // For launches whose queries sit at the end of each sequence's KV (decode, a ragged prefill with
  // queries_at_kv_end): query positions among the KV positions, [0, Skv - 1], as the GPU's decode.
  RangeInfo kv_end_ranges;
  bool mask_uses_b = true, mask_uses_h = true;
};
std::shared_ptr<const SpecState> make_spec_state(const SpecIR& ir, const std::string& canonical);

// f32 / f16 / bf16, else throws naming the dtype.
ElemType elem_type(dsl::DType t);

// Compiles (or fetches) the mods for these launch values and fills the job's mod fields;
// `params` receives the slot array job.params points into. Null when the spec has no mods.
// queries_at_kv_end: the launch's query positions are among its KV positions (st.kv_end_ranges).
std::shared_ptr<const CompiledMods> attach_mods(const SpecState& st, const BoundValues& values, const std::vector<Tensor>& buffers,
                                                const CpuSettings& cfg, AttentionJob& job, std::vector<uint64_t>& params,
                                                bool queries_at_kv_end = false);

// The parameter slots of `mods` for a launch's buffers and values (a buffer with an empty dimension reads zeros).
std::vector<uint64_t> mod_params(const CompiledMods& mods, const std::vector<Tensor>& buffers, const BoundValues& values);

// The fields a forward or backward job takes from its compiled mods; `params` is mod_params' result, which the job
// points into.
template <class Job>
void set_mod_fields(Job& job, const CompiledMods& mods, const std::vector<uint64_t>& params) {
  job.mods = &mods.fns;
  job.has_score_mod = mods.info.has_score_mod;
  job.has_mask_mod = mods.info.has_mask_mod;
  job.row_stage = mods.info.row_values > 0;
  job.col_stage = mods.info.col_values > 0;
  job.tile_stage = mods.info.tile_values > 0;
  job.params = params.data();
  job.state_bytes = mods.info.state_bytes;
}

// The block classification inputs for a launch of `st` at `values`.
BlockSparsity sparsity_of(const SpecState& st, const BoundValues& values);

// The error bits of a launch as a message naming each buffer and load (as the GPU's
// check_errors does).
std::string describe_errors(const SpecIR& ir, const ModModuleInfo& info, uint32_t bits);

// Tile sizes from the settings (0: the defaults).
void apply_tiles(const CpuSettings& cfg, AttentionJob& job);

}  // namespace flexjit::cpu
