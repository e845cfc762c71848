// Instantiates the backward kernels for one head dim (FLEX_HEAD_DIM): the sm_90a main kernel, the mma.sync one for
// comparison, and the preprocess / dQ kernels, with every harness variant the checks and benchmarks use.
#include "flex_backward.cuh"
#include "flex_backward_sm90.cuh"
#include "harness.h"
#include "variants.cuh"

#ifndef FLEX_HEAD_DIM
#error "compile with -DFLEX_HEAD_DIM=<head dim>"
#endif

namespace {

constexpr int kHeadDim = FLEX_HEAD_DIM;

template <class Element>
using Traits = FlexBackwardTraits<kHeadDim, Element>;

// The generated module's entry points, as backward_source.cpp writes them.
template <class T, class Variant, bool kDet, KernelKind kKernel>
__global__ void __launch_bounds__(T::kNThreads, 1) harness_bwd_main(const FlexBackwardParams p, const typename Variant::Params vp) {
  if constexpr (kKernel == KernelKind::Old) flex_backward_main<T, Variant, kDet>(p, vp);
  else flex_backward_main_sm90<T, Variant, kDet, kKernel == KernelKind::Sm90>(p, vp);
}

template <class Element, bool kDet>
__global__ void __launch_bounds__(256) harness_bwd_preprocess(const FlexBackwardParams p) {
  flex_backward_preprocess<Element, kHeadDim, kDet>(p);
}

template <class Element, bool kDet>
__global__ void __launch_bounds__(256) harness_bwd_dq(const FlexBackwardParams p) {
  flex_backward_dq<Element, kHeadDim, kDet>(p);
}

template <KernelKind kKernel>
constexpr int smem_bytes() {
  using T = Traits<__nv_bfloat16>;
  return kKernel == KernelKind::Old ? T::kSmemBytes : flex_bwd_sm90::Smem<T>::kAllocBytes;
}

template <class Element, class Variant, bool kDet, KernelKind kKernel>
cudaError_t launch(const FlexBackwardParams& p, const HarnessBuffers& hb, cudaStream_t stream) {
  using T = Traits<Element>;
  auto kernel = harness_bwd_main<T, Variant, kDet, kKernel>;
  constexpr int kSmem = smem_bytes<kKernel>();
  static bool attribute_set = false;  // once per instantiation, so timed launches carry no extra API call
  if (!attribute_set) {
    const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
    if (err != cudaSuccess) return err;
    attribute_set = true;
  }
  const dim3 grid((p.seqlen_kv + T::kBlockN - 1) / T::kBlockN, p.kv_heads, p.batch);
  kernel<<<grid, T::kNThreads, kSmem, stream>>>(p, Variant::make(hb));
  return cudaGetLastError();
}

// Instantiates only what the flags name (each main-kernel instantiation costs tens of seconds of ptxas).
template <class Element, template <bool> class V, bool kCheck, bool kWithOld, bool kWithDet, bool kWithNoDq, bool kWithOldDet>
cudaError_t by_kernel(KernelKind kernel, bool det, const FlexBackwardParams& p, const HarnessBuffers& hb, cudaStream_t s) {
  if (kernel == KernelKind::Sm90) {
    if (!det) return launch<Element, V<kCheck>, false, KernelKind::Sm90>(p, hb, s);
    if constexpr (kWithDet) return launch<Element, V<kCheck>, true, KernelKind::Sm90>(p, hb, s);
  } else if (kernel == KernelKind::Old) {
    if constexpr (kWithOld)
      if (!det) return launch<Element, V<kCheck>, false, KernelKind::Old>(p, hb, s);
    if constexpr (kWithOldDet)
      if (det) return launch<Element, V<kCheck>, true, KernelKind::Old>(p, hb, s);
  } else {
    if constexpr (kWithNoDq)
      if (!det) return launch<Element, V<kCheck>, false, KernelKind::Sm90NoDq>(p, hb, s);
  }
  return cudaErrorNotSupported;
}

// What exists. Checked (kCheck) builds: every variant in bf16 (new kernel both modes, old kernel atomics mode, the
// no-dQ form for causal), plain and causal in fp16 (new kernel, both modes). Unchecked (benchmark) builds, D = 128
// bf16 only: new and old kernels in atomics mode, and in deterministic mode for causal.
template <class Element>
cudaError_t dispatch(VariantKind kind, KernelKind kernel, bool det, bool check, const FlexBackwardParams& p, const HarnessBuffers& hb,
                     cudaStream_t s) {
  constexpr bool kBf16 = __is_same(Element, __nv_bfloat16);
  if (check) {
    if constexpr (kBf16) {
      switch (kind) {
        case VariantKind::Plain: return by_kernel<Element, PlainGrad, true, true, true, false, false>(kernel, det, p, hb, s);
        case VariantKind::Causal: return by_kernel<Element, CausalGrad, true, true, true, true, false>(kernel, det, p, hb, s);
        case VariantKind::Softcap: return by_kernel<Element, SoftcapGrad, true, true, true, false, false>(kernel, det, p, hb, s);
        case VariantKind::Bias: return by_kernel<Element, BiasGrad, true, true, true, false, false>(kernel, det, p, hb, s);
        case VariantKind::Slope: return by_kernel<Element, SlopeGrad, true, true, true, false, false>(kernel, det, p, hb, s);
      }
    } else {
      if (kind == VariantKind::Plain) return by_kernel<Element, PlainGrad, true, false, true, false, false>(kernel, det, p, hb, s);
      if (kind == VariantKind::Causal) return by_kernel<Element, CausalGrad, true, false, true, false, false>(kernel, det, p, hb, s);
    }
    return cudaErrorNotSupported;
  }
  if constexpr (kBf16 && kHeadDim == 128) {
    switch (kind) {
      case VariantKind::Plain: return by_kernel<Element, PlainGrad, false, true, false, false, false>(kernel, det, p, hb, s);
      case VariantKind::Causal: return by_kernel<Element, CausalGrad, false, true, true, false, true>(kernel, det, p, hb, s);
      case VariantKind::Softcap: return by_kernel<Element, SoftcapGrad, false, true, false, false, false>(kernel, det, p, hb, s);
      case VariantKind::Bias: return by_kernel<Element, BiasGrad, false, true, false, false, false>(kernel, det, p, hb, s);
      case VariantKind::Slope: return by_kernel<Element, SlopeGrad, false, true, false, false, false>(kernel, det, p, hb, s);
    }
  }
  return cudaErrorNotSupported;
}

dim3 row_grid(const FlexBackwardParams& p) { return dim3((p.seqlen_q + 7) / 8, p.heads, p.batch); }

}  // namespace

#define FLEX_CAT2(a, b) a##b
#define FLEX_CAT(a, b) FLEX_CAT2(a, b)
cudaError_t FLEX_CAT(launch_main_d, FLEX_HEAD_DIM)(VariantKind kind, DType dtype, KernelKind kernel, bool det, bool check,
                                                   const FlexBackwardParams& p, const HarnessBuffers& hb, cudaStream_t s) {
  if (dtype == DType::BF16) return dispatch<__nv_bfloat16>(kind, kernel, det, check, p, hb, s);
  return dispatch<__half>(kind, kernel, det, check, p, hb, s);
}

cudaError_t FLEX_CAT(launch_preprocess_d, FLEX_HEAD_DIM)(DType dtype, bool det, const FlexBackwardParams& p, cudaStream_t s) {
  if (dtype == DType::BF16) {
    if (det) harness_bwd_preprocess<__nv_bfloat16, true><<<row_grid(p), 256, 0, s>>>(p);
    else harness_bwd_preprocess<__nv_bfloat16, false><<<row_grid(p), 256, 0, s>>>(p);
  } else {
    if (det) harness_bwd_preprocess<__half, true><<<row_grid(p), 256, 0, s>>>(p);
    else harness_bwd_preprocess<__half, false><<<row_grid(p), 256, 0, s>>>(p);
  }
  return cudaGetLastError();
}

cudaError_t FLEX_CAT(launch_dq_d, FLEX_HEAD_DIM)(DType dtype, bool det, const FlexBackwardParams& p, cudaStream_t s) {
  if (dtype == DType::BF16) {
    if (det) harness_bwd_dq<__nv_bfloat16, true><<<row_grid(p), 256, 0, s>>>(p);
    else harness_bwd_dq<__nv_bfloat16, false><<<row_grid(p), 256, 0, s>>>(p);
  } else {
    if (det) harness_bwd_dq<__half, true><<<row_grid(p), 256, 0, s>>>(p);
    else harness_bwd_dq<__half, false><<<row_grid(p), 256, 0, s>>>(p);
  }
  return cudaGetLastError();
}

int FLEX_CAT(main_smem_bytes_d, FLEX_HEAD_DIM)(KernelKind kernel) {
  return kernel == KernelKind::Old ? smem_bytes<KernelKind::Old>() : smem_bytes<KernelKind::Sm90>();
}
