// Value specialisation of runtime int divisors (compiler/specialize.h): which parameters qualify, and that a
// specialised spec compiles to exactly the kernel of the spec that declares the value `const`.
#include <catch2/catch.hpp>

#include "compiler/codegen/kernel_source.h"
#include "compiler/frontend.h"
#include "compiler/ir_report.h"
#include "compiler/specialize.h"

using namespace flexjit;

namespace {

SpecIR spec_ir(const std::string& score, const std::vector<std::string>& params, const std::vector<std::string>& buffers = {},
               const std::string& mask = "") {
  dsl::Spec spec;
  spec.name = "specialize";
  spec.head_dim = 64;
  if (!score.empty()) spec.score_mod = score;
  if (!mask.empty()) spec.mask_mod = mask;
  dsl::Diagnostics d;
  for (const auto& b : buffers) dsl::add_buffer(spec, b, "test", d);
  for (const auto& p : params) dsl::add_param(spec, p, "test", d);
  REQUIRE(!d.has_errors());
  return build_spec_ir(spec);
}

std::string sm90_source(const SpecIR& ir) {
  ForwardKernelOptions fo;
  fo.head_dim = 64;
  fo.arch = "sm_90a";
  return forward_kernel_source(ir, analyze_ir_ranges(ir), fo).source;
}

const std::vector<std::string> kSamBuffers = {"rel_h: bf16[B, H, Sq, 64]", "rel_w: bf16[B, H, Sq, 64]"};

}  // namespace

TEST_CASE("divisor_params: runtime int parameters that divide, and only those", "[compiler][specialize]") {
  CHECK(divisor_params(spec_ir("score + rel_h[b, h, q, kv // W] + rel_w[b, h, q, kv % W]", {"W: int"}, kSamBuffers)) ==
        std::vector<int>{0});
  // Both operands' parameters, in declaration order; a divisor built from parameters counts.
  CHECK(divisor_params(spec_ir("score + float((kv // (V + 1)) % W)", {"W: int", "c: float", "V: int"})) == std::vector<int>{0, 2});
  // In the mask too.
  CHECK(divisor_params(spec_ir("", {"W: int"}, {}, "kv // W <= q // W")) == std::vector<int>{0});
  // Not: a constant divisor, a parameter that only multiplies or compares, a divisor that reads a position, a float
  // parameter, a const parameter.
  CHECK(divisor_params(spec_ir("score + rel_h[b, h, q, kv // 64]", {}, {"rel_h: bf16[B, H, Sq, 64]"})).empty());
  CHECK(divisor_params(spec_ir("score * c + float(kv * W)", {"W: int", "c: float"}, {}, "q - kv < W")).empty());
  CHECK(divisor_params(spec_ir("score + float(W // (kv + 1))", {"W: int"})).empty());
  CHECK(divisor_params(spec_ir("score / c", {"c: float"})).empty());
  CHECK(divisor_params(spec_ir("score + float(kv % W)", {"const W: int = 64"})).empty());
}

TEST_CASE("a specialised runtime width compiles to the kernel of the const width", "[compiler][specialize]") {
  const std::string sam = "score + rel_h[b, h, q, kv // W] + rel_w[b, h, q, kv % W]";
  const SpecIR runtime_w = spec_ir(sam, {"W: int"}, kSamBuffers);
  const SpecIR specialised = specialize_params(runtime_w, {{0, 64}});
  CHECK(divisor_params(specialised).empty());
  // The specialised IR stages rel_h per KV tile and rel_w per column, as the const spec's does: the same source.
  CHECK(sm90_source(specialised) == sm90_source(spec_ir(sam, {"const W: int = 64"}, kSamBuffers)));
  CHECK(sm90_source(specialised) != sm90_source(runtime_w));
  // Another value gives another kernel; the input IR is left as it was.
  CHECK(sm90_source(specialize_params(runtime_w, {{0, 14}})) == sm90_source(spec_ir(sam, {"const W: int = 14"}, kSamBuffers)));
  CHECK(divisor_params(runtime_w) == std::vector<int>{0});
}
