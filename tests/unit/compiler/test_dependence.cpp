// Tests of the dependence analysis.
#include <catch2/catch.hpp>

#include <stdexcept>

#include "compiler/ir/ir_mutator.h"
#include "compiler/ir/ir_printer.h"
#include "compiler/passes/dependence.h"
#include "compiler/passes/pipeline.h"
#include "unit/compiler/spec_fixture.h"

using namespace flexjit;
using namespace flexjit::ir;
using dsl::VarId;

namespace {

uint32_t bit(VarId v) { return 1u << int(v); }

Expr find_load(const std::vector<Expr>& roots, const std::string& name) {
  Expr found;
  for_each_node(roots, [&](const Expr& e) {
    if (const Load* l = e.as<Load>(); l && l->name == name) found = e;
  });
  REQUIRE(found);
  return found;
}

}  // namespace

TEST_CASE("dependence: the SAM loads", "[compiler][dependence]") {
  SpecIR s = optimize(test::make_spec("score + rel_h[b, h, q, kv // 64] + rel_w[b, h, q, kv % 64]", std::nullopt,
                                      {"rel_h: bf16[B, H, Sq, 64]", "rel_w: bf16[B, H, Sq, 64]"}));
  DependenceInfo info({s.score_mod, s.mask_mod});
  Expr rel_h = find_load({s.score_mod}, "rel_h");
  const Dependence& d = info.of(rel_h);
  CHECK(d.vars == (bit(VarId::B) | bit(VarId::H) | bit(VarId::Q) | bit(VarId::KV)));
  CHECK(d.uses(VarId::KV));
  CHECK_FALSE(d.uses(VarId::Score));
  CHECK(d.buffers == std::vector<int>{0});
  CHECK(d.has_load);
  CHECK_FALSE(d.uses_params);
  CHECK(d.describe({"rel_h", "rel_w"}) == "depends on b,h,q,kv; loads rel_h");
  CHECK(d.describe() == "depends on b,h,q,kv; loads buffer#0");

  const Dependence& idx = info.of(rel_h.as<Load>()->indices[3]);  // kv // 64
  CHECK(idx.vars == bit(VarId::KV));
  CHECK(idx.buffers.empty());
  CHECK_FALSE(idx.has_load);
  CHECK(info.of(rel_h.as<Load>()->indices[0]).vars == bit(VarId::B));

  const Dependence& root = info.of(s.score_mod);
  CHECK(root.uses(VarId::Score));
  CHECK(root.buffers == std::vector<int>{0, 1});
  CHECK(root.describe({"rel_h", "rel_w"}) == "depends on b,h,q,kv,score; loads rel_h,rel_w");
}

TEST_CASE("dependence: params, symbols, nested loads and unknown nodes", "[compiler][dependence]") {
  SpecIR s = test::make_spec("score + bias[offset[q]] * slope + float(Skv)", "q >= kv - window", {"bias: f32[L]", "offset: i32[Sq]"},
                             {"slope: float", "window: int"});
  DependenceInfo info({s.score_mod, s.mask_mod});
  Expr bias = find_load({s.score_mod}, "bias");
  const Dependence& d = info.of(bias);
  CHECK(d.vars == bit(VarId::Q));
  CHECK(d.buffers == std::vector<int>{0, 1});  // nested: offset is loaded to index bias
  CHECK_FALSE(d.uses_params);
  const Dependence& root = info.of(s.score_mod);
  CHECK(root.uses_params);
  CHECK(root.symbols == std::vector<int>{s.checked.symbol_index("Skv")});
  const Dependence& mask = info.of(s.mask_mod);
  CHECK(mask.uses_params);
  CHECK(mask.vars == (bit(VarId::Q) | bit(VarId::KV)));
  CHECK(mask.describe() == "depends on q,kv; uses params");
}

TEST_CASE("dependence: unknown nodes throw", "[compiler][dependence]") {
  SpecIR s = test::make_spec(std::nullopt, "q >= kv");
  DependenceInfo info({s.mask_mod});
  CHECK_THROWS_AS(info.of(make_int(1)), std::out_of_range);
  CHECK(info.of(s.mask_mod).describe() == "depends on q,kv");
}
