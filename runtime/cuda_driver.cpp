#include "runtime/cuda_driver.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <cstdlib>
#include <string_view>

#include "dsl/error.h"
#include "runtime/log.h"

namespace flexjit::runtime {
namespace {

// cuGetProcAddress has two ABIs: the CUDA 12 one (exported as cuGetProcAddress_v2) reports why
// a symbol was not found; the CUDA 11.3 one (plain name) does not. Declared by hand because
// cuda.h only declares whichever one its macros select.
using GetProcAddressV2 = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
using GetProcAddressV1 = CUresult (*)(const char*, void**, int, cuuint64_t);

struct Loaded {
  CudaDriver driver;
  bool ok = false;
  std::string reason;
};

class Resolver {
 public:
  explicit Resolver(void* lib) : lib_(lib) {
    v2_ = reinterpret_cast<GetProcAddressV2>(dlsym(lib, "cuGetProcAddress_v2"));
    if (!v2_) v1_ = reinterpret_cast<GetProcAddressV1>(dlsym(lib, "cuGetProcAddress"));
  }

  // The exact exported symbol is the declared ABI; cuGetProcAddress is the fallback for a
  // driver that exports the entry point under another name.
  void* find(const char* symbol, const char* name, int version) const {
    if (void* p = dlsym(lib_, symbol)) return p;
    void* p = nullptr;
    if (v2_) {
      CUdriverProcAddressQueryResult status{};
      if (v2_(name, &p, version, CU_GET_PROC_ADDRESS_DEFAULT, &status) == CUDA_SUCCESS &&
          status == CU_GET_PROC_ADDRESS_SUCCESS)
        return p;
    } else if (v1_) {
      if (v1_(name, &p, version, CU_GET_PROC_ADDRESS_DEFAULT) == CUDA_SUCCESS) return p;
    }
    return nullptr;
  }

 private:
  void* lib_;
  GetProcAddressV2 v2_ = nullptr;
  GetProcAddressV1 v1_ = nullptr;
};

std::string error_text(const CudaDriver& d, CUresult result) {
  const char* name = nullptr;
  const char* text = nullptr;
  if (d.cuGetErrorName) d.cuGetErrorName(result, &name);
  if (d.cuGetErrorString) d.cuGetErrorString(result, &text);
  if (name && text) return fmt::format("{} ({})", name, text);
  if (name) return name;
  return fmt::format("CUresult {}", static_cast<int>(result));
}

Loaded load() {
  Loaded out;
  if (const char* off = std::getenv("FLEXJIT_DISABLE_CUDA"); off && *off && std::string_view(off) != "0") {
    out.reason = "the CUDA driver is disabled by FLEXJIT_DISABLE_CUDA; unset it to use the GPU";
    return out;
  }
  // RTLD_LOCAL keeps the driver's symbols out of the global namespace. Never dlclose'd: handles
  // into it (contexts, libraries) may outlive any owner we could give it.
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* why = dlerror();
    out.reason = fmt::format(
        "no CUDA driver: dlopen(\"libcuda.so.1\") failed ({}). Install the NVIDIA driver to run "
        "kernels on a GPU; compiling kernels and the CPU backend work without it",
        why ? why : "unknown reason");
    return out;
  }
  CudaDriver& d = out.driver;
  Resolver resolver(lib);
  std::string missing;
#define FLEXJIT_CUDA_DRIVER_RESOLVE_REQUIRED(symbol, name, version)                      \
  d.symbol = reinterpret_cast<decltype(d.symbol)>(resolver.find(#symbol, name, version)); \
  if (!d.symbol) missing += (missing.empty() ? "" : ", ") + std::string(#symbol);
#define FLEXJIT_CUDA_DRIVER_RESOLVE_OPTIONAL(symbol, name, version) \
  d.symbol = reinterpret_cast<decltype(d.symbol)>(resolver.find(#symbol, name, version));
  FLEXJIT_CUDA_DRIVER_REQUIRED(FLEXJIT_CUDA_DRIVER_RESOLVE_REQUIRED)
  FLEXJIT_CUDA_DRIVER_OPTIONAL(FLEXJIT_CUDA_DRIVER_RESOLVE_OPTIONAL)
#undef FLEXJIT_CUDA_DRIVER_RESOLVE_REQUIRED
#undef FLEXJIT_CUDA_DRIVER_RESOLVE_OPTIONAL

  if (d.cuDriverGetVersion) d.cuDriverGetVersion(&d.driver_version);
  if (!missing.empty()) {
    out.reason = fmt::format(
        "the CUDA driver (version {}.{}) is too old: libcuda.so.1 lacks {}. flexjit needs a "
        "driver for CUDA 12.8 or newer; update the NVIDIA driver",
        d.driver_version / 1000, d.driver_version % 1000 / 10, missing);
    return out;
  }
  if (CUresult r = d.cuInit(0); r != CUDA_SUCCESS) {
    out.reason = fmt::format("the CUDA driver is installed but cuInit failed: {}", error_text(d, r));
    return out;
  }
  if (CUresult r = d.cuDeviceGetCount(&d.device_count); r != CUDA_SUCCESS) {
    out.reason = fmt::format("cuDeviceGetCount failed: {}", error_text(d, r));
    return out;
  }
  if (d.device_count <= 0) {
    out.reason = "the CUDA driver is installed but sees no device (check CUDA_VISIBLE_DEVICES)";
    return out;
  }
  out.ok = true;
  return out;
}

const Loaded& loaded() {
  // Never destroyed: kernels and contexts owned by static objects may be released during
  // static destruction, and they still need the function pointers.
  static const Loaded* l = [] {
    auto* p = new Loaded(load());
    if (p->ok)
      log_info("CUDA driver {}.{} loaded, {} device(s)", p->driver.driver_version / 1000,
               p->driver.driver_version % 1000 / 10, p->driver.device_count);
    else
      log_info("CUDA unavailable: {}", p->reason);
    return p;
  }();
  return *l;
}

}  // namespace

const CudaDriver* cuda_driver() {
  const Loaded& l = loaded();
  return l.ok ? &l.driver : nullptr;
}

const std::string& cuda_driver_unavailable_reason() { return loaded().reason; }

std::string cu_error_text(CUresult result) { return error_text(loaded().driver, result); }

void throw_cu_error(CUresult result, const char* what) {
  throw Error(fmt::format("{} failed: {}", what, cu_error_text(result)));
}

}  // namespace flexjit::runtime
