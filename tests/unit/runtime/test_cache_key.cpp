// Tests of the cache key: canonical text, stability, hashing, validation.
#include <catch2/catch.hpp>

#include <string>

#include "dsl/error.h"
#include "kernels_templates/embedded.h"
#include "runtime/cache_key.h"

using namespace flexjit::runtime;

TEST_CASE("cache key: the text is canonical and stable", "[runtime][cache_key]") {
  CacheKey key = CacheKeyBuilder()
                     .arch("sm_90a")
                     .nvrtc_version("13.0")
                     .set("score_mod", "(add score (mul 2 q))")
                     .set("head_dim", 128)
                     .set("causal", true)
                     .options({"--std=c++17", "-default-device"})
                     .entries({"flex_fwd", "flex_lse"})
                     .build();
  std::string expected = std::string("schema=1\n") + "flexjit_version=" + FLEXJIT_VERSION + "\n" +
                         "templates=" + flexjit::templates::content_hash() + "\n" +
                         "arch=sm_90a\n"
                         "nvrtc=13.0\n"
                         "causal=true\n"
                         "entries[#]=2\n"
                         "entries[0]=flex_fwd\n"
                         "entries[1]=flex_lse\n"
                         "head_dim=128\n"
                         "options[#]=2\n"
                         "options[0]=--std=c++17\n"
                         "options[1]=-default-device\n"
                         "score_mod=(add score (mul 2 q))\n";
  CHECK(key.text() == expected);
  CHECK(key.arch() == "sm_90a");
  REQUIRE(key.hash().size() == 32);
  CHECK(key.hash().find_first_not_of("0123456789abcdef") == std::string::npos);
}

TEST_CASE("cache key: field order and option order do not matter", "[runtime][cache_key]") {
  CacheKey a = CacheKeyBuilder().set("x", "1").set("y", "2").arch("sm_80").options({"-b", "-a"}).build();
  CacheKey b = CacheKeyBuilder().options({"-a", "-b"}).arch("sm_80").set("y", "2").set("x", "1").build();
  CHECK(a.text() == b.text());
  CHECK(a.hash() == b.hash());
  CHECK(a == b);
}

TEST_CASE("cache key: every field reaches the hash", "[runtime][cache_key]") {
  auto base = [] { return CacheKeyBuilder().arch("sm_90a").nvrtc_version("13.0").set("ir", "q - kv"); };
  std::string h = base().build().hash();
  CHECK(base().arch("sm_80").build().hash() != h);
  CHECK(base().nvrtc_version("13.1").build().hash() != h);
  CHECK(base().set("ir", "kv - q").build().hash() != h);
  CHECK(base().set("extra", "").build().hash() != h);
  CHECK(base().options({}).build().hash() != h);  // an empty list differs from no list
  CHECK(base().build().hash() == h);               // and building twice gives the same hash
}

TEST_CASE("cache key: values are escaped onto one line", "[runtime][cache_key]") {
  CacheKey multi = CacheKeyBuilder().set("ir", "line1\nline2\\n").build();
  CHECK(multi.text().find("ir=line1\\nline2\\\\n\n") != std::string::npos);
  CacheKey other = CacheKeyBuilder().set("ir", "line1\\nline2\\n").build();
  CHECK(multi.hash() != other.hash());
  // A value cannot forge another field's line.
  CacheKey forged = CacheKeyBuilder().set("a", "1\nb=2").build();
  CacheKey real = CacheKeyBuilder().set("a", "1").set("b", "2").build();
  CHECK(forged.hash() != real.hash());
}

TEST_CASE("cache key: the hash is XXH3-128", "[runtime][cache_key]") {
  // Reference values of XXH3-128 (xxhsum -H2).
  CHECK(xxh3_128_hex("", 0) == "99aa06d3014798d86001c324468d497f");
  CacheKey key = CacheKeyBuilder().arch("sm_80").build();
  CHECK(key.hash() == xxh3_128_hex(key.text().data(), key.text().size()));
}

TEST_CASE("cache key: bad names and architectures are rejected", "[runtime][cache_key]") {
  CHECK_THROWS_AS(CacheKeyBuilder().set("bad name", "x"), flexjit::Error);
  CHECK_THROWS_AS(CacheKeyBuilder().set("", "x"), flexjit::Error);
  CHECK_THROWS_AS(CacheKeyBuilder().set("a=b", "x"), flexjit::Error);
  CHECK_THROWS_AS(CacheKeyBuilder().arch("../sm_90a"), flexjit::Error);
  CHECK_THROWS_AS(CacheKeyBuilder().set("arch", "sm 90"), flexjit::Error);
  CHECK_THROWS_AS(CacheKeyBuilder().set_list("arch", {"sm_80"}), flexjit::Error);
  CHECK(CacheKeyBuilder().build().arch().empty());
}
