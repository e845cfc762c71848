#include "runtime/cpu/attention_cpu.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <new>
#include <system_error>
#include <thread>

#include "compiler/passes/interval_eval.h"
#include "dsl/error.h"

namespace flexjit::cpu {

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Generic: return "generic";
    case Isa::Avx2: return "avx2";
    case Isa::Avx512: return "avx512";
  }
  return "?";
}

namespace {

// Whether this CPU runs the code built with -march=x86-64-v3 (AVX2, FMA, F16C, BMI) or
// x86-64-v4 (AVX-512 F/BW/CD/DQ/VL).
bool cpu_runs(Isa isa) {
  if (isa == Isa::Generic) return true;
#ifdef FLEXJIT_CPU_HAVE_X86_ISAS
  __builtin_cpu_init();
#if defined(__clang__)
  bool v3 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi") && __builtin_cpu_supports("bmi2");
  bool v4 = v3 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
            __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512cd");
#else
  bool v3 = __builtin_cpu_supports("x86-64-v3");
  bool v4 = __builtin_cpu_supports("x86-64-v4");
#endif
  return isa == Isa::Avx2 ? v3 : v4;
#else
  return false;
#endif
}

QueryTileKernel kernel_for(Isa isa) {
  switch (isa) {
    case Isa::Generic: return &isa_generic::run_query_tile;
#ifdef FLEXJIT_CPU_HAVE_X86_ISAS
    case Isa::Avx2: return &isa_avx2::run_query_tile;
    case Isa::Avx512: return &isa_avx512::run_query_tile;
#else
    default: break;
#endif
  }
  throw Error(fmt::format("CPU backend: this build has no `{}` kernel", isa_name(isa)));
}

size_t align64(size_t v) { return (v + 63) / 64 * 64; }

ScratchLayout scratch_layout(const AttentionJob& j) {
  ScratchLayout s;
  size_t total = 0;
  auto take = [&](size_t bytes) {
    size_t off = total;
    total = align64(total + std::max<size_t>(bytes, 1));
    return off;
  };
  const size_t M = static_cast<size_t>(j.block_m), N = static_cast<size_t>(j.block_n), CN = static_cast<size_t>(j.chunk_n);
  const size_t D = static_cast<size_t>(j.D), Dv = static_cast<size_t>(j.Dv);
  s.q = take(M * D * 4);
  s.k = take(CN * D * 4);
  s.v = take(CN * Dv * 4);
  s.s = take(M * CN * 4);
  s.o = take(M * Dv * 4);
  s.row_max = take(M * 4);
  s.row_sum = take(M * 4);
  s.alpha = take(M * 4);
  s.keep = take(M * CN);
  s.ones = take(N);
  s.state = take(M * j.state_bytes);
  s.total = total;
  return s;
}

// Block classes by interval evaluation of the mask over each (query tile, KV tile) box,
// computed on first use and shared by every work item (and every b / h the mask ignores).
class Classifier {
 public:
  Classifier(const BlockSparsity& s, const AttentionJob& j)
      : mask_(s.ir->mask_mod), values_(*s.values), uses_b_(s.uses_b), uses_h_(s.uses_h), B_(j.B), H_(j.H), Hkv_(j.Hkv), Sq_(j.Sq),
        Skv_(j.Skv), M_(j.block_m), N_(j.block_n) {
    static std::atomic<uint64_t> generations{0};
    generation_ = ++generations;
    bm_ = uses_b_ ? B_ : 1;
    hm_ = uses_h_ ? H_ : 1;
    nqt_ = (Sq_ + M_ - 1) / M_;
    nkt_ = (Skv_ + N_ - 1) / N_;
    int64_t entries = bm_ * hm_ * nqt_ * nkt_;
    // Past a few hundred MB of table, classify every time instead of caching.
    if (entries <= (int64_t{1} << 28)) {
      table_ = std::make_unique<std::atomic<uint8_t>[]>(static_cast<size_t>(entries));
      for (int64_t i = 0; i < entries; ++i) table_[i].store(kUnknown, std::memory_order_relaxed);
    }
    for (const Value& v : values_.params) params_.push_back(v.type == ir::Type::Float ? v.f : v.type == ir::Type::Bool ? (v.b ? 1.0 : 0.0) : double(v.i));
  }

  static uint8_t classify(const void* ctx, int64_t b, int64_t h, int64_t qt, int64_t kt) {
    const Classifier* c = static_cast<const Classifier*>(ctx);
    int64_t bb = c->uses_b_ ? b : 0, hh = c->uses_h_ ? h : 0;
    if (!c->table_) return c->compute(bb, hh, qt, kt);
    std::atomic<uint8_t>& slot = c->table_[((bb * c->hm_ + hh) * c->nqt_ + qt) * c->nkt_ + kt];
    uint8_t v = slot.load(std::memory_order_relaxed);
    if (v != kUnknown) return v;
    v = c->compute(bb, hh, qt, kt);
    slot.store(v, std::memory_order_relaxed);  // racing writers store the same value
    return v;
  }

 private:
  static constexpr uint8_t kUnknown = 0xff;

  uint8_t compute(int64_t b, int64_t h, int64_t qt, int64_t kt) const {
    thread_local IntervalEnv env;
    thread_local uint64_t env_generation = 0;
    if (env_generation != generation_) {
      env.symbols = values_.symbols;
      env.params = params_;
      env_generation = generation_;
    }
    auto set = [&](dsl::VarId v, int64_t lo, int64_t hi) { env.vars[static_cast<int>(v)] = {lo, hi}; };
    if (uses_b_) set(dsl::VarId::B, b, b);
    else set(dsl::VarId::B, 0, B_ - 1);
    if (uses_h_) {
      set(dsl::VarId::H, h, h);
      int64_t hkv = h / (H_ / Hkv_);
      set(dsl::VarId::KvHead, hkv, hkv);
    } else {
      set(dsl::VarId::H, 0, H_ - 1);
      set(dsl::VarId::KvHead, 0, Hkv_ - 1);
    }
    set(dsl::VarId::Q, qt * M_, std::min(Sq_, (qt + 1) * M_) - 1);
    set(dsl::VarId::KV, kt * N_, std::min(Skv_, (kt + 1) * N_) - 1);
    try {
      switch (classify_box(mask_, env)) {
        case TriBool::False: return kTileEmpty;
        case TriBool::True: return kTileFull;
        case TriBool::Unknown: return kTilePartial;
      }
    } catch (...) {
      // Deciding nothing is always sound: the tile is evaluated element by element.
    }
    return kTilePartial;
  }

  ir::Expr mask_;
  const BoundValues& values_;
  std::vector<double> params_;
  bool uses_b_, uses_h_;
  int64_t B_, H_, Hkv_, Sq_, Skv_, M_, N_;
  int64_t bm_ = 1, hm_ = 1, nqt_ = 0, nkt_ = 0;
  uint64_t generation_ = 0;
  std::unique_ptr<std::atomic<uint8_t>[]> table_;
};

struct AlignedFree {
  void operator()(void* p) const { ::operator delete(p, std::align_val_t{64}); }
};

}  // namespace

std::vector<Isa> supported_isas() {
  std::vector<Isa> out;
  for (Isa isa : {Isa::Generic, Isa::Avx2, Isa::Avx512}) {
#ifndef FLEXJIT_CPU_HAVE_X86_ISAS
    if (isa != Isa::Generic) continue;
#endif
    if (cpu_runs(isa)) out.push_back(isa);
  }
  return out;
}

Isa choose_isa(const std::string& requested) {
  std::vector<Isa> ok = supported_isas();
  if (requested.empty()) return ok.back();
  for (Isa isa : {Isa::Generic, Isa::Avx2, Isa::Avx512}) {
    if (requested != isa_name(isa)) continue;
    if (std::find(ok.begin(), ok.end(), isa) == ok.end())
      throw Error(fmt::format("CPU backend: instruction set `{}` is not available on this machine (or not built in); use one of: {}", requested,
                              fmt::join([&] {
                                std::vector<std::string> n;
                                for (Isa i : ok) n.push_back(isa_name(i));
                                return n;
                              }(), ", ")));
    return isa;
  }
  throw Error(fmt::format("CPU backend: unknown instruction set `{}`; use generic, avx2 or avx512", requested));
}

uint32_t run_attention(AttentionJob job, const BlockSparsity& sparsity, const DriverOptions& options) {
  QueryTileKernel kernel = kernel_for(options.isa);
  job.chunk_n = std::max(job.chunk_n / job.block_n, 1) * job.block_n;  // whole tiles
  job.scratch = scratch_layout(job);
  std::unique_ptr<Classifier> classifier;
  if (sparsity.ir && sparsity.ir->mask_mod && sparsity.values) {
    classifier = std::make_unique<Classifier>(sparsity, job);
    job.classify = &Classifier::classify;
    job.classify_ctx = classifier.get();
  }
  const int64_t nqt = (job.Sq + job.block_m - 1) / job.block_m;
  const int64_t heads = job.B * job.H;
  const int64_t items = heads * nqt;
  int64_t threads = options.threads > 0 ? options.threads : static_cast<int64_t>(std::max(1u, std::thread::hardware_concurrency()));
  threads = std::max<int64_t>(1, std::min(threads, items));

  std::vector<std::unique_ptr<void, AlignedFree>> scratch;
  for (int64_t t = 0; t < threads; ++t) scratch.emplace_back(::operator new(job.scratch.total, std::align_val_t{64}));

  std::atomic<int64_t> next{0};
  std::atomic<uint32_t> errors{0};
  // Later query tiles first: under causal-like masks they have the most KV tiles, so
  // handing them out first balances the threads.
  auto worker = [&](int64_t t) {
    uint32_t e = 0;
    for (;;) {
      int64_t i = next.fetch_add(1, std::memory_order_relaxed);
      if (i >= items) break;
      int64_t qt = nqt - 1 - i / heads, bh = i % heads;
      e |= kernel(job, scratch[static_cast<size_t>(t)].get(), bh / job.H, bh % job.H, qt);
    }
    errors.fetch_or(e, std::memory_order_relaxed);
  };
  std::vector<std::thread> pool;
  for (int64_t t = 1; t < threads; ++t) {
    try {
      pool.emplace_back(worker, t);
    } catch (const std::system_error&) {
      break;  // fewer threads than asked for: the others pick up the work
    }
  }
  worker(0);
  for (std::thread& th : pool) th.join();
  return errors.load();
}

}  // namespace flexjit::cpu
