// JIT-compiled score_mod / mask_mod modules, cached in memory per spec (canonical IR text),
// KV tile size and set of checked loads, so each is generated and compiled once per process.
#pragma once
#include <cstddef>
#include <memory>
#include <string>

#include "compiler/passes/range_analysis.h"
#include "compiler/spec_ir.h"
#include "runtime/cpu/codegen_llvm.h"
#include "runtime/cpu/mod_abi.h"

namespace flexjit::cpu {

struct CompiledMods {
  ModFunctions fns;
  ModModuleInfo info;
  double jit_ms = 0;  // generation + optimisation + machine code, when it was compiled
};

// The compiled mods of `ir` (which must have a score_mod or a mask_mod). `ranges` must come
// from analyze_ranges over ir's mods; `canonical_ir` is canonical_ir_text(ir) (computed when
// empty). Concurrent calls for one key compile once. Throws flexjit::Error.
std::shared_ptr<const CompiledMods> compile_mods(const SpecIR& ir, const RangeInfo& ranges, const CodeGenOptions& options,
                                                 const std::string& canonical_ir = {});

// How many modules this process has JIT-compiled (cache misses), for tests and logs.
size_t jit_compile_count();

}  // namespace flexjit::cpu
