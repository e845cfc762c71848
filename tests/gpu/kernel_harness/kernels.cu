// Instantiates the forward template for one head dim (FLEX_HEAD_DIM) with every harness variant and dtype.
// -DFLEX_HARNESS_SM90 builds the Hopper main loop (flex_forward_sm90.cuh) for head dims up to 128 instead.
#include "flex_forward.cuh"
#include "flex_forward_sm90.cuh"
#include "harness.h"
#include "variants.cuh"

#ifndef FLEX_HEAD_DIM
#error "compile with -DFLEX_HEAD_DIM=<head dim>"
#endif

namespace {

constexpr int kHeadDim = FLEX_HEAD_DIM;
// The tile table of flex_forward.cuh.
constexpr int kBlockM = 128;
constexpr int kBlockN = 64;
constexpr int kNWarps = kHeadDim <= 128 ? 4 : 8;

#if defined(FLEX_HARNESS_SM90)
constexpr bool kSm90 = kHeadDim <= 128;
#else
constexpr bool kSm90 = false;
#endif
template <class Element, bool kHopper = kSm90>
struct TraitsFor {
  using type = FlexForwardTraits<kHeadDim, kBlockM, kBlockN, kNWarps, Element>;
};
template <class Element>
struct TraitsFor<Element, true> {
  using type = FlexForwardTraitsSm90<kHeadDim, Element>;
};
template <class Element>
using Traits = typename TraitsFor<Element>::type;

// What generated code writes, templated here instead of spelled out per variant. FLEX_HARNESS_MIN_BLOCKS
// (default 1, as generated code) lets an experiment cap registers for more CTAs per SM.
// As the generator does: data-dependent masks (here the document mask) rank CTAs by block-mask work.
template <class Variant>
struct RankTiles {
  static constexpr bool value = false;
};
template <bool kCheck>
struct RankTiles<DocVariant<kCheck>> {
  static constexpr bool value = true;
};

#ifndef FLEX_HARNESS_MIN_BLOCKS
#define FLEX_HARNESS_MIN_BLOCKS 1
#endif
template <class T, class Variant>
__global__ void __launch_bounds__(T::kNThreads, FLEX_HARNESS_MIN_BLOCKS)
    harness_forward(const FlexForwardParams p, const typename Variant::Params vp) {
  if constexpr (kSm90)
    flex_forward_sm90<T, Variant, /*kVarlen=*/false, RankTiles<Variant>::value>(p, vp);
  else
    flex_forward<T, Variant, /*kVarlen=*/false, RankTiles<Variant>::value>(p, vp);
}

template <class Element, class Variant>
cudaError_t launch(const FlexForwardParams& p, const HarnessParams& vp, cudaStream_t stream) {
  using T = Traits<Element>;
  auto kernel = harness_forward<T, Variant>;
  static bool attribute_set = false;  // once per instantiation, so timed launches carry no extra API call
  if (!attribute_set) {
    const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSmemBytes);
    if (err != cudaSuccess) return err;
    attribute_set = true;
  }
  const dim3 grid((p.seqlen_q + T::kBlockM - 1) / T::kBlockM, p.heads, p.batch);
  kernel<<<grid, T::kNThreads, T::kSmemBytes, stream>>>(p, vp);
  return cudaGetLastError();
}

// Which combinations exist: every variant checked in bf16, a subset in fp16; unchecked (benchmark) ones
// only for the benchmarked shapes.
template <class Element>
cudaError_t dispatch(VariantKind kind, bool check, const FlexForwardParams& p, const HarnessParams& vp,
                     cudaStream_t s) {
  constexpr bool kBf16 = sizeof(Element) == 2 && __is_same(Element, __nv_bfloat16);
  if (check) {
    switch (kind) {
      case VariantKind::Plain: return launch<Element, PlainVariant<true>>(p, vp, s);
      case VariantKind::Causal: return launch<Element, CausalVariant<true>>(p, vp, s);
      case VariantKind::Softcap: return launch<Element, SoftcapVariant<true, false>>(p, vp, s);
      case VariantKind::Sam: return launch<Element, SamVariant<true>>(p, vp, s);
      case VariantKind::Doc: return launch<Element, DocVariant<true>>(p, vp, s);
      case VariantKind::SoftcapApprox:
        if constexpr (kBf16) return launch<Element, SoftcapVariant<true, true>>(p, vp, s);
        break;
    }
    return cudaErrorNotSupported;
  }
  if (kind == VariantKind::Plain) return launch<Element, PlainVariant<false>>(p, vp, s);
  if constexpr (kBf16 && kHeadDim == 128) {
    switch (kind) {
      case VariantKind::Causal: return launch<Element, CausalVariant<false>>(p, vp, s);
      case VariantKind::Softcap: return launch<Element, SoftcapVariant<false, false>>(p, vp, s);
      case VariantKind::SoftcapApprox: return launch<Element, SoftcapVariant<false, true>>(p, vp, s);
      case VariantKind::Doc: return launch<Element, DocVariant<false>>(p, vp, s);
      default: break;
    }
  }
  if constexpr (kBf16 && (kHeadDim == 64 || kHeadDim == 80)) {
    if (kind == VariantKind::Sam) return launch<Element, SamVariant<false>>(p, vp, s);
  }
  return cudaErrorNotSupported;
}

}  // namespace

#define FLEX_CAT2(a, b) a##b
#define FLEX_CAT(a, b) FLEX_CAT2(a, b)
cudaError_t FLEX_CAT(launch_forward_d, FLEX_HEAD_DIM)(VariantKind kind, DType dtype, bool check,
                                                      const FlexForwardParams& p, const HarnessParams& vp,
                                                      cudaStream_t s) {
  if (dtype == DType::BF16) return dispatch<__nv_bfloat16>(kind, check, p, vp, s);
  return dispatch<__half>(kind, check, p, vp, s);
}
