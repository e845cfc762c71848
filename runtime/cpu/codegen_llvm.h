// CodeGenLLVM: lowers a spec's staged score_mod / mask_mod IR to LLVM IR with IRBuilder, as
// the row-segment functions of runtime/cpu/mod_abi.h that LLVM's loop vectoriser can widen.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "compiler/codegen/params_layout.h"
#include "compiler/passes/autodiff.h"
#include "compiler/passes/range_analysis.h"
#include "compiler/spec_ir.h"

namespace llvm {
class LLVMContext;
class Module;
}  // namespace llvm

namespace flexjit::cpu {

struct CodeGenOptions {
  int tile_size = 64;          // the driver's KV tile (staging aligns kv // c and kv % c to it)
  uint64_t checked_loads = 0;  // bit i: conditional load i (RangeInfo::loads order) failed its obligation at launch
  bool hoist = true;           // hoist Row / Col / Tile values (false: everything per element, for tests)
  // Let the loop vectoriser call glibc's vector math library (libmvec) for tanh, log1p and
  // pow, whose scalar calls otherwise keep a row loop scalar; within 4 ulp of the scalar C
  // library instead of bit for bit (docs/CPU_BACKEND.md). Off: every function is the scalar
  // C library's, exactly what the interpreter computes.
  bool vector_math = false;
  // When set, the module also has the backward's gradient function (`<prefix>_grad`, see
  // mod_abi.h): d_score and every scatter's coefficient and resolved target. Must be the
  // gradient of the IR the generator is given; must outlive generate().
  const ScoreModGradient* gradient = nullptr;
};

// A load site that can raise an error bit (a checked load), for error messages.
struct FlagSite {
  std::string buffer;      // buffer name
  std::string expression;  // the load as lowered, e.g. "bias[offset[q]]"
  uint32_t bit = 0;
};

// What the driver needs to call a generated module.
struct ModModuleInfo {
  ParamsLayout params;      // the slot array `p` of every function
  int tile_size = 64;
  size_t state_bytes = 0;   // per query row, a multiple of 64
  int row_values = 0, col_values = 0, tile_values = 0;
  bool has_score_mod = false, has_mask_mod = false;
  std::vector<FlagSite> loads;  // checked loads only
  std::vector<std::string> function_names;  // row, col, tile, score, mask[, grad] (the JIT looks these up)
  bool has_grad = false;                    // the module has the gradient function
  std::vector<int> scatter_buffers;         // spec buffer index of each GradScatter (gradient modules)
};

// Where the module will run: from the JIT's target machine.
struct TargetInfo {
  std::string triple, data_layout, cpu, features;
  // libmvec variants the JIT can bind, by x86 vector ABI letter: 'b' (SSE, 4 lanes),
  // 'd' (AVX2, 8), 'e' (AVX-512, 16); empty when libmvec is unavailable.
  std::string vector_math_isas;
};

class CodeGenLLVM {
 public:
  // `ranges` must come from analyze_ranges over ir.score_mod and ir.mask_mod (forward domains).
  CodeGenLLVM(const SpecIR& ir, const RangeInfo& ranges, const CodeGenOptions& options);
  ~CodeGenLLVM();

  // Builds the five functions of mod_abi.h, named `<prefix>_row` ... `<prefix>_mask`, and
  // `<prefix>_grad` when options.gradient is set.
  std::unique_ptr<llvm::Module> generate(llvm::LLVMContext& ctx, const TargetInfo& target, const std::string& prefix);
  const ModModuleInfo& info() const { return info_; }

  struct Impl;  // the staged IR, analyses and state layout (shared with the emitter in the .cpp)

 private:
  std::unique_ptr<Impl> impl_;
  ModModuleInfo info_;
};

// The slot layout of the `p` array for a spec (same scheme as the CUDA variant's Params).
ParamsLayout cpu_params_layout(const SpecIR& ir);

}  // namespace flexjit::cpu
