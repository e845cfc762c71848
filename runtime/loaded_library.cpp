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

void LoadedLibrary::reset() {
  if (!library_) return;
  if (const CudaDriver* d = cuda_driver()) d->cuLibraryUnload(library_);
  library_ = nullptr;
}

}  // namespace flexjit::runtime
