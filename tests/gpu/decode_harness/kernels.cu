// Instantiates the decode template for one head dim (FLEX_HEAD_DIM) with the harness variants, dtypes and configs.
#include <type_traits>

#include "decode_harness.h"
#include "decode_variants.cuh"
#include "flex_decode.cuh"

#ifndef FLEX_HEAD_DIM
#error "compile with -DFLEX_HEAD_DIM=<head dim>"
#endif

namespace {

constexpr int kHeadDim = FLEX_HEAD_DIM;
// The runtime's stage count (compiler/codegen/kernel_config.cpp, decode_config); -DDECODE_DEFAULT_STAGES=n to compare.
#ifdef DECODE_DEFAULT_STAGES
constexpr int kHarnessDefaultStages = DECODE_DEFAULT_STAGES;
#else
constexpr int kHarnessDefaultStages = 2;
#endif
// Pipeline of this build (FlexDecodeTraits::kAlternate): unset = the template's default, which is the runtime's
// choice (flex_decode_alternate); -DFLEX_DECODE_ALTERNATE=0 / 1 forces the 64-row K+V pairs / the alternating
// 128-row loads wherever there are two stages (build.sh FLAVOURS builds one binary per choice).
#ifdef FLEX_DECODE_ALTERNATE
template <int kD, int kM, int kSt, class Element>
using HarnessTraits = FlexDecodeTraits<kD, kM, kSt, Element, FLEX_DECODE_ALTERNATE != 0 && kSt == 2>;
#else
template <int kD, int kM, int kSt, class Element>
using HarnessTraits = FlexDecodeTraits<kD, kM, kSt, Element>;
#endif

// What generated code writes: a __global__ wrapper per instantiation, two CTAs per SM wanted.
template <class T, class Variant>
__global__ void __launch_bounds__(T::kNThreads, 2) harness_decode(const FlexDecodeParams p, const typename Variant::Params vp) {
  flex_decode<T, Variant>(p, vp);
}
template <int kD, class Element>
__global__ void __launch_bounds__(128) harness_combine(const FlexDecodeParams p) {
  flex_decode_combine<kD, Element>(p);
}

template <class Element, int kMTiles, int kStages, class Variant>
struct Launcher {
  using T = HarnessTraits<kHeadDim, kMTiles, kStages, Element>;
  static cudaError_t prepare() {
    static bool done = false;  // once per instantiation, so timed launches carry no extra API call
    if (!done) {
      const cudaError_t err =
          cudaFuncSetAttribute(harness_decode<T, Variant>, cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSmemBytes);
      if (err != cudaSuccess) return err;
      done = true;
    }
    return cudaSuccess;
  }
  static cudaError_t launch(const FlexDecodeParams& p, const DecodeHarnessParams& vp, cudaStream_t s) {
    if (const cudaError_t err = prepare(); err != cudaSuccess) return err;
    const dim3 grid(p.num_splits, p.kv_heads * p.row_blocks, p.batch);
    harness_decode<T, Variant><<<grid, T::kNThreads, T::kSmemBytes, s>>>(p, vp);
    if (const cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;
    // Fused combine (split_counters set): the decode kernel merges. g_decode_skip_combine: timing of the
    // decode kernel alone (results not merged).
    if (p.num_splits > 1 && p.split_counters == nullptr && !g_decode_skip_combine) {
      const long long rows = (long long)p.batch * p.heads * p.max_q_len;
      harness_combine<kHeadDim, Element><<<(unsigned)((rows + 3) / 4), 128, 0, s>>>(p);
      return cudaGetLastError();
    }
    return cudaSuccess;
  }
  static int ctas_per_sm() {
    if (prepare() != cudaSuccess) return 0;
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, harness_decode<T, Variant>, T::kNThreads, T::kSmemBytes) !=
        cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    return n;
  }
};

// Calls f(Launcher<...>{}) for the instantiated combination and returns true, else returns false.
template <class Element, bool kCheck, class F>
bool with_variant(const DecodeConfig& cfg, DVariant kind, F&& f) {
  constexpr bool kBf16 = __is_same(Element, __nv_bfloat16);
  // Per head dim: the default stage count and which variants exist.
  constexpr int kDefaultStages = kHarnessDefaultStages;
  const int st = cfg.stages == 0 ? kDefaultStages : cfg.stages;
  auto pick = [&](auto variant_tag) -> bool {
    using V = typename decltype(variant_tag)::type;
    if (cfg.m_tiles == 1 && st == kDefaultStages) return f(Launcher<Element, 1, kDefaultStages, V>{}), true;
    if constexpr (kHeadDim <= 128) {
      if (cfg.m_tiles == 2 && st == kDefaultStages) return f(Launcher<Element, 2, kDefaultStages, V>{}), true;
    }
    return false;
  };
  auto pick_stages = [&](auto variant_tag) -> bool {
    using V = typename decltype(variant_tag)::type;
    if constexpr (kHeadDim == 128 && kBf16 && !kCheck) {
      if (cfg.m_tiles == 1 && st == 2) return f(Launcher<Element, 1, 2, V>{}), true;
      if (cfg.m_tiles == 1 && st == 3) return f(Launcher<Element, 1, 3, V>{}), true;
      if (cfg.m_tiles == 1 && st == 4) return f(Launcher<Element, 1, 4, V>{}), true;
    }
    return pick(variant_tag);
  };
  switch (kind) {
    case DVariant::Plain: return pick_stages(std::type_identity<DPlain<kCheck>>{});
    case DVariant::Alibi: return pick(std::type_identity<DAlibi<kCheck>>{});
    case DVariant::Causal: return pick(std::type_identity<DCausal<kCheck>>{});
    default: break;
  }
  if constexpr (kBf16 && (kHeadDim <= 128)) {
    switch (kind) {
      case DVariant::Softcap: return pick(std::type_identity<DSoftcap<kCheck>>{});
      case DVariant::Window: return pick(std::type_identity<DWindow<kCheck>>{});
      case DVariant::Doc: return pick(std::type_identity<DDoc<kCheck>>{});
      default: break;
    }
  }
  return false;
}

// DECODE_BENCH_ONLY: only the unchecked variants (quicker builds of experimental flavours).
template <class Element>
bool dispatch(const DecodeConfig& cfg, DVariant kind, bool check, auto&& f) {
#ifdef DECODE_BENCH_ONLY
  if (check) return false;
#else
  if (check) return with_variant<Element, true>(cfg, kind, f);
#endif
  return with_variant<Element, false>(cfg, kind, f);
}

}  // namespace

#define FLEX_CAT2(a, b) a##b
#define FLEX_CAT(a, b) FLEX_CAT2(a, b)

cudaError_t FLEX_CAT(launch_decode_d, FLEX_HEAD_DIM)(const DecodeConfig& cfg, DVariant kind, DType dtype, bool check,
                                                     const FlexDecodeParams& p, const DecodeHarnessParams& vp,
                                                     cudaStream_t s) {
  cudaError_t err = cudaErrorNotSupported;
  auto f = [&](auto launcher) { err = decltype(launcher)::launch(p, vp, s); };
  if (dtype == DType::BF16) dispatch<__nv_bfloat16>(cfg, kind, check, f);
  else dispatch<__half>(cfg, kind, check, f);
  return err;
}

int FLEX_CAT(decode_ctas_per_sm_d, FLEX_HEAD_DIM)(const DecodeConfig& cfg, DVariant kind, DType dtype, bool check) {
  int n = 0;
  auto f = [&](auto launcher) { n = decltype(launcher)::ctas_per_sm(); };
  if (dtype == DType::BF16) dispatch<__nv_bfloat16>(cfg, kind, check, f);
  else dispatch<__half>(cfg, kind, check, f);
  return n;
}

namespace {
template <int kM>
int smem_bytes_for(int stages) {
  if constexpr (kHeadDim > 128 && kM > 1) {
    return 0;
  } else {
    switch (stages) {
      case 2: return HarnessTraits<kHeadDim, kM, 2, __half>::kSmemBytes;
      case 3: return HarnessTraits<kHeadDim, kM, 3, __half>::kSmemBytes;
      default: break;
    }
    if constexpr (kHeadDim <= 128) return HarnessTraits<kHeadDim, kM, 4, __half>::kSmemBytes;
    return 0;
  }
}
}  // namespace

int FLEX_CAT(decode_smem_bytes_d, FLEX_HEAD_DIM)(const DecodeConfig& cfg) {
  const int st = cfg.stages == 0 ? kHarnessDefaultStages : cfg.stages;
  return cfg.m_tiles == 2 ? smem_bytes_for<2>(st) : smem_bytes_for<1>(st);
}
