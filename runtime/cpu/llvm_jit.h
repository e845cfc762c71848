// The process-wide LLVM ORC JIT: optimises generated modules for the host CPU (O3, so the
// row loops vectorise) and links them into executable memory.
#pragma once
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "runtime/cpu/codegen_llvm.h"

namespace llvm {
class TargetMachine;
namespace orc {
class LLJIT;
}
}  // namespace llvm

namespace flexjit::cpu {

class JitEngine {
 public:
  // The engine, created on first use (initialises LLVM's native target). Throws flexjit::Error
  // when LLVM cannot target this machine.
  static JitEngine& instance();
  ~JitEngine();

  const TargetInfo& target() const { return target_; }

  // Optimises `module` (which must live in `context`) and adds it to its own JIT dylib;
  // returns the addresses of `names` in order. The code stays loaded for the process's
  // lifetime. Thread-safe. Throws flexjit::Error on failure.
  std::vector<void*> add(std::unique_ptr<llvm::Module> module, std::unique_ptr<llvm::LLVMContext> context,
                         const std::vector<std::string>& names);

  // A fresh module name prefix (`fj<N>`), unique in the process.
  std::string next_prefix();

  // The optimised LLVM IR text of the last module added (for debugging dumps), when
  // FLEXJIT_CPU_DUMP_IR is set in the environment.
  std::string last_ir() const;

 private:
  JitEngine();
  void find_vector_math();
  std::unique_ptr<llvm::orc::LLJIT> jit_;
  std::unique_ptr<llvm::TargetMachine> tm_;
  TargetInfo target_;
  std::vector<std::pair<std::string, void*>> vector_math_;  // libmvec functions generated code may call
  mutable std::mutex mutex_;
  int counter_ = 0;
  std::string last_ir_;
};

}  // namespace flexjit::cpu
