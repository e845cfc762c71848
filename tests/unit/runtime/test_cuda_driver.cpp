// Tests of the dlopen'ed driver API: "no driver" is a normal condition, never a crash.
#include <catch2/catch.hpp>

#include <string>

#include "dsl/error.h"
#include "runtime/cuda_driver.h"

using namespace flexjit::runtime;

TEST_CASE("cuda driver: absent or loaded, never a crash", "[runtime][cuda_driver]") {
  const CudaDriver* drv = cuda_driver();
  CHECK(cuda_driver() == drv);  // loaded once
  if (!drv) {
    // The CPU machines: no libcuda.so.1, or no device.
    INFO(cuda_driver_unavailable_reason());
    CHECK_FALSE(cuda_driver_unavailable_reason().empty());
    return;
  }
  CHECK(cuda_driver_unavailable_reason().empty());
  CHECK(drv->device_count >= 1);
  CHECK(drv->driver_version >= 12000);
#define FLEXJIT_TEST_RESOLVED(symbol, name, version) CHECK(drv->symbol != nullptr);
  FLEXJIT_CUDA_DRIVER_REQUIRED(FLEXJIT_TEST_RESOLVED)
#undef FLEXJIT_TEST_RESOLVED
  CUdevice dev = 0;
  check_cu(drv->cuDeviceGet(&dev, 0), "cuDeviceGet");
  char name[256] = {};
  check_cu(drv->cuDeviceGetName(name, sizeof name, dev), "cuDeviceGetName");
  CHECK(name[0] != '\0');
}

TEST_CASE("cuda driver: check_cu names the call and the error", "[runtime][cuda_driver]") {
  CHECK_NOTHROW(check_cu(CUDA_SUCCESS, "cuInit"));
  CHECK_THROWS_AS(check_cu(CUDA_ERROR_INVALID_VALUE, "cuMemAlloc"), flexjit::Error);
  CHECK_THROWS_WITH(check_cu(CUDA_ERROR_INVALID_VALUE, "cuMemAlloc"), Catch::Contains("cuMemAlloc failed"));
  std::string text = cu_error_text(CUDA_ERROR_OUT_OF_MEMORY);
  if (cuda_driver())
    CHECK(text.find("CUDA_ERROR_OUT_OF_MEMORY") != std::string::npos);
  else
    CHECK_FALSE(text.empty());  // without libcuda only the number: "CUresult 2"
}
