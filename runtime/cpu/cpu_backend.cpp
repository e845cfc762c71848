#include "runtime/cpu/cpu_backend.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
#include <map>
#include <mutex>

#include "compiler/codegen/kernel_source.h"
#include "dsl/error.h"
#include "runtime/cpu/attention_cpu.h"
#include "runtime/cpu/backward_launch.h"
#include "runtime/cpu/forward_common.h"
#include "runtime/cpu/ragged_launch.h"
#include "runtime/cpu_executor.h"
#include "runtime/forward_launch.h"

namespace flexjit::cpu {

namespace {

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

Operand operand(const Tensor& t) {
  Operand o;
  o.data = t.data;
  std::vector<int64_t> s = t.effective_strides();
  for (int i = 0; i < 4; ++i) o.stride[i] = s[i];
  return o;
}

class Executor : public CpuExecutor {
 public:
  void forward(const SpecIR& ir, const AttentionArgs& a) override {
    const dsl::Spec& spec = ir.spec();
    ElemType et = elem_type(spec.dtype);
    runtime::LaunchShape shape = runtime::validate_operands(spec, a, /*gpu=*/false);
    std::vector<Tensor> buffers = runtime::collect_buffers(spec, a, {});
    // A shard of a longer sequence: the mods see Sq and Skv of the whole sequence, and global positions.
    BoundValues values = runtime::bind_launch(ir.checked, runtime::mods_shape(shape, runtime::window_of(a)), buffers, a);
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
    job.q_offset = a.q_offset;
    job.kv_offset = a.kv_offset;
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
    apply_tiles(cfg, job);
    std::vector<uint64_t> params;
    std::shared_ptr<const CompiledMods> mods = attach_mods(*st, values, buffers, cfg, job, params);
    DriverOptions driver;
    driver.threads = cfg.threads;
    driver.isa = choose_isa(cfg.isa);
    uint32_t errors = run_attention(job, sparsity_of(*st, values), driver);
    if (errors && mods) throw Error(describe_errors(st->ir, mods->info, errors));
  }

  void forward_varlen(const SpecIR& ir, const VarlenArgs& a) override { launch_varlen(*state_for(ir), ir, a); }

  void decode(const SpecIR& ir, const DecodePlanOptions& plan, const DecodeArgs& a) override { launch_decode(*state_for(ir), ir, plan, a); }

  void backward(const SpecIR& ir, const BackwardArgs& a) override { launch_backward(ir, *backward_spec_for(ir), a); }
  void backward_varlen(const SpecIR& ir, const VarlenBackwardArgs& a) override { launch_backward_varlen(ir, *backward_spec_for(ir), a); }

 private:
  std::shared_ptr<const BackwardSpec> backward_spec_for(const SpecIR& ir) {
    std::string canonical = backward_cache_key(ir);
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = backward_specs_.find(canonical);
    if (it != backward_specs_.end()) return it->second;
    std::shared_ptr<const BackwardSpec> bs = make_backward_spec(ir);
    backward_specs_.emplace(canonical, bs);
    return bs;
  }

  std::shared_ptr<const SpecState> state_for(const SpecIR& ir) {
    std::string canonical = canonical_ir_text(ir);
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = specs_.find(canonical);
    if (it != specs_.end()) return it->second;
    std::shared_ptr<const SpecState> st = make_spec_state(ir, canonical);
    specs_.emplace(canonical, st);
    return st;
  }

  std::mutex mutex_;
  std::map<std::string, std::shared_ptr<const SpecState>> specs_;
  std::map<std::string, std::shared_ptr<const BackwardSpec>> backward_specs_;
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
