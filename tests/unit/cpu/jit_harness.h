// Runs a spec's JIT-compiled mods (runtime/cpu/mod_abi.h) directly on row segments, with
// the same bindings the interpreter gets, so tests can compare the two point by point.
#pragma once
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <vector>

#include "compiler/bindings.h"
#include "compiler/interpreter.h"
#include "compiler/passes/range_analysis.h"
#include "compiler/spec_ir.h"
#include "runtime/cpu/mod_jit.h"
#include "runtime/flexjit.hpp"
#include "runtime/forward_launch.h"

namespace flexjit::test {

class JitHarness {
 public:
  // `env` supplies symbols, params and buffers exactly as the interpreter reads them.
  JitHarness(const SpecIR& ir, const EvalEnv& env, int tile_size = 64, bool hoist = true, bool vector_math = false) : ir_(ir) {
    std::vector<ir::Expr> roots;
    if (ir.score_mod) roots.push_back(ir.score_mod);
    if (ir.mask_mod) roots.push_back(ir.mask_mod);
    ranges_ = analyze_ranges(roots, ir.checked, VarDomains::forward(ir.checked));
    values_.symbols = env.symbols;
    values_.symbol_bound.assign(env.symbols.size(), true);
    values_.params = env.params;
    values_.params.resize(ir.spec().params.size());
    cpu::CodeGenOptions options;
    options.tile_size = tile_size;
    options.hoist = hoist;
    options.vector_math = vector_math;
    options.checked_loads = runtime::choose_variant(ranges_, ir.checked, values_).checked_loads;
    mods_ = cpu::compile_mods(ir, ranges_, options);
    for (const BufferView& v : env.buffers) {
      Tensor t;
      t.data = const_cast<void*>(v.data);
      t.dtype = v.dtype;
      t.shape = v.shape;
      t.strides = v.strides;
      buffers_.push_back(t);
    }
    params_ = runtime::fill_variant_params(mods_->info.params, buffers_, values_, nullptr);
    state_.reset(static_cast<char*>(::operator new(std::max<size_t>(64, mods_->info.state_bytes), std::align_val_t{64})));
    std::memset(state_.get(), 0xcd, std::max<size_t>(64, mods_->info.state_bytes));  // garbage: every read must be written first
  }

  const cpu::CompiledMods& mods() const { return *mods_; }
  int64_t symbol(const char* name) const { return values_.symbols[ir_.checked.symbol_index(name)]; }

  // Prepares the row state for (b, h, hkv, q) and the KV tile starting at k0.
  void start(int64_t b, int64_t h, int64_t hkv, int64_t q, int64_t k0) {
    const cpu::ModFunctions& f = mods_->fns;
    int64_t tile = mods_->info.tile_size;
    f.row(params_.data(), b, h, hkv, q, state_.get());
    f.col(params_.data(), b, h, hkv, q, std::min(tile, symbol("Skv")), state_.get());
    f.tile(params_.data(), b, h, hkv, q, k0, state_.get());
    b_ = b, h_ = h, hkv_ = hkv, q_ = q, k0_ = k0;
  }

  // score_mod over columns [k0, k0 + scores.size()); returns the error bits.
  uint32_t score(std::vector<float>& scores, const std::vector<uint8_t>& keep) {
    return mods_->fns.score(params_.data(), b_, h_, hkv_, q_, k0_, static_cast<int64_t>(scores.size()), scores.data(), keep.data(), state_.get());
  }
  uint32_t mask(std::vector<uint8_t>& keep) {
    return mods_->fns.mask(params_.data(), b_, h_, hkv_, q_, k0_, static_cast<int64_t>(keep.size()), keep.data(), state_.get());
  }

 private:
  struct AlignedFree {
    void operator()(char* p) const { ::operator delete(p, std::align_val_t{64}); }
  };
  const SpecIR& ir_;
  RangeInfo ranges_;
  BoundValues values_;
  std::shared_ptr<const cpu::CompiledMods> mods_;
  std::vector<Tensor> buffers_;
  std::vector<uint64_t> params_;
  std::unique_ptr<char, AlignedFree> state_;
  int64_t b_ = 0, h_ = 0, hkv_ = 0, q_ = 0, k0_ = 0;
};

// Equal as the semantics require: bit for bit, except that any NaN equals any NaN and
// +0 equals -0 (fminf / fmaxf may pick either zero).
inline bool same_float(float a, float b) {
  if (a != a && b != b) return true;
  if (a == 0 && b == 0) return true;
  uint32_t x, y;
  std::memcpy(&x, &a, 4);
  std::memcpy(&y, &b, 4);
  return x == y;
}

}  // namespace flexjit::test
