// libFuzzer's entry point for one target, chosen at compile time by FLEXJIT_FUZZ_TARGET
// (e.g. run_npy): a property violation aborts, so libFuzzer saves the input as a crash.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "fuzz/targets/targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string violation = flexjit::fuzz::FLEXJIT_FUZZ_TARGET(data, size);
  if (!violation.empty()) {
    std::fprintf(stderr, "flexjit fuzz property violated: %s\n", violation.c_str());
    std::abort();
  }
  return 0;
}
