// What a new user meets first: dtype spellings from PyTorch and elsewhere (fp32, fp16, bf16,
// float32, ...) wherever a dtype is read, a missing spec file reported as missing, and tests
// that find their data in the checkout they run from.
#include <catch2/catch.hpp>

#include <filesystem>

#include "dsl/builtins.h"
#include "dsl/decl.h"
#include "dsl/spec.h"
#include "support/shell.h"
#include "support/spec_loading.h"
#include "support/test_paths.h"

using namespace flexjit;
namespace fs = std::filesystem;

TEST_CASE("dtype aliases: fp32, fp16, bf16 and the long names mean the same types", "[dsl][dtype]") {
  using dsl::DType;
  for (const char* s : {"f32", "fp32", "float32"}) CHECK(dsl::parse_dtype(s) == DType::F32);
  for (const char* s : {"f16", "fp16", "float16"}) CHECK(dsl::parse_dtype(s) == DType::F16);
  for (const char* s : {"bf16", "bfloat16"}) CHECK(dsl::parse_dtype(s) == DType::BF16);
  CHECK_FALSE(dsl::parse_dtype("fp64"));
  CHECK_FALSE(dsl::parse_dtype("FP32"));

  dsl::Diagnostics d;
  auto spec = dsl::parse_spec_json(R"({"mask_mod": "q >= kv", "dtype": "fp32", "buffers": ["bias: fp16[H]"]})", "spec.json", d);
  INFO(d.render_text());
  REQUIRE(spec);
  CHECK(spec->dtype == DType::F32);
  REQUIRE(spec->buffers.size() == 1);
  CHECK(spec->buffers[0].dtype == DType::F16);
  CHECK(spec->buffers[0].str() == "bias: f16[H]");  // printed in the canonical spelling

  const std::string cli = test::cli_path();
  for (const char* dt : {"fp32", "fp16", "bf16", "float16", "bfloat16"}) {
    test::ShellResult r = test::run_shell(cli + " check --mask 'q >= kv' --dtype " + dt);
    INFO(dt << ": " << r.out);
    CHECK(r.status == 0);
  }
  test::ShellResult bad = test::run_shell(cli + " check --mask 'q >= kv' --dtype fp64");
  CHECK(bad.status == 1);
  CHECK(bad.out.find("--dtype fp64 is not supported") != std::string::npos);
}

TEST_CASE("a missing spec file is reported as not found, by the CLI and by the tests' loader", "[cli][paths]") {
  const fs::path missing = fs::temp_directory_path() / "flexjit-no-such-dir" / "spec.json";
  test::ShellResult r = test::run_shell(test::cli_path() + " check " + missing.string());
  CHECK(r.status == 1);
  CHECK(r.out.find("spec file '" + missing.string() + "' not found") != std::string::npos);
  CHECK(r.out.find("not valid JSON") == std::string::npos);
  CHECK_THROWS_WITH(test::load_spec(missing), Catch::Contains("not found") && Catch::Contains("FLEXJIT_TEST_SOURCE_DIR"));
}

TEST_CASE("the tests locate the checkout they run from", "[paths]") {
  const fs::path root = fs::canonical(test::source_dir());
  CHECK(test::is_checkout_root(root));
  CHECK(test::checkout_above(root / "tests" / "unit" / "tools") == root);
  CHECK(test::checkout_above(root / "examples" / "gallery" / "causal.json") == root);
  const fs::path elsewhere = fs::temp_directory_path() / ("flexjit-not-a-checkout-" + std::to_string(::getpid()));
  fs::create_directories(elsewhere / "tests");
  CHECK_FALSE(test::is_checkout_root(elsewhere));
  if (!test::checkout_above(fs::temp_directory_path())) CHECK_FALSE(test::checkout_above(elsewhere / "tests"));
  fs::remove_all(elsewhere);
  // Every gallery spec the tests read is found there.
  CHECK(test::gallery_specs().size() >= 10);
}
