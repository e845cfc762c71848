// The CPU backward driver: rowsum(dO * O), then dK / dV per (b, KV head, KV tile) and dQ plus
// the buffer gradients per (b, head, query tile), each pass over std::threads, with block
// sparsity from the same interval classification as the forward.
#pragma once
#include <cstdint>
#include <vector>

#include "runtime/cpu/attention_cpu.h"
#include "runtime/cpu/backward_tile.h"

namespace flexjit::cpu {

// One buffer gradient the launch writes: f32, the buffer's shape, any strides; overwritten.
struct GradOutput {
  float* data = nullptr;
  std::vector<int64_t> shape, strides;
};

// Runs the whole backward of every job in order (a dense launch has one; a ragged batch one per
// sequence, with the same mods, tiles and head dims). Each job must be complete except for
// `delta`, `scratch`, `classify` and `classify_ctx`, which this fills; job.scatter_target indexes
// `grads`. Each thread sums its scatters of every job into its own float64 copy of every gradient
// and the copies are added in thread order once at the end, so the gradients are the sums over the
// jobs, reproducible for a given thread count.
void run_backward(const std::vector<BackwardJob>& jobs, const BlockSparsity& sparsity, const DriverOptions& options,
                  const std::vector<GradOutput>& grads);

}  // namespace flexjit::cpu
