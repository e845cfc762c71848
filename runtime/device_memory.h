// Owned device allocations with host copies, for the CLI, tests and benchmarks (the launch
// path itself never allocates).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "runtime/flexjit.hpp"

namespace flexjit::runtime {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(int device, size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return reinterpret_cast<void*>(ptr_); }
  size_t bytes() const { return bytes_; }
  int device() const { return device_; }
  void upload(const void* host, size_t bytes);
  void download(void* host, size_t bytes) const;
  void fill_bytes(unsigned char value);  // e.g. 0xff poisons floats with NaN

 private:
  int device_ = -1;
  uint64_t ptr_ = 0;
  size_t bytes_ = 0;
};

}  // namespace flexjit::runtime
