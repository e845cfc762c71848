// Paths the tests need, from the environment ctest sets (see tests/CMakeLists.txt).
#pragma once
#include <cstdlib>
#include <filesystem>
#include <string>

namespace flexjit::test {

inline std::filesystem::path source_dir() {
  const char* s = std::getenv("FLEXJIT_SOURCE_DIR");
  return s ? s : FLEXJIT_TEST_SOURCE_DIR;
}
inline std::filesystem::path gallery_dir() { return source_dir() / "examples" / "gallery"; }
inline std::string cli_path() {
  const char* s = std::getenv("FLEXJIT_CLI");
  return s ? s : FLEXJIT_TEST_CLI;
}

}  // namespace flexjit::test
