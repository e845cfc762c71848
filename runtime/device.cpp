#include "runtime/device.h"

#include <fmt/format.h>

#include <deque>
#include <mutex>

#include "dsl/error.h"
#include "runtime/cuda_driver.h"
#include "runtime/nvrtc.h"

namespace flexjit::runtime {

namespace {

const CudaDriver& driver() {
  const CudaDriver* d = cuda_driver();
  if (!d) throw Error("no CUDA driver: " + cuda_driver_unavailable_reason());
  return *d;
}

struct Registry {
  std::mutex mutex;
  std::deque<DeviceInfo> infos;  // stable addresses
  std::vector<DeviceInfo*> by_ordinal;
};

Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

int device_count() {
  const CudaDriver* d = cuda_driver();
  return d ? d->device_count : 0;
}

const DeviceInfo& device_info(int ordinal) {
  const CudaDriver& d = driver();
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (ordinal < 0 || ordinal >= d.device_count)
    throw Error(fmt::format("there is no device cuda:{}; this machine has {} CUDA device{}", ordinal, d.device_count,
                            d.device_count == 1 ? "" : "s"));
  if (r.by_ordinal.size() < static_cast<size_t>(d.device_count)) r.by_ordinal.resize(d.device_count, nullptr);
  if (r.by_ordinal[ordinal]) return *r.by_ordinal[ordinal];
  DeviceInfo info;
  info.ordinal = ordinal;
  check_cu(d.cuDeviceGet(&info.device, ordinal), "cuDeviceGet");
  check_cu(d.cuDevicePrimaryCtxRetain(&info.context, info.device), "cuDevicePrimaryCtxRetain");
  check_cu(d.cuDeviceGetAttribute(&info.cc_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, info.device), "cuDeviceGetAttribute");
  check_cu(d.cuDeviceGetAttribute(&info.cc_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, info.device), "cuDeviceGetAttribute");
  check_cu(d.cuDeviceGetAttribute(&info.sm_count, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, info.device), "cuDeviceGetAttribute");
  check_cu(d.cuDeviceGetAttribute(&info.max_shared_optin, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, info.device),
           "cuDeviceGetAttribute");
  char name[256] = {};
  check_cu(d.cuDeviceGetName(name, sizeof name, info.device), "cuDeviceGetName");
  info.name = name;
  if (info.cc_major < 8)
    throw Error(fmt::format("device cuda:{} ({}) has compute capability {}.{}; flexjit's kernels need 8.0 or newer", ordinal, info.name,
                            info.cc_major, info.cc_minor));
  info.arch = arch_for_compute_capability(info.cc_major, info.cc_minor);
  r.infos.push_back(info);
  r.by_ordinal[ordinal] = &r.infos.back();
  return r.infos.back();
}

ScopedDevice::ScopedDevice(int ordinal) {
  const CudaDriver& d = driver();
  const DeviceInfo& info = device_info(ordinal);
  check_cu(d.cuCtxGetCurrent(&previous_), "cuCtxGetCurrent");
  if (previous_ != info.context) check_cu(d.cuCtxSetCurrent(info.context), "cuCtxSetCurrent");
}

ScopedDevice::~ScopedDevice() {
  const CudaDriver* d = cuda_driver();
  CUcontext now = nullptr;
  if (d && d->cuCtxGetCurrent(&now) == CUDA_SUCCESS && now != previous_) d->cuCtxSetCurrent(previous_);
}

int pointer_device(const void* ptr) {
  const CudaDriver* d = cuda_driver();
  if (!d || !ptr) return -1;
  CUpointer_attribute attrs[2] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL};
  unsigned int memtype = 0;
  int ordinal = -1;
  void* data[2] = {&memtype, &ordinal};
  if (d->cuPointerGetAttributes(2, attrs, data, reinterpret_cast<CUdeviceptr>(ptr)) != CUDA_SUCCESS) return -1;
  if (memtype != CU_MEMORYTYPE_DEVICE && memtype != CU_MEMORYTYPE_UNIFIED) return -1;
  return ordinal;
}

}  // namespace flexjit::runtime
