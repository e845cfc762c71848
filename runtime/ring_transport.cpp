// The in-process ring transport: R virtual ranks of one process hand their packets on by moving them between slots.
#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "dsl/error.h"
#include "runtime/cuda_driver.h"
#include "runtime/device.h"
#include "runtime/ring.h"

namespace flexjit {

InProcessRingTransport::~InProcessRingTransport() { release_events(); }

void InProcessRingTransport::release_events() {
  if (events_.empty()) return;
  if (const runtime::CudaDriver* d = runtime::cuda_driver()) {
    runtime::ScopedDevice scope(device_);
    for (CUevent e : events_) d->cuEventDestroy_v2(e);
  }
  events_.clear();
}

std::vector<int> InProcessRingTransport::local_ranks(int ranks) const {
  if (ranks < 1) throw Error(fmt::format("ring attention: {} ranks; a ring needs at least one", ranks));
  std::vector<int> out(static_cast<size_t>(ranks));
  std::iota(out.begin(), out.end(), 0);
  return out;
}

void InProcessRingTransport::attach(RingHeld& held) {
  if (held.streams.empty()) return;  // host memory: the CPU backend runs its ranks one after another
  if (held.streams.size() != held.packets.size())
    throw Error(fmt::format("ring attention: internal error, {} streams for {} ranks", held.streams.size(), held.packets.size()));
  if (held.device.index == device_ && events_.size() >= held.streams.size()) return;
  release_events();
  device_ = held.device.index;
  runtime::ScopedDevice scope(device_);
  const runtime::CudaDriver* d = runtime::cuda_driver();
  for (size_t i = 0; i < held.streams.size(); ++i) {
    CUevent e = nullptr;
    runtime::check_cu(d->cuEventCreate(&e, CU_EVENT_DISABLE_TIMING), "creating the ring's events");
    events_.push_back(e);
  }
}

void InProcessRingTransport::finish(RingHeld& held) {
  const size_t n = held.packets.size();
  if (n < 2) return;
  if (!held.streams.empty()) {
    if (events_.size() < n || held.device.index != device_)
      throw Error("ring attention: internal error, the in-process transport was not attached to these ranks' streams");
    runtime::ScopedDevice scope(device_);
    const runtime::CudaDriver* d = runtime::cuda_driver();
    // Each packet's next holder waits for its last launches on it.
    for (size_t i = 0; i < n; ++i) runtime::check_cu(d->cuEventRecord(events_[i], held.streams[i]), "recording a ring hop");
    for (size_t i = 0; i < n; ++i)
      runtime::check_cu(d->cuStreamWaitEvent(held.streams[i], events_[(i + n - 1) % n], 0), "ordering a ring hop");
  }
  std::rotate(held.packets.rbegin(), held.packets.rbegin() + 1, held.packets.rend());
}

}  // namespace flexjit
