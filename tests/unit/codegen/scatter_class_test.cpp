// Scatter classification of the backward (compiler/codegen/codegen_cuda_grad.h): which kernel reduces which
// buffer gradient, and the class arrays the generated variants carry for the KV-major and query-major kernels.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "compiler/codegen/codegen_cuda_grad.h"
#include "compiler/frontend.h"
#include "compiler/passes/autodiff.h"

using namespace flexjit;

namespace {

// The classes of a score_mod's scatters, every float buffer marked as requiring a gradient.
std::vector<ScatterClass> classes(const std::string& score_mod, const std::vector<std::string>& buffers) {
  dsl::Spec spec;
  spec.score_mod = score_mod;
  dsl::Diagnostics diags;
  for (const std::string& b : buffers) REQUIRE(dsl::add_buffer(spec, b, "test", diags));
  for (dsl::BufferDecl& b : spec.buffers) b.requires_grad = b.dtype == dsl::DType::F32 || b.dtype == dsl::DType::BF16;
  std::vector<ScatterClass> out;
  for (const GradScatter& s : differentiate_score_mod(build_spec_ir(spec)).scatters) out.push_back(classify_scatter(s));
  return out;
}

using C = std::vector<ScatterClass>;

}  // namespace

TEST_CASE("scatter classes: SAM's rel_w is row-col, rel_h row-tile; the KV-major classes stay", "[backward][codegen]") {
  CHECK(classes("score + rel_h[b, h, q, kv // 64] + rel_w[b, h, q, kv % 64]", {"rel_h: bf16[B, H, Sq, 64]", "rel_w: bf16[B, H, Sq, 64]"}) ==
        C{ScatterClass::RowTile, ScatterClass::RowCol});
  CHECK(classes("score + bias[h, q - kv + Skv - 1]", {"bias: f32[H, L]"}) == C{ScatterClass::Diagonal});
  CHECK(classes("score + slope[h] * (kv - q)", {"slope: f32[H]"}) == C{ScatterClass::Uniform});
  CHECK(classes("score + bias[offset[q]]", {"bias: f32[N]", "offset: i32[Sq]"}) == C{ScatterClass::QOnly});
  CHECK(classes("score + kvb[kv]", {"kvb: f32[Skv]"}) == C{ScatterClass::KvOnly});
}

TEST_CASE("scatter classes: row-owned only where the 64-wide tile rewrite proves it", "[backward][codegen]") {
  const std::vector<std::string> t = {"t: f32[Sq, 256]"};
  // Divisors of the tile width keep kv % c a column value; multiples of it keep kv // c a tile value.
  CHECK(classes("score + t[q, kv % 32]", t) == C{ScatterClass::RowCol});
  CHECK(classes("score + t[q, kv // 128]", t) == C{ScatterClass::RowTile});
  CHECK(classes("score + t[q, 3]", t) == C{ScatterClass::QOnly});
  // A column target of a 64-wide tile only recurs when the period divides 64; a tile target only when it spans
  // whole tiles; kv otherwise (or both at once) changes the target with every element of a row.
  CHECK(classes("score + t[q, kv % 128]", t) == C{ScatterClass::General});
  CHECK(classes("score + t[q, kv // 32]", t) == C{ScatterClass::General});
  CHECK(classes("score + t[q, (kv + 1) // 64]", t) == C{ScatterClass::General});
  CHECK(classes("score + t[q, kv]", t) == C{ScatterClass::General});
  CHECK(classes("score + t[q, kv // 64 + kv % 64]", t) == C{ScatterClass::General});
  CHECK(classes("score + u[q, kv // 64, kv % 64]", {"u: f32[Sq, 64, 64]"}) == C{ScatterClass::General});
  // kv through a load of a column or tile value: still constant where the load's index is.
  CHECK(classes("score + t[q, idx[kv % 64]]", {"t: f32[Sq, 256]", "idx: i32[64]"}) == C{ScatterClass::RowCol});
  CHECK(classes("score + t[q, idx[kv // 64]]", {"t: f32[Sq, 256]", "idx: i32[64]"}) == C{ScatterClass::RowTile});
  // A target computed from the score moves with every element, whatever else it uses.
  CHECK(classes("score + w[int(score)]", {"w: f32[64]"}) == C{ScatterClass::General});
  CHECK(classes("score + t[q, int(score) + kv % 64]", t) == C{ScatterClass::General});
  // Without q, a column target belongs to the KV-major kernel's kv-only class.
  CHECK(classes("score + w[kv % 64]", {"w: f32[64]"}) == C{ScatterClass::KvOnly});
}

TEST_CASE("scatter classes: kernel class values with and without the query-major pass", "[backward][codegen]") {
  CHECK(row_owned(ScatterClass::QOnly));
  CHECK(row_owned(ScatterClass::RowCol));
  CHECK(row_owned(ScatterClass::RowTile));
  CHECK_FALSE(row_owned(ScatterClass::Uniform));
  CHECK_FALSE(row_owned(ScatterClass::Diagonal));
  CHECK_FALSE(row_owned(ScatterClass::KvOnly));
  CHECK_FALSE(row_owned(ScatterClass::General));
  // Without the pass the KV-major kernel reduces everything: row-col and row-tile as general.
  CHECK(kv_major_scatter_class(ScatterClass::RowCol, false) == 4);
  CHECK(kv_major_scatter_class(ScatterClass::RowTile, false) == 4);
  CHECK(kv_major_scatter_class(ScatterClass::QOnly, false) == 1);
  CHECK(kv_major_scatter_class(ScatterClass::Diagonal, false) == 3);
  // With it, the row-owned ones are skipped there (kScatterQMajor) and reduced by the pass.
  CHECK(kv_major_scatter_class(ScatterClass::RowCol, true) == 5);
  CHECK(kv_major_scatter_class(ScatterClass::RowTile, true) == 5);
  CHECK(kv_major_scatter_class(ScatterClass::QOnly, true) == 5);
  CHECK(kv_major_scatter_class(ScatterClass::Uniform, true) == 0);
  CHECK(kv_major_scatter_class(ScatterClass::Diagonal, true) == 3);
  CHECK(query_major_scatter_class(ScatterClass::QOnly) == 1);
  CHECK(query_major_scatter_class(ScatterClass::RowCol) == 2);
  CHECK(query_major_scatter_class(ScatterClass::RowTile) == 3);
  CHECK(query_major_scatter_class(ScatterClass::General) == 0);
}

TEST_CASE("generated gradient variants carry both class arrays and the query-major functions", "[backward][codegen]") {
  dsl::Spec spec;
  spec.score_mod = "score + rel_h[b, h, q, kv // 64] + rel_w[b, h, q, kv % 64] + slope[h] * (kv - q)";
  dsl::Diagnostics diags;
  for (const char* b : {"rel_h: bf16[B, H, Sq, 64]", "rel_w: bf16[B, H, Sq, 64]", "slope: f32[H]"}) REQUIRE(dsl::add_buffer(spec, b, "test", diags));
  for (dsl::BufferDecl& b : spec.buffers) b.requires_grad = true;
  SpecIR ir = build_spec_ir(spec);
  ScoreModGradient grad = differentiate_score_mod(ir);
  RangeInfo ranges = analyze_ranges(backward_roots(grad), ir.checked, VarDomains::forward(ir.checked));
  REQUIRE(grad.scatters.size() == 3);
  GradVariantOptions go;
  GeneratedGradVariant atomic = generate_cuda_grad_variant(ir, grad, ranges, VariantOptions{}, "V", go);
  INFO(atomic.code);
  CHECK(atomic.code.find("kScatterClass[3] = {4 /* row-tile */, 4 /* row-col */, 0 /* uniform */}") != std::string::npos);
  CHECK(atomic.code.find("kScatterRowClass[3] = {0, 0, 0}") != std::string::npos);
  CHECK(atomic.code.find("scatter_coef(") != std::string::npos);
  CHECK(atomic.code.find("scatter_offset(") != std::string::npos);
  go.query_major_pass = true;
  GeneratedGradVariant split = generate_cuda_grad_variant(ir, grad, ranges, VariantOptions{}, "V", go);
  CHECK(split.code.find("kScatterClass[3] = {5 /* row-tile */, 5 /* row-col */, 0 /* uniform */}") != std::string::npos);
  CHECK(split.code.find("kScatterRowClass[3] = {3, 2, 0}") != std::string::npos);
  CHECK(split.scatter_classes == C{ScatterClass::RowTile, ScatterClass::RowCol, ScatterClass::Uniform});
  // The query-major struct is hoisted as the forward: rel_h per tile, rel_w per column.
  go.hoisted = true;
  GeneratedGradVariant hoisted = generate_cuda_grad_variant(ir, grad, ranges, VariantOptions{}, "VQ", go);
  CHECK(hoisted.code.find("struct Tile { float") != std::string::npos);
  CHECK(hoisted.code.find("struct Col { float") != std::string::npos);
  CHECK(split.code.find("struct Tile {") == std::string::npos);  // not hoisted: the base's empty Tile
}
