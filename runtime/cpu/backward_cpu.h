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

// Runs the whole backward. `job` must be complete except for `delta`, `scratch`, `classify`
// and `classify_ctx`, which this fills; job.scatter_target indexes `grads`. Each thread sums
// its scatters into its own float64 copy of every gradient and the copies are added in thread
// order, so the results are reproducible for a given thread count.
void run_backward(BackwardJob job, const BlockSparsity& sparsity, const DriverOptions& options, const std::vector<GradOutput>& grads);

}  // namespace flexjit::cpu
