// Tests of the launch binding's buffer facts: which buffers the generated loads may index without their last stride.
#include <catch2/catch.hpp>

#include "compiler/frontend.h"
#include "compiler/ir_report.h"
#include "runtime/forward_launch.h"

using namespace flexjit;

TEST_CASE("bind_launch marks the buffers whose last stride is 1 (or whose last extent is 1)", "[runtime]") {
  dsl::Spec spec;
  spec.head_dim = 64;
  spec.score_mod = "score + x[h, kv] + y[h, kv] + z[h, 0]";
  dsl::Diagnostics d;
  for (const char* decl : {"x: f32[H, Skv]", "y: f32[H, Skv]", "z: f32[H, 1]"}) dsl::add_buffer(spec, decl, "test", d);
  REQUIRE(!d.has_errors());
  SpecIR ir = build_spec_ir(spec);
  const runtime::LaunchShape shape{1, 4, 4, 16, 16, 64, 64};
  Tensor x = Tensor::contiguous(nullptr, DType::F32, {4, 16});
  Tensor y = x;
  y.strides = {1, 4};  // a transposed [16, 4] tensor: the last index moves by 4 elements
  Tensor z = Tensor::contiguous(nullptr, DType::F32, {4, 1});
  z.strides = {3, 7};  // one element per row: its stride never multiplies a nonzero index
  const BoundValues values = runtime::bind_launch(ir.checked, shape, {x, y, z}, AttentionArgs{});
  CHECK(values.unit_inner_stride == 0b101);
  const runtime::VariantChoice choice = runtime::choose_variant(analyze_ir_ranges(ir), ir.checked, values);
  CHECK(choice.unit_inner_stride == 0b101);
  CHECK(choice.key().find("_u5") != std::string::npos);
}
