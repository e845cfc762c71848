// Golden tests of generated CUDA: every gallery spec's forward kernel source against
// tests/golden/<name>.cu. Set FLEXJIT_UPDATE_GOLDEN=1 to regenerate after an intended change.
#include <catch2/catch.hpp>
#include <fstream>
#include <sstream>

#include "compiler/codegen/kernel_source.h"
#include "compiler/ir_report.h"
#include "support/spec_loading.h"

using namespace flexjit;

namespace {

// "line N: expected `...` but got `...`" for the first differing line, or "" if equal.
std::string first_difference(const std::string& expected, const std::string& actual) {
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

}  // namespace

TEST_CASE("generated CUDA matches the golden files", "[golden]") {
  bool update = std::getenv("FLEXJIT_UPDATE_GOLDEN") != nullptr;
  for (const auto& path : test::gallery_specs()) {
    dsl::Spec spec = test::load_spec(path);
    SpecIR ir = build_spec_ir(spec);
    ForwardKernelOptions fo;
    fo.dtype = spec.dtype;
    fo.head_dim = spec.head_dim;
    std::string actual = forward_kernel_source(ir, analyze_ir_ranges(ir), fo).source;
    auto golden = test::source_dir() / "tests" / "golden" / (spec.name + ".cu");
    if (update) {
      std::ofstream(golden) << actual;
      continue;
    }
    std::ifstream f(golden);
    INFO("golden file " << golden.string() << " (regenerate with FLEXJIT_UPDATE_GOLDEN=1 after an intended change)");
    REQUIRE(f.good());
    std::stringstream ss;
    ss << f.rdbuf();
    std::string diff = first_difference(ss.str(), actual);
    INFO(diff);
    CHECK(diff.empty());
  }
}
