// Per-device state: the primary context, attributes read once, the architecture to compile
// for, and which device a pointer lives on (for the launch-time pointer checks).
#pragma once
#include <cuda.h>

#include <string>

namespace flexjit::runtime {

struct DeviceInfo {
  int ordinal = 0;
  CUdevice device = 0;
  CUcontext context = nullptr;  // the primary context, retained for the process
  int cc_major = 0, cc_minor = 0;
  int sm_count = 0;
  int max_shared_optin = 0;     // bytes of dynamic shared memory a block may opt into
  std::string name;
  std::string arch;             // "sm_90a" on Hopper: what NVRTC compiles for
};

// Number of CUDA devices (0 without a driver or device).
int device_count();

// The device's info, initialising it on first use. Throws flexjit::Error for a bad ordinal
// or when no driver is present (with the reason).
const DeviceInfo& device_info(int ordinal);

// Makes the device's primary context current on this thread for the scope.
class ScopedDevice {
 public:
  explicit ScopedDevice(int ordinal);
  ~ScopedDevice();
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;

 private:
  CUcontext previous_ = nullptr;
};

// The ordinal of the device holding `ptr`, or -1 for host memory or an unknown pointer.
int pointer_device(const void* ptr);

}  // namespace flexjit::runtime
