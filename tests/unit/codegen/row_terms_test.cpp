// score_mod's row and column terms (compiler/codegen/row_terms.h): which forms split, that the parts add up to the
// score_mod at any anchor row, and what the forward variant declares for them.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>

#include "compiler/codegen/codegen_cuda.h"
#include "compiler/codegen/row_terms.h"
#include "compiler/frontend.h"
#include "compiler/ir_report.h"
#include "compiler/passes/autodiff.h"
#include "compiler/passes/row_constant_scatters.h"
#include "unit/compiler/spec_fixture.h"

using namespace flexjit;

namespace {

SpecIR optimized_spec(const std::string& score, const std::vector<std::string>& buffers, const std::string& mask = "") {
  dsl::Spec spec;
  spec.score_mod = score;
  if (!mask.empty()) spec.mask_mod = mask;
  dsl::Diagnostics d;
  for (const auto& b : buffers) dsl::add_buffer(spec, b, "test", d);
  REQUIRE(!d.has_errors());
  return build_spec_ir(spec);
}

std::string forward_variant(const SpecIR& ir) {
  VariantOptions vo;
  vo.split_row_terms = true;
  return generate_cuda_variant(ir, analyze_ir_ranges(ir), vo).code;
}

bool has(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

}  // namespace

TEST_CASE("row terms: rest + column terms + row terms equal score_mod at any anchor row", "[codegen]") {
  const std::vector<float> slope = {0.5f, 0.0625f, 0.70710677f, 3.f};
  const std::vector<float> bias = {-1.5f, 2.25f, 0.125f, 7.f, -3.f};
  const std::vector<int32_t> offset = {4, 0, 3, 1, 2, 2, 0, 1};
  for (const char* score : {"score + slope[h] * (kv - q)", "score - slope[h] * (q - kv)", "(kv - q) * slope[h] + 2 * score",
                            "score + bias[offset[q]]", "tanh(score) + slope[h] * (kv - q + 3) - bias[h]",
                            "-(slope[h] * (q - kv - 2)) + score * score + bias[kv % 5]"}) {
    INFO(score);
    const SpecIR ir = optimized_spec(score, {"slope: f32[H]", "bias: f32[N]", "offset: i32[Sq]"});
    const RowTerms t = split_row_terms(ir.score_mod);
    REQUIRE(t.split);
    EvalEnv env;
    env.symbols = test::symbols(ir.checked, {{"H", 4}, {"N", 5}, {"Sq", 8}, {"Skv", 8}});
    env.buffers = {test::view(dsl::DType::F32, slope, {4}), test::view(dsl::DType::F32, bias, {5}),
                   test::view(dsl::DType::I32, offset, {8})};
    std::mt19937 rng(7);
    for (int i = 0; i < 200; ++i) {
      const int64_t h = rng() % 4, q = rng() % 8, kv = rng() % 8, a = q - static_cast<int64_t>(rng() % 32);
      const float score = std::uniform_real_distribution<float>(-4.f, 4.f)(rng);
      test::set_point(env, 0, h, q, kv, score);
      const float whole = evaluate(ir.score_mod, env).f;
      const float rest = evaluate(t.rest, env).f;
      float col = 0.f, row = 0.f;
      env.vars[int(dsl::VarId::TileStart)] = a;
      env.vars[int(dsl::VarId::TileCol)] = kv - a;
      if (t.col) col = evaluate(t.col, env).f;
      if (t.row) row = evaluate(t.row, env).f;
      INFO("h " << h << " q " << q << " kv " << kv << " anchor " << a);
      CHECK(std::fabs(rest + col + row - whole) <= 1e-5f * (1.f + std::fabs(whole)));
    }
  }
}

TEST_CASE("row terms: what does not split", "[codegen]") {
  for (const char* score : {"score + bias[h, q - kv + Skv - 1]",  // one load of both positions
                            "score + slope[h] * abs(kv - q)",      // not a sum under the conversion
                            "score * (kv - q)",                    // the score times a position
                            "score + slope[q] * (kv - q)",         // a factor that depends on the row
                            "score + slope[h] * (2 * kv - q)",     // kv with a coefficient other than +-1
                            "score + bias[kv, 0]", "score * 2", "score + slope[h] * float(kv * kv)"}) {
    INFO(score);
    const SpecIR ir = optimized_spec(score, {"slope: f32[Sq]", "bias: f32[Skv, Skv]"});
    CHECK(!split_row_terms(ir.score_mod).split);
    CHECK(!has(forward_variant(ir), "kRowTerms"));
  }
}

TEST_CASE("row terms: the forward variant drops them from the per-element score_mod", "[codegen]") {
  // ALiBi: nothing left per element but the column term; the row term is a conversion of q - a, not of q.
  const std::string alibi = forward_variant(optimized_spec("score + slope[h] * (kv - q)", {"slope: f32[H]"}, "q >= kv"));
  INFO(alibi);
  CHECK(has(alibi, "static constexpr bool kRowTerms = true;"));
  CHECK(has(alibi, "static constexpr bool kColTerms = true;"));
  CHECK(has(alibi, "static constexpr bool kHasScoreMod = true;"));
  CHECK(has(alibi, "(float)j"));
  CHECK(!has(alibi, "float score_mod("));
  // A bias gathered per row: no per-element work at all.
  const std::string offset = forward_variant(optimized_spec("score + bias[offset[q]]", {"bias: f32[N]", "offset: i32[Sq]"}));
  INFO(offset);
  CHECK(has(offset, "kRowTerms = true;"));
  CHECK(!has(offset, "kColTerms"));
  CHECK(!has(offset, "kHasScoreMod"));
  // Decode and the backward evaluate score_mod whole.
  const SpecIR ir = optimized_spec("score + slope[h] * (kv - q)", {"slope: f32[H]"});
  CHECK(!has(generate_cuda_variant(ir, analyze_ir_ranges(ir), VariantOptions{}).code, "kRowTerms"));
}

TEST_CASE("row-constant scatters are dropped: their gradient is rowsum(dS) = 0 times a row constant", "[codegen]") {
  auto kept = [](const std::string& score, const std::vector<std::string>& buffers) {
    dsl::Spec spec;
    spec.score_mod = score;
    dsl::Diagnostics d;
    for (const auto& b : buffers) dsl::add_buffer(spec, b, "test", d);
    for (dsl::BufferDecl& b : spec.buffers) b.requires_grad = b.dtype == dsl::DType::F32;
    REQUIRE(!d.has_errors());
    ScoreModGradient g = differentiate_score_mod(build_spec_ir(spec));
    drop_row_constant_scatters(g);
    std::vector<int> out;
    for (const GradScatter& s : g.scatters) out.push_back(s.buffer);
    return out;
  };
  CHECK(kept("score + bias[offset[q]]", {"bias: f32[N]", "offset: i32[Sq]"}).empty());
  CHECK(kept("score + 3 * bias[h] + slope[h] * (kv - q)", {"bias: f32[H]", "slope: f32[H]"}) == std::vector<int>{1});
  CHECK(kept("score * bias[q]", {"bias: f32[Sq]"}) == std::vector<int>{0});      // the coefficient is the score
  CHECK(kept("score + bias[q, kv % 4]", {"bias: f32[Sq, 4]"}) == std::vector<int>{0});  // the index moves along the row
}

TEST_CASE("row terms: a conversion is split only where its integer sum has a finite range, and stays 64-bit off kv - q", "[codegen]") {
  dsl::Spec spec;
  spec.score_mod = "score + slope[h] * (kv - q + shift)";
  dsl::Diagnostics d;
  dsl::add_buffer(spec, "slope: f32[H]", "test", d);
  dsl::add_param(spec, "shift: int", "test", d);
  REQUIRE(!d.has_errors());
  CHECK(!has(forward_variant(build_spec_ir(spec)), "kRowTerms"));  // an int parameter has no bound: the sum may wrap
  const std::string offset = forward_variant(optimized_spec("score + slope[h] * (kv - q + 3)", {"slope: f32[H]"}));
  INFO(offset);
  CHECK(has(offset, "kColTerms = true;"));
  CHECK(has(offset, "fj::add((long long)j, (long long)3)"));
}
