// KernelImpl's backward launches (placeholder until the GPU backward lands).
#include "dsl/error.h"
#include "runtime/cpu_executor.h"
#include "runtime/kernel_impl.h"

namespace flexjit {

void CpuExecutor::backward(const SpecIR&, const BackwardArgs&) { throw Error("this CPU backend has no backward pass"); }

void KernelImpl::backward(const BackwardArgs& a) {
  if (a.device.kind == Device::Kind::Cpu) {
    auto cpu = cpu_executor();
    if (!cpu) throw Error("this build of flexjit has no CPU backend (configure with FLEXJIT_CPU_BACKEND=ON)");
    cpu->backward(ir_, a);
    return;
  }
  throw Error("the GPU backward is not built yet");
}

std::unique_ptr<Workspace> KernelImpl::make_backward_workspace(int, int, int, int, int) {
  throw Error("the GPU backward is not built yet");
}

}  // namespace flexjit
