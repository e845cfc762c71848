// The CPU backward launch: argument checks (with messages saying what, where and how to fix),
// binding, the JIT-compiled gradient module and the job for the backward driver.
#pragma once
#include <memory>
#include <string>

#include "compiler/bindings.h"
#include "compiler/passes/autodiff.h"
#include "compiler/passes/range_analysis.h"
#include "compiler/spec_ir.h"
#include "runtime/cpu/backward_cpu.h"
#include "runtime/cpu/cpu_backend.h"
#include "runtime/cpu/mod_jit.h"
#include "runtime/flexjit.hpp"
#include "runtime/forward_launch.h"

namespace flexjit::cpu {

// What every backward launch of one spec shares (the executor caches it per canonical IR).
struct BackwardSpec {
  SpecIR ir;                   // the spec, with the programs the gradient shares nodes with
  ScoreModGradient gradient;   // differentiate_score_mod(ir)
  RangeInfo ranges;            // analyze_ranges over ir's programs (forward domains)
  std::string canonical;       // backward_cache_key(ir)
  bool mask_uses_b = true, mask_uses_h = true;
  bool d_score_is_one = true;  // d_score is the immediate 1.0 (bias-only mods): dS flows unchanged
};

// canonical_ir_text(ir) plus which buffers require a gradient: specs with equal keys have the
// same gradient and the same compiled backward module.
std::string backward_cache_key(const SpecIR& ir);

// Differentiates and analyses `ir` once. Throws flexjit::Error.
std::shared_ptr<const BackwardSpec> make_backward_spec(const SpecIR& ir);

// What the jobs of one backward launch share: the bound values (the symbols bind to `mods_shape`,
// the buffers and parameters to `binding`, the scale too), the compiled gradient module and its
// parameter slots, and the checked buffer-gradient outputs. A dense launch runs one job, a ragged
// batch one per sequence; run() sums the buffer gradients over all of them.
class BackwardLaunch {
 public:
  // Throws flexjit::Error (a bad `grads` entry, a spec dtype the CPU lacks, the mods' compilation).
  BackwardLaunch(const SpecIR& ir, const BackwardSpec& bs, const runtime::LaunchShape& mods_shape, const AttentionArgs& binding,
                 const std::vector<std::pair<std::string, Tensor>>& grads);
  BackwardLaunch(const BackwardLaunch&) = delete;  // the base job points into the members
  BackwardLaunch& operator=(const BackwardLaunch&) = delete;
  // A job with the heads, head dims, scale, dtype, tiles and mods set; the caller sets B, Sq, Skv,
  // the offsets, the operands and the LSE.
  BackwardJob job() const { return base_; }
  // The jobs in order, then the buffer gradients (overwritten with the sums over the jobs).
  void run(const std::vector<BackwardJob>& jobs) const;

 private:
  const BackwardSpec& bs_;
  CpuSettings cfg_;
  std::vector<Tensor> buffers_;
  BoundValues values_;
  std::vector<int> scatter_target_;
  std::vector<GradOutput> grads_;
  std::shared_ptr<const CompiledMods> mods_;
  std::vector<uint64_t> params_;
  BackwardJob base_;
};

// dq, dk, dv and the requested buffer gradients (BackwardArgs) of a launch of `ir` (whose
// dtype and head dims the operands are checked against); `spec` is make_backward_spec of an
// IR with the same backward_cache_key. Throws flexjit::Error.
void launch_backward(const SpecIR& ir, const BackwardSpec& spec, const BackwardArgs& args);

}  // namespace flexjit::cpu
