// libFuzzer target for the front end (built with clang when FLEXJIT_FUZZ=ON). The input is
// split at the first NUL byte into score_mod and mask_mod text.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "fuzz/fuzz_body.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string in(reinterpret_cast<const char*>(data), size);
  size_t nul = in.find('\0');
  std::string score = in.substr(0, nul), mask = nul == std::string::npos ? "" : in.substr(nul + 1);
  std::string violation = flexjit::fuzz::check_one(score, mask);
  if (!violation.empty()) {
    std::fprintf(stderr, "property violated: %s\n", violation.c_str());
    std::abort();
  }
  return 0;
}
