#include "runtime/loaded_library.h"

#include "runtime/cuda_driver.h"

namespace flexjit::runtime {

LoadedLibrary& LoadedLibrary::operator=(LoadedLibrary&& o) noexcept {
  if (this != &o) {
    reset();
    library_ = o.library_;
    o.library_ = nullptr;
  }
  return *this;
}

CUresult LoadedLibrary::load(const std::vector<uint8_t>& cubin) {
  reset();
  const CudaDriver* d = cuda_driver();
  if (!d) return CUDA_ERROR_NO_DEVICE;
  CUlibrary lib = nullptr;
  const CUresult res = d->cuLibraryLoadData(&lib, cubin.data(), nullptr, nullptr, 0, nullptr, nullptr, 0);
  if (res == CUDA_SUCCESS) library_ = lib;
  return res;
}

CUfunction LoadedLibrary::function(const char* entry) const {
  const CudaDriver* d = cuda_driver();
  if (!d) check_cu(CUDA_ERROR_NO_DEVICE, "looking up a kernel");
  CUkernel k = nullptr;
  check_cu(d->cuLibraryGetKernel(&k, library_, entry), "cuLibraryGetKernel");
  CUfunction f = nullptr;
  check_cu(d->cuKernelGetFunction(&f, k), "cuKernelGetFunction");
  return f;
}

void LoadedLibrary::reset() {
  if (!library_) return;
  if (const CudaDriver* d = cuda_driver()) d->cuLibraryUnload(library_);
  library_ = nullptr;
}

}  // namespace flexjit::runtime
