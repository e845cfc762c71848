// The CPU backend's entry point: installs the LLVM-JIT CPU executor into the runtime, so
// launches with Device::cpu() run on this machine's cores, plus its process-wide settings.
#pragma once
#include <string>
#include <vector>

namespace flexjit::cpu {

// Idempotent and thread-safe.
void install();

// Process-wide settings for CPU launches. Defaults come from the environment:
// FLEXJIT_CPU_THREADS (worker threads; 0 or unset = one per hardware thread) and
// FLEXJIT_CPU_ISA (generic | avx2 | avx512; unset = the best this CPU runs) and
// FLEXJIT_CPU_EXACT_MATH=1 (tanh, log1p and pow from the scalar C library, bit for bit as the
// interpreter, instead of glibc's vector math library, within 4 ulp, which lets the row
// loops that use them vectorise).
struct CpuSettings {
  int threads = 0;
  std::string isa;
  int block_m = 0;  // query rows per work item; 0 = default (64)
  int block_n = 0;  // KV rows per tile (also the JIT's staging tile); 0 = default (64)
  int chunk_n = 0;  // most KV rows per Eigen product (whole tiles); 0 = default (256)
  bool exact_math = false;
};
CpuSettings settings();
// Throws flexjit::Error for an ISA this build or CPU cannot run.
void configure(const CpuSettings& s);

// The instruction sets launches can use on this machine ("generic", "avx2", "avx512"), best last.
std::vector<std::string> available_isas();

}  // namespace flexjit::cpu
