#include "runtime/cpu/forward_common.h"

#include <fmt/format.h>

#include "compiler/codegen/decode_source.h"
#include "compiler/codegen/kernel_source.h"
#include "compiler/passes/dependence.h"
#include "dsl/error.h"
#include "runtime/forward_launch.h"

namespace flexjit::cpu {

namespace {

// Query rows per work item and KV rows per tile. 64 x 64 keeps the score tile, K, V and the
// O accumulator of a work item in L2 and the block classification as fine as the GPU's.
constexpr int kBlockM = 64;
constexpr int kBlockN = 64;
// Consecutive non-empty KV tiles are multiplied together, up to this many KV rows: Eigen
// packs both operands of every product, and wider products amortise the packing.
constexpr int kChunkN = 256;

}  // namespace

std::shared_ptr<const SpecState> make_spec_state(const SpecIR& ir, const std::string& canonical) {
  auto st = std::make_shared<SpecState>();
  st->ir = ir;
  st->canonical = canonical;
  std::vector<ir::Expr> roots;
  if (st->ir.score_mod) roots.push_back(st->ir.score_mod);
  if (st->ir.mask_mod) roots.push_back(st->ir.mask_mod);
  st->ranges = analyze_ranges(roots, st->ir.checked, VarDomains::forward(st->ir.checked));
  st->kv_end_ranges = analyze_ranges(roots, st->ir.checked, decode_var_domains(st->ir.checked));
  if (st->ir.mask_mod) {
    DependenceInfo deps({st->ir.mask_mod});
    const Dependence& d = deps.of(st->ir.mask_mod);
    st->mask_uses_b = d.uses(dsl::VarId::B);
    st->mask_uses_h = d.uses(dsl::VarId::H) || d.uses(dsl::VarId::KvHead);
  }
  return st;
}

ElemType elem_type(dsl::DType t) {
  switch (t) {
    case dsl::DType::F32: return ElemType::F32;
    case dsl::DType::F16: return ElemType::F16;
    case dsl::DType::BF16: return ElemType::BF16;
    default: break;
  }
  throw Error(fmt::format("CPU backend: q, k, v and o must be f32, f16 or bf16, not {}; set the spec's dtype", dsl::dtype_name(t)));
}

void apply_tiles(const CpuSettings& cfg, AttentionJob& job) {
  job.block_m = cfg.block_m > 0 ? cfg.block_m : kBlockM;
  job.block_n = cfg.block_n > 0 ? cfg.block_n : kBlockN;
  job.chunk_n = cfg.chunk_n > 0 ? cfg.chunk_n : kChunkN;
}

std::shared_ptr<const CompiledMods> attach_mods(const SpecState& st, const BoundValues& values, const std::vector<Tensor>& buffers,
                                                const CpuSettings& cfg, AttentionJob& job, std::vector<uint64_t>& params,
                                                bool queries_at_kv_end) {
  if (!st.ir.score_mod && !st.ir.mask_mod) return nullptr;
  // Queries at the end of their KV reach positions up to Skv - 1: a load the forward's ranges prove in range (t[q]
  // with t sized Sq) may not be, so those launches compile with their own ranges (a module of its own).
  const RangeInfo& ranges = queries_at_kv_end ? st.kv_end_ranges : st.ranges;
  runtime::VariantChoice choice = runtime::choose_variant(ranges, st.ir.checked, values);
  CodeGenOptions options;
  options.tile_size = job.block_n;
  options.checked_loads = choice.checked_loads;
  options.vector_math = !cfg.exact_math;
  std::shared_ptr<const CompiledMods> mods =
      compile_mods(st.ir, ranges, options,
                   queries_at_kv_end ? (st.canonical.empty() ? canonical_ir_text(st.ir) : st.canonical) + "\nqueries at the end of their KV"
                                     : st.canonical);
  params = mod_params(*mods, buffers, values);
  set_mod_fields(job, *mods, params);
  return mods;
}

std::vector<uint64_t> mod_params(const CompiledMods& mods, const std::vector<Tensor>& buffers, const BoundValues& values) {
  // A buffer with an empty dimension is read (clamped to index 0, flagged) from zeros.
  alignas(64) static const uint64_t zeros[8] = {};
  std::vector<Tensor> safe = buffers;
  for (Tensor& t : safe)
    for (int64_t d : t.shape)
      if (d <= 0) t.data = const_cast<uint64_t*>(zeros);
  return runtime::fill_variant_params(mods.info.params, safe, values, nullptr);
}

BlockSparsity sparsity_of(const SpecState& st, const BoundValues& values) {
  BlockSparsity sparsity;
  sparsity.ir = &st.ir;
  sparsity.values = &values;
  sparsity.uses_b = st.mask_uses_b;
  sparsity.uses_h = st.mask_uses_h;
  return sparsity;
}

std::string describe_errors(const SpecIR& ir, const ModModuleInfo& info, uint32_t bits) {
  std::vector<std::string> problems;
  if (bits & kZeroDivisorBit) problems.push_back("an integer division or modulo met a zero divisor (the result was 0)");
  for (const FlagSite& s : info.loads)
    if (bits & s.bit) problems.push_back(fmt::format("buffer `{}`: an index of `{}` was out of range and was clamped", s.buffer, s.expression));
  if (problems.empty()) problems.push_back(fmt::format("error bits {:#x}", bits));
  return fmt::format("spec `{}` (CPU): {}; check the buffer's declared shape against the indices the expression produces", ir.spec().name,
                     fmt::join(problems, "; "));
}

}  // namespace flexjit::cpu
