// Loading gallery specs and building their IR in tests.
#pragma once
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "compiler/frontend.h"
#include "dsl/compile_error.h"
#include "support/test_paths.h"

namespace flexjit::test {

// Throws flexjit::Error when the file is missing, naming the checkout the tests read.
inline dsl::Spec load_spec(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec))
    throw Error("spec file '" + path.string() + "' not found (the tests read the checkout at '" + source_dir().string() +
                "'; set FLEXJIT_TEST_SOURCE_DIR to another)");
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  dsl::Diagnostics d;
  auto spec = dsl::parse_spec_json(ss.str(), path.string(), d);
  if (!spec) throw CompileError(d);
  return *spec;
}

inline std::vector<std::filesystem::path> gallery_specs() {
  std::vector<std::filesystem::path> out;
  for (const auto& e : std::filesystem::directory_iterator(gallery_dir()))
    if (e.path().extension() == ".json") out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace flexjit::test
