// Golden-file checks: compare a test's output with a file under tests/golden/, showing the first
// differing line; FLEXJIT_UPDATE_GOLDEN=1 rewrites the files instead, after an intended change.
#pragma once
#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace flexjit::test {

// "first difference at line N, column C: expected ... actual ..." for the first differing line, or "" if equal.
inline std::string first_difference(const std::string& expected, const std::string& actual) {
  std::istringstream e(expected), a(actual);
  std::string le, la;
  for (int line = 1;; ++line) {
    bool he = static_cast<bool>(std::getline(e, le)), ha = static_cast<bool>(std::getline(a, la));
    if (!he && !ha) return "";
    if (he != ha || le != la) {
      size_t col = 0;
      while (col < le.size() && col < la.size() && le[col] == la[col]) ++col;
      return "first difference at line " + std::to_string(line) + ", column " + std::to_string(col + 1) + ":\n  expected: " +
             (he ? le : "<end of file>") + "\n  actual:   " + (ha ? la : "<end of file>");
    }
  }
}

inline bool updating_goldens() { return std::getenv("FLEXJIT_UPDATE_GOLDEN") != nullptr; }

// Checks `actual` against the golden file (or rewrites it when updating_goldens()).
inline void check_golden(const std::filesystem::path& golden, const std::string& actual) {
  if (updating_goldens()) {
    std::ofstream(golden) << actual;
    return;
  }
  std::ifstream f(golden);
  INFO("golden file " << golden.string() << " (regenerate with FLEXJIT_UPDATE_GOLDEN=1 after an intended change)");
  REQUIRE(f.good());
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string diff = first_difference(ss.str(), actual);
  INFO(diff);
  CHECK(diff.empty());
}

}  // namespace flexjit::test
