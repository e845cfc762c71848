#include "runtime/cpu/mod_jit.h"

#include <fmt/format.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>

#include "compiler/codegen/kernel_source.h"
#include "runtime/cpu/llvm_jit.h"
#include "runtime/log.h"

namespace flexjit::cpu {

namespace {

struct CacheSlot {
  std::mutex mutex;  // held while compiling, so concurrent requests for one key compile once
  std::shared_ptr<const CompiledMods> mods;
};

std::mutex& cache_mutex() {
  static std::mutex m;
  return m;
}
std::map<std::string, std::shared_ptr<CacheSlot>>& cache() {
  static std::map<std::string, std::shared_ptr<CacheSlot>> c;
  return c;
}
std::atomic<size_t> g_compiles{0};

std::shared_ptr<const CompiledMods> build(const SpecIR& ir, const RangeInfo& ranges, const CodeGenOptions& options) {
  auto t0 = std::chrono::steady_clock::now();
  JitEngine& jit = JitEngine::instance();
  CodeGenLLVM gen(ir, ranges, options);
  auto ctx = std::make_unique<llvm::LLVMContext>();
  std::unique_ptr<llvm::Module> module = gen.generate(*ctx, jit.target(), jit.next_prefix());
  auto mods = std::make_shared<CompiledMods>();
  mods->info = gen.info();
  std::vector<void*> addr = jit.add(std::move(module), std::move(ctx), mods->info.function_names);
  mods->fns.row = reinterpret_cast<RowStageFn>(addr.at(0));
  mods->fns.col = reinterpret_cast<ColStageFn>(addr.at(1));
  mods->fns.tile = reinterpret_cast<TileStageFn>(addr.at(2));
  mods->fns.score = reinterpret_cast<ScoreRowFn>(addr.at(3));
  mods->fns.mask = reinterpret_cast<MaskRowFn>(addr.at(4));
  if (mods->info.has_grad) mods->fns.grad = reinterpret_cast<GradRowFn>(addr.at(5));
  mods->jit_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  ++g_compiles;
  runtime::log_info(
      "cpu: JIT-compiled the {}mods of spec `{}` for {} ({}, KV tile {}, {} row / {} col / {} tile values, {} checked loads, {}) in {:.1f} ms",
      mods->info.has_grad ? "backward " : "", ir.spec().name, jit.target().cpu, jit.target().triple, options.tile_size, mods->info.row_values, mods->info.col_values,
      mods->info.tile_values, mods->info.loads.size(),
      options.vector_math && !jit.target().vector_math_isas.empty() ? "libmvec for tanh/log1p/pow" : "scalar libm", mods->jit_ms);
  return mods;
}

}  // namespace

std::shared_ptr<const CompiledMods> compile_mods(const SpecIR& ir, const RangeInfo& ranges, const CodeGenOptions& options,
                                                 const std::string& canonical_ir) {
  std::string key = fmt::format("{}\ntile {}\nchecked {:x}\nhoist {}\nvector_math {}\ngrad {}\n",
                                canonical_ir.empty() ? canonical_ir_text(ir) : canonical_ir, options.tile_size, options.checked_loads,
                                options.hoist ? 1 : 0, options.vector_math ? 1 : 0, options.gradient ? 1 : 0);
  std::shared_ptr<CacheSlot> slot;
  {
    std::lock_guard<std::mutex> lock(cache_mutex());
    auto& s = cache()[key];
    if (!s) s = std::make_shared<CacheSlot>();
    slot = s;
  }
  std::lock_guard<std::mutex> lock(slot->mutex);
  if (!slot->mods) slot->mods = build(ir, ranges, options);
  return slot->mods;
}

size_t jit_compile_count() { return g_compiles.load(); }

}  // namespace flexjit::cpu
