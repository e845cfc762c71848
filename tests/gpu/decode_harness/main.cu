// Standalone harness of the flex decode template: correctness against an fp64 CPU reference, and benchmarks.
//
// Usage: decode_harness [check|bench|all|sanitize|quick|opt|target]
//        decode_harness one <kv_len> <splits> <stages> <page_size>
// Built per pipeline choice (build.sh FLAVOURS; -DFLEX_DECODE_ALTERNATE, see kernels.cu).
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
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "decode_harness.h"

#define CUDA_CHECK(expr)                                                                                   \
  do {                                                                                                     \
    cudaError_t err_ = (expr);                                                                             \
    if (err_ != cudaSuccess) {                                                                             \
      std::fprintf(stderr, "CUDA error %s at %s:%d: %s\n", cudaGetErrorName(err_), __FILE__, __LINE__,     \
                   cudaGetErrorString(err_));                                                              \
      std::exit(2);                                                                                        \
    }                                                                                                      \
  } while (0)

#define DECL(D)                                                                                                    \
  __attribute__((weak)) cudaError_t launch_decode_d##D(const DecodeConfig&, DVariant, DType, bool,                \
                                                       const FlexDecodeParams&, const DecodeHarnessParams&,       \
                                                       cudaStream_t);                                             \
  __attribute__((weak)) int decode_ctas_per_sm_d##D(const DecodeConfig&, DVariant, DType, bool);                  \
  __attribute__((weak)) int decode_smem_bytes_d##D(const DecodeConfig&);
DECODE_HARNESS_HEAD_DIMS(DECL)
#undef DECL

cudaError_t launch_decode(const DecodeConfig& cfg, DVariant kind, DType dtype, bool check, const FlexDecodeParams& p,
                          const DecodeHarnessParams& vp, cudaStream_t stream) {
  switch (cfg.head_dim) {
#define CASE(D) \
  case D: return launch_decode_d##D ? launch_decode_d##D(cfg, kind, dtype, check, p, vp, stream) : cudaErrorNotSupported;
    DECODE_HARNESS_HEAD_DIMS(CASE)
#undef CASE
  }
  return cudaErrorNotSupported;
}
int decode_ctas_per_sm(const DecodeConfig& cfg, DVariant kind, DType dtype, bool check) {
  switch (cfg.head_dim) {
#define CASE(D) \
  case D: return decode_ctas_per_sm_d##D ? decode_ctas_per_sm_d##D(cfg, kind, dtype, check) : 0;
    DECODE_HARNESS_HEAD_DIMS(CASE)
#undef CASE
  }
  return 0;
}
int decode_default_stages() {
#ifdef DECODE_DEFAULT_STAGES
  return DECODE_DEFAULT_STAGES;
#else
  return 2;
#endif
}

int decode_smem_bytes(const DecodeConfig& cfg) {
  switch (cfg.head_dim) {
#define CASE(D) \
  case D: return decode_smem_bytes_d##D ? decode_smem_bytes_d##D(cfg) : 0;
    DECODE_HARNESS_HEAD_DIMS(CASE)
#undef CASE
  }
  return 0;
}

namespace {

constexpr int kBlockN = kFlexDecodeBlockN;
constexpr uint16_t kPoison = 0xFFFF;  // NaN in both bf16 and fp16

const char* kind_name(DVariant k) {
  switch (k) {
    case DVariant::Plain: return "plain";
    case DVariant::Causal: return "causal";
    case DVariant::Alibi: return "alibi";
    case DVariant::Softcap: return "softcap";
    case DVariant::Window: return "window";
    case DVariant::Doc: return "doc";
  }
  return "?";
}
bool has_mask(DVariant k) { return k == DVariant::Causal || k == DVariant::Window || k == DVariant::Doc; }

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

template <class T>
T* to_device(const std::vector<T>& h) {
  if (h.empty()) return nullptr;
  T* d = nullptr;
  CUDA_CHECK(cudaMalloc(&d, h.size() * sizeof(T)));
  CUDA_CHECK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

// ---------------------------------------------------------------------------------------------------
// One problem: shapes, layout, variant, tile window mode
// ---------------------------------------------------------------------------------------------------
enum class TileMode {
  None,    // no tile info: every tile visited, all partial
  Exact,   // window and full range classified from the mask (what a host planner would build)
  Narrow,  // an artificial window [n/3, n - n/4) without full tiles: rows outside see nothing
};

struct Case {
  std::string note;
  DType dtype = DType::BF16;
  int D = 128;
  int H = 32, Hkv = 8;
  int max_q = 1;
  std::vector<int> q_lens;   // per sequence (B = kv_lens.size())
  std::vector<int> kv_lens;  // per sequence
  int page_size = 0;         // 0 = contiguous [B, Hkv, Smax, D]
  bool head_major = false;   // paged [pages, Hkv, ps, D] instead of [pages, ps, Hkv, D]
  bool q_head_major = false; // q/o as [B, H, max_q, D] instead of [B, max_q, H, D]
  DVariant kind = DVariant::Plain;
  int window = 256;
  TileMode tiles = TileMode::None;
  int splits = 0;            // 0 = heuristic
  bool null_lens = false;    // pass kv_lens / q_lens as null (all sequences equal)
  bool evict_first = false;  // FlexDecodeParams::kv_evict_first
};

int batch_of(const Case& c) { return (int)c.kv_lens.size(); }
int m_tiles_of(const Case& c) { return (c.H / c.Hkv) * c.max_q <= 16 ? 1 : 2; }

struct HostProblem {
  std::vector<float> q;                  // [B, max_q, H, D] logical values (rounded)
  std::vector<std::vector<float>> k, v;  // per sequence [kv_len, Hkv, D] logical values
  std::vector<float> slopes;             // [H]
  std::vector<int> doc;                  // [B, doc_stride]
  long long doc_stride = 0;
  std::vector<int> tb, te, fb, fe;       // per sequence tile window / full range
};

bool host_mask(const Case& c, const HostProblem& hp, int b, int q, int kv) {
  switch (c.kind) {
    case DVariant::Causal: return q >= kv;
    case DVariant::Window: return kv <= q && q - kv < c.window;
    case DVariant::Doc: {
      const int dq = hp.doc[b * hp.doc_stride + q];
      return dq >= 0 && hp.doc[b * hp.doc_stride + kv] == dq;
    }
    default: return true;
  }
}
double host_score(const Case& c, const HostProblem& hp, int h, int q, int kv, double s) {
  switch (c.kind) {
    case DVariant::Alibi: return s + (double)hp.slopes[h] * (double)(kv - q);
    case DVariant::Softcap: return 30.0 * std::tanh(s / 30.0);
    default: return s;
  }
}

// Tile window / full range per sequence, as a host planner would build them (mask does not depend on h).
void classify_tiles(const Case& c, HostProblem& hp) {
  const int B = batch_of(c);
  hp.tb.assign(B, 0);
  hp.te.assign(B, 0);
  hp.fb.assign(B, 0);
  hp.fe.assign(B, 0);
  for (int b = 0; b < B; ++b) {
    const int L = c.kv_lens[b], ql = c.q_lens[b];
    const int n = (L + kBlockN - 1) / kBlockN;
    if (c.tiles == TileMode::Narrow) {
      hp.tb[b] = n / 3;
      hp.te[b] = n - n / 4;
      continue;
    }
    if (!has_mask(c.kind)) {
      hp.te[b] = n;
      hp.fe[b] = n;
      continue;
    }
    std::vector<char> any(n, 0), all(n, 1);
    for (int t = 0; t < n; ++t)
      for (int i = 0; i < ql; ++i) {
        const int q = L - ql + i;
        for (int kv = t * kBlockN; kv < std::min(L, (t + 1) * kBlockN); ++kv) {
          const bool m = host_mask(c, hp, b, q, kv);
          any[t] |= m;
          all[t] &= m;
        }
      }
    int first = -1, last = -1;
    for (int t = 0; t < n; ++t)
      if (any[t]) {
        if (first < 0) first = t;
        last = t;
      }
    if (first < 0) continue;  // nothing visible: empty window
    hp.tb[b] = first;
    hp.te[b] = last + 1;
    int f = first;
    while (f <= last && !all[f]) ++f;
    int g = f;
    while (g <= last && all[g]) ++g;
    hp.fb[b] = f;
    hp.fe[b] = g;
  }
}

struct RefOut {
  std::vector<double> o;    // [B, max_q, H, D] (rows i >= q_len unused)
  std::vector<double> lse;  // [B, H, max_q]
};

RefOut reference(const Case& c, const HostProblem& hp) {
  const int B = batch_of(c), H = c.H, D = c.D, G = c.H / c.Hkv, Q = c.max_q;
  const double scale = 1.0 / std::sqrt((double)D);
  RefOut r;
  r.o.assign((size_t)B * Q * H * D, 0.0);
  r.lse.assign((size_t)B * H * Q, -INFINITY);
  const bool windowed = c.tiles != TileMode::None;
  parallel_for((long long)B * H * Q, [&](long long lo, long long hi) {
    std::vector<double> s;
    for (long long idx = lo; idx < hi; ++idx) {
      const int i = (int)(idx % Q);
      const int h = (int)((idx / Q) % H);
      const int b = (int)(idx / ((long long)Q * H));
      if (i >= c.q_lens[b]) continue;
      const int L = c.kv_lens[b];
      const int qpos = L - c.q_lens[b] + i;
      const int hkv = h / G;
      int lo_kv = 0, hi_kv = L;
      if (windowed) {
        lo_kv = hp.tb[b] * kBlockN;
        hi_kv = std::min(L, hp.te[b] * kBlockN);
      }
      const float* qv = &hp.q[(((size_t)b * Q + i) * H + h) * D];
      s.assign(std::max(0, hi_kv - lo_kv), -INFINITY);
      double mx = -INFINITY;
      for (int kv = lo_kv; kv < hi_kv; ++kv) {
        if (!host_mask(c, hp, b, qpos, kv)) continue;
        const float* kr = &hp.k[b][((size_t)kv * c.Hkv + hkv) * D];
        double dot = 0;
        for (int d = 0; d < D; ++d) dot += (double)qv[d] * kr[d];
        const double x = host_score(c, hp, h, qpos, kv, dot * scale);
        s[kv - lo_kv] = x;
        mx = std::max(mx, x);
      }
      if (mx == -INFINITY) continue;  // all masked: O = 0, LSE = -inf
      double sum = 0;
      std::vector<double> acc(D, 0.0);
      for (int kv = lo_kv; kv < hi_kv; ++kv) {
        const double x = s[kv - lo_kv];
        if (x == -INFINITY) continue;
        const double p = std::exp(x - mx);
        sum += p;
        const float* vr = &hp.v[b][((size_t)kv * c.Hkv + hkv) * D];
        for (int d = 0; d < D; ++d) acc[d] += p * vr[d];
      }
      double* o = &r.o[(((size_t)b * Q + i) * H + h) * D];
      for (int d = 0; d < D; ++d) o[d] = acc[d] / sum;
      r.lse[((size_t)b * H + h) * Q + i] = mx + std::log(sum);
    }
  });
  return r;
}

// ---------------------------------------------------------------------------------------------------
// Device side of one problem
// ---------------------------------------------------------------------------------------------------
struct DeviceProblem {
  void *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr;
  float *lse = nullptr, *ws = nullptr, *slopes = nullptr;
  int *kv_lens = nullptr, *q_lens = nullptr, *page_table = nullptr, *doc = nullptr, *violations = nullptr;
  int *tb = nullptr, *te = nullptr, *fb = nullptr, *fe = nullptr;
  size_t o_elems = 0, lse_elems = 0;
  FlexDecodeParams p{};
  DecodeHarnessParams vp{};
  DecodeConfig cfg{};
  long long kv_bytes_visited = 0;  // K + V bytes the launch must read
  void release() {
    for (void* ptr : {q, k, v, o, (void*)lse, (void*)ws, (void*)slopes, (void*)kv_lens, (void*)q_lens,
                      (void*)page_table, (void*)doc, (void*)violations, (void*)tb, (void*)te, (void*)fb, (void*)fe})
      if (ptr) cudaFree(ptr);
  }
};

int g_num_sms = 0;
// DECODE_FUSED=1: checks run the fused combine (split counters), each case launched twice (counter reset).
bool g_fused = false;

// Physical KV storage from per-sequence logical rows. `fill(b, pos, hkv, d)` gives element bits. Paged: pages
// shuffled, the unused slots and an extra poison page (where unused page-table entries point) are NaN.
// Contiguous: [B, Hkv, Smax, D], positions past kv_len NaN.
struct KvLayout {
  std::vector<int> page_table;
  long long page_table_stride = 0, stride_page = 0, stride_row = 0, stride_head = 0;
  size_t elems = 0;
  std::vector<long long> row_offset;  // not stored; computed by offset()
};

template <class Fill>
std::vector<uint16_t> build_kv(const Case& c, KvLayout& lay, uint64_t seed, Fill&& fill) {
  const int B = batch_of(c), Hkv = c.Hkv, D = c.D;
  std::vector<uint16_t> buf;
  if (c.page_size == 0) {
    const int smax = *std::max_element(c.kv_lens.begin(), c.kv_lens.end());
    lay.stride_head = (long long)smax * D;
    lay.stride_row = D;
    lay.stride_page = (long long)Hkv * smax * D;
    lay.elems = (size_t)B * Hkv * smax * D;
    buf.assign(lay.elems, kPoison);
    for (int b = 0; b < B; ++b)
      for (int pos = 0; pos < c.kv_lens[b]; ++pos)
        for (int h = 0; h < Hkv; ++h)
          for (int d = 0; d < D; ++d) buf[b * lay.stride_page + pos * lay.stride_row + h * lay.stride_head + d] = fill(b, pos, h, d);
    return buf;
  }
  const int ps = c.page_size;
  int max_pages = 0, total = 0;
  for (int L : c.kv_lens) {
    max_pages = std::max(max_pages, (L + ps - 1) / ps);
    total += (L + ps - 1) / ps;
  }
  const int n_pages = total + 1;  // + poison page
  std::vector<int> perm(n_pages);
  std::iota(perm.begin(), perm.end(), 0);
  std::mt19937_64 rng(seed);
  std::shuffle(perm.begin(), perm.end(), rng);
  const int poison_page = perm[total];
  lay.page_table_stride = max_pages + 3;  // not a multiple of anything on purpose
  lay.page_table.assign((size_t)B * lay.page_table_stride, poison_page);
  if (c.head_major) {
    lay.stride_page = (long long)Hkv * ps * D;
    lay.stride_row = D;
    lay.stride_head = (long long)ps * D;
  } else {
    lay.stride_page = (long long)ps * Hkv * D;
    lay.stride_row = (long long)Hkv * D;
    lay.stride_head = D;
  }
  lay.elems = (size_t)n_pages * ps * Hkv * D;
  buf.assign(lay.elems, kPoison);
  int next = 0;
  for (int b = 0; b < B; ++b) {
    const int np = (c.kv_lens[b] + ps - 1) / ps;
    for (int pg = 0; pg < np; ++pg) lay.page_table[b * lay.page_table_stride + pg] = perm[next++];
    for (int pos = 0; pos < c.kv_lens[b]; ++pos) {
      const long long page = lay.page_table[b * lay.page_table_stride + pos / ps];
      for (int h = 0; h < Hkv; ++h)
        for (int d = 0; d < D; ++d)
          buf[page * lay.stride_page + (pos % ps) * lay.stride_row + h * lay.stride_head + d] = fill(b, pos, h, d);
    }
  }
  return buf;
}

void fill_params(const Case& c, DeviceProblem& dp, const KvLayout& lay, const HostProblem& hp, int splits_override) {
  const int B = batch_of(c), H = c.H, D = c.D, Q = c.max_q;
  FlexDecodeParams& p = dp.p;
  p = FlexDecodeParams{};
  p.q = dp.q;
  p.k = dp.k;
  p.v = dp.v;
  p.o = dp.o;
  p.lse = dp.lse;
  if (c.q_head_major) {
    p.q_stride_b = (long long)H * Q * D;
    p.q_stride_h = (long long)Q * D;
    p.q_stride_s = D;
  } else {
    p.q_stride_b = (long long)Q * H * D;
    p.q_stride_s = (long long)H * D;
    p.q_stride_h = D;
  }
  p.o_stride_b = p.q_stride_b;
  p.o_stride_s = p.q_stride_s;
  p.o_stride_h = p.q_stride_h;
  p.lse_stride_b = (long long)H * Q;
  p.lse_stride_h = Q;
  p.kv_lens = c.null_lens ? nullptr : dp.kv_lens;
  p.q_lens = c.null_lens ? nullptr : dp.q_lens;
  p.kv_len = c.kv_lens[0];
  p.kv_evict_first = c.evict_first ? 1 : 0;
  p.page_table = c.page_size ? dp.page_table : nullptr;
  p.page_table_stride = lay.page_table_stride;
  p.kv_stride_page = lay.stride_page;
  p.kv_stride_row = lay.stride_row;
  p.kv_stride_head = lay.stride_head;
  p.page_size = c.page_size ? c.page_size : 1;
  p.page_shift = -1;
  if (c.page_size && (c.page_size & (c.page_size - 1)) == 0) {
    p.page_shift = 0;
    while ((1 << p.page_shift) < c.page_size) ++p.page_shift;
  }
  p.batch = B;
  p.heads = H;
  p.kv_heads = c.Hkv;
  p.max_q_len = Q;
  p.scale = 1.f / std::sqrt((float)D);
  dp.cfg = {D, m_tiles_of(c), 0};
  const int block_m = 16 * dp.cfg.m_tiles;
  p.row_blocks = ((H / c.Hkv) * Q + block_m - 1) / block_m;
  if (c.tiles != TileMode::None) {
    p.tiles.begin = dp.tb;
    p.tiles.end = dp.te;
    if (c.tiles == TileMode::Exact) {
      p.tiles.full_begin = dp.fb;
      p.tiles.full_end = dp.fe;
    }
    p.tiles.stride_b = 1;
    p.tiles.stride_h = 0;
  }
  // Split count: heuristic on the longest visited window, unless forced.
  int max_tiles = 0;
  dp.kv_bytes_visited = 0;
  for (int b = 0; b < B; ++b) {
    const int n = (c.kv_lens[b] + kBlockN - 1) / kBlockN;
    int t0 = 0, t1 = n;
    if (c.tiles != TileMode::None) {
      t0 = hp.tb[b];
      t1 = std::min(hp.te[b], n);
    }
    max_tiles = std::max(max_tiles, t1 - t0);
    const long long rows = std::max(0, std::min(c.kv_lens[b], t1 * kBlockN) - t0 * kBlockN);
    dp.kv_bytes_visited += rows * c.Hkv * D * 2 * 2;
  }
  int splits = splits_override ? splits_override : c.splits;
  if (splits == 0) {
    const int ctas = decode_ctas_per_sm(dp.cfg, c.kind, c.dtype, true);
    const int st = dp.cfg.stages ? dp.cfg.stages : decode_default_stages();
    splits = flex_decode_num_splits(g_num_sms, flex_decode_bandwidth_ctas(std::max(1, ctas), D, st), B * c.Hkv * p.row_blocks, max_tiles);
  }
  p.num_splits = splits;
  if (dp.ws) cudaFree(dp.ws);
  dp.ws = nullptr;
  const long long ws_bytes = flex_decode_workspace_bytes(B, H, Q, D, splits);
  if (ws_bytes > 0) {
    // Fused-combine counters (zero) after the partials.
    const size_t counter_bytes = (size_t)B * c.Hkv * p.row_blocks * 4;
    CUDA_CHECK(cudaMalloc(&dp.ws, ws_bytes + counter_bytes));
    CUDA_CHECK(cudaMemset(dp.ws, 0xFF, ws_bytes));  // NaN: a partial read before it was written shows up
    CUDA_CHECK(cudaMemset(reinterpret_cast<char*>(dp.ws) + ws_bytes, 0, counter_bytes));
    p.ws_o = dp.ws;
    p.ws_lse = dp.ws + (size_t)B * H * Q * splits * D;
    if (g_fused) p.split_counters = reinterpret_cast<int*>(reinterpret_cast<char*>(dp.ws) + ws_bytes);
  }
  DecodeHarnessParams& vp = dp.vp;
  vp = DecodeHarnessParams{};
  vp.alibi_slopes = dp.slopes;
  vp.doc = dp.doc;
  vp.doc_stride = hp.doc_stride;
  vp.window = c.window;
  vp.kv_lens = dp.kv_lens;
  vp.q_lens = dp.q_lens;
  vp.batch = B;
  vp.heads = H;
  vp.violations = dp.violations;
}

// ---------------------------------------------------------------------------------------------------
// Correctness
// ---------------------------------------------------------------------------------------------------
struct CheckResult {
  bool ok = true;
  double max_abs = 0, rel_l2 = 0, max_lse = 0;
  int neg_inf_rows = 0, rows = 0;
  std::string why;
};

CheckResult run_check(const Case& c, uint64_t seed) {
  const int B = batch_of(c), H = c.H, D = c.D, Q = c.max_q, Hkv = c.Hkv;
  const DType dt = c.dtype;
  HostProblem hp;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nq(0.f, 2.f), n1(0.f, 1.f);
  std::vector<uint16_t> q_bits((size_t)B * Q * H * D);
  hp.q.resize(q_bits.size());
  for (size_t i = 0; i < q_bits.size(); ++i) {
    q_bits[i] = to_bits(nq(rng), dt);
    hp.q[i] = from_bits(q_bits[i], dt);
  }
  hp.k.resize(B);
  hp.v.resize(B);
  for (int b = 0; b < B; ++b) {
    const size_t n = (size_t)c.kv_lens[b] * Hkv * D;
    hp.k[b].resize(n);
    hp.v[b].resize(n);
    parallel_for((long long)n, [&](long long lo, long long hi) {
      std::mt19937_64 r2(seed * 7919 + b * 104729 + lo);
      std::normal_distribution<float> nd(0.f, 1.f);
      for (long long i = lo; i < hi; ++i) {
        hp.k[b][i] = from_bits(to_bits(nd(r2), dt), dt);
        hp.v[b][i] = from_bits(to_bits(nd(r2), dt), dt);
      }
    });
  }
  hp.slopes.resize(H);
  for (int h = 0; h < H; ++h) hp.slopes[h] = std::pow(2.f, -8.f * (h + 1) / H);
  int smax = *std::max_element(c.kv_lens.begin(), c.kv_lens.end());
  hp.doc_stride = smax;
  hp.doc.assign((size_t)B * smax, 0);
  for (int b = 0; b < B; ++b) {
    // Documents of random lengths; the last sequence's final document is -1 (its rows attend nothing).
    int pos = 0, id = 0;
    std::uniform_int_distribution<int> len(1, std::max(1, c.kv_lens[b] / 3 + 1));
    while (pos < c.kv_lens[b]) {
      const int l = len(rng);
      for (int i = pos; i < std::min(c.kv_lens[b], pos + l); ++i) hp.doc[(size_t)b * smax + i] = id;
      pos += l;
      ++id;
    }
    if (b == B - 1 && B > 1)
      for (int i = std::max(0, c.kv_lens[b] - 70); i < c.kv_lens[b]; ++i) hp.doc[(size_t)b * smax + i] = -1;
  }
  classify_tiles(c, hp);

  KvLayout lay;
  auto kbits = build_kv(c, lay, seed + 1, [&](int b, int pos, int h, int d) {
    return to_bits(hp.k[b][((size_t)pos * Hkv + h) * D + d], dt);
  });
  KvLayout lay_v;
  auto vbits = build_kv(c, lay_v, seed + 1, [&](int b, int pos, int h, int d) {
    return to_bits(hp.v[b][((size_t)pos * Hkv + h) * D + d], dt);
  });

  DeviceProblem dp;
  if (c.q_head_major) {  // hp.q stays [B, max_q, H, D]; the device copy is [B, H, max_q, D]
    std::vector<uint16_t> t(q_bits.size());
    for (int b = 0; b < B; ++b)
      for (int i = 0; i < Q; ++i)
        for (int h = 0; h < H; ++h)
          std::memcpy(&t[(((size_t)b * H + h) * Q + i) * D], &q_bits[(((size_t)b * Q + i) * H + h) * D], D * 2);
    q_bits.swap(t);
  }
  dp.q = to_device(q_bits);
  dp.k = to_device(kbits);
  dp.v = to_device(vbits);
  dp.o_elems = q_bits.size();
  CUDA_CHECK(cudaMalloc(&dp.o, dp.o_elems * 2));
  dp.lse_elems = (size_t)B * H * Q;
  CUDA_CHECK(cudaMalloc(&dp.lse, dp.lse_elems * 4));
  dp.kv_lens = to_device(c.kv_lens);
  dp.q_lens = to_device(c.q_lens);
  if (c.page_size) dp.page_table = to_device(lay.page_table);
  dp.slopes = to_device(hp.slopes);
  dp.doc = to_device(hp.doc);
  dp.tb = to_device(hp.tb);
  dp.te = to_device(hp.te);
  dp.fb = to_device(hp.fb);
  dp.fe = to_device(hp.fe);
  CUDA_CHECK(cudaMalloc(&dp.violations, 4));
  fill_params(c, dp, lay, hp, 0);

  CUDA_CHECK(cudaMemset(dp.o, 0xFF, dp.o_elems * 2));
  CUDA_CHECK(cudaMemset(dp.lse, 0xFF, dp.lse_elems * 4));
  CUDA_CHECK(cudaMemset(dp.violations, 0, 4));
  CheckResult res;
  if (g_fused && dp.p.split_counters != nullptr) {
    // A first launch, then poison again: the second launch checks that the counters were reset to zero.
    const cudaError_t e1 = launch_decode(dp.cfg, c.kind, dt, true, dp.p, dp.vp, 0);
    if (e1 == cudaSuccess) {
      CUDA_CHECK(cudaDeviceSynchronize());
      CUDA_CHECK(cudaMemset(dp.o, 0xFF, dp.o_elems * 2));
      CUDA_CHECK(cudaMemset(dp.lse, 0xFF, dp.lse_elems * 4));
    }
  }
  const cudaError_t lerr = launch_decode(dp.cfg, c.kind, dt, true, dp.p, dp.vp, 0);
  if (lerr != cudaSuccess) {
    res.ok = false;
    res.why = std::string("launch: ") + cudaGetErrorString(lerr);
    dp.release();
    return res;
  }
  CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<uint16_t> o_bits(dp.o_elems);
  std::vector<float> lse(dp.lse_elems);
  int viol = 0;
  CUDA_CHECK(cudaMemcpy(o_bits.data(), dp.o, dp.o_elems * 2, cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(lse.data(), dp.lse, dp.lse_elems * 4, cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(&viol, dp.violations, 4, cudaMemcpyDeviceToHost));
  const int splits = dp.p.num_splits;
  dp.release();

  const RefOut ref = reference(c, hp);
  double err2 = 0, ref2 = 0;
  char buf[256];
  auto fail = [&](const std::string& w) {
    if (res.ok) res.why = w;
    res.ok = false;
  };
  for (int b = 0; b < B; ++b)
    for (int i = 0; i < Q; ++i)
      for (int h = 0; h < H; ++h) {
        const size_t orow = (c.q_head_major ? (((size_t)b * H + h) * Q + i) : (((size_t)b * Q + i) * H + h)) * D;
        const size_t rrow = (((size_t)b * Q + i) * H + h) * D;
        const size_t li = ((size_t)b * H + h) * Q + i;
        if (i >= c.q_lens[b]) {
          bool untouched = std::isnan(lse[li]);
          for (int d = 0; d < D; ++d) untouched &= o_bits[orow + d] == kPoison;
          if (!untouched) {
            std::snprintf(buf, sizeof buf, "row b%d h%d i%d past q_len was written", b, h, i);
            fail(buf);
          }
          continue;
        }
        ++res.rows;
        const double rl = ref.lse[li];
        if (rl == -INFINITY) {
          ++res.neg_inf_rows;
          bool zero = lse[li] == -INFINITY;
          for (int d = 0; d < D; ++d) zero &= from_bits(o_bits[orow + d], dt) == 0.f;
          if (!zero) {
            std::snprintf(buf, sizeof buf, "all-masked row b%d h%d i%d: lse %g, o[0] %g (want -inf, 0)", b, h, i,
                          lse[li], from_bits(o_bits[orow], dt));
            fail(buf);
          }
          continue;
        }
        const double dl = std::fabs((double)lse[li] - rl);
        if (!(dl <= 1e-3 * std::max(1.0, std::fabs(rl)))) {
          std::snprintf(buf, sizeof buf, "lse b%d h%d i%d: %g vs %g", b, h, i, lse[li], rl);
          fail(buf);
        }
        res.max_lse = std::max(res.max_lse, std::isnan(dl) ? 1e30 : dl);
        for (int d = 0; d < D; ++d) {
          const double x = from_bits(o_bits[orow + d], dt), r = ref.o[rrow + d];
          const double e = std::fabs(x - r);
          if (std::isnan(x)) {
            std::snprintf(buf, sizeof buf, "NaN at b%d h%d i%d d%d", b, h, i, d);
            fail(buf);
          }
          res.max_abs = std::max(res.max_abs, std::isnan(e) ? 1e30 : e);
          err2 += e * e;
          ref2 += r * r;
        }
      }
  res.rel_l2 = ref2 > 0 ? std::sqrt(err2 / ref2) : std::sqrt(err2);
  const double tol_abs = dt == DType::BF16 ? 4e-2 : 6e-3;
  const double tol_rel = dt == DType::BF16 ? 1.2e-2 : 2e-3;
  if (res.max_abs > tol_abs || res.rel_l2 > tol_rel) fail("O error above tolerance");
  if (viol != 0) fail("variant called out of range " + std::to_string(viol) + " times");
  std::printf("%-4s %-8s D%-3d H%2d/%-2d q%-2d B%d ps%-3d%s%s tiles=%s splits=%-3d rows=%-5d -inf=%-4d "
              "max|dO|=%.2e relL2=%.2e |dLSE|=%.1e  %s %s%s\n",
              res.ok ? "ok" : "FAIL", kind_name(c.kind), D, H, Hkv, Q, B, c.page_size, c.head_major ? "h" : " ",
              c.q_head_major ? "Q" : " ",
              c.tiles == TileMode::None ? "-" : c.tiles == TileMode::Exact ? "exact" : "narrow", splits, res.rows,
              res.neg_inf_rows, res.max_abs, res.rel_l2, res.max_lse, dt == DType::BF16 ? "bf16" : "fp16",
              c.note.c_str(), res.ok ? "" : ("  <- " + res.why).c_str());
  std::fflush(stdout);
  return res;
}

std::vector<int> fill_lens(int B, int value) { return std::vector<int>(B, value); }

std::vector<Case> check_cases(bool sanitize) {
  std::vector<Case> cs;
  const std::vector<int> mixed = {1, 17, 64, 65, 1000, 4097, 32768, 8191};
  auto base = [&](std::vector<int> kv, int max_q) {
    Case c;
    c.kv_lens = kv;
    c.max_q = max_q;
    c.q_lens.assign(kv.size(), max_q);
    return c;
  };
  if (sanitize) {
    for (int ps : {0, 1, 16}) {
      Case c = base({1, 100, 700}, 1);
      c.H = 8;
      c.Hkv = 2;
      c.page_size = ps;
      c.splits = 3;
      cs.push_back(c);
    }
    Case c = base({5, 300, 129}, 4);
    c.q_lens = {1, 4, 3};
    c.H = 8;
    c.Hkv = 2;
    c.kind = DVariant::Causal;
    c.page_size = 16;
    c.splits = 2;
    c.tiles = TileMode::Exact;
    cs.push_back(c);
    Case d = base({70, 300, 1000}, 16);
    d.H = 16;
    d.Hkv = 2;
    d.kind = DVariant::Doc;
    d.page_size = 64;
    d.splits = 4;
    cs.push_back(d);
    Case e = base({200, 3000}, 1);
    e.H = 4;
    e.Hkv = 4;
    e.D = 64;
    e.splits = 1;
    cs.push_back(e);
    return cs;
  }
  // Page sizes and layouts, mixed lengths 1..32768, GQA 4 (H32/Hkv8 uses a narrower KV for reference speed).
  for (int ps : {0, 1, 16, 64, 256}) {
    Case c = base(mixed, 1);
    c.H = 16;
    c.Hkv = 4;
    c.page_size = ps;
    c.evict_first = ps == 16 || ps == 256;
    c.note = ps == 16 || ps == 256 ? "mixed lengths, evict_first" : "mixed lengths";
    cs.push_back(c);
  }
  {
    Case c = base(mixed, 1);
    c.H = 16;
    c.Hkv = 4;
    c.page_size = 16;
    c.head_major = true;
    c.note = "head-major pages";
    cs.push_back(c);
    c.head_major = false;
    c.page_size = 48;
    c.note = "page size 48 (not a power of two)";
    cs.push_back(c);
    c.page_size = 3;
    c.note = "page size 3";
    cs.push_back(c);
  }
  // Direct path (one split), forced many splits with empty trailing splits for short sequences.
  {
    Case c = base({1, 33, 1000, 5000}, 1);
    c.H = 32;
    c.Hkv = 8;
    c.splits = 1;
    c.note = "one split (no combine)";
    cs.push_back(c);
    c.splits = 64;
    c.page_size = 16;
    c.note = "64 splits (empty splits)";
    cs.push_back(c);
    c.splits = 0;
    c.null_lens = true;
    c.kv_lens = fill_lens(4, 3000);
    c.q_lens = fill_lens(4, 1);
    c.note = "kv_lens/q_lens null";
    cs.push_back(c);
  }
  // GQA 1, 4, 8 with several query lengths (row packing, two m-tiles, row blocks), ragged q_lens.
  for (auto [H, Hkv] : {std::pair{8, 8}, std::pair{32, 8}, std::pair{16, 2}}) {
    for (int mq : {1, 4, 16}) {
      Case c = base({16, 100, 2000, 777}, mq);
      c.H = H;
      c.Hkv = Hkv;
      if (mq > 1) c.q_lens = {std::min(mq, 16), 1, mq, std::max(1, mq / 2)};
      c.kind = DVariant::Causal;
      c.page_size = 16;
      c.tiles = mq == 4 ? TileMode::Exact : TileMode::None;
      c.note = "GQA " + std::to_string(H / Hkv);
      cs.push_back(c);
    }
  }
  {
    Case c = base({3000, 20}, 8);
    c.H = 32;
    c.Hkv = 8;
    c.q_lens = {8, 5};
    c.kind = DVariant::Alibi;
    c.q_head_major = true;
    c.note = "q/o [B,H,S,D]";
    cs.push_back(c);
  }
  // Variants.
  for (DVariant k : {DVariant::Plain, DVariant::Causal, DVariant::Alibi, DVariant::Softcap, DVariant::Window, DVariant::Doc}) {
    for (TileMode tm : {TileMode::None, TileMode::Exact}) {
      if (!has_mask(k) && tm == TileMode::Exact) continue;
      Case c = base({1, 300, 4096, 10000, 65, 2048}, 2);
      c.q_lens = {1, 2, 2, 1, 2, 2};
      c.H = 16;
      c.Hkv = 4;
      c.kind = k;
      c.window = 300;
      c.page_size = 16;
      c.tiles = tm;
      c.note = k == DVariant::Doc ? "doc: all-masked splits and rows" : "";
      cs.push_back(c);
    }
  }
  {
    Case c = base({1, 300, 4096, 10000, 65, 2048}, 1);
    c.H = 16;
    c.Hkv = 4;
    c.kind = DVariant::Plain;
    c.tiles = TileMode::Narrow;
    c.page_size = 64;
    c.note = "narrow tile window (empty windows too)";
    cs.push_back(c);
    c.kind = DVariant::Window;
    c.window = 1024;
    c.tiles = TileMode::Exact;
    c.kv_lens = {32768, 1500, 1024, 40000};
    c.q_lens = fill_lens(4, 1);
    c.note = "window 1024 over long caches";
    cs.push_back(c);
  }
  // fp16, other head dims.
  for (DVariant k : {DVariant::Plain, DVariant::Causal, DVariant::Alibi}) {
    Case c = base({1, 500, 5000, 1234}, 4);
    c.q_lens = {1, 4, 3, 4};
    c.dtype = DType::FP16;
    c.H = 32;
    c.Hkv = 8;
    c.kind = k;
    c.page_size = 16;
    cs.push_back(c);
  }
  for (int D : {64, 256}) {
    for (DVariant k : {DVariant::Plain, DVariant::Alibi}) {
      Case c = base({1, 500, 5000, 1234}, 2);
      c.q_lens = {1, 2, 2, 1};
      c.D = D;
      c.H = 8;
      c.Hkv = 2;
      c.kind = k;
      c.page_size = 32;
      cs.push_back(c);
    }
  }
  {
    Case c = base({1, 500, 5000, 1234}, 8);
    c.D = 64;
    c.H = 16;
    c.Hkv = 4;
    c.kind = DVariant::Softcap;
    c.page_size = 0;
    cs.push_back(c);
  }
  return cs;
}

int run_checks(bool sanitize) {
  int fails = 0, n = 0;
  uint64_t seed = 1234;
  for (const Case& c : check_cases(sanitize)) {
    ++n;
    if (!run_check(c, seed++).ok) ++fails;
  }
  std::printf("checks: %d / %d passed\n", n - fails, n);
  return fails;
}

// ---------------------------------------------------------------------------------------------------
// Benchmarks
// ---------------------------------------------------------------------------------------------------
__global__ void fill_random(uint16_t* p, size_t n, uint64_t seed, int is_bf16) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    // Sum of four uniforms: roughly normal, never zero-heavy.
    float s = 0.f;
    for (int k = 0; k < 4; ++k) s += (float)((x >> (16 * k)) & 0xFFFF) * (1.f / 65536.f);
    const float val = (s - 2.f) * 1.7f;
    if (is_bf16) {
      __nv_bfloat16 b = __float2bfloat16(val);
      p[i] = *reinterpret_cast<uint16_t*>(&b);
    } else {
      __half h = __float2half(val);
      p[i] = *reinterpret_cast<uint16_t*>(&h);
    }
  }
}

struct BenchSpec {
  std::string name;
  DVariant kind = DVariant::Plain;
  int kv_len = 8192;
  int page_size = 0;
  int window = 0;  // > 0: tile window + window mask
  int splits = 0;
  int stages = 0;
  DType dtype = DType::BF16;
  bool evict_first = false;
  bool fused = false;         // fused combine (split counters)
  bool skip_combine = false;  // time the decode kernel alone (results not merged)
};

float* g_flush = nullptr;
constexpr size_t kFlushBytes = 256ull << 20;

double time_ms(const std::function<void()>& launch, int reps) {
  cudaEvent_t e0, e1;
  CUDA_CHECK(cudaEventCreate(&e0));
  CUDA_CHECK(cudaEventCreate(&e1));
  for (int i = 0; i < 3; ++i) launch();
  CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> ts;
  for (int r = 0; r < reps; ++r) {
    CUDA_CHECK(cudaMemsetAsync(g_flush, r & 0xFF, kFlushBytes));  // evict the KV cache from L2
    CUDA_CHECK(cudaEventRecord(e0));
    launch();
    CUDA_CHECK(cudaEventRecord(e1));
    CUDA_CHECK(cudaEventSynchronize(e1));
    float ms;
    CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    ts.push_back(ms);
  }
  CUDA_CHECK(cudaEventDestroy(e0));
  CUDA_CHECK(cudaEventDestroy(e1));
  std::sort(ts.begin(), ts.end());
  return ts[ts.size() / 2];
}

// B8, 32 query heads / 8 KV heads, D128, one query token: the issue's target shape.
void run_bench(const std::string& set, const BenchSpec& one, int reps) {
  const int B = 8, H = 32, Hkv = 8, D = 128;
  const int max_len = 32768;
  CUDA_CHECK(cudaMalloc(&g_flush, kFlushBytes));
  // Device memory copy ceiling.
  if (set != "one") {
    const size_t bytes = 1ull << 30;
    void *a, *b2;
    CUDA_CHECK(cudaMalloc(&a, bytes));
    CUDA_CHECK(cudaMalloc(&b2, bytes));
    CUDA_CHECK(cudaMemset(a, 1, bytes));
    const double ms = time_ms([&] { CUDA_CHECK(cudaMemcpyAsync(b2, a, bytes, cudaMemcpyDeviceToDevice)); }, 10);
    std::printf("device copy 1 GiB: %.3f ms = %.2f TB/s (read + write)\n", ms, 2.0 * bytes / ms / 1e9);
    if (set == "target") std::printf("RESULT copy_TBps %.3f 0 0\n", 2.0 * bytes / ms / 1e9);
    CUDA_CHECK(cudaFree(a));
    CUDA_CHECK(cudaFree(b2));
  }
  // One contiguous cache [B, Hkv, 32768, D] and one paged cache (page size varies) of the same capacity.
  const size_t kv_elems = (size_t)B * Hkv * max_len * D;
  uint16_t *kc, *vc, *kp, *vp2, *q, *o;
  CUDA_CHECK(cudaMalloc(&kc, kv_elems * 2));
  CUDA_CHECK(cudaMalloc(&vc, kv_elems * 2));
  CUDA_CHECK(cudaMalloc(&kp, kv_elems * 2));
  CUDA_CHECK(cudaMalloc(&vp2, kv_elems * 2));
  CUDA_CHECK(cudaMalloc(&q, (size_t)B * H * D * 2));
  CUDA_CHECK(cudaMalloc(&o, (size_t)B * H * D * 2));
  float *lse, *slopes, *ws;
  CUDA_CHECK(cudaMalloc(&lse, (size_t)B * H * 4));
  const long long ws_max = flex_decode_workspace_bytes(B, H, 1, D, kFlexDecodeMaxSplits);
  CUDA_CHECK(cudaMalloc(&ws, ws_max + B * Hkv * 4));
  int* counters = reinterpret_cast<int*>(reinterpret_cast<char*>(ws) + ws_max);
  CUDA_CHECK(cudaMemset(counters, 0, B * Hkv * 4));
  std::vector<float> hs(H);
  for (int h = 0; h < H; ++h) hs[h] = std::pow(2.f, -8.f * (h + 1) / H);
  slopes = to_device(hs);
  fill_random<<<1024, 256>>>(kc, kv_elems, 1, 1);
  fill_random<<<1024, 256>>>(vc, kv_elems, 2, 1);
  fill_random<<<1024, 256>>>(kp, kv_elems, 3, 1);
  fill_random<<<1024, 256>>>(vp2, kv_elems, 4, 1);
  fill_random<<<64, 256>>>(q, (size_t)B * H * D, 5, 1);
  CUDA_CHECK(cudaGetLastError());
  int *kv_lens, *q_lens, *pt, *tb, *te, *fb, *fe, *viol;
  CUDA_CHECK(cudaMalloc(&kv_lens, B * 4));
  CUDA_CHECK(cudaMalloc(&q_lens, B * 4));
  CUDA_CHECK(cudaMalloc(&pt, (size_t)B * max_len * 4));
  CUDA_CHECK(cudaMalloc(&tb, B * 4));
  CUDA_CHECK(cudaMalloc(&te, B * 4));
  CUDA_CHECK(cudaMalloc(&fb, B * 4));
  CUDA_CHECK(cudaMalloc(&fe, B * 4));
  CUDA_CHECK(cudaMalloc(&viol, 4));
  std::vector<int> ones(B, 1);
  CUDA_CHECK(cudaMemcpy(q_lens, ones.data(), B * 4, cudaMemcpyHostToDevice));

  std::vector<BenchSpec> specs;
  if (set == "quick") {
    for (int L : {8192, 32768}) {
      specs.push_back({"decode contiguous", DVariant::Plain, L, 0});
      specs.push_back({"paged ps16", DVariant::Plain, L, 16});
      for (int sp : {4, 8}) {
        BenchSpec s{"contiguous splits " + std::to_string(sp), DVariant::Plain, L, 0};
        s.splits = sp;
        specs.push_back(s);
      }
    }
    specs.push_back({"window 1024 ps16", DVariant::Window, 32768, 16, 1024});
  } else if (set == "opt") {
    // Optimisation sweep: fused combine, decode alone, split counts, stages.
    auto add = [&](BenchSpec s, bool fused, bool skip = false) {
      s.fused = fused;
      s.skip_combine = skip;
      if (fused) s.name += " fused";
      if (skip) s.name += " decode-only";
      specs.push_back(s);
    };
    for (int L : {8192, 32768}) {
      add({"contiguous", DVariant::Plain, L, 0}, false);
      add({"contiguous", DVariant::Plain, L, 0}, true);
      add({"contiguous", DVariant::Plain, L, 0}, false, true);
      add({"ps16", DVariant::Plain, L, 16}, false);
      add({"ps16", DVariant::Plain, L, 16}, true);
      add({"alibi", DVariant::Alibi, L, 0}, false);
      add({"alibi", DVariant::Alibi, L, 0}, true);
      add({"softcap", DVariant::Softcap, L, 0}, true);
      BenchSpec e{"evict_first contiguous", DVariant::Plain, L, 0};
      e.evict_first = true;
      add(e, false);
      add(e, true);
    }
    add({"window 1024 ps16", DVariant::Window, 32768, 16, 1024}, false);
    add({"window 1024 ps16", DVariant::Window, 32768, 16, 1024}, true);
    {
      BenchSpec e{"window 1024 ps16 evict_first", DVariant::Window, 32768, 16, 1024};
      e.evict_first = true;
      add(e, false);
      add(e, true);
    }
    for (int L : {8192, 32768})
      for (int st : {2, 3, 4})
        for (int sp : {2, 3, 4, 5, 6, 8, 12}) {
          BenchSpec s{"st" + std::to_string(st) + " splits " + std::to_string(sp), DVariant::Plain, L, 0};
          s.splits = sp;
          s.stages = st;
          add(s, true);
        }
    add({"contiguous (repeat)", DVariant::Plain, 32768, 0}, false);
    add({"contiguous (repeat)", DVariant::Plain, 32768, 0}, true);
    add({"contiguous (repeat)", DVariant::Plain, 8192, 0}, true);
  } else if (set == "target") {
    // The target cases with the runtime's defaults (fused merge; evict_first for caches up to 512 MB and for the
    // window), then the decode kernel alone and a repeat of the first case; RESULT lines for
    // tools/device/decode.sh, which runs this side by side across the pipeline builds.
    auto add = [&](const std::string& key, DVariant kind, int L, int ps, int window, bool evict_first, bool skip = false) {
      BenchSpec s{key, kind, L, ps, window};
      s.fused = true;
      s.evict_first = evict_first;
      s.skip_combine = skip;
      specs.push_back(s);
    };
    add("32768_contiguous", DVariant::Plain, 32768, 0, 0, false);
    add("32768_ps16", DVariant::Plain, 32768, 16, 0, false);
    add("8192_contiguous", DVariant::Plain, 8192, 0, 0, true);
    add("8192_ps16", DVariant::Plain, 8192, 16, 0, true);
    add("window1024_ps16", DVariant::Window, 32768, 16, 1024, true);
    add("32768_alibi", DVariant::Alibi, 32768, 0, 0, false);
    add("32768_softcap", DVariant::Softcap, 32768, 0, 0, false);
    add("32768_evict_first", DVariant::Plain, 32768, 0, 0, true);
    add("32768_decode_only", DVariant::Plain, 32768, 0, 0, false, true);
    add("32768_contiguous_again", DVariant::Plain, 32768, 0, 0, false);
  } else if (set == "one") {
    BenchSpec s{"one", DVariant::Plain, one.kv_len, one.page_size};
    s.splits = one.splits;
    s.stages = one.stages;
    specs.push_back(s);
  } else {
    for (int L : {8192, 32768}) {
      specs.push_back({"decode contiguous", DVariant::Plain, L, 0});
      specs.push_back({"paged ps16", DVariant::Plain, L, 16});
      specs.push_back({"paged ps1", DVariant::Plain, L, 1});
      specs.push_back({"paged ps64", DVariant::Plain, L, 64});
      specs.push_back({"paged ps256", DVariant::Plain, L, 256});
      specs.push_back({"alibi contiguous", DVariant::Alibi, L, 0});
      specs.push_back({"softcap contiguous", DVariant::Softcap, L, 0});
      specs.push_back({"causal contiguous (mask every tile)", DVariant::Causal, L, 0});
      specs.push_back({"alibi ps16", DVariant::Alibi, L, 16});
      specs.push_back({"softcap ps16", DVariant::Softcap, L, 16});
    }
    specs.push_back({"window 1024 ps16", DVariant::Window, 32768, 16, 1024});
    specs.push_back({"window 1024 contiguous", DVariant::Window, 32768, 0, 1024});
    for (BenchSpec s : {BenchSpec{"evict_first contiguous", DVariant::Plain, 8192, 0},
                        BenchSpec{"evict_first ps16", DVariant::Plain, 8192, 16},
                        BenchSpec{"evict_first contiguous", DVariant::Plain, 32768, 0},
                        BenchSpec{"evict_first ps16", DVariant::Plain, 32768, 16},
                        BenchSpec{"evict_first window 1024 ps16", DVariant::Window, 32768, 16, 1024}}) {
      s.evict_first = true;
      specs.push_back(s);
    }
    specs.push_back({"decode contiguous (repeat)", DVariant::Plain, 8192, 0});
    specs.push_back({"decode contiguous (repeat)", DVariant::Plain, 32768, 0});
    for (int L : {8192, 32768})
      for (int st : {2, 3, 4})
        for (int sp : {2, 4, 8, 16}) {
          BenchSpec s{"sweep stages " + std::to_string(st) + " splits " + std::to_string(sp), DVariant::Plain, L, 0};
          s.splits = sp;
          s.stages = st;
          specs.push_back(s);
        }
    for (int sp : {1, 2, 4, 8}) {
      BenchSpec s{"sweep window splits " + std::to_string(sp), DVariant::Window, 32768, 16, 1024};
      s.splits = sp;
      specs.push_back(s);
    }
  }

  std::printf("\nBenchmarks: B%d H%d/%d D%d one query token, bf16, median of %d cudaEvent-timed launches (L2 flushed "
              "before each), decode + combine\n",
              B, H, Hkv, D, reps);
  std::printf("%-34s %6s %6s %7s %9s %9s\n", "case", "kv", "splits", "ctas/SM", "ms", "TB/s");
  for (const BenchSpec& s : specs) {
    const int L = s.kv_len;
    std::vector<int> lens(B, L);
    CUDA_CHECK(cudaMemcpy(kv_lens, lens.data(), B * 4, cudaMemcpyHostToDevice));
    FlexDecodeParams p{};
    p.q = q;
    p.o = o;
    p.lse = lse;
    p.q_stride_b = (long long)H * D;
    p.q_stride_s = (long long)H * D;
    p.q_stride_h = D;
    p.o_stride_b = p.q_stride_b;
    p.o_stride_s = p.q_stride_s;
    p.o_stride_h = p.q_stride_h;
    p.lse_stride_b = H;
    p.lse_stride_h = 1;
    p.kv_lens = kv_lens;
    p.q_lens = q_lens;
    p.kv_len = L;
    p.batch = B;
    p.heads = H;
    p.kv_heads = Hkv;
    p.max_q_len = 1;
    p.scale = 1.f / std::sqrt((float)D);
    p.row_blocks = 1;
    p.kv_evict_first = s.evict_first ? 1 : 0;
    if (s.page_size == 0) {
      p.k = kc;
      p.v = vc;
      p.kv_stride_page = (long long)Hkv * max_len * D;
      p.kv_stride_row = D;
      p.kv_stride_head = (long long)max_len * D;
      p.page_size = 1;
      p.page_shift = -1;
    } else {
      // Token-major pages [pages, ps, Hkv, D], pages of the batch shuffled over the whole pool.
      const int ps = s.page_size;
      const int per_seq = max_len / ps;
      std::vector<int> perm((size_t)B * per_seq);
      std::iota(perm.begin(), perm.end(), 0);
      std::mt19937 rng(77);
      std::shuffle(perm.begin(), perm.end(), rng);
      CUDA_CHECK(cudaMemcpy(pt, perm.data(), perm.size() * 4, cudaMemcpyHostToDevice));
      p.k = kp;
      p.v = vp2;
      p.page_table = pt;
      p.page_table_stride = per_seq;
      p.page_size = ps;
      p.page_shift = 0;
      while ((1 << p.page_shift) < ps) ++p.page_shift;
      p.kv_stride_page = (long long)ps * Hkv * D;
      p.kv_stride_row = (long long)Hkv * D;
      p.kv_stride_head = D;
    }
    int tiles = (L + kBlockN - 1) / kBlockN;
    long long rows_read = L;
    if (s.window > 0) {
      // Query at L - 1 sees kv in [L - window, L - 1]: tiles from (L - window) / 64; full where entirely inside.
      const int first = (L - s.window) / kBlockN;
      const int full_first = (L - s.window + kBlockN - 1) / kBlockN;
      const int full_last = L / kBlockN;  // tiles ending at or before L
      std::vector<int> vb(B, first), ve(B, tiles), vfb(B, full_first), vfe(B, full_last);
      CUDA_CHECK(cudaMemcpy(tb, vb.data(), B * 4, cudaMemcpyHostToDevice));
      CUDA_CHECK(cudaMemcpy(te, ve.data(), B * 4, cudaMemcpyHostToDevice));
      CUDA_CHECK(cudaMemcpy(fb, vfb.data(), B * 4, cudaMemcpyHostToDevice));
      CUDA_CHECK(cudaMemcpy(fe, vfe.data(), B * 4, cudaMemcpyHostToDevice));
      p.tiles = {tb, te, fb, fe, 1, 0};
      rows_read = std::min<long long>(L, (long long)(tiles - first) * kBlockN);
      tiles -= first;
    }
    const DecodeConfig cfg{D, 1, s.stages};
    const int ctas = decode_ctas_per_sm(cfg, s.kind, s.dtype, false);
    if (ctas == 0) {
      std::printf("%-34s not instantiated\n", s.name.c_str());
      continue;
    }
    p.num_splits = s.splits ? s.splits
                            : flex_decode_num_splits(g_num_sms, flex_decode_bandwidth_ctas(ctas, D, s.stages ? s.stages : decode_default_stages()),
                                                     B * Hkv, tiles);
    p.ws_o = ws;
    p.ws_lse = ws + (size_t)B * H * p.num_splits * D;
    p.split_counters = s.fused ? counters : nullptr;
    g_decode_skip_combine = s.skip_combine;
    DecodeHarnessParams vp{};
    vp.alibi_slopes = slopes;
    vp.window = s.window;
    vp.kv_lens = kv_lens;
    vp.q_lens = q_lens;
    vp.batch = B;
    vp.heads = H;
    vp.violations = viol;
    const cudaError_t err = launch_decode(cfg, s.kind, s.dtype, false, p, vp, 0);
    if (err != cudaSuccess) {
      std::printf("%-34s launch failed: %s\n", s.name.c_str(), cudaGetErrorString(err));
      continue;
    }
    const double ms = time_ms([&] { CUDA_CHECK(launch_decode(cfg, s.kind, s.dtype, false, p, vp, 0)); }, reps);
    const double bytes = (double)B * Hkv * rows_read * D * 2 * 2;
    std::printf("%-34s %6d %6d %7d %9.4f %9.3f\n", s.name.c_str(), L, p.num_splits, ctas, ms, bytes / ms / 1e9);
    if (set == "target") std::printf("RESULT %s %.4f %d %d\n", s.name.c_str(), ms, p.num_splits, ctas);
    std::fflush(stdout);
    g_decode_skip_combine = false;
  }
  for (void* ptr : {(void*)kc, (void*)vc, (void*)kp, (void*)vp2, (void*)q, (void*)o, (void*)lse, (void*)ws,
                    (void*)slopes, (void*)kv_lens, (void*)q_lens, (void*)pt, (void*)tb, (void*)te, (void*)fb,
                    (void*)fe, (void*)viol, (void*)g_flush})
    cudaFree(ptr);
}

}  // namespace

bool g_decode_skip_combine = false;

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "all";
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  g_num_sms = prop.multiProcessorCount;
  if (const char* e = std::getenv("DECODE_FUSED")) g_fused = std::atoi(e) != 0;
  std::printf("device: %s, %d SMs, L2 %d MB\n", prop.name, g_num_sms, prop.l2CacheSize >> 20);
  int fails = 0;
  if (mode == "check" || mode == "all") fails += run_checks(false);
  if (mode == "sanitize") fails += run_checks(true);
  if (mode == "bench" || mode == "all") run_bench("full", BenchSpec{}, 30);
  if (mode == "quick") run_bench("quick", BenchSpec{}, 30);
  if (mode == "opt") run_bench("opt", BenchSpec{}, 30);
  if (mode == "target") run_bench("target", BenchSpec{}, 30);
  if (mode == "one") {  // decode_harness one <kv_len> <splits> <stages> <page_size>: for ncu
    BenchSpec s;
    s.kv_len = argc > 2 ? std::atoi(argv[2]) : 32768;
    s.splits = argc > 3 ? std::atoi(argv[3]) : 0;
    s.stages = argc > 4 ? std::atoi(argv[4]) : 0;
    s.page_size = argc > 5 ? std::atoi(argv[5]) : 0;
    run_bench("one", s, 3);
  }
  return fails ? 1 : 0;
}
