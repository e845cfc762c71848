// How the bench commands time GPU work: CUDA events around each launch, the way
// triton.testing.do_bench times the PyTorch side of bench/ (so both columns of a table are
// measured alike).
#pragma once

#include <functional>
#include <vector>

namespace flexjit::tools {

struct LaunchTiming {
  int warmup = 10;
  int iters = 50;
  // Evict L2 (write 256 MB) before each timed launch, as do_bench does.
  bool flush_l2 = true;
};

// Runs `launch` warmup times, then iters times between a pair of events each, and returns the
// iters times in milliseconds, sorted. Every launch is queued before the host waits for any of
// them: waiting after each one would leave the GPU idle while the host queues the next launch,
// and the events would then count that host time (several microseconds) as kernel time.
std::vector<double> time_launches(const LaunchTiming& t, const std::function<void()>& launch);

// Host-side cost of one launch in microseconds: wall time per call of back-to-back launches
// (the GPU queue absorbs them), the best of five rounds since the host may be interrupted.
double host_launch_us(const std::function<void()>& launch);

// The median of sorted times.
double median_ms(const std::vector<double>& sorted_ms);

}  // namespace flexjit::tools
