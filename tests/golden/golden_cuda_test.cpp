// Golden tests of generated CUDA: every gallery spec's forward kernel source against
// tests/golden/<name>.cu. Set FLEXJIT_UPDATE_GOLDEN=1 to regenerate after an intended change.
#include <catch2/catch.hpp>

#include "compiler/codegen/kernel_source.h"
#include "compiler/ir_report.h"
#include "support/golden.h"
#include "support/spec_loading.h"

using namespace flexjit;

TEST_CASE("generated CUDA matches the golden files", "[golden]") {
  for (const auto& path : test::gallery_specs()) {
    dsl::Spec spec = test::load_spec(path);
    SpecIR ir = build_spec_ir(spec);
    ForwardKernelOptions fo;
    fo.dtype = spec.dtype;
    fo.head_dim = spec.head_dim;
    std::string actual = forward_kernel_source(ir, analyze_ir_ranges(ir), fo).source;
    test::check_golden(test::source_dir() / "tests" / "golden" / (spec.name + ".cu"), actual);
  }
}
