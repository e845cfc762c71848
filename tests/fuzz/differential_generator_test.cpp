// The differential generator and shrinker themselves: generated specs are well typed and
// reproducible, declarations are used consistently, and a shrunk case keeps failing the way
// the original did while getting smaller.
#include <catch2/catch.hpp>

#include <regex>

#include "compiler/frontend.h"
#include "fuzz/differential/case_runner.h"
#include "fuzz/differential/random_spec.h"
#include "fuzz/differential/shrink.h"

using namespace flexjit;
using namespace flexjit::fuzz;

TEST_CASE("every generated spec checks, in both kinds, and a seed always gives the same case", "[fuzz][differential]") {
  for (bool gpu : {false, true}) {
    GenOptions o;
    o.gpu = gpu;
    int with_score = 0, with_mask = 0, with_buffers = 0, with_grads = 0;
    for (uint64_t seed = 1; seed <= 600; ++seed) {
      GenCase c = generate_case(seed, o);
      const dsl::Spec spec = c.spec();
      INFO(describe(c));
      REQUIRE(spec.buffers.size() == c.buffers.size());
      REQUIRE(spec.params.size() == c.params.size());
      REQUIRE_NOTHROW(build_spec_ir(spec));
      CHECK(dsl::spec_to_json(generate_case(seed, o).spec()) == dsl::spec_to_json(spec));
      CHECK(c.sizes.H % c.sizes.Hkv == 0);
      if (gpu) CHECK(c.dtype != dsl::DType::F32);
      with_score += spec.score_mod.has_value();
      with_mask += spec.mask_mod.has_value();
      with_buffers += !spec.buffers.empty();
      for (const dsl::BufferDecl& b : spec.buffers) with_grads += b.requires_grad;
    }
    // Every feature is exercised often.
    CHECK(with_score > 300);
    CHECK(with_mask > 250);
    CHECK(with_buffers > 400);
    CHECK(with_grads > 100);
  }
}

TEST_CASE("a case survives its regression file unchanged", "[fuzz][differential]") {
  GenCase c = generate_case(42, {});
  GenCase back = case_from_json(case_to_json(c));
  CHECK(dsl::spec_to_json(back.spec()) == dsl::spec_to_json(c.spec()));
  CHECK(back.sizes.Sq == c.sizes.Sq);
  CHECK(back.sizes.Skv == c.sizes.Skv);
  CHECK(back.values == c.values);
  CHECK(back.bshd == c.bshd);
  CHECK(back.backward == c.backward);
}

TEST_CASE("shrinking keeps the failure and drops everything else", "[fuzz][differential]") {
  // A stand-in for a bug: any spec whose mask_mod compares q and kv with >= "fails".
  auto fails = [](const GenCase& c) { return c.mask_mod && c.mask_mod->render().find("q >= kv") != std::string::npos; };
  int shrunk = 0;
  for (uint64_t seed = 1; seed <= 200 && shrunk < 5; ++seed) {
    GenCase c = generate_case(seed, {});
    if (!fails(c) || c.mask_mod->size() < 4) continue;
    GenCase s = shrink_case(c, fails);
    INFO(describe(c) << "\nshrunk to " << describe(s));
    CHECK(fails(s));
    CHECK_FALSE(s.score_mod);
    CHECK(s.mask_mod->size() < c.mask_mod->size());
    CHECK(s.sizes.B == 1);
    CHECK(s.sizes.Sq == 1);
    CHECK(s.buffers.empty());
    ++shrunk;
  }
  CHECK(shrunk == 5);
}
