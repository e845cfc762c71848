// The one Catch2 main shared by every test executable. It points the kernel cache at one
// directory per build tree (unless the caller chose one), so NVRTC results are shared by
// every test of a run and never leak into the user's cache.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <cstdlib>

int main(int argc, char* argv[]) {
  setenv("FLEXJIT_CACHE_DIR", FLEXJIT_TEST_CACHE_DIR, /*overwrite=*/0);
  return Catch::Session().run(argc, argv);
}
