// Where the tests find the checkout's data (specs, goldens, test data) and the CLI: from the
// checkout they run in, so a binary built in one tree runs against another (a GPU machine).
#pragma once
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <system_error>

namespace flexjit::test {

// Whether `dir` is the root of a flexjit checkout (what the tests read is there).
inline bool is_checkout_root(const std::filesystem::path& dir) {
  std::error_code ec;
  return std::filesystem::exists(dir / "examples" / "gallery" / "causal.json", ec) &&
         std::filesystem::exists(dir / "tests" / "support" / "test_paths.h", ec);
}

// The nearest checkout root at or above `start`, if any.
inline std::optional<std::filesystem::path> checkout_above(std::filesystem::path start) {
  std::error_code ec;
  start = std::filesystem::weakly_canonical(start, ec);
  if (ec) return std::nullopt;
  for (std::filesystem::path p = start; !p.empty(); p = p.parent_path()) {
    if (is_checkout_root(p)) return p;
    if (p == p.parent_path()) break;
  }
  return std::nullopt;
}

inline std::filesystem::path executable_path() {
  std::error_code ec;
  return std::filesystem::read_symlink("/proc/self/exe", ec);
}

// The checkout the tests read: $FLEXJIT_TEST_SOURCE_DIR, else the checkout holding the
// working directory, else the one holding the test executable, else the source tree the
// executable was built from.
inline std::filesystem::path source_dir() {
  static const std::filesystem::path dir = [] {
    for (const char* var : {"FLEXJIT_TEST_SOURCE_DIR", "FLEXJIT_SOURCE_DIR"})
      if (const char* s = std::getenv(var); s && *s) return std::filesystem::path(s);
    std::error_code ec;
    if (auto p = checkout_above(std::filesystem::current_path(ec))) return *p;
    if (auto p = checkout_above(executable_path().parent_path())) return *p;
    return std::filesystem::path(FLEXJIT_TEST_SOURCE_DIR);
  }();
  return dir;
}
inline std::filesystem::path gallery_dir() { return source_dir() / "examples" / "gallery"; }

// The flexjit CLI: $FLEXJIT_CLI, else the one this build made, else `flexjit` next to the
// test executable or in the build tree's tools/ beside its tests/ (a staged copy).
inline std::string cli_path() {
  if (const char* s = std::getenv("FLEXJIT_CLI"); s && *s) return s;
  std::error_code ec;
  if (std::filesystem::exists(FLEXJIT_TEST_CLI, ec)) return FLEXJIT_TEST_CLI;
  const std::filesystem::path exe_dir = executable_path().parent_path();
  for (const std::filesystem::path& p : {exe_dir / "flexjit", exe_dir.parent_path() / "tools" / "flexjit"})
    if (std::filesystem::exists(p, ec)) return p.string();
  return FLEXJIT_TEST_CLI;
}

}  // namespace flexjit::test
