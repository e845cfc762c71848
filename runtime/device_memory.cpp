#include "runtime/device_memory.h"

#include <utility>

#include "runtime/cuda_driver.h"
#include "runtime/device.h"

namespace flexjit::runtime {

DeviceBuffer::DeviceBuffer(int device, size_t bytes) : device_(device), bytes_(bytes) {
  ScopedDevice d(device);
  CUdeviceptr p = 0;
  check_cu(cuda_driver()->cuMemAlloc_v2(&p, bytes ? bytes : 1), "cuMemAlloc");
  ptr_ = p;
}

DeviceBuffer::~DeviceBuffer() {
  if (!ptr_) return;
  if (const CudaDriver* d = cuda_driver()) {
    ScopedDevice s(device_);
    d->cuMemFree_v2(static_cast<CUdeviceptr>(ptr_));
  }
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept
    : device_(o.device_), ptr_(std::exchange(o.ptr_, 0)), bytes_(std::exchange(o.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    this->~DeviceBuffer();
    device_ = o.device_;
    ptr_ = std::exchange(o.ptr_, 0);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

void DeviceBuffer::upload(const void* host, size_t bytes) {
  ScopedDevice d(device_);
  check_cu(cuda_driver()->cuMemcpyHtoD_v2(static_cast<CUdeviceptr>(ptr_), host, bytes), "cuMemcpyHtoD");
}

void DeviceBuffer::download(void* host, size_t bytes) const {
  ScopedDevice d(device_);
  check_cu(cuda_driver()->cuCtxSynchronize(), "cuCtxSynchronize");
  check_cu(cuda_driver()->cuMemcpyDtoH_v2(host, static_cast<CUdeviceptr>(ptr_), bytes), "cuMemcpyDtoH");
}

void DeviceBuffer::fill_bytes(unsigned char value) {
  ScopedDevice d(device_);
  check_cu(cuda_driver()->cuMemsetD8_v2(static_cast<CUdeviceptr>(ptr_), value, bytes_), "cuMemsetD8");
}

}  // namespace flexjit::runtime
