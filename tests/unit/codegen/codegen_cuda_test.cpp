// Code generation facts that golden files would only show indirectly.
#include <catch2/catch.hpp>

#include "compiler/codegen/kernel_source.h"
#include "compiler/frontend.h"
#include "compiler/ir_report.h"

using namespace flexjit;

namespace {
dsl::Spec spec_of(const std::string& score, const std::string& mask, const std::vector<std::string>& buffers, int head_dim = 64) {
  dsl::Spec spec;
  spec.head_dim = head_dim;
  if (!score.empty()) spec.score_mod = score;
  if (!mask.empty()) spec.mask_mod = mask;
  dsl::Diagnostics d;
  for (const auto& b : buffers) dsl::add_buffer(spec, b, "test", d);
  REQUIRE(!d.has_errors());
  return spec;
}

std::string source_for(const std::string& score, const std::string& mask, std::vector<std::string> buffers, bool int32 = true,
                       int head_dim = 64, const std::string& arch = "", uint64_t checked_loads = 0) {
  SpecIR ir = build_spec_ir(spec_of(score, mask, buffers, head_dim));
  ForwardKernelOptions fo;
  fo.head_dim = head_dim;
  fo.arch = arch;
  fo.variant.int32 = int32;
  fo.variant.checked_loads = checked_loads;
  return forward_kernel_source(ir, analyze_ir_ranges(ir), fo).source;
}

// The variant alone, with the staged per-column forms of mask_mod asked for.
std::string staged_variant_for(const std::string& mask, std::vector<std::string> buffers, uint64_t checked_loads = 0) {
  SpecIR ir = build_spec_ir(spec_of("", mask, buffers));
  VariantOptions vo;
  vo.checked_loads = checked_loads;
  vo.stage_kv_cols = true;
  return generate_cuda_variant(ir, analyze_ir_ranges(ir), vo).code;
}
}  // namespace

TEST_CASE("a guarded checked load is evaluated only when selected", "[codegen]") {
  std::string src = source_for("where(offset[q] < 4, score + bias[offset[q]], score)", "", {"bias: f32[N]", "offset: i32[Sq]"});
  INFO(src);
  CHECK(src.find("fj::checked_index") != std::string::npos);
  CHECK(src.find("if (") != std::string::npos);
}

TEST_CASE("proven loads are unchecked and hoisted; 64-bit mode widens ints", "[codegen]") {
  std::string src = source_for("score + rel_h[b, h, q, kv // 64] + rel_w[b, h, q, kv % 64]", "", {"rel_h: bf16[B, H, Sq, 64]", "rel_w: bf16[B, H, Sq, 64]"});
  CHECK(src.find("fj::checked_index") == std::string::npos);
  CHECK(src.find("struct Col { float") != std::string::npos);
  CHECK(src.find("struct Tile { float") != std::string::npos);
  std::string wide = source_for("score + bias[h, q - kv + Skv - 1]", "", {"bias: f32[H, L]"}, /*int32=*/false);
  CHECK(wide.find("long long") != std::string::npos);
}

TEST_CASE("a buffer-free mask gets an interval block-mask builder, a data-dependent one a dense builder", "[codegen]") {
  std::string causal = source_for("", "q >= kv && q - kv < 100", {});
  CHECK(causal.find("flex_build_block_mask_interval") != std::string::npos);
  std::string doc = source_for("", "doc[q] == doc[kv]", {"doc: i32[Sq]"});
  CHECK(doc.find("flex_build_block_mask_dense") != std::string::npos);
}

TEST_CASE("a score_mod of the form out * core(in * score) exposes its constants to the forward kernels", "[codegen]") {
  std::string softcap = source_for("30 * tanh(score / 30)", "", {});
  INFO(softcap);
  CHECK(softcap.find("kSplitScore = true;") != std::string::npos);
  CHECK(softcap.find("score_in_scale(const Params& p) { return 0.033333335f; }") != std::string::npos);
  CHECK(softcap.find("score_out_scale(const Params& p) { return 30.0f; }") != std::string::npos);
  // The core takes the already scaled score: no multiply left in it.
  const size_t core = softcap.find("float score_mod_core(");
  REQUIRE(core != std::string::npos);
  const std::string core_body = softcap.substr(core, softcap.find("  }\n", core) - core);
  CHECK(core_body.find("tanh_fast(score)") != std::string::npos);
  CHECK(core_body.find(" * ") == std::string::npos);
  // Either operand order, and a multiply instead of the division.
  CHECK(source_for("tanh(0.5 * score) * 4", "", {}).find("score_in_scale(const Params& p) { return 0.5f; }") != std::string::npos);
}

TEST_CASE("runtime factors split like literals: a division by a parameter multiplies by its host-side reciprocal", "[codegen]") {
  dsl::Spec spec;
  spec.score_mod = "cap * tanh(score / cap)";
  dsl::Diagnostics d;
  REQUIRE(dsl::add_param(spec, "cap: float", "test", d));
  SpecIR ir = build_spec_ir(spec);
  auto variant = [&](RuntimeSplit split) {
    VariantOptions vo;
    vo.runtime_split = split;
    return generate_cuda_variant(ir, analyze_ir_ranges(ir), vo).code;
  };
  const std::string running = variant(RuntimeSplit::RunningMax);
  INFO(running);
  CHECK(running.find("float param_cap_inv;") != std::string::npos);
  CHECK(running.find("(score * p.param_cap_inv)") != std::string::npos);  // no IEEE division per element
  CHECK(running.find("score_in_scale(const Params& p) { return p.param_cap_inv; }") != std::string::npos);
  CHECK(running.find("score_out_scale(const Params& p) { return p.param_cap; }") != std::string::npos);
  CHECK(running.find("kFixedMax") == std::string::npos);
  CHECK(variant(RuntimeSplit::FixedMax).find("static constexpr bool kFixedMax = true;") != std::string::npos);
  CHECK(variant(RuntimeSplit::Unsplit).find("kSplitScore") == std::string::npos);
  // The launch's value decides: cap > 0 keeps the split, and the fixed maximum fits while 2 cap log2(e) <= 100.
  const ScoreScales scales = split_score_scales(ir.score_mod);
  REQUIRE(scales.split);
  CHECK(scales.out.runtime());
  CHECK(runtime_split_for(scales, {30.f}) == RuntimeSplit::FixedMax);
  CHECK(runtime_split_for(scales, {40.f}) == RuntimeSplit::RunningMax);
  CHECK(runtime_split_for(scales, {-30.f}) == RuntimeSplit::Unsplit);
  CHECK(runtime_split_for(scales, {0.f}) == RuntimeSplit::Unsplit);
}

TEST_CASE("a runtime int parameter compared with a 32-bit value reads its saturated 32-bit copy", "[codegen]") {
  dsl::Spec spec;
  spec.mask_mod = "q >= kv && q - kv < window && kv * 4000000000 != window";
  dsl::Diagnostics d;
  REQUIRE(dsl::add_param(spec, "window: int", "test", d));
  SpecIR ir = build_spec_ir(spec);
  VariantOptions vo;
  const std::string narrow = generate_cuda_variant(ir, analyze_ir_ranges(ir), vo).code;
  INFO(narrow);
  CHECK(narrow.find("int param_window_i32;") != std::string::npos);
  CHECK(narrow.find("< p.param_window_i32)") != std::string::npos);
  // kv * 4e9 does not fit in 32 bits: that comparison keeps the 64-bit parameter.
  CHECK(narrow.find("!= p.param_window)") != std::string::npos);
  // The 64-bit variant (int32 off) compares in 64 bits throughout.
  vo.int32 = false;
  const std::string wide = generate_cuda_variant(ir, analyze_ir_ranges(ir), vo).code;
  CHECK(wide.find("< p.param_window_i32") == std::string::npos);
}

TEST_CASE("a split score_mod whose core is bounded declares the bound (the kernels' fixed softmax maximum)", "[codegen]") {
  const std::string softcap = source_for("30 * tanh(score / 30)", "", {});
  CHECK(softcap.find("kFixedMax = true;") != std::string::npos);
  CHECK(softcap.find("kScoreCoreMax = 1.0f;") != std::string::npos);
  // Bounds carry through constants, +, * and select; sigmoid is bounded like tanh.
  const std::string shifted = source_for("2 * (tanh(score * 0.5) * 0.5 + 1)", "", {});
  CHECK(shifted.find("kScoreCoreMax = 1.5f;") != std::string::npos);
  // A range too wide for exp2 to stay a normal number in bf16 P keeps the running maximum: 2 x 40 x log2(e) > 100.
  CHECK(source_for("40 * tanh(score / 40)", "", {}).find("kFixedMax") == std::string::npos);
  CHECK(source_for("4 * sigmoid(score * 0.25)", "", {}).find("kScoreCoreMax = 1.0f;") != std::string::npos);
  // Split but unbounded: exp grows without limit, and a buffer value has no known range.
  for (const char* score : {"2 * exp(score * 0.5)", "3 * (tanh(score / 3) + bias[q, kv])"}) {
    INFO(score);
    const std::string src = source_for(score, "", {"bias: f32[Sq, Skv]"});
    CHECK(src.find("score_mod_core") != std::string::npos);
    CHECK(src.find("kScoreCoreMax") == std::string::npos);
  }
  // A term constant along the row leaves for the LSE (kRowTerms), and what remains is bounded again.
  const std::string biased = source_for("3 * (tanh(score / 3) + bias[h])", "", {"bias: f32[H]"});
  CHECK(biased.find("kRowTerms = true;") != std::string::npos);
  CHECK(biased.find("kScoreCoreMax = 1.0f;") != std::string::npos);
}

TEST_CASE("score_mods not of the form out * core(in * score) are not split", "[codegen]") {
  for (const char* score : {"score + 30 * tanh(score / 30)",       // a bare score beside the scaled one
                            "-30 * tanh(score / 30)",               // a negative factor would turn the row maximum into a minimum
                            "30 * tanh(score / 30 + score / 10)",   // two different input factors
                            "score * 2", "score + bias[h]"}) {
    INFO(score);
    CHECK(source_for(score, "", {"bias: f32[H]"}).find("score_mod_core") == std::string::npos);
  }
}

TEST_CASE("mask_mod's per-column loads can be staged once per column (kStagedKvCols)", "[codegen]") {
  const std::vector<std::string> doc = {"doc: i32[Sq]"};
  std::string staged_src = staged_variant_for("doc[q] == doc[kv]", doc);
  INFO(staged_src);
  CHECK(staged_src.find("struct KvCol { int c0; };") != std::string::npos);
  CHECK(staged_src.find("static constexpr bool kStagedKvCols = true;") != std::string::npos);
  // The staged form compares the row's value with the staged one and loads nothing itself.
  const size_t staged = staged_src.find("bool mask_mod_staged(");
  REQUIRE(staged != std::string::npos);
  const std::string body = staged_src.substr(staged, staged_src.find("  }\n", staged) - staged);
  CHECK(body.find("load_i32") == std::string::npos);
  CHECK(body.find("kc.c0") != std::string::npos);
  // Not asked for: nothing staged.
  CHECK(source_for("", "doc[q] == doc[kv]", doc, true, 128, "sm_90a").find("KvCol") == std::string::npos);
  // A load the launch needs checked (its error bit) stays per element: a staged value is computed for every column.
  CHECK(staged_variant_for("doc[q] == doc[kv]", doc, ~0ull).find("KvCol") == std::string::npos);
}

TEST_CASE("staged column values: several types, at most two per column", "[codegen]") {
  std::string two = staged_variant_for("doc[q] == dk[b, kv] && w[kv] > 0.5", {"doc: i32[Sq]", "dk: i32[B, Skv]", "w: f32[Skv]"});
  INFO(two);
  CHECK(two.find("struct KvCol { int c0; bool c1; };") != std::string::npos);
  std::string three = staged_variant_for("a[kv] == doc[q] && b2[kv] == doc[q] && c[kv] == doc[q]",
                                        {"doc: i32[Sq]", "a: i32[Skv]", "b2: i32[Skv]", "c: i32[Skv]"});
  INFO(three);
  CHECK(three.find("struct KvCol { int c0; int c1; };") != std::string::npos);
  const size_t staged = three.find("bool mask_mod_staged(");
  REQUIRE(staged != std::string::npos);
  CHECK(three.substr(staged, three.find("  }\n", staged) - staged).find("load_i32") != std::string::npos);  // the third, per element
}

TEST_CASE("mods without loads or runtime divisors may run past Skv (kEvaluablePastSkv)", "[codegen]") {
  auto evaluable = [](const std::string& score, const std::string& mask, const std::vector<std::string>& buffers,
                      const std::string& param = "") {
    dsl::Spec spec = spec_of(score, mask, buffers);
    dsl::Diagnostics d;
    if (!param.empty()) REQUIRE(dsl::add_param(spec, param, "test", d));
    SpecIR ir = build_spec_ir(spec);
    const std::string code = generate_cuda_variant(ir, analyze_ir_ranges(ir), VariantOptions{}).code;
    INFO(code);
    return code.find("static constexpr bool kEvaluablePastSkv = true;") != std::string::npos;
  };
  CHECK(evaluable("", "kv < 4 || (q >= kv && q - kv < 1024)", {}));
  CHECK(evaluable("30 * tanh(score / 30)", "", {}));
  CHECK(evaluable("", "q >= kv && q - kv < window", {}, "window: int"));
  CHECK(evaluable("", "kv // 64 <= q // 64", {}));
  // A load past Skv could read past its buffer; a division by a runtime value could flag a zero divisor.
  CHECK_FALSE(evaluable("", "doc[q] == doc[kv]", {"doc: i32[Skv]"}));
  CHECK_FALSE(evaluable("score + bias[h, q - kv + Skv - 1]", "", {"bias: f32[H, L]"}));
  CHECK_FALSE(evaluable("", "kv // w <= q // w", {}, "w: int"));
}
