// Floor division and modulo of a non-negative 32-bit value by a runtime integer parameter (`kv // W` with `W: int`),
// through a multiplier the host computes once per launch instead of a 64-bit division per element: the division is a
// subroutine call on the GPU, whose calling convention makes the compiler spill the score_mod's registers around it.
// The language's semantics (docs/SEMANTICS.md) are kept for every divisor: Python's floor division, 0 for a zero
// divisor.
#pragma once

// Host and device: the host computes the multiplier and tests the functions (tests/unit/codegen/int_divisor_test.cpp).
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define FLEX_INT_DIVISOR_FN __host__ __device__ __forceinline__
#else
#define FLEX_INT_DIVISOR_FN inline
#endif

namespace fj {

// The launch constant of divisor d, one formula for every d: with e = |d| and 1 <= e < 2^31, s = 31 + ceil(log2 e) and
// M = ceil(2^s / e), so that floor(a / e) = (a M) >> s for every 0 <= a < 2^31 (Granlund and Montgomery: M e - 2^s <
// e <= 2^ceil(log2 e); M < 2^32 because e > 2^(ceil(log2 e) - 1), and a M < 2^63). M = s = 0 where e = 0 or
// e >= 2^31 (the quotient of a by e is 0 there). Bits: M in 0..31, s in 32..37, d < 0 in 63.
constexpr unsigned long long divisor_magic(long long d) {
  const unsigned long long e = d < 0 ? 0ull - static_cast<unsigned long long>(d) : static_cast<unsigned long long>(d);
  unsigned long long ms = 0;
  if (e >= 1 && e < (1ull << 31)) {
    int l = 0;
    while ((1ull << l) < e) ++l;
    const int s = 31 + l;
    ms = (static_cast<unsigned long long>(s) << 32) | (((1ull << s) + e - 1) / e);
  }
  return ms | (d < 0 ? 1ull << 63 : 0ull);
}

// floor(a / d) for 0 <= a < 2^31; magic = divisor_magic(d). No division instruction and no branch but on the
// launch-uniform sign: q0 = floor(a / |d|), and floor(a / d) = -ceil(a / |d|) for d < 0.
FLEX_INT_DIVISOR_FN long long floordiv_by_param(int a, long long d, unsigned long long magic) {
  const unsigned long long ua = static_cast<unsigned>(a);
  const unsigned long long q0 = (ua * (magic & 0xffffffffull)) >> ((magic >> 32) & 63);
  if ((magic >> 63) == 0) return static_cast<long long>(q0);
  const unsigned long long e = 0ull - static_cast<unsigned long long>(d);
  return -static_cast<long long>(q0 + (ua != q0 * e ? 1 : 0));
}

// a mod d (the sign of d, Python's %) for 0 <= a < 2^31; 0 for d = 0.
FLEX_INT_DIVISOR_FN long long mod_by_param(int a, long long d, unsigned long long magic) {
  // The remainder a - q d always fits 64 bits, but q d itself not for q = -1 and d = -2^63: in wrap-around arithmetic.
  const unsigned long long qd = static_cast<unsigned long long>(floordiv_by_param(a, d, magic)) * static_cast<unsigned long long>(d);
  return d == 0 ? 0 : static_cast<long long>(static_cast<unsigned long long>(a) - qd);
}

}  // namespace fj
