// Code generation facts that golden files would only show indirectly.
#include <catch2/catch.hpp>

#include "compiler/codegen/kernel_source.h"
#include "compiler/frontend.h"
#include "compiler/ir_report.h"

using namespace flexjit;

namespace {
std::string source_for(const std::string& score, const std::string& mask, std::vector<std::string> buffers, bool int32 = true,
                       int head_dim = 64, const std::string& arch = "", uint64_t checked_loads = 0) {
  dsl::Spec spec;
  spec.head_dim = head_dim;
  if (!score.empty()) spec.score_mod = score;
  if (!mask.empty()) spec.mask_mod = mask;
  dsl::Diagnostics d;
  for (const auto& b : buffers) dsl::add_buffer(spec, b, "test", d);
  REQUIRE(!d.has_errors());
  SpecIR ir = build_spec_ir(spec);
  ForwardKernelOptions fo;
  fo.head_dim = head_dim;
  fo.arch = arch;
  fo.variant.int32 = int32;
  fo.variant.checked_loads = checked_loads;
  return forward_kernel_source(ir, analyze_ir_ranges(ir), fo).source;
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
  CHECK(softcap.find("kScoreInScale = 0.033333335f;") != std::string::npos);
  CHECK(softcap.find("kScoreOutScale = 30.0f;") != std::string::npos);
  // The core takes the already scaled score: no multiply left in it.
  const size_t core = softcap.find("float score_mod_core(");
  REQUIRE(core != std::string::npos);
  const std::string core_body = softcap.substr(core, softcap.find("  }\n", core) - core);
  CHECK(core_body.find("tanh_fast(score)") != std::string::npos);
  CHECK(core_body.find(" * ") == std::string::npos);
  // Either operand order, and a multiply instead of the division.
  CHECK(source_for("tanh(0.5 * score) * 4", "", {}).find("kScoreInScale = 0.5f;") != std::string::npos);
}

TEST_CASE("a split score_mod whose core is bounded declares the bounds (the kernels' fixed softmax maximum)", "[codegen]") {
  const std::string softcap = source_for("30 * tanh(score / 30)", "", {});
  CHECK(softcap.find("kScoreCoreMin = -1.0f;") != std::string::npos);
  CHECK(softcap.find("kScoreCoreMax = 1.0f;") != std::string::npos);
  // Bounds carry through constants, +, * and select; sigmoid is bounded like tanh.
  const std::string shifted = source_for("2 * (tanh(score * 0.5) * 0.5 + 1)", "", {});
  CHECK(shifted.find("kScoreCoreMin = 0.5f;") != std::string::npos);
  CHECK(shifted.find("kScoreCoreMax = 1.5f;") != std::string::npos);
  CHECK(source_for("4 * sigmoid(score * 0.25)", "", {}).find("kScoreCoreMax = 1.0f;") != std::string::npos);
  // Split but unbounded: exp grows without limit, and a buffer value has no known range.
  for (const char* score : {"2 * exp(score * 0.5)", "3 * (tanh(score / 3) + bias[h])"}) {
    INFO(score);
    const std::string src = source_for(score, "", {"bias: f32[H]"});
    CHECK(src.find("score_mod_core") != std::string::npos);
    CHECK(src.find("kScoreCoreMax") == std::string::npos);
  }
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

TEST_CASE("mask_mod's per-column loads are staged for the 64-row Hopper loop at head dims 96 and 128", "[codegen]") {
  const std::vector<std::string> doc = {"doc: i32[Sq]"};
  std::string d128 = source_for("", "doc[q] == doc[kv]", doc, true, 128, "sm_90a");
  INFO(d128);
  CHECK(d128.find("struct KvCol { int c0; };") != std::string::npos);
  CHECK(d128.find("/*kStagedKvCols=*/true") != std::string::npos);
  // The staged form compares the row's value with the staged one and loads nothing itself.
  const size_t staged = d128.find("bool mask_mod_staged(");
  REQUIRE(staged != std::string::npos);
  const std::string body = d128.substr(staged, d128.find("  }\n", staged) - staged);
  CHECK(body.find("load_i32") == std::string::npos);
  CHECK(body.find("kc.c0") != std::string::npos);
  // Other loops read per element.
  CHECK(source_for("", "doc[q] == doc[kv]", doc, true, 64, "sm_90a").find("KvCol") == std::string::npos);
  CHECK(source_for("", "doc[q] == doc[kv]", doc, true, 128, "sm_80").find("KvCol") == std::string::npos);
  // A load the launch needs checked (its error bit) stays per element: a staged value is computed for every column.
  CHECK(source_for("", "doc[q] == doc[kv]", doc, true, 128, "sm_90a", ~0ull).find("KvCol") == std::string::npos);
}

TEST_CASE("staged column values: several types, at most two per column", "[codegen]") {
  std::string two = source_for("", "doc[q] == dk[b, kv] && w[kv] > 0.5", {"doc: i32[Sq]", "dk: i32[B, Skv]", "w: f32[Skv]"}, true, 96, "sm_90a");
  INFO(two);
  CHECK(two.find("struct KvCol { int c0; bool c1; };") != std::string::npos);
  std::string three = source_for("", "a[kv] == doc[q] && b2[kv] == doc[q] && c[kv] == doc[q]",
                                 {"doc: i32[Sq]", "a: i32[Skv]", "b2: i32[Skv]", "c: i32[Skv]"}, true, 128, "sm_90a");
  INFO(three);
  CHECK(three.find("struct KvCol { int c0; int c1; };") != std::string::npos);
  const size_t staged = three.find("bool mask_mod_staged(");
  REQUIRE(staged != std::string::npos);
  CHECK(three.substr(staged, three.find("  }\n", staged) - staged).find("load_i32") != std::string::npos);  // the third, per element
}
