#include "runtime/cpu/attention_cpu.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <system_error>
#include <thread>

#include "dsl/error.h"
#include "runtime/cpu/block_classifier.h"
#include "runtime/cpu/scratch.h"

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

ScratchLayout scratch_layout(const AttentionJob& j) {
  ScratchLayout s;
  ScratchRegions r;
  const size_t M = static_cast<size_t>(j.block_m), N = static_cast<size_t>(j.block_n), CN = static_cast<size_t>(j.chunk_n);
  const size_t D = static_cast<size_t>(j.D), Dv = static_cast<size_t>(j.Dv);
  s.q = r.take(M * D * 4);
  s.k = r.take(CN * D * 4);
  s.v = r.take(CN * Dv * 4);
  s.s = r.take(M * CN * 4);
  s.o = r.take(M * Dv * 4);
  s.row_max = r.take(M * 4);
  s.row_sum = r.take(M * 4);
  s.alpha = r.take(M * 4);
  s.keep = r.take(M * CN);
  s.ones = r.take(2 * N);  // N zeros, then N ones: a tile's keep-all row after its padding columns
  s.state = r.take(M * j.state_bytes);
  s.total = r.total();
  return s;
}

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
  const std::unique_ptr<BlockClassifier> classifier = attach_classifier(sparsity, job);
  const int64_t nqt = (job.Sq + job.block_m - 1) / job.block_m;
  const int64_t heads = job.B * job.H;
  const int64_t items = heads * nqt;
  int64_t threads = options.threads > 0 ? options.threads : static_cast<int64_t>(std::max(1u, std::thread::hardware_concurrency()));
  threads = std::max<int64_t>(1, std::min(threads, items));

  const std::vector<ScratchBlock> scratch = allocate_scratch(static_cast<size_t>(threads), job.scratch.total);

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
