// Floor division and modulo by a runtime int parameter through its launch multiplier
// (kernels_templates/flex_int_divisor.cuh, the functions the generated kernels call) against Python's // and %, with
// the language's 0 for a zero divisor, over the divisors where the multiplier is hardest to get right.
#include <catch2/catch.hpp>

#include <cstdint>
#include <random>
#include <vector>

#include "kernels_templates/flex_int_divisor.cuh"

namespace {

long long py_floordiv(long long a, long long d) {
  if (d == 0) return 0;
  long long q = a / d;
  if (a % d != 0 && ((a < 0) != (d < 0))) --q;
  return q;
}

long long py_mod(long long a, long long d) {
  if (d == 0) return 0;
  return static_cast<long long>(static_cast<__int128>(a) - static_cast<__int128>(py_floordiv(a, d)) * d);
}

}  // namespace

TEST_CASE("floor division and modulo by a runtime int parameter match Python's for every divisor", "[codegen][int-divisor]") {
  std::vector<long long> divisors = {1, 2, 3, 5, 7, 10, 14, 16, 63, 64, 65, 100, 641, 1000, 4096, 65535, 65536, 65537, 1ll << 30,
                                     (1ll << 30) + 1, (1ll << 31) - 2, (1ll << 31) - 1, 1ll << 31, (1ll << 31) + 1, 1ll << 40,
                                     INT64_MAX, 0, -1, -2, -3, -7, -64, -65, -(1ll << 30), -((1ll << 31) - 1), -(1ll << 31),
                                     -(1ll << 31) - 1, -(1ll << 40), INT64_MIN};
  std::mt19937_64 rng(20261127);
  for (int i = 0; i < 200; ++i) divisors.push_back(static_cast<long long>(rng() % ((1ull << 31) - 1)) + 1);
  std::vector<int> dividends = {0, 1, 2, 13, 63, 64, 65, 4095, 4096, 65535, 65536, (1 << 30) - 1, 1 << 30, INT32_MAX - 1, INT32_MAX};
  for (int i = 0; i < 200; ++i) dividends.push_back(static_cast<int>(rng() % (1ull << 31)));
  for (long long d : divisors) {
    const unsigned long long magic = fj::divisor_magic(d);
    CHECK(((magic & 0xffffffffull) != 0) == (d != 0 && d > -(1ll << 31) && d < (1ll << 31)));
    // Next to each divisor's multiples, where a rounding error of the multiplier shows first.
    std::vector<int> as = dividends;
    if (d >= 1 && d < (1ll << 31))
      for (long long k : {1ll, 2ll, 3ll, (1ll << 31) / d - 1, (1ll << 31) / d})
        for (long long a = k * d - 1; a <= k * d + 1; ++a)
          if (a >= 0 && a <= INT32_MAX) as.push_back(static_cast<int>(a));
    for (int a : as) {
      INFO("a = " << a << ", d = " << d);
      REQUIRE(fj::floordiv_by_param(a, d, magic) == py_floordiv(a, d));
      REQUIRE(fj::mod_by_param(a, d, magic) == py_mod(a, d));
    }
  }
}

TEST_CASE("the divisor multiplier is exact over every dividend for small divisors", "[codegen][int-divisor]") {
  // Every a < 2^20 for d < 300, and a stride through the whole range: the multiplier's error grows with a.
  for (long long d = 1; d < 300; ++d) {
    const unsigned long long magic = fj::divisor_magic(d);
    for (int a = 0; a < (1 << 20); ++a)
      if (fj::floordiv_by_param(a, d, magic) != a / d) FAIL("a = " << a << ", d = " << d);
    for (long long a = INT32_MAX; a >= 0; a -= 9973)
      if (fj::floordiv_by_param(static_cast<int>(a), d, magic) != a / d) FAIL("a = " << a << ", d = " << d);
  }
}
