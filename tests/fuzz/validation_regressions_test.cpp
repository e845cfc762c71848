// Regression tests of the bugs the fuzz targets found, one case each, stated through the public
// interfaces (the inputs that found them are in tests/fuzz/regressions/ too).
#include <catch2/catch.hpp>

#include <cstdint>
#include <limits>
#include <vector>

#include "compiler/bindings.h"
#include "dsl/error.h"
#include "dsl/spec.h"
#include "runtime/capi/flexjit.h"
#include "runtime/forward_launch.h"

using namespace flexjit;

TEST_CASE("a spec file cut off at its end is reported with a caret inside the text", "[fuzz][regression]") {
  const std::string text = "{\"mask_mod\": ";
  dsl::Diagnostics diags;
  CHECK_FALSE(dsl::parse_spec_json(text, "spec.json", diags));
  REQUIRE(diags.list().size() == 1);
  const dsl::Diagnostic& d = diags.list().front();
  REQUIRE(d.source);
  CHECK(d.span.begin <= text.size());
  CHECK(d.span.end <= text.size());
  CHECK(diags.render_text().find("not valid JSON") != std::string::npos);
}

TEST_CASE("a spec file with a number beyond double is an error, not an escaping exception", "[fuzz][regression]") {
  dsl::Diagnostics diags;
  CHECK_FALSE(dsl::parse_spec_json(R"({"head_dim": 64, "gqa_group": 1e400})", "spec.json", diags));
  REQUIRE(diags.list().size() == 1);
  CHECK(diags.list().front().message.find("not valid JSON") != std::string::npos);
  // Through the C API it once came back as FLEXJIT_ERROR_INTERNAL ("a bug in flexjit").
  flexjit_runtime* rt = nullptr;
  flexjit_kernel* k = nullptr;
  REQUIRE(flexjit_runtime_create(&rt) == FLEXJIT_OK);
  CHECK(flexjit_compile(rt, R"({"mask_mod": "q >= kv", "head_dim": 1e400})", &k) == FLEXJIT_ERROR_COMPILE);
  flexjit_runtime_destroy(rt);
}

TEST_CASE("contiguous strides that overflow 64 bits are an error, not undefined behaviour", "[fuzz][regression]") {
  CHECK(contiguous_strides({2, 3, 4}) == std::vector<int64_t>{12, 4, 1});
  const int64_t big = (int64_t{1} << 31) - 1;
  CHECK_THROWS_AS(contiguous_strides({1, big, big, big}), Error);
}

#ifdef FLEXJIT_HAVE_CPU_BACKEND
TEST_CASE("the C API refuses strides whose extent no memory can have", "[fuzz][regression]") {
  REQUIRE(flexjit_enable_cpu_backend() == FLEXJIT_OK);
  flexjit_runtime* rt = nullptr;
  flexjit_kernel* k = nullptr;
  flexjit_args* a = nullptr;
  REQUIRE(flexjit_runtime_create(&rt) == FLEXJIT_OK);
  REQUIRE(flexjit_compile(rt, R"({"mask_mod": "q >= kv", "dtype": "f32", "head_dim": 8})", &k) == FLEXJIT_OK);
  REQUIRE(flexjit_args_create(&a) == FLEXJIT_OK);
  std::vector<float> q(2 * 2 * 5 * 8, 0.5f), kv(2 * 2 * 7 * 8, 0.25f), o(q.size()), lse(2 * 2 * 5), d_o(q.size(), 1.0f), dq(q.size()),
      dk(kv.size()), dv(kv.size());
  REQUIRE(flexjit_args_set_qkvo(a, q.data(), kv.data(), kv.data(), o.data(), FLEXJIT_F32, 2, 2, 2, 5, 7, 8) == FLEXJIT_OK);
  REQUIRE(flexjit_args_set_lse(a, lse.data()) == FLEXJIT_OK);
  REQUIRE(flexjit_args_set_stream(a, nullptr, -2) == FLEXJIT_OK);
  REQUIRE(flexjit_forward(k, a) == FLEXJIT_OK);
  REQUIRE(flexjit_args_set_backward(a, d_o.data(), dq.data(), dk.data(), dv.data()) == FLEXJIT_OK);
  REQUIRE(flexjit_backward(k, a) == FLEXJIT_OK);
  // v's head stride reaches 2^63 elements away: once read as a wild address (SIGSEGV in the backward).
  const int64_t wild[4] = {100, std::numeric_limits<int64_t>::min(), 100, -64};
  REQUIRE(flexjit_args_set_strides(a, nullptr, nullptr, wild, nullptr) == FLEXJIT_OK);
  CHECK(flexjit_backward(k, a) == FLEXJIT_ERROR_USER);
  CHECK(std::string(flexjit_last_error()).find("further apart than any memory") != std::string::npos);
  CHECK(flexjit_forward(k, a) == FLEXJIT_ERROR_USER);
  flexjit_args_destroy(a);
  flexjit_kernel_destroy(k);
  flexjit_runtime_destroy(rt);
}
#endif

// The C API's check moved into the launch validation every API shares (docs/FUZZING.md listed the C++ API as open).
TEST_CASE("launches through the C++ API refuse strides whose extent no memory can have", "[fuzz][regression]") {
  dsl::Spec spec;
  spec.dtype = dsl::DType::F32;
  spec.head_dim = 8;
  dsl::Diagnostics diags;
  REQUIRE(dsl::add_buffer(spec, "bias: f32[Skv]", "test", diags));
  std::vector<float> q(2 * 5 * 8), kv(2 * 7 * 8), o(q.size()), bias(7);
  AttentionArgs a;
  a.q = Tensor{q.data(), dsl::DType::F32, {1, 2, 5, 8}, {}};
  a.k = Tensor{kv.data(), dsl::DType::F32, {1, 2, 7, 8}, {}};
  a.v = a.k;
  a.o = Tensor{o.data(), dsl::DType::F32, {1, 2, 5, 8}, {}};
  a.buffers = {{"bias", Tensor{bias.data(), dsl::DType::F32, {7}, {}}}};
  CHECK_NOTHROW(runtime::validate_operands(spec, a, /*gpu=*/false));
  CHECK_NOTHROW(runtime::collect_buffers(spec, a, {}));
  const int64_t wild = std::numeric_limits<int64_t>::min();
  AttentionArgs bad_v = a;
  bad_v.v.strides = {100, wild, 8, 1};
  CHECK_THROWS_WITH(runtime::validate_operands(spec, bad_v, false), Catch::Contains("v has shape") && Catch::Contains("further apart than any memory"));
  AttentionArgs bad_buffer = a;
  bad_buffer.buffers = {{"bias", Tensor{bias.data(), dsl::DType::F32, {7}, {wild}}}};
  CHECK_THROWS_WITH(runtime::collect_buffers(spec, bad_buffer, {}), Catch::Contains("buffer `bias`") && Catch::Contains("further apart"));
}

TEST_CASE("a ragged launch with zero KV heads is refused, not divided by", "[fuzz][regression]") {
  flexjit_runtime* rt = nullptr;
  flexjit_kernel* k = nullptr;
  flexjit_args* a = nullptr;
  REQUIRE(flexjit_runtime_create(&rt) == FLEXJIT_OK);
  REQUIRE(flexjit_compile(rt, R"({"dtype": "bf16", "head_dim": 16})", &k) == FLEXJIT_OK);
  REQUIRE(flexjit_args_create(&a) == FLEXJIT_OK);
  std::vector<uint16_t> x(64 * 16);
  const int32_t cu[3] = {0, 3, 6};
  REQUIRE(flexjit_args_set_varlen(a, x.data(), x.data(), x.data(), x.data(), FLEXJIT_BF16, 2, 2, 0, 0, 16, 2, cu, cu, 3, 3) == FLEXJIT_OK);
  CHECK(flexjit_forward_varlen(k, a) != FLEXJIT_OK);
  CHECK(std::string(flexjit_last_error()).find("heads") != std::string::npos);
  flexjit_args_destroy(a);
  flexjit_kernel_destroy(k);
  flexjit_runtime_destroy(rt);
}
