// The online softmax of the forward and decode kernels over one thread's rows of the S accumulator (any loop whose accumulators
// use the m16n8 C layout: mma.sync, and wgmma, which repeats it per warp).
#pragma once
#include "flex_mma.cuh"
#include "flex_type_traits.cuh"

namespace flex {

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000u); }

// Online softmax, base 2, over S tiles of kMTiles x kNTiles m16n8 blocks per warp (rows 2 kMTiles per thread):
//   m' = max(m, rowmax(S));  P = exp2(S * mult - m' * mult);  l' = l * exp2((m - m') * mult) + rowsum(P);
//   O' = O * exp2((m - m') * mult)
// mult is the exp2 factor of one S unit (scale * log2(e) on raw q.k, or log2(e) times the variant's out scale on
// modified scores); score_unit (the LSE's factor) is what one S unit is in natural-log score units.
//
// Lazy rescaling: a row keeps its stale max m unless the tile's max exceeds it by more than kRescaleLog2 in exp2
// units, so P <= 2^kRescaleLog2 (harmless in fp32 sums and in bf16/fp16 P) and O *= alpha runs only when some row
// of the warp jumped. The final O / l and LSE use the same m, so the result is unchanged. A row with every element
// -inf so far keeps m = -inf and subtracts 0, so P = exp2(-inf) = 0 instead of NaN from (-inf) - (-inf).
//
// kFixedMax (Variant::kFixedMax): the variant's score_mod_core is bounded by kScoreCoreMax, so the softmax subtracts
// that bound instead of each row's running maximum: no max reduction, no shuffles, no rescale of the sums and of O,
// and each exp2 waits on its own S element only. bf16 P only (fp16 would flush the smallest P to 0). A kernel whose S
// holds score_mod's whole value rather than a split variant's core (decode) passes kFixedMaxAllowed = false.
template <class Variant, class Element, int kMTiles, int kNTiles, bool kFixedMaxAllowed = true>
struct Softmax {
  static constexpr int kRows = 2 * kMTiles;
  // The fixed maximum only where P's type has fp32's exponent range (bf16): a P far below 1 stays a normal number
  // after packing.
  static constexpr bool kFixedMax = kFixedMaxAllowed && Variant::kFixedMax && IsSame<Element, __nv_bfloat16>::value;
  static constexpr float kRescaleLog2 = 8.f;

  float row_max[kRows];     // in S units
  float row_sum[kRows];     // this thread's part of the row sums (the quad's lanes are summed in finalize)
  float max_scaled[kRows];  // row_max * mult, what the exponentials subtract
  float mult;
  float lse_shift[kRows];   // added to a finite LSE: the row's split score terms (Variant::kRowTerms), else 0

  __device__ __forceinline__ explicit Softmax(float mult_) : mult(mult_) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      row_max[r] = kFixedMax ? Variant::kScoreCoreMax : neg_inf();
      row_sum[r] = 0.f;
      max_scaled[r] = kFixedMax ? Variant::kScoreCoreMax * mult : 0.f;
      lse_shift[r] = 0.f;
    }
  }

  // Takes the tile's row maxima: updates the maxima and rescales the sums; alpha is each row's factor for O. Returns
  // whether any of the thread's rows jumped (rescale_o skips the multiply when no row of the warp did).
  __device__ __forceinline__ bool update_max(const float (&s)[kMTiles][kNTiles][4], float (&alpha)[kRows]) {
    if constexpr (kFixedMax) {
#pragma unroll
      for (int r = 0; r < kRows; ++r) alpha[r] = 1.f;
      return false;
    }
    bool jumped = false;
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = mt * 2 + half;
        float t[kNTiles];  // tree reduction: depth log2(kNTiles) instead of a kNTiles-long dependency chain
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) t[nt] = fmaxf(s[mt][nt][2 * half], s[mt][nt][2 * half + 1]);
#pragma unroll
        for (int stride = 1; stride < kNTiles; stride *= 2)
#pragma unroll
          for (int i = 0; i + stride < kNTiles; i += 2 * stride) t[i] = fmaxf(t[i], t[i + stride]);
        const float mx = quad_max(fmaxf(row_max[r], t[0]));
        // (mx - m) * mult is +inf when m = -inf < mx, NaN (false) when both are -inf.
        const bool jump = (mx - row_max[r]) * mult > kRescaleLog2;
        const float m_new = jump ? mx : row_max[r];
        // 0 while the row has no max, and also where a finite max scales past the fp32 range (scores near -3.4e38,
        // e.g. the lowest bf16 used as a mask value): every element so far then scales to -inf as well, and 0 keeps
        // alpha = ex2(-inf - max_scaled) at 0 instead of NaN. A row whose every score is that low ends as fully masked.
        const float scaled = m_new * mult;
        max_scaled[r] = scaled == neg_inf() ? 0.f : scaled;
        // A row that did not jump keeps alpha = 1 exactly: computed, row_max * mult - max_scaled contracts to an FFMA
        // whose residual (up to half an ulp of max_scaled) would scale the row's sum every tile while O stays
        // unscaled, a drift that grows with the scores' magnitude and the number of tiles.
        alpha[r] = jump ? ex2(row_max[r] * mult - max_scaled[r]) : 1.f;
        row_max[r] = m_new;
        row_sum[r] *= alpha[r];
        jumped |= jump;
      }
    }
    return jumped;
  }

  // Whether some row of the warp jumped, so O needs rescaling. A runtime vote even where no row can jump (kFixedMax):
  // the Hopper mainloop branches on it (flex_mainloop_sm90.cuh says why).
  __device__ __forceinline__ static bool warp_jumped(bool jumped) { return __any_sync(0xffffffffu, jumped); }

  // O *= alpha (nothing under kFixedMax, where alpha is 1).
  template <int kDTiles>
  __device__ __forceinline__ void scale_o(float (&o)[kMTiles][kDTiles][4], const float (&alpha)[kRows]) const {
    if constexpr (kFixedMax) return;
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[mt][dt][e] *= alpha[mt * 2 + e / 2];
  }

  // O *= alpha when some row of the warp jumped; rows that did not have alpha = 1 exactly (or O = 0 while still
  // empty), so the skip is exact.
  template <int kDTiles>
  __device__ __forceinline__ void rescale_o(float (&o)[kMTiles][kDTiles][4], const float (&alpha)[kRows], bool jumped) const {
    if constexpr (kFixedMax) return;
    if (warp_jumped(jumped)) scale_o(o, alpha);
  }

  // P = exp2(S * mult - max_scaled) in place for the 16 columns kk of m-tile mt (n8 tiles 2 kk and 2 kk + 1), and
  // the row sums. kFmaShare (the tile policy's exp_on_fma): some of the exponentials on the FMA pipe
  // (flex::ex2_fma) instead of the MUFU unit: one in four, or one in two with kFixedMax (no row maximum holds the
  // exponentials back there, so MUFU is what they wait on).
  template <bool kFmaShare = false>
  __device__ __forceinline__ void exp_kstep(float (&s)[kMTiles][kNTiles][4], int mt, int kk) {
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float x = fmaf(s[mt][2 * kk + i][e], mult, -max_scaled[mt * 2 + e / 2]);
        s[mt][2 * kk + i][e] = kFmaShare && i == 1 && (kFixedMax || kk % 2 == 0) ? ex2_fma(x) : ex2(x);
      }
    row_sum[mt * 2] += (s[mt][2 * kk][0] + s[mt][2 * kk][1]) + (s[mt][2 * kk + 1][0] + s[mt][2 * kk + 1][1]);
    row_sum[mt * 2 + 1] += (s[mt][2 * kk][2] + s[mt][2 * kk][3]) + (s[mt][2 * kk + 1][2] + s[mt][2 * kk + 1][3]);
  }

  // The 16 columns kk of m-tile mt of P (exponentiated in place) as the A fragment of a 16-deep P V step.
  __device__ __forceinline__ static void pack_kstep(const float (&s)[kMTiles][kNTiles][4], int mt, int kk, unsigned (&pa)[4]) {
    using Mma = Mma16816<Element>;
    pa[0] = Mma::pack(s[mt][2 * kk][0], s[mt][2 * kk][1]);
    pa[1] = Mma::pack(s[mt][2 * kk][2], s[mt][2 * kk][3]);
    pa[2] = Mma::pack(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
    pa[3] = Mma::pack(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
  }

  // O = O / l;  LSE = max * score_unit + ln(l) + lse_shift. A fully masked row has l = 0: O = 0 and LSE = -inf.
  // lse_shift stands for a term of every score of the row, so a row shifted by -inf is fully masked as well, and one
  // shifted by +inf or NaN has NaN scores: O = NaN (LSE +inf or NaN), as if the term had been added to each score.
  template <int kDTiles>
  __device__ __forceinline__ void finalize(float (&o)[kMTiles][kDTiles][4], float score_unit, float (&lse)[kRows]) const {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = mt * 2 + half;
        const float l = quad_sum(row_sum[r]);
        const float shift = lse_shift[r];
        const bool empty = !(l > 0.f) || shift == neg_inf();
        const float inv = empty ? 0.f : isfinite(shift) ? 1.f / l : __int_as_float(0x7fffffff);
        lse[r] = empty ? neg_inf() : row_max[r] * score_unit + logf(l) + shift;
#pragma unroll
        for (int dt = 0; dt < kDTiles; ++dt) {
          o[mt][dt][2 * half] *= inv;
          o[mt][dt][2 * half + 1] *= inv;
        }
      }
    }
  }
};

}  // namespace flex
