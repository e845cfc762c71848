// Standalone harness of the sm_90a backward main kernel (flex_backward_sm90.cuh): every gradient element against
// a float64 CPU reference (forward and backward), the mma.sync kernel beside it, and old-vs-new benchmarks.
//
// Usage: backward_harness [check|bench|all] [--quick] [--tiny] [--d=N]  |  backward_harness one N (bench case N alone, for ncu)
//   check: the case matrix of docs/notes/BACKWARD_SM90.md; --quick runs the 1000-row cases only; --d=N one head dim;
//          --tiny five small cases (for compute-sanitizer).
//   bench: B4 H16 S4096 D128 bf16 (full, causal, softcap, learnable bias, learnable slope, causal deterministic),
//          median of 20 cudaEvent timings after warm-up, old and new kernel in the same run.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "flex_backward.cuh"
#include "harness.h"

#define CUDA_CHECK(expr)                                                                                                  \
  do {                                                                                                                    \
    cudaError_t err_ = (expr);                                                                                            \
    if (err_ != cudaSuccess) {                                                                                            \
      std::fprintf(stderr, "CUDA error %s at %s:%d: %s\n", cudaGetErrorName(err_), __FILE__, __LINE__, cudaGetErrorString(err_)); \
      std::exit(2);                                                                                                       \
    }                                                                                                                     \
  } while (0)

// Per head dim entry points (kernels.cu); weak so a build of some head dims links.
#define FLEX_DECLARE(D)                                                                                                   \
  __attribute__((weak)) cudaError_t launch_main_d##D(VariantKind, DType, KernelKind, bool, bool, const FlexBackwardParams&, \
                                                     const HarnessBuffers&, cudaStream_t);                                \
  __attribute__((weak)) cudaError_t launch_preprocess_d##D(DType, bool, const FlexBackwardParams&, cudaStream_t);          \
  __attribute__((weak)) cudaError_t launch_dq_d##D(DType, bool, const FlexBackwardParams&, cudaStream_t);                  \
  __attribute__((weak)) int main_smem_bytes_d##D(KernelKind);
FLEX_BWD_HARNESS_HEAD_DIMS(FLEX_DECLARE)
#undef FLEX_DECLARE

cudaError_t launch_main(int head_dim, VariantKind kind, DType dtype, KernelKind kernel, bool det, bool check, const FlexBackwardParams& p,
                        const HarnessBuffers& hb, cudaStream_t s) {
  switch (head_dim) {
#define FLEX_CASE(D) \
  case D: return launch_main_d##D ? launch_main_d##D(kind, dtype, kernel, det, check, p, hb, s) : cudaErrorNotSupported;
    FLEX_BWD_HARNESS_HEAD_DIMS(FLEX_CASE)
#undef FLEX_CASE
  }
  return cudaErrorNotSupported;
}
cudaError_t launch_preprocess(int head_dim, DType dtype, bool det, const FlexBackwardParams& p, cudaStream_t s) {
  switch (head_dim) {
#define FLEX_CASE(D) \
  case D: return launch_preprocess_d##D ? launch_preprocess_d##D(dtype, det, p, s) : cudaErrorNotSupported;
    FLEX_BWD_HARNESS_HEAD_DIMS(FLEX_CASE)
#undef FLEX_CASE
  }
  return cudaErrorNotSupported;
}
cudaError_t launch_dq(int head_dim, DType dtype, bool det, const FlexBackwardParams& p, cudaStream_t s) {
  switch (head_dim) {
#define FLEX_CASE(D) \
  case D: return launch_dq_d##D ? launch_dq_d##D(dtype, det, p, s) : cudaErrorNotSupported;
    FLEX_BWD_HARNESS_HEAD_DIMS(FLEX_CASE)
#undef FLEX_CASE
  }
  return cudaErrorNotSupported;
}
int main_smem_bytes(int head_dim, KernelKind kernel) {
  switch (head_dim) {
#define FLEX_CASE(D) \
  case D: return main_smem_bytes_d##D ? main_smem_bytes_d##D(kernel) : 0;
    FLEX_BWD_HARNESS_HEAD_DIMS(FLEX_CASE)
#undef FLEX_CASE
  }
  return 0;
}

// Fixed-point buffer gradients to f32 (deterministic mode), as the runtime's conversion kernel.
__global__ void __launch_bounds__(256) harness_bwd_convert(const FlexConvertParams c) { flex_backward_convert(c); }

namespace {

const char* kind_name(VariantKind k) {
  switch (k) {
    case VariantKind::Plain: return "plain";
    case VariantKind::Causal: return "causal";
    case VariantKind::Softcap: return "softcap";
    case VariantKind::Bias: return "bias";
    case VariantKind::Slope: return "slope";
  }
  return "?";
}
const char* kernel_name(KernelKind k) {
  switch (k) {
    case KernelKind::Sm90: return "sm90";
    case KernelKind::Sm90NoDq: return "sm90-nodq";
    case KernelKind::Old: return "mma.sync";
  }
  return "?";
}
bool is_causal(VariantKind k) { return k == VariantKind::Causal || k == VariantKind::Bias || k == VariantKind::Slope; }

// ---------------------------------------------------------------------------------------------------
// Host data
// ---------------------------------------------------------------------------------------------------
uint16_t to_bits(float x, DType dt) {
  uint16_t r;
  if (dt == DType::BF16) {
    __nv_bfloat16 v = __float2bfloat16(x);
    std::memcpy(&r, &v, 2);
  } else {
    __half v = __float2half(x);
    std::memcpy(&r, &v, 2);
  }
  return r;
}
float from_bits(uint16_t b, DType dt) {
  if (dt == DType::BF16) {
    __nv_bfloat16_raw r;
    r.x = b;
    return __bfloat162float(__nv_bfloat16(r));
  }
  __half_raw r;
  r.x = b;
  return __half2float(__half(r));
}

int num_threads() { return (int)std::max(1u, std::min(64u, std::thread::hardware_concurrency())); }

void parallel_for(long long n, const std::function<void(int, long long, long long)>& body) {
  const int nt = num_threads();
  std::vector<std::thread> ts;
  const long long chunk = (n + nt - 1) / nt;
  for (int t = 0; t < nt; ++t) {
    const long long lo = t * chunk, hi = std::min(n, lo + chunk);
    if (lo >= hi) break;
    ts.emplace_back([=, &body] { body(t, lo, hi); });
  }
  for (auto& t : ts) t.join();
}

// Random values rounded to the element type: `bits` for the device, `val` (the rounded value) for the reference.
struct HostTensor {
  std::vector<uint16_t> bits;
  std::vector<double> val;
};
HostTensor random_tensor(size_t n, DType dt, float sigma, uint64_t seed, bool with_values = true) {
  HostTensor t;
  t.bits.resize(n);
  if (with_values) t.val.resize(n);
  parallel_for((long long)n, [&](int, long long lo, long long hi) {
    std::mt19937_64 rng(seed * 1000003ull + (uint64_t)lo);
    std::normal_distribution<float> nd(0.f, sigma);
    for (long long i = lo; i < hi; ++i) {
      t.bits[i] = to_bits(nd(rng), dt);
      if (with_values) t.val[i] = from_bits(t.bits[i], dt);
    }
  });
  return t;
}

template <class T>
T* to_device(const std::vector<T>& v) {
  T* d = nullptr;
  CUDA_CHECK(cudaMalloc(&d, std::max<size_t>(1, v.size()) * sizeof(T)));
  if (!v.empty()) CUDA_CHECK(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

// ---------------------------------------------------------------------------------------------------
// Problems and the float64 reference
// ---------------------------------------------------------------------------------------------------
struct Case {
  VariantKind kind;
  DType dtype;
  int d, b, h, hkv, sq, skv;
  bool bshd = false;  // [B, S, H, D] storage of every [B, H, S, D] operand instead
};

// Logical layout everywhere on the host: q, d_o, o, dq [B, H, Sq, D]; k, v, dk, dv [B, Hkv, Skv, D].
struct Problem {
  Case c;
  double scale;
  int L = 0;                      // bias: [H, L], L = Sq + Skv - 1 (every q - kv + Skv - 1 in range)
  HostTensor q, k, v, d_o;
  std::vector<float> bias, slope;
  std::vector<uint16_t> o_bits;   // the reference forward's O rounded to the element type
  std::vector<double> o_val;
  std::vector<float> lse;         // [B, H, Sq], natural log, as the forward writes it
  std::vector<double> dq, dk, dv, dbias, dslope;
  // Tile classes at the forward's granularity (128 query x 64 KV rows), broadcast over b and h; empty: no mask.
  std::vector<uint8_t> tile_state;
  int ts_nq = 0, ts_nkv = 0;
};

double ref_score_mod(const Problem& pr, int h, int q, int kv, double s) {
  switch (pr.c.kind) {
    case VariantKind::Softcap: return 30.0 * std::tanh(s / 30.0);
    case VariantKind::Bias: return s + pr.bias[(size_t)h * pr.L + (q - kv + pr.c.skv - 1)];
    case VariantKind::Slope: return s + (double)pr.slope[h] * (double)(kv - q);
    default: return s;
  }
}
double ref_d_score(const Problem& pr, double s) {
  if (pr.c.kind != VariantKind::Softcap) return 1.0;
  const double t = std::tanh(s / 30.0);
  return 1.0 - t * t;
}
bool ref_keep(const Problem& pr, int q, int kv) { return !is_causal(pr.c.kind) || q >= kv; }

double dot(const double* a, const double* b, int n) {
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += a[i] * b[i];
    s1 += a[i + 1] * b[i + 1];
    s2 += a[i + 2] * b[i + 2];
    s3 += a[i + 3] * b[i + 3];
  }
  for (; i < n; ++i) s0 += a[i] * b[i];
  return (s0 + s1) + (s2 + s3);
}

// Forward (O, LSE) and backward (dq, dk, dv, buffer gradients) in float64 from the rounded inputs; the backward
// uses the O and LSE the kernels get (O rounded to the element type, LSE as float).
void reference(Problem& pr) {
  const Case& c = pr.c;
  const int D = c.d, group = c.h / c.hkv;
  const long long rows = (long long)c.b * c.h * c.sq;
  pr.o_bits.assign((size_t)rows * D, 0);
  pr.o_val.assign((size_t)rows * D, 0.0);
  pr.lse.assign((size_t)rows, 0.f);
  pr.dq.assign((size_t)rows * D, 0.0);
  const size_t kv_elems = (size_t)c.b * c.hkv * c.skv * D;
  pr.dk.assign(kv_elems, 0.0);
  pr.dv.assign(kv_elems, 0.0);
  pr.dbias.assign(pr.bias.size(), 0.0);
  pr.dslope.assign(pr.slope.size(), 0.0);
  struct Partial {
    std::vector<double> dk, dv, dbias, dslope;
  };
  std::vector<Partial> parts(num_threads());
  parallel_for(rows, [&](int t, long long lo, long long hi) {
    Partial& part = parts[t];
    part.dk.assign(kv_elems, 0.0);
    part.dv.assign(kv_elems, 0.0);
    part.dbias.assign(pr.bias.size(), 0.0);
    part.dslope.assign(pr.slope.size(), 0.0);
    std::vector<double> s(c.skv), z(c.skv), o(D);
    for (long long row = lo; row < hi; ++row) {
      const int b = (int)(row / ((long long)c.h * c.sq)), h = (int)((row / c.sq) % c.h), q = (int)(row % c.sq);
      const int hkv = h / group;
      const double* qp = &pr.q.val[(size_t)row * D];
      const double* dop = &pr.d_o.val[(size_t)row * D];
      const size_t kv_base = ((size_t)b * c.hkv + hkv) * c.skv;
      double m = -std::numeric_limits<double>::infinity();
      for (int kv = 0; kv < c.skv; ++kv) {
        if (!ref_keep(pr, q, kv)) {
          z[kv] = -std::numeric_limits<double>::infinity();
          continue;
        }
        s[kv] = pr.scale * dot(qp, &pr.k.val[(kv_base + kv) * D], D);
        z[kv] = ref_score_mod(pr, h, q, kv, s[kv]);
        m = std::max(m, z[kv]);
      }
      std::fill(o.begin(), o.end(), 0.0);
      double lse = -std::numeric_limits<double>::infinity();
      if (m > -std::numeric_limits<double>::infinity()) {
        double sum = 0;
        for (int kv = 0; kv < c.skv; ++kv) sum += std::exp(z[kv] - m);
        lse = m + std::log(sum);
        for (int kv = 0; kv < c.skv; ++kv) {
          if (z[kv] == -std::numeric_limits<double>::infinity()) continue;
          const double pv = std::exp(z[kv] - lse);
          const double* vp = &pr.v.val[(kv_base + kv) * D];
          for (int d = 0; d < D; ++d) o[d] += pv * vp[d];
        }
      }
      pr.lse[row] = (float)lse;
      double delta = 0;
      for (int d = 0; d < D; ++d) {
        pr.o_bits[(size_t)row * D + d] = to_bits((float)o[d], c.dtype);
        pr.o_val[(size_t)row * D + d] = from_bits(pr.o_bits[(size_t)row * D + d], c.dtype);
        delta += dop[d] * pr.o_val[(size_t)row * D + d];
      }
      if (lse == -std::numeric_limits<double>::infinity()) continue;
      const double lse_f = (double)pr.lse[row];
      double* dqp = &pr.dq[(size_t)row * D];
      for (int kv = 0; kv < c.skv; ++kv) {
        if (z[kv] == -std::numeric_limits<double>::infinity()) continue;
        const double pv = std::exp(z[kv] - lse_f);
        const double* kp = &pr.k.val[(kv_base + kv) * D];
        const double* vp = &pr.v.val[(kv_base + kv) * D];
        const double ds = pv * (dot(dop, vp, D) - delta);
        const double dpre = ds * ref_d_score(pr, s[kv]);
        double* dkp = &part.dk[(kv_base + kv) * D];
        double* dvp = &part.dv[(kv_base + kv) * D];
        for (int d = 0; d < D; ++d) {
          dqp[d] += pr.scale * dpre * kp[d];
          dkp[d] += pr.scale * dpre * qp[d];
          dvp[d] += pv * dop[d];
        }
        if (c.kind == VariantKind::Bias) part.dbias[(size_t)h * pr.L + (q - kv + c.skv - 1)] += ds;
        if (c.kind == VariantKind::Slope) part.dslope[h] += ds * (double)(kv - q);
      }
    }
  });
  for (const Partial& part : parts) {
    if (part.dk.empty()) continue;
    for (size_t i = 0; i < kv_elems; ++i) pr.dk[i] += part.dk[i], pr.dv[i] += part.dv[i];
    for (size_t i = 0; i < pr.dbias.size(); ++i) pr.dbias[i] += part.dbias[i];
    for (size_t i = 0; i < pr.dslope.size(); ++i) pr.dslope[i] += part.dslope[i];
  }
}

// Dense tile classes of the causal mask at the forward's 128 x 64 granularity over in-range elements (what
// flexjit_bwd_tile_state produces from the forward's block mask): 0 skip, 1 full, 2 partial.
void build_tile_state(Problem& pr) {
  const Case& c = pr.c;
  pr.tile_state.clear();
  if (!is_causal(c.kind)) return;
  pr.ts_nq = (c.sq + 127) / 128;
  pr.ts_nkv = (c.skv + 63) / 64;
  pr.tile_state.assign((size_t)pr.ts_nq * pr.ts_nkv, 0);
  for (int mq = 0; mq < pr.ts_nq; ++mq)
    for (int nk = 0; nk < pr.ts_nkv; ++nk) {
      const int q_lo = mq * 128, q_hi = std::min(c.sq, q_lo + 128) - 1;
      const int kv_lo = nk * 64, kv_hi = std::min(c.skv, kv_lo + 64) - 1;
      uint8_t cls = 2;
      if (q_lo >= kv_hi) cls = 1;       // every element q >= kv
      else if (q_hi < kv_lo) cls = 0;   // none
      pr.tile_state[(size_t)mq * pr.ts_nkv + nk] = cls;
    }
}

Problem make_problem(const Case& c, uint64_t seed, bool with_reference) {
  Problem pr;
  pr.c = c;
  pr.scale = 1.0 / std::sqrt((double)c.d);
  pr.q = random_tensor((size_t)c.b * c.h * c.sq * c.d, c.dtype, 1.f, seed * 4 + 0, with_reference);
  pr.k = random_tensor((size_t)c.b * c.hkv * c.skv * c.d, c.dtype, 1.f, seed * 4 + 1, with_reference);
  pr.v = random_tensor((size_t)c.b * c.hkv * c.skv * c.d, c.dtype, 1.f, seed * 4 + 2, with_reference);
  pr.d_o = random_tensor((size_t)c.b * c.h * c.sq * c.d, c.dtype, 1.f, seed * 4 + 3, with_reference);
  std::mt19937_64 rng(seed);
  if (c.kind == VariantKind::Bias) {
    pr.L = c.sq + c.skv - 1;
    std::normal_distribution<float> nd(0.f, 1.f);
    pr.bias.resize((size_t)c.h * pr.L);
    for (float& x : pr.bias) x = nd(rng);
  }
  if (c.kind == VariantKind::Slope) {
    std::uniform_real_distribution<float> ud(0.002f, 0.02f);
    pr.slope.resize(c.h);
    for (float& x : pr.slope) x = ud(rng);
  }
  build_tile_state(pr);
  if (with_reference) {
    reference(pr);
  } else {
    // Benchmarks: O random, LSE about what N(0, 1) scores give (log of the attended count + 1/2).
    const long long rows = (long long)c.b * c.h * c.sq;
    pr.o_bits = random_tensor((size_t)rows * c.d, c.dtype, 0.1f, seed * 4 + 5, false).bits;
    pr.lse.resize(rows);
    for (long long r = 0; r < rows; ++r) {
      const int q = (int)(r % c.sq);
      const int n = is_causal(c.kind) ? std::min(q + 1, c.skv) : c.skv;
      pr.lse[r] = (float)(std::log((double)n) + 0.5);
    }
  }
  return pr;
}

// Element offset of logical (b, h, s, d) in the device layout.
size_t dev_index(const Case& c, int heads, int seqlen, int b, int h, int s, int d) {
  if (c.bshd) return (((size_t)b * seqlen + s) * heads + h) * c.d + d;
  return (((size_t)b * heads + h) * seqlen + s) * c.d + d;
}
std::vector<uint16_t> to_layout(const Case& c, const std::vector<uint16_t>& logical, int heads, int seqlen) {
  if (!c.bshd) return logical;
  std::vector<uint16_t> out(logical.size());
  size_t i = 0;
  for (int b = 0; b < c.b; ++b)
    for (int h = 0; h < heads; ++h)
      for (int s = 0; s < seqlen; ++s)
        for (int d = 0; d < c.d; ++d) out[dev_index(c, heads, seqlen, b, h, s, d)] = logical[i++];
  return out;
}
std::vector<float> from_layout(const Case& c, const std::vector<uint16_t>& dev, int heads, int seqlen) {
  std::vector<float> out(dev.size());
  size_t i = 0;
  for (int b = 0; b < c.b; ++b)
    for (int h = 0; h < heads; ++h)
      for (int s = 0; s < seqlen; ++s)
        for (int d = 0; d < c.d; ++d) out[i++] = from_bits(dev[dev_index(c, heads, seqlen, b, h, s, d)], c.dtype);
  return out;
}

// ---------------------------------------------------------------------------------------------------
// Device problem and one backward launch sequence (runtime/backward_impl.cpp's order)
// ---------------------------------------------------------------------------------------------------
struct DeviceProblem {
  uint16_t *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr, *d_o = nullptr, *dq = nullptr, *dk = nullptr, *dv = nullptr;
  float *lse = nullptr, *delta = nullptr, *lse2 = nullptr;
  void* dq_accum = nullptr;
  float *bias = nullptr, *slope = nullptr;
  float* grad = nullptr;               // f32 gradient of the learnable buffer
  unsigned long long* grad64 = nullptr;  // its fixed-point scratch (deterministic)
  size_t grad_n = 0;
  unsigned char* tile_state = nullptr;
  unsigned int* flags = nullptr;
  FlexBackwardParams p{};
  HarnessBuffers hb{};

  void free_all() {
    for (void* x : {(void*)q, (void*)k, (void*)v, (void*)o, (void*)d_o, (void*)dq, (void*)dk, (void*)dv, (void*)lse, (void*)delta,
                    (void*)lse2, dq_accum, (void*)bias, (void*)slope, (void*)grad, (void*)grad64, (void*)tile_state, (void*)flags})
      if (x) cudaFree(x);
  }
};

DeviceProblem upload(const Problem& pr) {
  const Case& c = pr.c;
  DeviceProblem dp;
  dp.q = to_device(to_layout(c, pr.q.bits, c.h, c.sq));
  dp.k = to_device(to_layout(c, pr.k.bits, c.hkv, c.skv));
  dp.v = to_device(to_layout(c, pr.v.bits, c.hkv, c.skv));
  dp.o = to_device(to_layout(c, pr.o_bits, c.h, c.sq));
  dp.d_o = to_device(to_layout(c, pr.d_o.bits, c.h, c.sq));
  const size_t nq = (size_t)c.b * c.h * c.sq * c.d, nkv = (size_t)c.b * c.hkv * c.skv * c.d, rows = (size_t)c.b * c.h * c.sq;
  CUDA_CHECK(cudaMalloc(&dp.dq, nq * 2));
  CUDA_CHECK(cudaMalloc(&dp.dk, nkv * 2));
  CUDA_CHECK(cudaMalloc(&dp.dv, nkv * 2));
  dp.lse = to_device(pr.lse);
  CUDA_CHECK(cudaMalloc(&dp.delta, rows * 4));
  CUDA_CHECK(cudaMalloc(&dp.lse2, rows * 4));
  CUDA_CHECK(cudaMalloc(&dp.dq_accum, nq * 8));
  if (!pr.bias.empty()) dp.bias = to_device(pr.bias);
  if (!pr.slope.empty()) dp.slope = to_device(pr.slope);
  dp.grad_n = !pr.bias.empty() ? pr.bias.size() : pr.slope.size();
  if (dp.grad_n) {
    CUDA_CHECK(cudaMalloc(&dp.grad, dp.grad_n * 4));
    CUDA_CHECK(cudaMalloc(&dp.grad64, dp.grad_n * 8));
  }
  if (!pr.tile_state.empty()) dp.tile_state = to_device(pr.tile_state);
  CUDA_CHECK(cudaMalloc(&dp.flags, 4));

  FlexBackwardParams& p = dp.p;
  p.q = dp.q, p.k = dp.k, p.v = dp.v, p.o = dp.o, p.d_o = dp.d_o, p.lse = dp.lse;
  p.dq = dp.dq, p.dk = dp.dk, p.dv = dp.dv;
  p.delta = dp.delta, p.lse2 = dp.lse2, p.dq_accum = dp.dq_accum;
  p.tile_state = dp.tile_state;
  p.ts_stride_b = 0, p.ts_stride_h = 0;
  p.ts_nq = pr.ts_nq, p.ts_nkv = pr.ts_nkv, p.ts_q_tile = 128, p.ts_kv_tile = 64;
  auto strides = [&](int heads, int seqlen, long long& sb, long long& sh, long long& ss) {
    if (c.bshd) sb = (long long)seqlen * heads * c.d, sh = c.d, ss = (long long)heads * c.d;
    else sb = (long long)heads * seqlen * c.d, sh = (long long)seqlen * c.d, ss = c.d;
  };
  strides(c.h, c.sq, p.q_stride_b, p.q_stride_h, p.q_stride_s);
  strides(c.hkv, c.skv, p.k_stride_b, p.k_stride_h, p.k_stride_s);
  strides(c.hkv, c.skv, p.v_stride_b, p.v_stride_h, p.v_stride_s);
  strides(c.h, c.sq, p.o_stride_b, p.o_stride_h, p.o_stride_s);
  strides(c.h, c.sq, p.do_stride_b, p.do_stride_h, p.do_stride_s);
  strides(c.h, c.sq, p.dq_stride_b, p.dq_stride_h, p.dq_stride_s);
  strides(c.hkv, c.skv, p.dk_stride_b, p.dk_stride_h, p.dk_stride_s);
  strides(c.hkv, c.skv, p.dv_stride_b, p.dv_stride_h, p.dv_stride_s);
  p.lse_stride_b = (long long)c.h * c.sq, p.lse_stride_h = c.sq;
  p.batch = c.b, p.heads = c.h, p.kv_heads = c.hkv, p.seqlen_q = c.sq, p.seqlen_kv = c.skv;
  p.scale = (float)pr.scale;

  HarnessBuffers& hb = dp.hb;
  hb.error_flags = dp.flags;
  hb.bias = dp.bias, hb.bias_n0 = c.h, hb.bias_n1 = pr.L;
  hb.slope = dp.slope, hb.slope_n0 = c.h;
  hb.B = c.b, hb.H = c.h, hb.Hkv = c.hkv, hb.Sq = c.sq, hb.Skv = c.skv, hb.D = c.d, hb.L = pr.L;
  return dp;
}

// Outputs and workspace poisoned with NaN (0xff bytes: NaN in bf16, fp16 and f32), buffer-gradient accumulators
// cleared as the runtime clears them.
void prepare(DeviceProblem& dp, const Case& c, bool det, cudaStream_t s) {
  const size_t nq = (size_t)c.b * c.h * c.sq * c.d, nkv = (size_t)c.b * c.hkv * c.skv * c.d, rows = (size_t)c.b * c.h * c.sq;
  CUDA_CHECK(cudaMemsetAsync(dp.dq, 0xff, nq * 2, s));
  CUDA_CHECK(cudaMemsetAsync(dp.dk, 0xff, nkv * 2, s));
  CUDA_CHECK(cudaMemsetAsync(dp.dv, 0xff, nkv * 2, s));
  CUDA_CHECK(cudaMemsetAsync(dp.delta, 0xff, rows * 4, s));
  CUDA_CHECK(cudaMemsetAsync(dp.lse2, 0xff, rows * 4, s));
  CUDA_CHECK(cudaMemsetAsync(dp.dq_accum, 0xff, nq * 8, s));
  CUDA_CHECK(cudaMemsetAsync(dp.flags, 0, 4, s));
  if (dp.grad_n) {
    if (det) {
      CUDA_CHECK(cudaMemsetAsync(dp.grad64, 0, dp.grad_n * 8, s));
      CUDA_CHECK(cudaMemsetAsync(dp.grad, 0xff, dp.grad_n * 4, s));
    } else {
      CUDA_CHECK(cudaMemsetAsync(dp.grad, 0, dp.grad_n * 4, s));
    }
  }
}

// The launch sequence: buffer-gradient clear, preprocess, main, dQ conversion, fixed-point conversion.
cudaError_t run_backward(DeviceProblem& dp, const Case& c, KernelKind kernel, bool det, bool check, cudaStream_t s) {
  FlexBackwardParams p = dp.p;
  if (dp.grad_n) p.grad_ptr[0] = det ? (void*)dp.grad64 : (void*)dp.grad;
  if (dp.grad_n && !det) CUDA_CHECK(cudaMemsetAsync(dp.grad, 0, dp.grad_n * 4, s));
  if (dp.grad_n && det) CUDA_CHECK(cudaMemsetAsync(dp.grad64, 0, dp.grad_n * 8, s));
  cudaError_t err = launch_preprocess(c.d, c.dtype, det, p, s);
  if (err != cudaSuccess) return err;
  err = launch_main(c.d, c.kind, c.dtype, kernel, det, check, p, dp.hb, s);
  if (err != cudaSuccess) return err;
  if (kernel != KernelKind::Sm90NoDq) {
    err = launch_dq(c.d, c.dtype, det, p, s);
    if (err != cudaSuccess) return err;
  }
  if (det && dp.grad_n) {
    FlexConvertParams cp{};
    cp.in = dp.grad64, cp.out = dp.grad, cp.n = (long long)dp.grad_n, cp.mult = 1.f;
    harness_bwd_convert<<<(unsigned)std::min<size_t>((dp.grad_n + 255) / 256, 4096), 256, 0, s>>>(cp);
    err = cudaGetLastError();
  }
  return err;
}

struct Outputs {
  std::vector<float> dq, dk, dv, grad;
  unsigned flags = 0;
  std::vector<uint16_t> raw;  // dq, dk, dv bits and grad bytes, for bitwise repeat checks
};
Outputs download(const DeviceProblem& dp, const Case& c) {
  Outputs o;
  const size_t nq = (size_t)c.b * c.h * c.sq * c.d, nkv = (size_t)c.b * c.hkv * c.skv * c.d;
  std::vector<uint16_t> dq(nq), dk(nkv), dv(nkv);
  CUDA_CHECK(cudaMemcpy(dq.data(), dp.dq, nq * 2, cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(dk.data(), dp.dk, nkv * 2, cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(dv.data(), dp.dv, nkv * 2, cudaMemcpyDeviceToHost));
  o.dq = from_layout(c, dq, c.h, c.sq);
  o.dk = from_layout(c, dk, c.hkv, c.skv);
  o.dv = from_layout(c, dv, c.hkv, c.skv);
  o.grad.resize(dp.grad_n);
  if (dp.grad_n) CUDA_CHECK(cudaMemcpy(o.grad.data(), dp.grad, dp.grad_n * 4, cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(&o.flags, dp.flags, 4, cudaMemcpyDeviceToHost));
  o.raw = dq;
  o.raw.insert(o.raw.end(), dk.begin(), dk.end());
  o.raw.insert(o.raw.end(), dv.begin(), dv.end());
  const uint16_t* gb = reinterpret_cast<const uint16_t*>(o.grad.data());
  o.raw.insert(o.raw.end(), gb, gb + 2 * o.grad.size());
  return o;
}

// ---------------------------------------------------------------------------------------------------
// Comparison
// ---------------------------------------------------------------------------------------------------
struct Cmp {
  double rel_l2 = 0, max_abs = 0, max_ref = 0;
  long long bad = 0, worst = -1;  // bad: NaN / inf elements
};
template <class R>
Cmp compare(const std::vector<float>& got, const std::vector<R>& ref) {
  Cmp c;
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double o = got[i], r = (double)ref[i];
    if (!std::isfinite(o)) {
      if (c.bad++ == 0) c.worst = (long long)i;
      continue;
    }
    num += (o - r) * (o - r);
    den += r * r;
    if (std::fabs(o - r) > c.max_abs) c.max_abs = std::fabs(o - r), c.worst = c.bad ? c.worst : (long long)i;
    c.max_ref = std::max(c.max_ref, std::fabs(r));
  }
  c.rel_l2 = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  return c;
}
// bf16 / fp16 bounds: relative L2 below 2e-2 (as tests/gpu/backward_test.cpp) and no element off by more than 6%
// of the largest reference value (catches a wrong row or column that the L2 norm would dilute); no NaN.
constexpr double kRelL2Bound = 2e-2;
constexpr double kMaxAbsFrac = 6e-2;
bool passes(const Cmp& c) { return c.bad == 0 && c.rel_l2 < kRelL2Bound && c.max_abs <= kMaxAbsFrac * c.max_ref + 1e-6; }

std::string where(const Case& c, long long i, bool kv_side) {
  if (i < 0) return "-";
  const int heads = kv_side ? c.hkv : c.h, seqlen = kv_side ? c.skv : c.sq;
  const long long d = i % c.d, s = (i / c.d) % seqlen, h = (i / c.d / seqlen) % heads, b = i / c.d / seqlen / heads;
  char buf[96];
  std::snprintf(buf, sizeof buf, "b%lld h%lld %s%lld d%lld", b, h, kv_side ? "kv" : "q", s, d);
  return buf;
}

// ---------------------------------------------------------------------------------------------------
// Checks
// ---------------------------------------------------------------------------------------------------
struct Run {
  KernelKind kernel;
  bool det;
};

std::vector<Case> check_cases(bool quick, bool tiny, int only_d) {
  std::vector<Case> v;
  if (tiny) {
    // Small shapes for compute-sanitizer: every head dim once, tails on both sides.
    v.push_back({VariantKind::Causal, DType::BF16, 128, 1, 2, 1, 200, 259});
    v.push_back({VariantKind::Bias, DType::BF16, 64, 1, 2, 2, 259, 259});
    v.push_back({VariantKind::Softcap, DType::BF16, 80, 1, 2, 1, 131, 200});
    v.push_back({VariantKind::Plain, DType::FP16, 96, 1, 2, 2, 200, 131});
    v.push_back({VariantKind::Slope, DType::BF16, 32, 1, 2, 1, 190, 190});
    return v;
  }
  const VariantKind kinds[] = {VariantKind::Plain, VariantKind::Causal, VariantKind::Softcap, VariantKind::Bias, VariantKind::Slope};
  for (int d : {32, 64, 80, 96, 128}) {
    if (only_d > 0 && d != only_d) continue;
    for (VariantKind k : kinds) {
      v.push_back({k, DType::BF16, d, 2, 4, 1, 1000, 1000});  // GQA 4:1
      v.push_back({k, DType::BF16, d, 1, 4, 1, 1000, 1037});  // KV tail, Sq != Skv
    }
    v.push_back({VariantKind::Plain, DType::FP16, d, 1, 4, 2, 1000, 1000});
    v.push_back({VariantKind::Causal, DType::FP16, d, 1, 4, 1, 1000, 1037, /*bshd=*/true});
    v.push_back({VariantKind::Causal, DType::BF16, d, 2, 2, 2, 333, 333, /*bshd=*/true});
  }
  if (!quick) {
    for (int d : {64, 128}) {
      if (only_d > 0 && d != only_d) continue;
      v.push_back({VariantKind::Causal, DType::BF16, d, 1, 4, 1, 4096, 4096});
      v.push_back({VariantKind::Bias, DType::BF16, d, 1, 4, 1, 4096, 4096});
    }
    if (only_d <= 0 || only_d == 128) {
      v.push_back({VariantKind::Plain, DType::BF16, 128, 1, 2, 2, 4096, 4096});
      v.push_back({VariantKind::Slope, DType::BF16, 128, 1, 2, 1, 4096, 4096});
      v.push_back({VariantKind::Softcap, DType::BF16, 128, 1, 2, 1, 4096, 4096});
    }
  }
  return v;
}

std::vector<Run> runs_for(const Case& c) {
  std::vector<Run> r = {{KernelKind::Sm90, false}, {KernelKind::Sm90, true}};
  if (c.dtype == DType::BF16) r.push_back({KernelKind::Old, false});
  if (c.dtype == DType::BF16 && c.kind == VariantKind::Causal) r.push_back({KernelKind::Sm90NoDq, false});
  return r;
}

int run_checks(bool quick, bool tiny, int only_d) {
  const std::vector<Case> cases = check_cases(quick, tiny, only_d);
  std::printf("%-8s %-4s %4s %-14s %-10s %-9s %-3s | %-17s | %-17s | %-17s | %-17s | %s\n", "variant", "type", "D", "B,H,Hkv", "Sq,Skv",
              "kernel", "det", "dq relL2 maxerr", "dk relL2 maxerr", "dv relL2 maxerr", "grad relL2 maxerr", "result");
  int passed = 0, failed = 0;
  std::vector<std::string> failures;
  uint64_t seed = 1000;
  for (const Case& c : cases) {
    Problem pr = make_problem(c, ++seed, true);
    DeviceProblem dp = upload(pr);
    char shape[40], lens[24];
    std::snprintf(shape, sizeof shape, "%d,%d,%d%s", c.b, c.h, c.hkv, c.bshd ? " bshd" : "");
    std::snprintf(lens, sizeof lens, "%d,%d", c.sq, c.skv);
    std::vector<float> old_dq;  // the mma.sync kernel's dq, for the new-vs-old line
    for (const Run& run : runs_for(c)) {
      char head[160];
      std::snprintf(head, sizeof head, "%-8s %-4s %4d %-14s %-10s %-9s %-3s", kind_name(c.kind), c.dtype == DType::BF16 ? "bf16" : "fp16", c.d,
                    shape, lens, kernel_name(run.kernel), run.det ? "yes" : "no");
      prepare(dp, c, run.det, 0);
      cudaError_t err = run_backward(dp, c, run.kernel, run.det, true, 0);
      if (err == cudaSuccess) err = cudaDeviceSynchronize();
      if (err == cudaErrorNotSupported) {
        std::printf("%s | not built\n", head);
        continue;
      }
      if (err != cudaSuccess) {
        std::printf("%s | launch failed: %s\n", head, cudaGetErrorString(err));
        failures.push_back(std::string(head) + " launch failed: " + cudaGetErrorString(err));
        ++failed;
        if (cudaDeviceSynchronize() != cudaSuccess) {
          // A sticky error (illegal address, ...): nothing after it can run.
          for (const std::string& f : failures) std::printf("FAILED: %s\n", f.c_str());
          std::printf("CHECK SUMMARY: %d passed, %d failed (stopped at a sticky CUDA error)\n", passed, failed);
          return 1;
        }
        continue;
      }
      Outputs o = download(dp, c);
      const bool with_dq = run.kernel != KernelKind::Sm90NoDq;
      Cmp cq = with_dq ? compare(o.dq, pr.dq) : Cmp{}, ck = compare(o.dk, pr.dk), cv = compare(o.dv, pr.dv);
      Cmp cg;
      if (c.kind == VariantKind::Bias) cg = compare(o.grad, pr.dbias);
      if (c.kind == VariantKind::Slope) cg = compare(o.grad, pr.dslope);
      bool ok = (!with_dq || passes(cq)) && passes(ck) && passes(cv) && (o.grad.empty() || passes(cg)) && o.flags == 0;
      std::string extra;
      if (o.flags) extra += " [variant called out of range]";
      if (run.det) {
        // Bitwise repeatability: a second run must give the same bytes.
        prepare(dp, c, true, 0);
        CUDA_CHECK(run_backward(dp, c, run.kernel, true, true, 0));
        CUDA_CHECK(cudaDeviceSynchronize());
        Outputs o2 = download(dp, c);
        const bool same = o2.raw == o.raw;
        extra += same ? " repeat=bitwise" : " [repeat differs]";
        ok = ok && same;
      }
      if (run.kernel == KernelKind::Old && !run.det) old_dq = o.dq;
      if (run.kernel == KernelKind::Sm90 && !run.det && !old_dq.empty()) extra += " (vs old dq relL2 " + std::to_string(compare(o.dq, old_dq).rel_l2) + ")";
      if (!ok) {
        if (with_dq && !passes(cq)) extra += " dq worst at " + where(c, cq.worst, false);
        if (!passes(ck)) extra += " dk worst at " + where(c, ck.worst, true);
        if (!passes(cv)) extra += " dv worst at " + where(c, cv.worst, true);
        if (!o.grad.empty() && !passes(cg)) extra += " grad worst at " + std::to_string(cg.worst);
      }
      auto cell = [](const Cmp& x, bool present) {
        char b[40];
        if (!present) std::snprintf(b, sizeof b, "%-17s", "-");
        else if (x.bad) std::snprintf(b, sizeof b, "%lld NaN/inf", x.bad);
        else std::snprintf(b, sizeof b, "%.1e %.1e", x.rel_l2, x.max_ref > 0 ? x.max_abs / x.max_ref : x.max_abs);
        return std::string(b);
      };
      std::printf("%s | %-17s | %-17s | %-17s | %-17s | %s%s\n", head, cell(cq, with_dq).c_str(), cell(ck, true).c_str(), cell(cv, true).c_str(),
                  cell(cg, !o.grad.empty()).c_str(), ok ? "PASS" : "FAIL", extra.c_str());
      std::fflush(stdout);
      if (ok) ++passed;
      else {
        ++failed;
        failures.push_back(std::string(head) + extra);
      }
    }
    dp.free_all();
  }
  std::printf("(maxerr = max |got - ref| / max |ref|; bounds: relL2 < %.0e, maxerr <= %.0e, no NaN, variants never called out of range)\n",
              kRelL2Bound, kMaxAbsFrac);
  for (const std::string& f : failures) std::printf("FAILED: %s\n", f.c_str());
  std::printf("CHECK SUMMARY: %d passed, %d failed\n", passed, failed);
  return failed;
}

// ---------------------------------------------------------------------------------------------------
// Benchmarks
// ---------------------------------------------------------------------------------------------------
double density(const Case& c) {
  if (!is_causal(c.kind)) return 1.0;
  double n = 0;
  for (int q = 0; q < c.sq; ++q) n += std::min(q + 1, c.skv);
  return n / ((double)c.sq * c.skv);
}

struct BenchRow {
  std::string name;
  double old_main = 0, new_main = 0, old_total = 0, new_total = 0, flops = 0;
  std::string sanity;
};

float median_ms(const std::function<void()>& body, int reps) {
  cudaEvent_t e0, e1;
  CUDA_CHECK(cudaEventCreate(&e0));
  CUDA_CHECK(cudaEventCreate(&e1));
  for (int i = 0; i < 3; ++i) body();
  CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> t;
  for (int i = 0; i < reps; ++i) {
    CUDA_CHECK(cudaEventRecord(e0));
    body();
    CUDA_CHECK(cudaEventRecord(e1));
    CUDA_CHECK(cudaEventSynchronize(e1));
    float ms;
    CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    t.push_back(ms);
  }
  std::sort(t.begin(), t.end());
  CUDA_CHECK(cudaEventDestroy(e0));
  CUDA_CHECK(cudaEventDestroy(e1));
  return t[t.size() / 2];
}

BenchRow bench_case(const std::string& name, const Case& c, bool det, int reps) {
  BenchRow row;
  row.name = name;
  Problem pr = make_problem(c, 4242, false);
  DeviceProblem dp = upload(pr);
  row.flops = 2.5 * 4.0 * c.b * c.h * (double)c.sq * c.skv * c.d * density(c);
  Outputs out[2];
  bool ok[2] = {false, false};
  for (int i = 0; i < 2; ++i) {
    const KernelKind kernel = i == 0 ? KernelKind::Old : KernelKind::Sm90;
    prepare(dp, c, det, 0);
    cudaError_t err = run_backward(dp, c, kernel, det, false, 0);
    if (err == cudaSuccess) err = cudaDeviceSynchronize();
    if (err != cudaSuccess) {
      std::printf("  %-28s %-8s %s\n", name.c_str(), kernel_name(kernel), cudaGetErrorString(err));
      if (err != cudaErrorNotSupported) std::exit(2);
      continue;
    }
    ok[i] = true;
    out[i] = download(dp, c);
    FlexBackwardParams p = dp.p;
    if (dp.grad_n) p.grad_ptr[0] = det ? (void*)dp.grad64 : (void*)dp.grad;
    const double main_ms = median_ms([&] { CUDA_CHECK(launch_main(c.d, c.kind, c.dtype, kernel, det, false, p, dp.hb, 0)); }, reps);
    const double total_ms = median_ms([&] { CUDA_CHECK(run_backward(dp, c, kernel, det, false, 0)); }, reps);
    (i == 0 ? row.old_main : row.new_main) = main_ms;
    (i == 0 ? row.old_total : row.new_total) = total_ms;
  }
  if (ok[0] && ok[1]) {
    // Sanity at the benchmark size: the two kernels agree (random O and LSE: not a reference check).
    char b[160];
    const Cmp q = compare(out[1].dq, out[0].dq), k = compare(out[1].dk, out[0].dk), v = compare(out[1].dv, out[0].dv);
    std::snprintf(b, sizeof b, "new vs old relL2 dq %.1e dk %.1e dv %.1e", q.rel_l2, k.rel_l2, v.rel_l2);
    row.sanity = b;
    if (!out[0].grad.empty()) {
      std::snprintf(b, sizeof b, " grad %.1e", compare(out[1].grad, out[0].grad).rel_l2);
      row.sanity += b;
    }
    if (q.bad || k.bad || v.bad) row.sanity += " NaN!";
  }
  std::printf("  %-28s old main %7.3f ms total %7.3f ms | new main %7.3f ms total %7.3f ms | %s\n", name.c_str(), row.old_main, row.old_total,
              row.new_main, row.new_total, row.sanity.c_str());
  std::fflush(stdout);
  dp.free_all();
  return row;
}

struct BenchCase {
  std::string name;
  Case c;
  bool det;
};

std::vector<BenchCase> bench_cases() {
  return {
      {"full    D128 bf16", {VariantKind::Plain, DType::BF16, 128, 4, 16, 16, 4096, 4096}, false},
      {"causal  D128 bf16", {VariantKind::Causal, DType::BF16, 128, 4, 16, 16, 4096, 4096}, false},
      {"softcap D128 bf16", {VariantKind::Softcap, DType::BF16, 128, 4, 16, 16, 4096, 4096}, false},
      {"bias+causal (grad) D128", {VariantKind::Bias, DType::BF16, 128, 4, 16, 16, 4096, 4096}, false},
      {"slope+causal (grad) D128", {VariantKind::Slope, DType::BF16, 128, 4, 16, 16, 4096, 4096}, false},
      {"causal D128 deterministic", {VariantKind::Causal, DType::BF16, 128, 4, 16, 16, 4096, 4096}, true},
  };
}

// One benchmark case, the sm_90a main kernel alone, three launches (for ncu: --launch-skip 2 --launch-count 1).
int run_one(int index) {
  const std::vector<BenchCase> cases = bench_cases();
  if (index < 0 || index >= (int)cases.size()) {
    std::printf("one: case index %d out of range [0, %zu)\n", index, cases.size());
    return 1;
  }
  const BenchCase& b = cases[index];
  Problem pr = make_problem(b.c, 4242, false);
  DeviceProblem dp = upload(pr);
  prepare(dp, b.c, b.det, 0);
  CUDA_CHECK(run_backward(dp, b.c, KernelKind::Sm90, b.det, false, 0));
  FlexBackwardParams p = dp.p;
  if (dp.grad_n) p.grad_ptr[0] = b.det ? (void*)dp.grad64 : (void*)dp.grad;
  const double ms = median_ms([&] { CUDA_CHECK(launch_main(b.c.d, b.c.kind, b.c.dtype, KernelKind::Sm90, b.det, false, p, dp.hb, 0)); }, 3);
  std::printf("one: %s, sm90 main %.3f ms\n", b.name.c_str(), ms);
  dp.free_all();
  return 0;
}

int run_bench() {
  const int reps = 20;
  using B = BenchCase;
  const std::vector<B> cases = bench_cases();
  std::printf("Benchmarks B4 H16 S4096 D128 (median of %d, cudaEvent; main = the main kernel alone, total = clear + preprocess + main + dq):\n",
              reps);
  std::vector<BenchRow> rows;
  for (const B& b : cases) rows.push_back(bench_case(b.name, b.c, b.det, reps));
  std::printf("\nBENCH TABLE (TFLOP/s = 2.5 x 4 B H Sq Skv D density / time)\n");
  std::printf("%-26s | %8s %8s %7s | %8s %8s %7s | %8s %8s %7s | %s\n", "case", "old main", "new main", "speedup", "old tot", "new tot",
              "speedup", "old TF/s", "new TF/s", "(total)", "");
  for (const BenchRow& r : rows) {
    auto tf = [&](double ms) { return ms > 0 ? r.flops / (ms * 1e-3) / 1e12 : 0.0; };
    std::printf("%-26s | %8.3f %8.3f %6.2fx | %8.3f %8.3f %6.2fx | %8.1f %8.1f %7s |\n", r.name.c_str(), r.old_main, r.new_main,
                r.new_main > 0 ? r.old_main / r.new_main : 0.0, r.old_total, r.new_total, r.new_total > 0 ? r.old_total / r.new_total : 0.0,
                tf(r.old_total), tf(r.new_total), "");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "all";
  bool quick = false, tiny = false;
  int only_d = 0;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") quick = true;
    else if (a == "--tiny") tiny = true;
    else if (a.rfind("--d=", 0) == 0) only_d = std::atoi(a.c_str() + 4);
  }
  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, sm_%d%d, %zu KB smem/block opt-in; host threads %d\n", prop.name, prop.multiProcessorCount, prop.major,
              prop.minor, prop.sharedMemPerBlockOptin / 1024, num_threads());
  std::printf("shared memory per CTA: D32/64/80/96/128 sm90 %d %d %d %d %d B, mma.sync %d %d %d %d %d B\n", main_smem_bytes(32, KernelKind::Sm90),
              main_smem_bytes(64, KernelKind::Sm90), main_smem_bytes(80, KernelKind::Sm90), main_smem_bytes(96, KernelKind::Sm90),
              main_smem_bytes(128, KernelKind::Sm90), main_smem_bytes(32, KernelKind::Old), main_smem_bytes(64, KernelKind::Old),
              main_smem_bytes(80, KernelKind::Old), main_smem_bytes(96, KernelKind::Old), main_smem_bytes(128, KernelKind::Old));
  int failed = 0;
  if (mode == "check" || mode == "all") failed += run_checks(quick, tiny, only_d);
  if (mode == "bench" || mode == "all") run_bench();
  if (mode == "one") failed += run_one(argc > 2 ? std::atoi(argv[2]) : 0);
  return failed ? 1 : 0;
}
