// The C API's switch for the CPU backend; it lives here so that only binaries linking
// flexjit_cpu (and so LLVM) have it.
#include "runtime/capi/flexjit.h"
#include "runtime/cpu/cpu_backend.h"

extern "C" flexjit_status flexjit_enable_cpu_backend(void) {
  try {
    flexjit::cpu::install();
    return FLEXJIT_OK;
  } catch (...) {
    return FLEXJIT_ERROR_INTERNAL;
  }
}
