#include "runtime/cpu/backward_cpu.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <memory>
#include <system_error>
#include <thread>
#include <utility>

#include "dsl/error.h"
#include "runtime/cpu/block_classifier.h"
#include "runtime/cpu/kv_tiles.h"
#include "runtime/cpu/scratch.h"

namespace flexjit::cpu {

namespace {

struct Kernels {
  DeltaKernel delta;
  KvTileKernel kv_tile;
  QTileKernel q_tile;
};

Kernels kernels_for(Isa isa) {
  switch (isa) {
    case Isa::Generic: return {&isa_generic::run_delta, &isa_generic::run_backward_kv_tile, &isa_generic::run_backward_q_tile};
#ifdef FLEXJIT_CPU_HAVE_X86_ISAS
    case Isa::Avx2: return {&isa_avx2::run_delta, &isa_avx2::run_backward_kv_tile, &isa_avx2::run_backward_q_tile};
    case Isa::Avx512: return {&isa_avx512::run_delta, &isa_avx512::run_backward_kv_tile, &isa_avx512::run_backward_q_tile};
#else
    default: break;
#endif
  }
  throw Error(fmt::format("CPU backend: this build has no `{}` backward kernel", isa_name(isa)));
}

BackwardScratchLayout scratch_layout(const BackwardJob& j) {
  BackwardScratchLayout s;
  ScratchRegions r;
  const size_t M = static_cast<size_t>(j.block_m), N = static_cast<size_t>(j.block_n);
  const size_t D = static_cast<size_t>(j.D), Dv = static_cast<size_t>(j.Dv), S = static_cast<size_t>(j.num_scatters);
  const size_t MN = std::max(M, N);
  s.q = r.take(M * D * 4);
  s.d_o = r.take(M * Dv * 4);
  s.k = r.take(N * D * 4);
  s.v = r.take(N * Dv * 4);
  s.s = r.take(M * N * 4);
  s.pre = r.take(M * N * 4);
  s.dp = r.take(M * N * 4);
  s.d_score = r.take(M * N * 4);
  s.keep = r.take(M * N);
  s.ones = r.take(2 * N);  // N zeros, then N ones: a tile's keep-all row after its padding columns
  s.coef = r.take(S * N * 4);
  s.offset = r.take(S * N * 8);
  s.acc_a = r.take(MN * D * 4);   // dK (N x D) or dQ (M x D)
  s.acc_b = r.take(N * Dv * 4);   // dV
  s.state = r.take(M * j.state_bytes);
  s.total = r.total();
  return s;
}

// Runs fn(thread, item) for items [0, count) on `threads` threads (the caller's included).
// Static: item i goes to thread i % threads, so what each thread sums does not depend on
// timing. Otherwise items are handed out by an atomic counter.
void parallel_for(int64_t threads, int64_t count, bool fixed, const std::function<void(int64_t, int64_t)>& fn) {
  std::atomic<int64_t> next{0};
  auto worker = [&](int64_t t) {
    if (fixed) {
      for (int64_t i = t; i < count; i += threads) fn(t, i);
      return;
    }
    for (;;) {
      int64_t i = next.fetch_add(1, std::memory_order_relaxed);
      if (i >= count) break;
      fn(t, i);
    }
  };
  std::vector<std::thread> pool;
  for (int64_t t = 1; t < threads; ++t) {
    try {
      pool.emplace_back(worker, t);
    } catch (const std::system_error&) {
      // Static work cannot be picked up by another thread: run it here once the others end.
      if (fixed) {
        for (std::thread& th : pool) th.join();
        pool.clear();
        for (int64_t r = t; r < threads; ++r) worker(r);
      }
      break;
    }
  }
  worker(0);
  for (std::thread& th : pool) th.join();
}

int64_t numel(const GradOutput& g) {
  int64_t n = 1;
  for (int64_t e : g.shape) n *= e;
  return n;
}

// Adds the threads' float64 copies in thread order (none: zeros) and stores the sums in the gradients' strides.
void write_grads(const std::vector<GradOutput>& grads, std::vector<std::vector<std::vector<double>>> partial) {
  for (size_t g = 0; g < grads.size(); ++g) {
    const GradOutput& out = grads[g];
    const int64_t n = numel(out);
    std::vector<double> sum = partial.empty() ? std::vector<double>(static_cast<size_t>(n), 0.0) : std::move(partial[0][g]);
    for (size_t t = 1; t < partial.size(); ++t) {
      const std::vector<double>& p = partial[t][g];
      for (size_t i = 0; i < sum.size(); ++i) sum[i] += p[i];
    }
    const size_t rank = out.shape.size();
    for (int64_t i = 0; i < n; ++i) {
      int64_t rest = i, at = 0;
      for (size_t d = rank; d-- > 0;) {
        at += (rest % out.shape[d]) * out.strides[d];
        rest /= out.shape[d];
      }
      out.data[at] = static_cast<float>(sum[static_cast<size_t>(i)]);
    }
  }
}

}  // namespace

void run_backward(const std::vector<BackwardJob>& jobs, const BlockSparsity& sparsity, const DriverOptions& options,
                  const std::vector<GradOutput>& grads) {
  Kernels k = kernels_for(options.isa);
  if (jobs.empty()) {
    write_grads(grads, {});
    return;
  }
  // Every job shares the tiles, head dims and mods, hence one scratch layout.
  const BackwardScratchLayout layout = scratch_layout(jobs.front());
  auto tiles = [](const BackwardJob& j, int64_t& nqt, int64_t& nkt) {
    nqt = (j.Sq + j.block_m - 1) / j.block_m;
    nkt = kv_tile_count(j.kv_offset, j.Skv, j.block_n);
    return std::max({j.B * j.H, j.B * j.Hkv * nkt, j.B * j.H * nqt, int64_t{1}});
  };
  int64_t most = 1;
  for (const BackwardJob& j : jobs) {
    int64_t nqt, nkt;
    most = std::max(most, tiles(j, nqt, nkt));
  }
  int64_t max_threads = options.threads > 0 ? options.threads : static_cast<int64_t>(std::max(1u, std::thread::hardware_concurrency()));
  max_threads = std::max<int64_t>(1, std::min(max_threads, most));

  const std::vector<ScratchBlock> scratch = allocate_scratch(static_cast<size_t>(max_threads), layout.total);
  for (const ScratchBlock& block : scratch) {
    char* ones = static_cast<char*>(block.get()) + layout.ones;
    std::memset(ones, 0, static_cast<size_t>(jobs.front().block_n));
    std::memset(ones + jobs.front().block_n, 1, static_cast<size_t>(jobs.front().block_n));
  }

  // Per thread, a float64 copy of every gradient, summed into across all jobs.
  std::vector<std::vector<std::vector<double>>> partial(static_cast<size_t>(max_threads));
  std::vector<std::vector<double*>> grad_ptrs(static_cast<size_t>(max_threads));
  for (int64_t t = 0; t < max_threads; ++t) {
    partial[static_cast<size_t>(t)].resize(grads.size());
    for (size_t g = 0; g < grads.size(); ++g) {
      partial[static_cast<size_t>(t)][g].assign(static_cast<size_t>(numel(grads[g])), 0.0);
      grad_ptrs[static_cast<size_t>(t)].push_back(partial[static_cast<size_t>(t)][g].data());
    }
  }
  const bool fixed = !grads.empty();
  std::vector<float> delta;
  for (BackwardJob job : jobs) {
    job.scratch = layout;
    int64_t nqt, nkt;
    const int64_t threads = std::min(max_threads, tiles(job, nqt, nkt));
    const std::unique_ptr<BlockClassifier> classifier = attach_classifier(sparsity, job);
    delta.assign(static_cast<size_t>(job.B * job.H * job.Sq), 0.0f);
    job.delta = delta.data();

    // Pass 0: delta = rowsum(dO * O), which every block of a row needs.
    parallel_for(threads, job.B * job.H, false, [&](int64_t, int64_t i) { k.delta(job, i / job.H, i % job.H); });

    // Pass 1: dK and dV; the counter balances tiles of uneven work (causal masks).
    parallel_for(threads, job.B * job.Hkv * nkt, false, [&](int64_t t, int64_t i) {
      int64_t bh = i / nkt;
      k.kv_tile(job, scratch[static_cast<size_t>(t)].get(), bh / job.Hkv, bh % job.Hkv, i % nkt);
    });

    // Pass 2: dQ and the scatters, each thread into its own float64 gradient copies.
    parallel_for(threads, job.B * job.H * nqt, fixed, [&](int64_t t, int64_t i) {
      // Later query tiles first: under causal-like masks they have the most KV tiles.
      int64_t qt = nqt - 1 - i / (job.B * job.H), bh = i % (job.B * job.H);
      double* const* g = grad_ptrs[static_cast<size_t>(t)].empty() ? nullptr : grad_ptrs[static_cast<size_t>(t)].data();
      k.q_tile(job, scratch[static_cast<size_t>(t)].get(), g, bh / job.H, bh % job.H, qt);
    });
  }
  write_grads(grads, std::move(partial));
}

}  // namespace flexjit::cpu
