// KernelImpl's decode plans and runs (placeholder until the GPU path lands).
#include "dsl/error.h"
#include "runtime/cpu_executor.h"
#include "runtime/kernel_impl.h"

namespace flexjit {

void CpuExecutor::decode(const SpecIR&, const DecodePlanOptions&, const DecodeArgs&) { throw Error("this CPU backend has no decode"); }

namespace {
class CpuDecodePlan : public DecodePlan {
 public:
  explicit CpuDecodePlan(DecodePlanOptions o) : options_(o) {}
  const DecodePlanOptions& options() const override { return options_; }
  int num_splits() const override { return 1; }

 private:
  DecodePlanOptions options_;
};
}  // namespace

std::unique_ptr<DecodePlan> KernelImpl::plan_decode(const DecodePlanOptions& o) {
  if (o.device.kind == Device::Kind::Cpu) return std::make_unique<CpuDecodePlan>(o);
  throw Error("decode on the GPU is not built yet");
}

void KernelImpl::decode(const DecodePlan& plan, const DecodeArgs& a) {
  if (plan.options().device.kind == Device::Kind::Cpu) {
    auto cpu = cpu_executor();
    if (!cpu) throw Error("this build of flexjit has no CPU backend (configure with FLEXJIT_CPU_BACKEND=ON)");
    cpu->decode(ir_, plan.options(), a);
    return;
  }
  throw Error("decode on the GPU is not built yet");
}

}  // namespace flexjit
