#include "runtime/cpu/cpu_backend.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
#include <map>
#include <mutex>

#include "compiler/codegen/kernel_source.h"
#include "compiler/passes/dependence.h"
#include "compiler/passes/range_analysis.h"
#include "dsl/error.h"
#include "runtime/cpu/attention_cpu.h"
#include "runtime/cpu/mod_jit.h"
#include "runtime/cpu_executor.h"
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

std::mutex& settings_mutex() {
  static std::mutex m;
  return m;
}

CpuSettings& settings_slot() {
  static CpuSettings s = [] {
    CpuSettings d;
    if (const char* t = std::getenv("FLEXJIT_CPU_THREADS")) d.threads = std::max(0, std::atoi(t));
    if (const char* i = std::getenv("FLEXJIT_CPU_ISA")) d.isa = i;
    if (const char* e = std::getenv("FLEXJIT_CPU_EXACT_MATH")) d.exact_math = std::string(e) == "1";
    return d;
  }();
  return s;
}

// What every launch of one spec shares, computed once per spec (by canonical IR text).
struct SpecState {
  SpecIR ir;  // the first caller's IR; any later IR with the same canonical text is identical
  std::string canonical;
  RangeInfo ranges;
  bool mask_uses_b = true, mask_uses_h = true;
};

ElemType elem_type(dsl::DType t) {
  switch (t) {
    case dsl::DType::F32: return ElemType::F32;
    case dsl::DType::F16: return ElemType::F16;
    case dsl::DType::BF16: return ElemType::BF16;
    default: break;
  }
  throw Error(fmt::format("CPU backend: q, k, v and o must be f32, f16 or bf16, not {}; set the spec's dtype", dsl::dtype_name(t)));
}

Operand operand(const Tensor& t) {
  Operand o;
  o.data = t.data;
  std::vector<int64_t> s = t.effective_strides();
  for (int i = 0; i < 4; ++i) o.stride[i] = s[i];
  return o;
}

// The error bits of a launch as a message naming each buffer and load (as the GPU's
// check_errors does).
std::string describe_errors(const SpecIR& ir, const ModModuleInfo& info, uint32_t bits) {
  std::vector<std::string> problems;
  if (bits & kZeroDivisorBit) problems.push_back("an integer division or modulo met a zero divisor (the result was 0)");
  for (const FlagSite& s : info.loads)
    if (bits & s.bit) problems.push_back(fmt::format("buffer `{}`: an index of `{}` was out of range and was clamped", s.buffer, s.expression));
  if (problems.empty()) problems.push_back(fmt::format("error bits {:#x}", bits));
  return fmt::format("spec `{}` (CPU): {}; check the buffer's declared shape against the indices the expression produces", ir.spec().name,
                     fmt::join(problems, "; "));
}

class Executor : public CpuExecutor {
 public:
  void forward(const SpecIR& ir, const AttentionArgs& a) override {
    const dsl::Spec& spec = ir.spec();
    ElemType et = elem_type(spec.dtype);
    runtime::LaunchShape shape = runtime::validate_operands(spec, a, /*gpu=*/false);
    std::vector<Tensor> buffers = runtime::collect_buffers(spec, a, {});
    BoundValues values = runtime::bind_launch(ir.checked, shape, buffers, a);
    std::shared_ptr<const SpecState> st = state_for(ir);
    CpuSettings cfg = settings();

    AttentionJob job;
    job.B = shape.batch;
    job.H = shape.heads;
    job.Hkv = shape.kv_heads;
    job.Sq = shape.seqlen_q;
    job.Skv = shape.seqlen_kv;
    job.D = shape.head_dim;
    job.Dv = shape.head_dim_v;
    job.scale = a.scale > 0 ? a.scale : static_cast<float>(1.0 / std::sqrt(static_cast<double>(shape.head_dim)));
    job.dtype = et;
    job.q = operand(a.q);
    job.k = operand(a.k);
    job.v = operand(a.v);
    Operand o = operand(a.o);
    job.o.data = a.o.data;
    for (int i = 0; i < 4; ++i) job.o.stride[i] = o.stride[i];
    if (a.lse.data) {
      job.lse = static_cast<float*>(a.lse.data);
      std::vector<int64_t> s = a.lse.effective_strides();
      for (int i = 0; i < 3; ++i) job.lse_stride[i] = s[i];
    }
    job.block_m = cfg.block_m > 0 ? cfg.block_m : kBlockM;
    job.block_n = cfg.block_n > 0 ? cfg.block_n : kBlockN;
    job.chunk_n = cfg.chunk_n > 0 ? cfg.chunk_n : kChunkN;

    std::shared_ptr<const CompiledMods> mods;
    std::vector<uint64_t> params;
    if (st->ir.score_mod || st->ir.mask_mod) {
      runtime::VariantChoice choice = runtime::choose_variant(st->ranges, st->ir.checked, values);
      CodeGenOptions options;
      options.tile_size = job.block_n;
      options.checked_loads = choice.checked_loads;
      options.vector_math = !cfg.exact_math;
      mods = compile_mods(st->ir, st->ranges, options, st->canonical);
      // A buffer with an empty dimension is read (clamped to index 0, flagged) from zeros.
      alignas(64) static const uint64_t zeros[8] = {};
      std::vector<Tensor> safe = buffers;
      for (Tensor& t : safe)
        for (int64_t d : t.shape)
          if (d <= 0) t.data = const_cast<uint64_t*>(zeros);
      params = runtime::fill_variant_params(mods->info.params, safe, values, nullptr);
      job.mods = &mods->fns;
      job.has_score_mod = mods->info.has_score_mod;
      job.has_mask_mod = mods->info.has_mask_mod;
      job.row_stage = mods->info.row_values > 0;
      job.col_stage = mods->info.col_values > 0;
      job.tile_stage = mods->info.tile_values > 0;
      job.params = params.data();
      job.state_bytes = mods->info.state_bytes;
    }
    BlockSparsity sparsity;
    sparsity.ir = &st->ir;
    sparsity.values = &values;
    sparsity.uses_b = st->mask_uses_b;
    sparsity.uses_h = st->mask_uses_h;
    DriverOptions driver;
    driver.threads = cfg.threads;
    driver.isa = choose_isa(cfg.isa);
    uint32_t errors = run_attention(job, sparsity, driver);
    if (errors && mods) throw Error(describe_errors(st->ir, mods->info, errors));
  }

 private:
  std::shared_ptr<const SpecState> state_for(const SpecIR& ir) {
    std::string canonical = canonical_ir_text(ir);
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = specs_.find(canonical);
    if (it != specs_.end()) return it->second;
    auto st = std::make_shared<SpecState>();
    st->ir = ir;
    st->canonical = canonical;
    std::vector<ir::Expr> roots;
    if (st->ir.score_mod) roots.push_back(st->ir.score_mod);
    if (st->ir.mask_mod) roots.push_back(st->ir.mask_mod);
    st->ranges = analyze_ranges(roots, st->ir.checked, VarDomains::forward(st->ir.checked));
    if (st->ir.mask_mod) {
      DependenceInfo deps({st->ir.mask_mod});
      const Dependence& d = deps.of(st->ir.mask_mod);
      st->mask_uses_b = d.uses(dsl::VarId::B);
      st->mask_uses_h = d.uses(dsl::VarId::H) || d.uses(dsl::VarId::KvHead);
    }
    specs_.emplace(canonical, st);
    return st;
  }

  std::mutex mutex_;
  std::map<std::string, std::shared_ptr<const SpecState>> specs_;
};

}  // namespace

void install() {
  static std::once_flag once;
  std::call_once(once, [] { register_cpu_executor(std::make_shared<Executor>()); });
}

CpuSettings settings() {
  std::lock_guard<std::mutex> lock(settings_mutex());
  return settings_slot();
}

void configure(const CpuSettings& s) {
  choose_isa(s.isa);
  if (s.block_m < 0 || s.block_n < 0 || s.chunk_n < 0 || s.block_m > 4096 || s.block_n > 4096 || s.chunk_n > 16384 || s.threads < 0)
    throw Error(fmt::format("CPU backend: invalid settings (threads {}, block_m {}, block_n {}): use 0 for the defaults", s.threads, s.block_m,
                            s.block_n));
  std::lock_guard<std::mutex> lock(settings_mutex());
  settings_slot() = s;
}

std::vector<std::string> available_isas() {
  std::vector<std::string> out;
  for (Isa isa : supported_isas()) out.push_back(isa_name(isa));
  return out;
}

}  // namespace flexjit::cpu
