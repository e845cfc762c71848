// How the bench commands time GPU work: CUDA events around each launch, the way
// triton.testing.do_bench times the PyTorch side of bench/ (so both columns of a table are
// measured alike).
#pragma once

#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "runtime/cuda_driver.h"
#include "runtime/device.h"
#include "tools/tensor_io.h"

namespace flexjit::tools {

// What every bench command sets up first: the CUDA device it times (current while this lives; an error naming the
// command for a CPU device or a missing driver) and the tensors it places there.
class BenchDevice {
 public:
  BenchDevice(const std::string& device_text, const char* command);
  const Device& device() const { return device_; }
  const runtime::CudaDriver& driver() const { return *drv_; }
  // `a` copied to the device, kept alive as long as this.
  Tensor add(NpyArray a);
  // Uninitialised device memory of that shape.
  Tensor empty(dsl::DType dtype, std::vector<int64_t> shape);

 private:
  Device device_;
  const runtime::CudaDriver* drv_;
  runtime::ScopedDevice scope_;
  std::deque<PlacedTensor> placed_;
};

// An f32 [n] array of ones: the dequantisation scales of an FP8 K / V in the benches.
NpyArray unit_scales(int64_t n);

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
