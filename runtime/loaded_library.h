// A compiled module loaded into the driver (a CUlibrary), owned: unloaded when its owner goes.
#pragma once
#include <cuda.h>

#include <cstdint>
#include <vector>

namespace flexjit::runtime {

// Every Kernel object loads the modules it launches, and a server re-creates kernels (new specs,
// cache clears) for as long as it runs: without the unload each one kept its code and the
// driver's host copy for the life of the process (the soak measured about 220 KiB of device and
// 800 KiB of host memory per re-created kernel). So a Kernel must outlive the work it queued and
// the CUDA graphs that captured its launches (runtime/flexjit.hpp says so to its users).
class LoadedLibrary {
 public:
  LoadedLibrary() = default;
  ~LoadedLibrary() { reset(); }
  LoadedLibrary(const LoadedLibrary&) = delete;
  LoadedLibrary& operator=(const LoadedLibrary&) = delete;
  LoadedLibrary(LoadedLibrary&& o) noexcept : library_(o.library_) { o.library_ = nullptr; }
  LoadedLibrary& operator=(LoadedLibrary&& o) noexcept;

  // Loads a cubin (replacing what was loaded); returns the driver's result, loading nothing on failure.
  CUresult load(const std::vector<uint8_t>& cubin);
  // Unloads; errors are ignored (at process exit the driver may already be gone).
  void reset();

  CUlibrary get() const { return library_; }
  // The function of one of the loaded module's entry points, for the current context; throws flexjit::Error when
  // the driver has none of that name.
  CUfunction function(const char* entry) const;
  explicit operator bool() const { return library_ != nullptr; }

 private:
  CUlibrary library_ = nullptr;
};

}  // namespace flexjit::runtime
