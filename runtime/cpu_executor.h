// The seam between the runtime and the CPU backend (its own library, so GPU-only builds
// never link LLVM): the CPU backend registers an executor, and launches with Device::cpu()
// go to it.
#pragma once
#include <memory>

#include "compiler/spec_ir.h"
#include "runtime/flexjit.hpp"

namespace flexjit {

class CpuExecutor {
 public:
  virtual ~CpuExecutor() = default;
  // O and LSE on host memory, with the same argument checks and semantics as the GPU.
  virtual void forward(const SpecIR& ir, const AttentionArgs& args) = 0;
  // The other launch kinds; a backend that lacks one throws flexjit::Error saying so.
  virtual void backward(const SpecIR& ir, const BackwardArgs& args);
  virtual void forward_varlen(const SpecIR& ir, const VarlenArgs& args);
  virtual void backward_varlen(const SpecIR& ir, const VarlenBackwardArgs& args);
  virtual void decode(const SpecIR& ir, const DecodePlanOptions& plan, const DecodeArgs& args);
};

// Installs the CPU backend (called by flexjit::cpu::install()).
void register_cpu_executor(std::shared_ptr<CpuExecutor> executor);
// The installed executor, or null when this binary was built without the CPU backend.
std::shared_ptr<CpuExecutor> cpu_executor();

}  // namespace flexjit
