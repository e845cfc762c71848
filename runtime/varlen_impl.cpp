// KernelImpl's ragged-prefill launches (placeholder until the GPU path lands).
#include "dsl/error.h"
#include "runtime/cpu_executor.h"
#include "runtime/kernel_impl.h"

namespace flexjit {

void CpuExecutor::forward_varlen(const SpecIR&, const VarlenArgs&) { throw Error("this CPU backend has no ragged prefill"); }

void KernelImpl::forward_varlen(const VarlenArgs& a) {
  if (a.device.kind == Device::Kind::Cpu) {
    auto cpu = cpu_executor();
    if (!cpu) throw Error("this build of flexjit has no CPU backend (configure with FLEXJIT_CPU_BACKEND=ON)");
    cpu->forward_varlen(ir_, a);
    return;
  }
  throw Error("ragged prefill on the GPU is not built yet");
}

}  // namespace flexjit
