// Standalone harness of the flex forward template: correctness against a CPU fp64 reference, and benchmarks.
//
// Usage: flex_harness [check|bench|all] [--quick]  |  flex_harness one N  (bench case N alone, for ncu)
//        flex_harness sanitize  (a few small checks, for compute-sanitizer)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "harness.h"

#define CUDA_CHECK(expr)                                                                         \
  do {                                                                                           \
    cudaError_t err_ = (expr);                                                                   \
    if (err_ != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "CUDA error %s at %s:%d: %s\n", cudaGetErrorName(err_), __FILE__,     \
                   __LINE__, cudaGetErrorString(err_));                                          \
      std::exit(2);                                                                              \
    }                                                                                            \
  } while (0)

// Weak, so a build of only some head dims (build.sh with DIMS=...) links; a missing one is "not supported".
#define FLEX_DECLARE(D)                                                                          \
  __attribute__((weak)) cudaError_t launch_forward_d##D(VariantKind, DType, bool,                \
                                                        const FlexForwardParams&,                \
                                                        const HarnessParams&, cudaStream_t);
FLEX_HARNESS_HEAD_DIMS(FLEX_DECLARE)
#undef FLEX_DECLARE

cudaError_t launch_forward(int head_dim, VariantKind kind, DType dtype, bool check, const FlexForwardParams& p,
                           const HarnessParams& vp, cudaStream_t stream) {
  switch (head_dim) {
#define FLEX_CASE(D) \
  case D: return launch_forward_d##D ? launch_forward_d##D(kind, dtype, check, p, vp, stream) : cudaErrorNotSupported;
    FLEX_HARNESS_HEAD_DIMS(FLEX_CASE)
#undef FLEX_CASE
  }
  return cudaErrorNotSupported;
}

TileConfig tile_config(int d) {
  const int warps = d <= 128 ? 4 : 8;
  return {128, 64, warps, (128 + 4 * 64) * (d + 8) * 2};
}

namespace {

const char* kind_name(VariantKind k) {
  switch (k) {
    case VariantKind::Plain: return "plain";
    case VariantKind::Causal: return "causal";
    case VariantKind::Sam: return "sam";
    case VariantKind::Softcap: return "softcap";
    case VariantKind::SoftcapApprox: return "softcap~";
    case VariantKind::Doc: return "doc";
  }
  return "?";
}

enum class MaskKind {
  None,     // no block mask
  Causal,   // exact causal block mask: partial diagonal tiles, full below
  AllFull,  // every tile listed as full (mask_mod must then never run)
  Doc,      // exact block mask of the document mask, classified by brute force
};
const char* mask_name(MaskKind m) {
  switch (m) {
    case MaskKind::None: return "-";
    case MaskKind::Causal: return "bm";
    case MaskKind::AllFull: return "bm-full";
    case MaskKind::Doc: return "bm";
  }
  return "?";
}

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
    __nv_bfloat16 v;
    std::memcpy(&v, &b, 2);
    return __bfloat162float(v);
  }
  __half v;
  std::memcpy(&v, &b, 2);
  return __half2float(v);
}

void parallel_for(long long n, const std::function<void(long long, long long)>& body) {
  const int nt = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> ts;
  const long long chunk = (n + nt - 1) / nt;
  for (int t = 0; t < nt; ++t) {
    const long long lo = t * chunk, hi = std::min(n, lo + chunk);
    if (lo >= hi) break;
    ts.emplace_back([=, &body] { body(lo, hi); });
  }
  for (auto& t : ts) t.join();
}

// Random values rounded to the element type; `bits` for the device, `val` (the rounded value) for the reference.
struct HostTensor {
  std::vector<uint16_t> bits;
  std::vector<float> val;
};
HostTensor random_tensor(size_t n, DType dt, float sigma, uint64_t seed) {
  HostTensor t;
  t.bits.resize(n);
  t.val.resize(n);
  parallel_for((long long)n, [&](long long lo, long long hi) {
    std::mt19937_64 rng(seed * 1000003ull + (uint64_t)lo);
    std::normal_distribution<float> nd(0.f, sigma);
    for (long long i = lo; i < hi; ++i) {
      t.bits[i] = to_bits(nd(rng), dt);
      t.val[i] = from_bits(t.bits[i], dt);
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
// Problem description and host-built block masks
// ---------------------------------------------------------------------------------------------------
struct Case {
  VariantKind kind;
  DType dtype;
  int d, b, h, hkv, sq, skv;
  bool bshd;  // [B, S, H, D] storage instead of [B, H, S, D]
  MaskKind mask;
  float q_sigma = 2.f;  // q ~ N(0, q_sigma^2): 2 gives scores ~ N(0, 4); large values make row maxima jump
};

struct Problem {
  Case c;
  float scale;
  HostTensor q, k, v;                 // logical [B, H(kv), S, D] values, stored per layout in bits
  std::vector<float> rel_h, rel_w;    // SAM, values of the bf16 buffers
  std::vector<uint16_t> rel_h_bits, rel_w_bits;
  int rel_h_cols = 0;
  std::vector<int> doc_q, doc_kv;     // [B, Sq], [B, Skv]
  // Block mask, tile classes [Bm][num_q_tiles][num_kv_tiles]: 0 empty, 1 partial, 2 full.
  int bm_batches = 0, num_q_tiles = 0, num_kv_tiles = 0;
  std::vector<uint8_t> tile_class;
};

bool mask_value(const Problem& pr, int b, int q, int kv) {
  switch (pr.c.kind) {
    case VariantKind::Causal: return q >= kv;
    case VariantKind::Doc: return pr.doc_q[(size_t)b * pr.c.sq + q] == pr.doc_kv[(size_t)b * pr.c.skv + kv];
    default: return true;
  }
}
bool has_mask_mod(VariantKind k) { return k == VariantKind::Causal || k == VariantKind::Doc; }

void build_tile_classes(Problem& pr) {
  const Case& c = pr.c;
  pr.num_q_tiles = (c.sq + 127) / 128;
  pr.num_kv_tiles = (c.skv + 63) / 64;
  pr.bm_batches = c.mask == MaskKind::Doc ? c.b : 1;  // causal/all-full broadcast over batch (stride 0)
  pr.tile_class.assign((size_t)pr.bm_batches * pr.num_q_tiles * pr.num_kv_tiles, 0);
  parallel_for((long long)pr.bm_batches * pr.num_q_tiles, [&](long long lo, long long hi) {
    for (long long bq = lo; bq < hi; ++bq) {
      const int b = (int)(bq / pr.num_q_tiles), mq = (int)(bq % pr.num_q_tiles);
      for (int nk = 0; nk < pr.num_kv_tiles; ++nk) {
        uint8_t cls;
        if (c.mask == MaskKind::AllFull) {
          cls = 2;
        } else {
          bool any = false, all = true;
          for (int q = mq * 128; q < std::min(c.sq, mq * 128 + 128); ++q)
            for (int kv = nk * 64; kv < std::min(c.skv, nk * 64 + 64); ++kv) {
              const bool m = mask_value(pr, b, q, kv);
              any |= m;
              all &= m;
            }
          cls = !any ? 0 : (all ? 2 : 1);
        }
        pr.tile_class[((size_t)b * pr.num_q_tiles + mq) * pr.num_kv_tiles + nk] = cls;
      }
    }
  });
}

// Device copies of the block mask lists (partial ones in ascending order, then full ones).
struct DeviceBlockMask {
  int *num_partial = nullptr, *partial_idx = nullptr, *num_full = nullptr, *full_idx = nullptr;
};
FlexBlockMask upload_block_mask(const Problem& pr, DeviceBlockMask& dm) {
  FlexBlockMask bm{};
  if (pr.c.mask == MaskKind::None) return bm;
  const int nq = pr.num_q_tiles, nk = pr.num_kv_tiles;
  std::vector<int> np((size_t)pr.bm_batches * nq), nf(np.size()), pi(np.size() * nk, -1), fi(np.size() * nk, -1);
  for (size_t t = 0; t < np.size(); ++t) {
    int a = 0, f = 0;
    for (int k = 0; k < nk; ++k) {
      const uint8_t cls = pr.tile_class[t * nk + k];
      if (cls == 1) pi[t * nk + a++] = k;
      if (cls == 2) fi[t * nk + f++] = k;
    }
    np[t] = a;
    nf[t] = f;
  }
  dm.num_partial = to_device(np);
  dm.partial_idx = to_device(pi);
  dm.num_full = to_device(nf);
  dm.full_idx = to_device(fi);
  bm.kv_num_partial = dm.num_partial;
  bm.kv_partial_idx = dm.partial_idx;
  bm.kv_num_full = dm.num_full;
  bm.kv_full_idx = dm.full_idx;
  bm.stride_b = pr.bm_batches > 1 ? nq : 0;
  bm.stride_h = 0;
  bm.num_q_tiles = nq;
  bm.max_kv_tiles = nk;
  bm.q_tile = 128;
  bm.kv_tile = 64;
  return bm;
}

double density(const Problem& pr) {
  // Fraction of (q, kv) pairs attended, from the element mask (batch 0).
  const Case& c = pr.c;
  if (!has_mask_mod(c.kind) || c.mask == MaskKind::AllFull) return 1.0;
  std::atomic<long long> total{0};
  parallel_for(c.sq, [&](long long lo, long long hi) {
    long long cnt = 0;
    for (long long q = lo; q < hi; ++q)
      for (int kv = 0; kv < c.skv; ++kv) cnt += mask_value(pr, 0, (int)q, kv);
    total += cnt;
  });
  return (double)total.load() / ((double)c.sq * c.skv);
}

Problem make_problem(const Case& c, uint64_t seed) {
  Problem pr;
  pr.c = c;
  pr.scale = 1.f / std::sqrt((float)c.d);
  // q scaled by q_sigma (2: scores ~ N(0, 4)), so row maxima move between tiles and the rescaling matters.
  pr.q = random_tensor((size_t)c.b * c.h * c.sq * c.d, c.dtype, c.q_sigma, seed * 3 + 1);
  pr.k = random_tensor((size_t)c.b * c.hkv * c.skv * c.d, c.dtype, 1.f, seed * 3 + 2);
  pr.v = random_tensor((size_t)c.b * c.hkv * c.skv * c.d, c.dtype, 1.f, seed * 3 + 3);
  if (c.kind == VariantKind::Sam) {
    pr.rel_h_cols = (c.skv + 63) / 64;
    HostTensor rh = random_tensor((size_t)c.b * c.h * c.sq * pr.rel_h_cols, DType::BF16, 1.f, seed * 7 + 5);
    HostTensor rw = random_tensor((size_t)c.b * c.h * c.sq * 64, DType::BF16, 1.f, seed * 7 + 6);
    pr.rel_h = rh.val;
    pr.rel_h_bits = rh.bits;
    pr.rel_w = rw.val;
    pr.rel_w_bits = rw.bits;
  }
  if (c.kind == VariantKind::Doc) {
    // Documents proportional in q and kv, 12 of them in long sequences (fewer when short); then holes:
    // queries with document -1 attend nothing (fully masked rows; in batch 1 a whole leading query tile).
    const int ndocs = std::max(1, std::min(12, std::min(c.sq, c.skv) / 8));
    std::mt19937 rng((unsigned)seed);
    pr.doc_q.resize((size_t)c.b * c.sq);
    pr.doc_kv.resize((size_t)c.b * c.skv);
    for (int b = 0; b < c.b; ++b) {
      std::vector<int> cuts(ndocs + 1, 0);
      for (int i = 1; i < ndocs; ++i) cuts[i] = (int)((long long)i * 1000 + (rng() % 500)) ;
      cuts[ndocs] = ndocs * 1000 + 500;
      std::sort(cuts.begin(), cuts.end());
      auto doc_of = [&](double frac) {
        const double x = frac * cuts[ndocs];
        int d = 0;
        while (d + 1 < ndocs && x >= cuts[d + 1]) ++d;
        return d;
      };
      for (int q = 0; q < c.sq; ++q) pr.doc_q[(size_t)b * c.sq + q] = doc_of((double)q / c.sq);
      for (int kv = 0; kv < c.skv; ++kv) pr.doc_kv[(size_t)b * c.skv + kv] = doc_of((double)kv / c.skv);
      for (int q = 0; q < c.sq; ++q)
        if (q % 97 == 5 || (b == 1 && q < 130)) pr.doc_q[(size_t)b * c.sq + q] = -1;
    }
  }
  if (c.mask != MaskKind::None) build_tile_classes(pr);
  return pr;
}

// Element offset of logical [b, h, s, 0] for either storage order.
struct Layout {
  long long sb, sh, ss;
};
Layout layout_of(bool bshd, int h, int s, int d) {
  if (bshd) return {(long long)s * h * d, (long long)d, (long long)h * d};
  return {(long long)h * s * d, (long long)s * d, (long long)d};
}
std::vector<uint16_t> store(const HostTensor& t, int b, int h, int s, int d, const Layout& L) {
  std::vector<uint16_t> out((size_t)b * h * s * d);
  for (int ib = 0; ib < b; ++ib)
    for (int ih = 0; ih < h; ++ih)
      for (int is = 0; is < s; ++is)
        std::memcpy(&out[ib * L.sb + ih * L.sh + is * L.ss], &t.bits[(((size_t)ib * h + ih) * s + is) * d], d * 2);
  return out;
}

// ---------------------------------------------------------------------------------------------------
// CPU reference (fp64 over the rounded inputs) for one query row
// ---------------------------------------------------------------------------------------------------
void reference_row(const Problem& pr, int b, int h, int q, std::vector<double>& scores, double* o, double& lse) {
  const Case& c = pr.c;
  const int hkv = h / (c.h / c.hkv);
  const float* qr = &pr.q.val[(((size_t)b * c.h + h) * c.sq + q) * c.d];
  const int mb = pr.bm_batches > 1 ? b : 0;
  double mx = -INFINITY;
  for (int kv = 0; kv < c.skv; ++kv) {
    bool attend = true, apply_mask = has_mask_mod(c.kind);
    if (c.mask != MaskKind::None) {
      const uint8_t cls = pr.tile_class[((size_t)mb * pr.num_q_tiles + q / 128) * pr.num_kv_tiles + kv / 64];
      if (cls == 0) attend = false;
      if (cls == 2) apply_mask = false;
    }
    if (attend && apply_mask) attend = mask_value(pr, b, q, kv);
    double s = -INFINITY;
    if (attend) {
      const float* kr = &pr.k.val[(((size_t)b * c.hkv + hkv) * c.skv + kv) * c.d];
      double dot = 0;
      for (int i = 0; i < c.d; ++i) dot += (double)qr[i] * kr[i];
      s = (double)pr.scale * dot;
      if (c.kind == VariantKind::Sam) {
        const size_t row = ((size_t)b * c.h + h) * c.sq + q;
        s += pr.rel_h[row * pr.rel_h_cols + kv / 64] + pr.rel_w[row * 64 + kv % 64];
      } else if (c.kind == VariantKind::Softcap || c.kind == VariantKind::SoftcapApprox) {
        s = 30.0 * std::tanh(s / 30.0);
      }
    }
    scores[kv] = s;
    mx = std::max(mx, s);
  }
  for (int i = 0; i < c.d; ++i) o[i] = 0;
  if (mx == -INFINITY) {
    lse = -INFINITY;
    return;
  }
  double l = 0;
  for (int kv = 0; kv < c.skv; ++kv) {
    if (scores[kv] == -INFINITY) continue;
    const double p = std::exp(scores[kv] - mx);
    l += p;
    const float* vr = &pr.v.val[(((size_t)b * c.hkv + hkv) * c.skv + kv) * c.d];
    for (int i = 0; i < c.d; ++i) o[i] += p * vr[i];
  }
  for (int i = 0; i < c.d; ++i) o[i] /= l;
  lse = mx + std::log(l);
}

// ---------------------------------------------------------------------------------------------------
// Device run
// ---------------------------------------------------------------------------------------------------
struct DeviceProblem {
  uint16_t *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr;
  float* lse = nullptr;
  __nv_bfloat16 *rel_h = nullptr, *rel_w = nullptr;
  int *doc_q = nullptr, *doc_kv = nullptr, *violations = nullptr;
  DeviceBlockMask bm;
  FlexForwardParams p{};
  HarnessParams vp{};
  Layout lq{}, lkv{};
  void free_all() {
    for (void* ptr : {(void*)q, (void*)k, (void*)v, (void*)o, (void*)lse, (void*)rel_h, (void*)rel_w, (void*)doc_q,
                      (void*)doc_kv, (void*)violations, (void*)bm.num_partial, (void*)bm.partial_idx,
                      (void*)bm.num_full, (void*)bm.full_idx})
      if (ptr) CUDA_CHECK(cudaFree(ptr));
  }
};

DeviceProblem upload(const Problem& pr) {
  const Case& c = pr.c;
  DeviceProblem dp;
  dp.lq = layout_of(c.bshd, c.h, c.sq, c.d);
  dp.lkv = layout_of(c.bshd, c.hkv, c.skv, c.d);
  dp.q = to_device(store(pr.q, c.b, c.h, c.sq, c.d, dp.lq));
  dp.k = to_device(store(pr.k, c.b, c.hkv, c.skv, c.d, dp.lkv));
  dp.v = to_device(store(pr.v, c.b, c.hkv, c.skv, c.d, dp.lkv));
  CUDA_CHECK(cudaMalloc(&dp.o, (size_t)c.b * c.h * c.sq * c.d * 2));
  CUDA_CHECK(cudaMalloc(&dp.lse, (size_t)c.b * c.h * c.sq * 4));
  CUDA_CHECK(cudaMalloc(&dp.violations, 4));
  CUDA_CHECK(cudaMemset(dp.violations, 0, 4));
  if (c.kind == VariantKind::Sam) {
    dp.rel_h = reinterpret_cast<__nv_bfloat16*>(to_device(pr.rel_h_bits));
    dp.rel_w = reinterpret_cast<__nv_bfloat16*>(to_device(pr.rel_w_bits));
  }
  if (c.kind == VariantKind::Doc) {
    dp.doc_q = to_device(pr.doc_q);
    dp.doc_kv = to_device(pr.doc_kv);
  }
  FlexForwardParams& p = dp.p;
  p.q = dp.q;
  p.k = dp.k;
  p.v = dp.v;
  p.o = dp.o;
  p.lse = dp.lse;
  p.q_stride_b = dp.lq.sb, p.q_stride_h = dp.lq.sh, p.q_stride_s = dp.lq.ss;
  p.k_stride_b = dp.lkv.sb, p.k_stride_h = dp.lkv.sh, p.k_stride_s = dp.lkv.ss;
  p.v_stride_b = dp.lkv.sb, p.v_stride_h = dp.lkv.sh, p.v_stride_s = dp.lkv.ss;
  p.o_stride_b = dp.lq.sb, p.o_stride_h = dp.lq.sh, p.o_stride_s = dp.lq.ss;
  p.lse_stride_b = (long long)c.h * c.sq, p.lse_stride_h = c.sq;
  p.batch = c.b, p.heads = c.h, p.kv_heads = c.hkv, p.seqlen_q = c.sq, p.seqlen_kv = c.skv;
  p.scale = pr.scale;
  p.block_mask = upload_block_mask(pr, dp.bm);
  HarnessParams& vp = dp.vp;
  vp.rel_h = dp.rel_h;
  vp.rel_w = dp.rel_w;
  vp.rel_h_stride_q = pr.rel_h_cols, vp.rel_h_stride_h = (long long)c.sq * pr.rel_h_cols;
  vp.rel_h_stride_b = vp.rel_h_stride_h * c.h;
  vp.rel_w_stride_q = 64, vp.rel_w_stride_h = (long long)c.sq * 64, vp.rel_w_stride_b = vp.rel_w_stride_h * c.h;
  vp.doc_q = dp.doc_q;
  vp.doc_kv = dp.doc_kv;
  vp.seqlen_q = c.sq;
  vp.seqlen_kv = c.skv;
  vp.violations = dp.violations;
  return dp;
}

// ---------------------------------------------------------------------------------------------------
// Correctness
// ---------------------------------------------------------------------------------------------------
struct CheckResult {
  bool ok = true;
  double max_abs = 0, rel_l2 = 0, max_lse = 0;
  long long bad = 0, nan = 0, viol = 0;
  std::string why;
};

// Compares rows (all when rows is empty) of the device output against the reference.
CheckResult compare(const Problem& pr, const DeviceProblem& dp, const std::vector<long long>& sample_rows) {
  const Case& c = pr.c;
  const size_t n_out = (size_t)c.b * c.h * c.sq * c.d;
  std::vector<uint16_t> o_dev(n_out);
  std::vector<float> lse_dev((size_t)c.b * c.h * c.sq);
  CUDA_CHECK(cudaMemcpy(o_dev.data(), dp.o, n_out * 2, cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(lse_dev.data(), dp.lse, lse_dev.size() * 4, cudaMemcpyDeviceToHost));
  int viol = 0;
  CUDA_CHECK(cudaMemcpy(&viol, dp.violations, 4, cudaMemcpyDeviceToHost));

  const bool bf16 = c.dtype == DType::BF16;
  const double atol = bf16 ? 1e-2 : 2e-3, rtol = bf16 ? 1e-2 : 2e-3;
  const double lse_tol = c.kind == VariantKind::SoftcapApprox ? 1e-2 : 2e-3;
  const long long n_rows = sample_rows.empty() ? (long long)c.b * c.h * c.sq : (long long)sample_rows.size();
  std::atomic<long long> bad{0}, nan{0};
  std::vector<double> max_abs_t(256, 0), max_lse_t(256, 0), err2_t(256, 0), ref2_t(256, 0);
  std::atomic<int> slot{0};
  parallel_for(n_rows, [&](long long lo, long long hi) {
    const int s = slot++;
    std::vector<double> scores(c.skv), o(c.d);
    for (long long i = lo; i < hi; ++i) {
      const long long row = sample_rows.empty() ? i : sample_rows[i];
      const int q = (int)(row % c.sq), h = (int)((row / c.sq) % c.h), b = (int)(row / ((long long)c.sq * c.h));
      double lse;
      reference_row(pr, b, h, q, scores, o.data(), lse);
      const uint16_t* od = &o_dev[b * dp.lq.sb + h * dp.lq.sh + q * dp.lq.ss];
      for (int x = 0; x < c.d; ++x) {
        const double got = from_bits(od[x], c.dtype);
        if (std::isnan(got)) {
          ++nan;
          continue;
        }
        const double e = std::fabs(got - o[x]);
        max_abs_t[s] = std::max(max_abs_t[s], e);
        err2_t[s] += e * e;
        ref2_t[s] += o[x] * o[x];
        if (e > atol + rtol * std::fabs(o[x])) ++bad;
      }
      const double lg = lse_dev[((size_t)b * c.h + h) * c.sq + q];
      if (std::isnan(lg)) {
        ++nan;
      } else if (std::isinf(lse) || std::isinf(lg)) {
        if (lg != lse) ++bad, max_lse_t[s] = INFINITY;
      } else {
        const double e = std::fabs(lg - lse);
        max_lse_t[s] = std::max(max_lse_t[s], e);
        if (e > lse_tol * std::max(1.0, std::fabs(lse))) ++bad;
      }
    }
  });
  CheckResult r;
  double e2 = 0, r2 = 0;
  for (int i = 0; i < 256; ++i) {
    r.max_abs = std::max(r.max_abs, max_abs_t[i]);
    r.max_lse = std::max(r.max_lse, max_lse_t[i]);
    e2 += err2_t[i];
    r2 += ref2_t[i];
  }
  r.rel_l2 = r2 > 0 ? std::sqrt(e2 / r2) : std::sqrt(e2);
  r.bad = bad;
  r.nan = nan;
  r.viol = viol;
  const double l2_tol = bf16 ? 5e-3 : 1e-3;
  r.ok = r.bad == 0 && r.nan == 0 && r.viol == 0 && r.rel_l2 <= l2_tol;
  return r;
}

void poison(const Problem& pr, const DeviceProblem& dp) {
  const Case& c = pr.c;
  CUDA_CHECK(cudaMemset(dp.o, 0xff, (size_t)c.b * c.h * c.sq * c.d * 2));  // NaN in bf16 and fp16
  CUDA_CHECK(cudaMemset(dp.lse, 0xff, (size_t)c.b * c.h * c.sq * 4));      // NaN
  CUDA_CHECK(cudaMemset(dp.violations, 0, 4));
}

// sanitize: a handful of small cases covering partial tiles, GQA, block masks, empty rows and every
// warp layout, cheap enough to run under compute-sanitizer (memcheck, racecheck, synccheck).
int run_checks(bool quick, bool sanitize) {
  std::vector<Case> cases;
  if (sanitize) {
    for (int d : {80, 128, 256}) {
      cases.push_back({VariantKind::Plain, DType::BF16, d, 1, 4, 1, 17, 200, false, MaskKind::None});
      cases.push_back({VariantKind::Causal, DType::BF16, d, 1, 2, 2, 333, 333, true, MaskKind::Causal});
      cases.push_back({VariantKind::Doc, DType::FP16, d, 2, 2, 1, 200, 130, false, MaskKind::Doc});
      cases.push_back({VariantKind::Sam, DType::BF16, d, 1, 2, 2, 130, 70, false, MaskKind::None});
    }
  }
  const int dims[] = {32, 64, 80, 96, 128, 192, 256};
  // (Sq, Skv) pairs over lengths 1, 17, 1000, mostly Sq != Skv; Sq = Skv for the causal/SAM rows.
  const int shapes[][2] = {{1, 17}, {17, 1000}, {1000, 17}, {1000, 1}, {1000, 1000}};
  for (int d : dims) {
    if (sanitize) break;
    for (auto& s : shapes) {
      if (quick && s[0] == 1000 && s[1] == 1000) continue;
      // GQA 4:1 on one batch, plain MHA on two batches.
      cases.push_back({VariantKind::Plain, DType::BF16, d, 1, 4, 1, s[0], s[1], false, MaskKind::None});
      cases.push_back({VariantKind::Causal, DType::BF16, d, 2, 2, 2, s[0], s[1], false, MaskKind::None});
      cases.push_back({VariantKind::Causal, DType::BF16, d, 1, 4, 1, s[0], s[1], false, MaskKind::Causal});
      cases.push_back({VariantKind::Sam, DType::BF16, d, 2, 2, 2, s[0], s[1], false, MaskKind::None});
      cases.push_back({VariantKind::Softcap, DType::BF16, d, 1, 4, 1, s[0], s[1], false, MaskKind::None});
      cases.push_back({VariantKind::Doc, DType::BF16, d, 2, 4, 1, s[0], s[1], false, MaskKind::Doc});
      cases.push_back({VariantKind::Plain, DType::FP16, d, 1, 4, 1, s[0], s[1], false, MaskKind::None});
    }
    // [B, S, H, D] storage, a mask_mod whose block mask says "all full" (must equal plain), fp16 variants,
    // tanh.approx soft capping, and a causal run of more than two KV tiles per query tile.
    cases.push_back({VariantKind::Plain, DType::BF16, d, 2, 4, 2, 300, 700, true, MaskKind::None});
    cases.push_back({VariantKind::Doc, DType::BF16, d, 2, 4, 2, 700, 300, true, MaskKind::Doc});
    cases.push_back({VariantKind::Causal, DType::BF16, d, 1, 2, 2, 333, 333, false, MaskKind::AllFull});
    cases.push_back({VariantKind::Causal, DType::FP16, d, 1, 4, 4, 517, 517, true, MaskKind::Causal});
    cases.push_back({VariantKind::Softcap, DType::FP16, d, 1, 2, 1, 129, 1000, false, MaskKind::None});
    cases.push_back({VariantKind::Sam, DType::FP16, d, 1, 2, 2, 200, 256, false, MaskKind::None});
    cases.push_back({VariantKind::SoftcapApprox, DType::BF16, d, 1, 2, 1, 257, 1000, false, MaskKind::None});
    cases.push_back({VariantKind::Doc, DType::FP16, d, 2, 2, 1, 1000, 1000, false, MaskKind::Doc});
    // Scores ~ N(0, 144): row maxima jump by more than the lazy-rescale threshold in later tiles.
    cases.push_back({VariantKind::Plain, DType::BF16, d, 1, 2, 1, 200, 1000, false, MaskKind::None, 12.f});
    cases.push_back({VariantKind::Causal, DType::FP16, d, 1, 2, 2, 300, 900, false, MaskKind::Causal, 12.f});
  }

  std::printf("%-9s %-4s %4s %-12s %-8s %-7s %10s %10s %10s %s\n", "variant", "type", "D", "B,H,Hkv", "Sq,Skv",
              "mask", "max|dO|", "relL2", "max|dLSE|", "result");
  int failed = 0, passed = 0;
  uint64_t seed = 12345;
  for (const Case& c : cases) {
    Problem pr = make_problem(c, ++seed);
    DeviceProblem dp = upload(pr);
    poison(pr, dp);
    const cudaError_t err = launch_forward(c.d, c.kind, c.dtype, /*check=*/true, dp.p, dp.vp, 0);
    char shape[32], lens[32];
    std::snprintf(shape, sizeof shape, "%d,%d,%d%s", c.b, c.h, c.hkv, c.bshd ? " bshd" : "");
    std::snprintf(lens, sizeof lens, "%d,%d", c.sq, c.skv);
    if (err != cudaSuccess) {
      std::printf("%-9s %-4s %4d %-12s %-8s %-7s launch failed: %s\n", kind_name(c.kind),
                  c.dtype == DType::BF16 ? "bf16" : "fp16", c.d, shape, lens, mask_name(c.mask),
                  cudaGetErrorString(err));
      ++failed;
      dp.free_all();
      continue;
    }
    CUDA_CHECK(cudaDeviceSynchronize());
    CheckResult r = compare(pr, dp, {});
    std::printf("%-9s %-4s %4d %-12s %-8s %-7s %10.2e %10.2e %10.2e %s", kind_name(c.kind),
                c.dtype == DType::BF16 ? "bf16" : "fp16", c.d, shape, lens, mask_name(c.mask), r.max_abs, r.rel_l2,
                r.max_lse, r.ok ? "PASS" : "FAIL");
    if (!r.ok) std::printf("  (bad %lld, NaN %lld, bad calls %lld)", r.bad, r.nan, r.viol);
    std::printf("\n");
    (r.ok ? passed : failed)++;
    dp.free_all();
  }
  std::printf("CHECK SUMMARY: %d passed, %d failed\n", passed, failed);
  return failed;
}

// ---------------------------------------------------------------------------------------------------
// Benchmarks
// ---------------------------------------------------------------------------------------------------
struct BenchRow {
  std::string name;
  double ms, tflops, density, err;
  bool ok;
};

BenchRow bench_case(const std::string& name, const Case& c, int reps) {
  Problem pr = make_problem(c, 777);
  DeviceProblem dp = upload(pr);
  const double dens = density(pr);
  poison(pr, dp);
  const cudaError_t first = launch_forward(c.d, c.kind, c.dtype, /*check=*/false, dp.p, dp.vp, 0);
  if (first == cudaErrorNotSupported) {
    dp.free_all();
    std::printf("  %-34s not built\n", name.c_str());
    return {name, 0, 0, dens, 0, false};
  }
  CUDA_CHECK(first);
  CUDA_CHECK(cudaDeviceSynchronize());
  // Spot-check 48 random rows of the benchmarked output against the reference.
  std::vector<long long> rows;
  std::mt19937_64 rng(99);
  for (int i = 0; i < 48; ++i) rows.push_back((long long)(rng() % ((unsigned long long)c.b * c.h * c.sq)));
  CheckResult r = compare(pr, dp, rows);

  cudaEvent_t e0, e1;
  CUDA_CHECK(cudaEventCreate(&e0));
  CUDA_CHECK(cudaEventCreate(&e1));
  for (int i = 0; i < 5; ++i) CUDA_CHECK(launch_forward(c.d, c.kind, c.dtype, false, dp.p, dp.vp, 0));
  std::vector<float> t;
  for (int i = 0; i < reps; ++i) {
    CUDA_CHECK(cudaEventRecord(e0));
    CUDA_CHECK(launch_forward(c.d, c.kind, c.dtype, false, dp.p, dp.vp, 0));
    CUDA_CHECK(cudaEventRecord(e1));
    CUDA_CHECK(cudaEventSynchronize(e1));
    float ms;
    CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    t.push_back(ms);
  }
  std::sort(t.begin(), t.end());
  const double ms = t[t.size() / 2];
  const double flops = 4.0 * c.b * c.h * (double)c.sq * c.skv * c.d * dens;
  CUDA_CHECK(cudaEventDestroy(e0));
  CUDA_CHECK(cudaEventDestroy(e1));
  dp.free_all();
  BenchRow row{name, ms, flops / (ms * 1e-3) / 1e12, dens, r.rel_l2, r.ok};
  std::printf("  %-34s %8.3f ms %7.1f TFLOP/s  (density %.3f, spread %.3f-%.3f ms, sample relL2 %.1e %s)\n",
              name.c_str(), ms, row.tflops, dens, t.front(), t.back(), r.rel_l2, r.ok ? "ok" : "WRONG");
  std::fflush(stdout);
  return row;
}

struct BenchCase {
  std::string name;
  Case c;
};
std::vector<BenchCase> bench_cases(bool quick) {
  std::vector<BenchCase> v = {
      {"full    B4 H16 S4096 D128 bf16", {VariantKind::Plain, DType::BF16, 128, 4, 16, 16, 4096, 4096, false, MaskKind::None}},
      {"causal  B4 H16 S4096 D128 bf16", {VariantKind::Causal, DType::BF16, 128, 4, 16, 16, 4096, 4096, false, MaskKind::Causal}},
      {"SAM     B8 H12 S4096 D64  bf16", {VariantKind::Sam, DType::BF16, 64, 8, 12, 12, 4096, 4096, false, MaskKind::None}},
      {"SAM     B8 H16 S4096 D80  bf16", {VariantKind::Sam, DType::BF16, 80, 8, 16, 16, 4096, 4096, false, MaskKind::None}},
      {"softcap B4 H16 S4096 D128 tanhf", {VariantKind::Softcap, DType::BF16, 128, 4, 16, 16, 4096, 4096, false, MaskKind::None}},
      {"softcap B4 H16 S4096 D128 approx", {VariantKind::SoftcapApprox, DType::BF16, 128, 4, 16, 16, 4096, 4096, false, MaskKind::None}},
      {"doc12   B4 H16 S4096 D128 bf16", {VariantKind::Doc, DType::BF16, 128, 4, 16, 16, 4096, 4096, false, MaskKind::Doc}},
      {"full    B4 H16 S4096 D128 fp16", {VariantKind::Plain, DType::FP16, 128, 4, 16, 16, 4096, 4096, false, MaskKind::None}},
      {"full    B4 H16 S4096 D128 bshd", {VariantKind::Plain, DType::BF16, 128, 4, 16, 16, 4096, 4096, true, MaskKind::None}},
      {"full    B4 H16 S4096 D64 bf16", {VariantKind::Plain, DType::BF16, 64, 4, 16, 16, 4096, 4096, false, MaskKind::None}},
  };
  if (!quick) {
    v.push_back({"causal  B4 H16 S4096 D128 no-bm", {VariantKind::Causal, DType::BF16, 128, 4, 16, 16, 4096, 4096, false, MaskKind::None}});
    for (int d : {32, 80, 96, 192, 256})
      v.push_back({"full    B4 H16 S4096 D" + std::to_string(d) + " bf16",
                   {VariantKind::Plain, DType::BF16, d, 4, 16, 16, 4096, 4096, false, MaskKind::None}});
  }
  return v;
}

int run_bench(bool quick, int only) {
  const int reps = only >= 0 ? 3 : (quick ? 15 : 30);
  std::vector<BenchRow> rows;
  std::printf("Benchmarks (median of %d, cudaEvent):\n", reps);
  const std::vector<BenchCase> cases = bench_cases(quick);
  for (int i = 0; i < (int)cases.size(); ++i)
    if (only < 0 || only == i) rows.push_back(bench_case(cases[i].name, cases[i].c, reps));
  std::printf("\n%-34s %9s %9s %8s %s\n", "BENCH case", "ms", "TFLOP/s", "density", "sample");
  for (auto& r : rows)
    std::printf("%-34s %9.3f %9.1f %8.3f %s\n", r.name.c_str(), r.ms, r.tflops, r.density, r.ok ? "ok" : "WRONG");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "all";
  bool quick = false;
  for (int i = 2; i < argc; ++i)
    if (std::string(argv[i]) == "--quick") quick = true;
  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, sm_%d%d, %zu KB smem/block opt-in\n", prop.name, prop.multiProcessorCount,
              prop.major, prop.minor, prop.sharedMemPerBlockOptin / 1024);
  int failed = 0;
  if (mode == "check" || mode == "all") failed += run_checks(quick, false);
  if (mode == "sanitize") failed += run_checks(true, true);
  if (mode == "bench" || mode == "all") run_bench(quick, -1);
  if (mode == "one") run_bench(true, argc > 2 ? std::atoi(argv[2]) : 0);  // one bench case, for ncu
  return failed ? 1 : 0;
}
