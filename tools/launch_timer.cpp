#include "tools/launch_timer.h"

#include <algorithm>
#include <chrono>

#include "dsl/error.h"
#include "runtime/cuda_driver.h"

namespace flexjit::tools {

namespace {

constexpr size_t kL2FlushBytes = size_t(256) << 20;

}  // namespace

std::vector<double> time_launches(const LaunchTiming& t, const std::function<void()>& launch) {
  const runtime::CudaDriver* drv = runtime::cuda_driver();
  for (int i = 0; i < t.warmup; ++i) launch();
  CUdeviceptr flush = 0;
  if (t.flush_l2) runtime::check_cu(drv->cuMemAlloc_v2(&flush, kL2FlushBytes), "allocating the L2 flush buffer");
  std::vector<CUevent> events(2 * size_t(t.iters));
  for (CUevent& e : events) runtime::check_cu(drv->cuEventCreate(&e, 0), "cuEventCreate");
  for (int i = 0; i < t.iters; ++i) {
    if (t.flush_l2) runtime::check_cu(drv->cuMemsetD8Async(flush, 0, kL2FlushBytes, nullptr), "flushing L2");
    runtime::check_cu(drv->cuEventRecord(events[2 * i], nullptr), "cuEventRecord");
    launch();
    runtime::check_cu(drv->cuEventRecord(events[2 * i + 1], nullptr), "cuEventRecord");
  }
  runtime::check_cu(drv->cuEventSynchronize(events.back()), "cuEventSynchronize");
  std::vector<double> ms;
  for (int i = 0; i < t.iters; ++i) {
    float v = 0;
    runtime::check_cu(drv->cuEventElapsedTime_v2(&v, events[2 * i], events[2 * i + 1]), "cuEventElapsedTime");
    ms.push_back(v);
  }
  for (CUevent e : events) drv->cuEventDestroy_v2(e);
  if (flush) drv->cuMemFree_v2(flush);
  std::sort(ms.begin(), ms.end());
  return ms;
}

namespace {

Device cuda_device(const std::string& text, const char* command) {
  Device d = parse_device(text);
  if (d.kind != Device::Kind::Cuda) throw Error(std::string(command) + " times GPU kernels; use --device cuda:N");
  if (!runtime::cuda_driver()) throw Error(runtime::cuda_driver_unavailable_reason());
  return d;
}

}  // namespace

BenchDevice::BenchDevice(const std::string& device_text, const char* command)
    : device_(cuda_device(device_text, command)), drv_(runtime::cuda_driver()), scope_(device_.index) {}

Tensor BenchDevice::add(NpyArray a) {
  placed_.push_back(place(std::move(a), device_));
  return placed_.back().tensor();
}

Tensor BenchDevice::empty(dsl::DType dtype, std::vector<int64_t> shape) {
  placed_.push_back(place_empty(dtype, std::move(shape), device_));
  return placed_.back().tensor();
}

NpyArray unit_scales(int64_t n) {
  NpyArray a;
  a.dtype = dsl::DType::F32;
  a.shape = {n};
  a.data.resize(size_t(n) * 4);
  std::fill(a.as<float>(), a.as<float>() + n, 1.f);
  return a;
}

double host_launch_us(const std::function<void()>& launch) {
  const runtime::CudaDriver* drv = runtime::cuda_driver();
  double best = 1e30;
  for (int round = 0; round < 5; ++round) {
    runtime::check_cu(drv->cuCtxSynchronize(), "synchronise");
    constexpr int kCalls = 20;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kCalls; ++i) launch();
    best = std::min(best, std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / kCalls);
  }
  return best;
}

double median_ms(const std::vector<double>& sorted_ms) { return sorted_ms.empty() ? 0.0 : sorted_ms[sorted_ms.size() / 2]; }

}  // namespace flexjit::tools
