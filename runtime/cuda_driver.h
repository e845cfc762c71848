// The CUDA driver API, loaded with dlopen("libcuda.so.1") so that binaries start without a driver.
#pragma once
// Only the types, enums and declarations of cuda.h are used; nothing links against libcuda.
#include <cuda.h>

#include <string>

#if defined(CUDA_API_PER_THREAD_DEFAULT_STREAM)
#error "flexjit resolves the legacy-default-stream driver entry points; do not define CUDA_API_PER_THREAD_DEFAULT_STREAM"
#endif

namespace flexjit::runtime {

// Every driver entry point flexjit uses: X(symbol, name, version).
// `symbol` is the exact exported name whose declaration in cuda.h gives the member's type (the
// versioned name where cuda.h #defines the plain one to it, e.g. cuMemAlloc -> cuMemAlloc_v2).
// `name` and `version` are what cuGetProcAddress needs to find the same ABI when dlsym cannot
// (`version` is the CUDA version that introduced this ABI, from cudaTypedefs.h's PFN_* names).
// Careful: the plain name may mean a different ABI at the current CUDA version (CUDA 13's
// cuCtxSynchronize takes a context), so the version pins the one declared here.
#define FLEXJIT_CUDA_DRIVER_REQUIRED(X)                                       \
  X(cuGetErrorName, "cuGetErrorName", 6000)                                   \
  X(cuGetErrorString, "cuGetErrorString", 6000)                               \
  X(cuInit, "cuInit", 2000)                                                   \
  X(cuDriverGetVersion, "cuDriverGetVersion", 2020)                           \
  X(cuDeviceGet, "cuDeviceGet", 2000)                                         \
  X(cuDeviceGetCount, "cuDeviceGetCount", 2000)                               \
  X(cuDeviceGetName, "cuDeviceGetName", 2000)                                 \
  X(cuDeviceGetAttribute, "cuDeviceGetAttribute", 2000)                       \
  X(cuDeviceTotalMem_v2, "cuDeviceTotalMem", 3020)                            \
  X(cuDeviceGetPCIBusId, "cuDeviceGetPCIBusId", 4010)                         \
  X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", 7000)               \
  X(cuDevicePrimaryCtxRelease_v2, "cuDevicePrimaryCtxRelease", 11000)         \
  X(cuCtxSetCurrent, "cuCtxSetCurrent", 4000)                                 \
  X(cuCtxGetCurrent, "cuCtxGetCurrent", 4000)                                 \
  X(cuCtxGetDevice, "cuCtxGetDevice", 2000)                                   \
  X(cuCtxPushCurrent_v2, "cuCtxPushCurrent", 4000)                            \
  X(cuCtxPopCurrent_v2, "cuCtxPopCurrent", 4000)                              \
  X(cuCtxSynchronize, "cuCtxSynchronize", 2000)                               \
  X(cuLibraryLoadData, "cuLibraryLoadData", 12000)                            \
  X(cuLibraryUnload, "cuLibraryUnload", 12000)                                \
  X(cuLibraryGetKernel, "cuLibraryGetKernel", 12000)                          \
  X(cuKernelGetFunction, "cuKernelGetFunction", 12000)                        \
  X(cuKernelGetAttribute, "cuKernelGetAttribute", 12000)                      \
  X(cuKernelSetAttribute, "cuKernelSetAttribute", 12000)                      \
  X(cuFuncGetAttribute, "cuFuncGetAttribute", 2020)                           \
  X(cuFuncSetAttribute, "cuFuncSetAttribute", 9000)                           \
  X(cuOccupancyMaxActiveBlocksPerMultiprocessor,                              \
    "cuOccupancyMaxActiveBlocksPerMultiprocessor", 6050)                      \
  X(cuLaunchKernel, "cuLaunchKernel", 4000)                                   \
  X(cuMemAlloc_v2, "cuMemAlloc", 3020)                                        \
  X(cuMemFree_v2, "cuMemFree", 3020)                                          \
  X(cuMemGetInfo_v2, "cuMemGetInfo", 3020)                                    \
  X(cuMemcpyHtoD_v2, "cuMemcpyHtoD", 3020)                                    \
  X(cuMemcpyDtoH_v2, "cuMemcpyDtoH", 3020)                                    \
  X(cuMemcpyHtoDAsync_v2, "cuMemcpyHtoDAsync", 3020)                          \
  X(cuMemcpyDtoHAsync_v2, "cuMemcpyDtoHAsync", 3020)                          \
  X(cuMemsetD8_v2, "cuMemsetD8", 3020)                                        \
  X(cuMemsetD32_v2, "cuMemsetD32", 3020)                                      \
  X(cuMemsetD8Async, "cuMemsetD8Async", 3020)                                 \
  X(cuMemsetD32Async, "cuMemsetD32Async", 3020)                               \
  X(cuStreamCreate, "cuStreamCreate", 2000)                                   \
  X(cuStreamDestroy_v2, "cuStreamDestroy", 4000)                              \
  X(cuStreamSynchronize, "cuStreamSynchronize", 2000)                         \
  X(cuStreamWaitEvent, "cuStreamWaitEvent", 3020)                             \
  X(cuStreamIsCapturing, "cuStreamIsCapturing", 10000)                        \
  X(cuStreamBeginCapture_v2, "cuStreamBeginCapture", 10010)                   \
  X(cuStreamEndCapture, "cuStreamEndCapture", 10000)                          \
  X(cuGraphInstantiateWithFlags, "cuGraphInstantiateWithFlags", 11040)        \
  X(cuGraphLaunch, "cuGraphLaunch", 10000)                                    \
  X(cuGraphExecDestroy, "cuGraphExecDestroy", 10000)                          \
  X(cuGraphDestroy, "cuGraphDestroy", 10000)                                  \
  X(cuEventCreate, "cuEventCreate", 2000)                                     \
  X(cuEventRecord, "cuEventRecord", 2000)                                     \
  X(cuEventSynchronize, "cuEventSynchronize", 2000)                           \
  X(cuEventElapsedTime_v2, "cuEventElapsedTime", 12080)                       \
  X(cuEventDestroy_v2, "cuEventDestroy", 4000)                                \
  X(cuPointerGetAttribute, "cuPointerGetAttribute", 4000)                     \
  X(cuPointerGetAttributes, "cuPointerGetAttributes", 7000)                   \
  X(cuTensorMapEncodeTiled, "cuTensorMapEncodeTiled", 12000)

// Entry points flexjit can do without: their members stay nullptr when the driver lacks them.
#define FLEXJIT_CUDA_DRIVER_OPTIONAL(X)                                       \
  X(cuModuleLoadData, "cuModuleLoadData", 2000)                               \
  X(cuModuleUnload, "cuModuleUnload", 2000)                                   \
  X(cuModuleGetFunction, "cuModuleGetFunction", 2000)                         \
  X(cuLibraryGetModule, "cuLibraryGetModule", 12000)

// The loaded driver: one function pointer per entry point, named by its exact symbol, so a call
// reads `drv->cuMemAlloc_v2(&ptr, bytes)` (or `drv->cuMemAlloc(...)`, which cuda.h's macros
// turn into the same member).
struct CudaDriver {
#define FLEXJIT_CUDA_DRIVER_MEMBER(symbol, name, version) decltype(&::symbol) symbol = nullptr;
  FLEXJIT_CUDA_DRIVER_REQUIRED(FLEXJIT_CUDA_DRIVER_MEMBER)
  FLEXJIT_CUDA_DRIVER_OPTIONAL(FLEXJIT_CUDA_DRIVER_MEMBER)
#undef FLEXJIT_CUDA_DRIVER_MEMBER

  int driver_version = 0;  // cuDriverGetVersion, e.g. 13000
  int device_count = 0;    // at least 1: without a device cuda_driver() returns nullptr
};

// The driver, loaded and initialised (cuInit) on the first call; thread-safe. Returns nullptr
// when there is no usable driver: libcuda.so.1 is absent (the CPU machines), it lacks a required
// entry point, cuInit fails, there is no device, or FLEXJIT_DISABLE_CUDA=1 is set. That is a
// normal condition, not an error; cuda_driver_unavailable_reason() says which. The library is
// never unloaded.
const CudaDriver* cuda_driver();

// Why cuda_driver() returned nullptr, as a sentence fit for a user; empty when it did not.
const std::string& cuda_driver_unavailable_reason();

// "CUDA_ERROR_INVALID_VALUE (invalid argument)"; works without a driver (then only the number).
std::string cu_error_text(CUresult result);

// Throws flexjit::Error("<what> failed: <cu_error_text>").
[[noreturn]] void throw_cu_error(CUresult result, const char* what);

// Throws flexjit::Error naming `what` (e.g. "cuLibraryLoadData") and the error when `result`
// is not CUDA_SUCCESS.
inline void check_cu(CUresult result, const char* what) {
  if (result != CUDA_SUCCESS) throw_cu_error(result, what);
}

}  // namespace flexjit::runtime
