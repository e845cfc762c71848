#include "runtime/cpu/llvm_jit.h"

#include <fmt/format.h>
#include <llvm/ExecutionEngine/Orc/Core.h>
#include <llvm/ExecutionEngine/Orc/JITTargetMachineBuilder.h>
#include <llvm/ExecutionEngine/Orc/LLJIT.h>
#include <llvm/ExecutionEngine/Orc/Mangling.h>
#include <llvm/ExecutionEngine/Orc/ThreadSafeModule.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>
#include <llvm/Passes/OptimizationLevel.h>
#include <llvm/Passes/PassBuilder.h>
#include <llvm/ADT/SmallVector.h>
#include <llvm/ADT/StringRef.h>
#include <llvm/Support/Error.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Target/TargetMachine.h>

#include <dlfcn.h>
#include <math.h>

#include <cstdlib>
#include <type_traits>

#include "dsl/error.h"

namespace flexjit::cpu {

namespace {

template <class T>
T check(llvm::Expected<T> v, const char* what) {
  if (!v) throw Error(fmt::format("CPU backend: {}: {}", what, llvm::toString(v.takeError())));
  if constexpr (std::is_reference_v<T>) {
    return *v;
  } else {
    return std::move(*v);
  }
}

void check(llvm::Error e, const char* what) {
  if (e) throw Error(fmt::format("CPU backend: {}: {}", what, llvm::toString(std::move(e))));
}

// O3 for the host CPU: the loop vectoriser widens the row loops (the functions carry the
// host's target-cpu / target-features, so the cost model knows the vector width).
void optimize(llvm::Module& m, llvm::TargetMachine& tm) {
  llvm::LoopAnalysisManager lam;
  llvm::FunctionAnalysisManager fam;
  llvm::CGSCCAnalysisManager cgam;
  llvm::ModuleAnalysisManager mam;
  llvm::PipelineTuningOptions pto;
  pto.LoopVectorization = true;
  pto.SLPVectorization = true;
  llvm::PassBuilder pb(&tm, pto);
  pb.registerModuleAnalyses(mam);
  pb.registerCGSCCAnalyses(cgam);
  pb.registerFunctionAnalyses(fam);
  pb.registerLoopAnalyses(lam);
  pb.crossRegisterProxies(lam, fam, cgam, mam);
  llvm::ModulePassManager mpm = pb.buildPerModuleDefaultPipeline(llvm::OptimizationLevel::O3);
  mpm.run(m, mam);
}

}  // namespace

JitEngine& JitEngine::instance() {
  static JitEngine engine;
  return engine;
}

JitEngine::JitEngine() {
  if (llvm::InitializeNativeTarget() || llvm::InitializeNativeTargetAsmPrinter())
    throw Error("CPU backend: LLVM has no native target for this machine; build LLVM with its host target");
  llvm::orc::JITTargetMachineBuilder jtmb = check(llvm::orc::JITTargetMachineBuilder::detectHost(), "detecting the host CPU");
  jtmb.setCodeGenOptLevel(llvm::CodeGenOptLevel::Aggressive);
  tm_ = check(jtmb.createTargetMachine(), "creating the target machine");
  target_.triple = jtmb.getTargetTriple().str();
  target_.cpu = jtmb.getCPU();
  target_.features = jtmb.getFeatures().getString();
  target_.data_layout = tm_->createDataLayout().getStringRepresentation();
  find_vector_math();
  jit_ = check(llvm::orc::LLJITBuilder().setJITTargetMachineBuilder(std::move(jtmb)).create(), "creating the ORC JIT");
}

JitEngine::~JitEngine() = default;

// glibc's vector math library (libmvec, glibc >= 2.35 for tanhf and log1pf): the variants of
// each ABI whose instructions this CPU has. The library stays loaded for the process.
void JitEngine::find_vector_math() {
  void* lib = dlopen("libmvec.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) return;
  llvm::SmallVector<llvm::StringRef, 128> features;
  llvm::StringRef(target_.features).split(features, ',');
  auto has = [&](const char* f) {
    for (llvm::StringRef x : features)
      if (x.size() > 1 && x[0] == '+' && x.substr(1) == f) return true;
    return false;
  };
  for (char isa : {'b', 'd', 'e'}) {
    if (isa == 'd' && !(has("avx2") && has("fma"))) continue;
    if (isa == 'e' && !(has("avx512f") && has("avx512dq"))) continue;
    unsigned lanes = isa == 'b' ? 4 : isa == 'e' ? 16 : 8;
    std::vector<std::pair<std::string, void*>> found;
    for (const auto& [fn, kinds] : {std::pair<const char*, const char*>{"tanhf", "v"}, {"log1pf", "v"}, {"powf", "vv"}}) {
      std::string name = fmt::format("_ZGV{}N{}{}_{}", isa, lanes, kinds, fn);
      if (void* addr = dlsym(lib, name.c_str())) found.push_back({name, addr});
    }
    if (found.size() != 3) continue;
    target_.vector_math_isas += isa;
    vector_math_.insert(vector_math_.end(), found.begin(), found.end());
  }
}

std::string JitEngine::next_prefix() {
  std::lock_guard<std::mutex> lock(mutex_);
  return fmt::format("fj{}", ++counter_);
}

std::string JitEngine::last_ir() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return last_ir_;
}

std::vector<void*> JitEngine::add(std::unique_ptr<llvm::Module> module, std::unique_ptr<llvm::LLVMContext> context,
                                  const std::vector<std::string>& names) {
  std::lock_guard<std::mutex> lock(mutex_);
  optimize(*module, *tm_);
  if (std::getenv("FLEXJIT_CPU_DUMP_IR")) {
    last_ir_.clear();
    llvm::raw_string_ostream os(last_ir_);
    module->print(os, nullptr);
  }
  std::string dylib_name = module->getName().str();
  llvm::orc::JITDylib& jd = check(jit_->createJITDylib(dylib_name), "creating a JIT dylib");
  llvm::orc::ExecutionSession& es = jit_->getExecutionSession();
  llvm::orc::MangleAndInterner mangle(es, jit_->getDataLayout());
  auto fn = [](auto* f) { return llvm::orc::ExecutorSymbolDef(llvm::orc::ExecutorAddr::fromPtr(f), llvm::JITSymbolFlags::Exported); };
  // The C library's fp32 functions the generated code calls: under their own names (what
  // LLVM lowers llvm.exp.f32 and friends to) and under private names for the calls LLVM must
  // not rewrite (powf, tanhf, log1pf), so all resolve to exactly what the interpreter calls.
  using F1 = float (*)(float);
  using F2 = float (*)(float, float);
  llvm::orc::SymbolMap libm = {
      {mangle("flexjit_powf"), fn(static_cast<F2>(&powf))},   {mangle("flexjit_tanhf"), fn(static_cast<F1>(&tanhf))},
      {mangle("flexjit_log1pf"), fn(static_cast<F1>(&log1pf))}, {mangle("expf"), fn(static_cast<F1>(&expf))},
      {mangle("exp2f"), fn(static_cast<F1>(&exp2f))},         {mangle("logf"), fn(static_cast<F1>(&logf))},
      {mangle("log2f"), fn(static_cast<F1>(&log2f))},         {mangle("sinf"), fn(static_cast<F1>(&sinf))},
      {mangle("cosf"), fn(static_cast<F1>(&cosf))},           {mangle("fmodf"), fn(static_cast<F2>(&fmodf))},
      {mangle("floorf"), fn(static_cast<F1>(&floorf))},       {mangle("ceilf"), fn(static_cast<F1>(&ceilf))},
      {mangle("roundevenf"), fn(static_cast<F1>(&roundevenf))}, {mangle("fminf"), fn(static_cast<F2>(&fminf))},
      {mangle("fmaxf"), fn(static_cast<F2>(&fmaxf))},         {mangle("tanhf"), fn(static_cast<F1>(&tanhf))},
      {mangle("powf"), fn(static_cast<F2>(&powf))},           {mangle("log1pf"), fn(static_cast<F1>(&log1pf))},
  };
  for (const auto& [name, addr] : vector_math_) libm[mangle(name)] = fn(addr);
  check(jd.define(llvm::orc::absoluteSymbols(std::move(libm))), "binding the C math library");
  check(jit_->addIRModule(jd, llvm::orc::ThreadSafeModule(std::move(module), std::move(context))), "adding a module");
  std::vector<void*> out;
  for (const std::string& n : names) out.push_back(check(jit_->lookup(jd, n), "linking generated code").toPtr<void*>());
  return out;
}

}  // namespace flexjit::cpu
