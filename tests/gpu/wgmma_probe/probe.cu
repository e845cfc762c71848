// Checks every wgmma operand layout the Hopper attention kernels use against a CPU reference, one warpgroup
// per case: K-major A and B from swizzled tiles (S = Q K^T), A from registers with an MN-major B (O = P V),
// MN-major A and B with a column offset (the backward's dQ = dS K split over warpgroups). Fresh random
// inputs, output poisoned with NaN, every element compared.
//   nvcc -std=c++17 -O2 -gencode arch=compute_90a,code=sm_90a -I kernels_templates probe.cu -o wgmma_probe
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "flex_wgmma.cuh"

#define CHECK(x)                                                                                   \
  do {                                                                                             \
    cudaError_t e_ = (x);                                                                          \
    if (e_ != cudaSuccess) {                                                                       \
      std::printf("CUDA error %s at line %d\n", cudaGetErrorString(e_), __LINE__);                  \
      std::exit(2);                                                                                \
    }                                                                                              \
  } while (0)

using bf16 = __nv_bfloat16;

// Copies a row-major [rows][cols] global matrix into a swizzled tile with plain 16-byte stores.
template <class Tile>
__device__ void fill_tile(unsigned char* smem, const bf16* g, int rows, int cols) {
  for (int i = threadIdx.x; i < rows * cols / 8; i += blockDim.x) {
    const int r = i / (cols / 8), c = i % (cols / 8);
    *reinterpret_cast<uint4*>(smem + Tile::chunk_offset(r, c)) = *reinterpret_cast<const uint4*>(g + r * cols + c * 8);
  }
}

template <int N>
__device__ void store_acc(float* out, const float (&d)[N / 2], int ldo) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int i = 0; i < N / 8; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) out[(warp * 16 + g + (e / 2) * 8) * ldo + i * 8 + 2 * t + (e % 2)] = d[4 * i + e];
}

// Case 1: C[64][N] = A[64][K] * B[N][K]^T, both K-major.
template <int K, int N, int kSw>
__global__ void k_ss_kmajor(const bf16* a, const bf16* b, float* c) {
  using TA = flex::SwizzledTile<64, K, kSw>;
  using TB = flex::SwizzledTile<N, K, kSw>;
  extern __shared__ __align__(1024) unsigned char smem[];
  fill_tile<TA>(smem, a, 64, K);
  fill_tile<TB>(smem + TA::kBytes, b, N, K);
  flex::fence_proxy_async();
  __syncthreads();
  const unsigned base = (unsigned)__cvta_generic_to_shared(smem);
  float d[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; ++i) d[i] = 0.f;
  flex::wgmma_fence();
#pragma unroll
  for (int k = 0; k < K / 16; ++k)
    flex::Wgmma<N>::template ss<bf16, 0, 0>(d, flex::desc_k_major<TA>(base, 0, k * 16),
                                            flex::desc_k_major<TB>(base + TA::kBytes, 0, k * 16), 1);
  flex::wgmma_commit();
  flex::wgmma_wait<0>();
  flex::fence_operands(d);
  store_acc<N>(c, d, N);
}

// Case 2: C[64][N] = A[64][K] * B[K][N], A from registers (mma.sync A-fragment layout), B MN-major.
template <int K, int N, int kSw>
__global__ void k_rs_mnmajor(const bf16* a, const bf16* b, float* c) {
  using TB = flex::SwizzledTile<K, N, kSw>;
  extern __shared__ __align__(1024) unsigned char smem[];
  fill_tile<TB>(smem, b, K, N);
  flex::fence_proxy_async();
  __syncthreads();
  const unsigned base = (unsigned)__cvta_generic_to_shared(smem);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  float d[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; ++i) d[i] = 0.f;
#pragma unroll
  for (int k = 0; k < K / 16; ++k) {
    auto pk = [&](int r, int col) {
      const bf16* p = a + (warp * 16 + r) * K + k * 16 + col;
      unsigned lo = *reinterpret_cast<const unsigned short*>(p), hi = *reinterpret_cast<const unsigned short*>(p + 1);
      return lo | (hi << 16);
    };
    unsigned fr[4] = {pk(g, 2 * t), pk(g + 8, 2 * t), pk(g, 2 * t + 8), pk(g + 8, 2 * t + 8)};
    flex::wgmma_fence();
    flex::Wgmma<N>::template rs<bf16, 1>(d, fr, flex::desc_mn_major<TB>(base, k * 16, 0), 1);
    flex::wgmma_commit();
  }
  flex::wgmma_wait<0>();
  flex::fence_operands(d);
  store_acc<N>(c, d, N);
}

// Case 3: C[64][N] = A[64][K] * B[K][col0 : col0 + N], A stored transposed (At[K][64], MN-major), B MN-major
// [K][NT] read from column col0.
template <int K, int N, int NT, int kSw, int kCol0>
__global__ void k_ss_mnmajor(const bf16* at, const bf16* b, float* c) {
  using TA = flex::SwizzledTile<K, 64, kSw>;
  using TB = flex::SwizzledTile<K, NT, kSw>;
  extern __shared__ __align__(1024) unsigned char smem[];
  fill_tile<TA>(smem, at, K, 64);
  fill_tile<TB>(smem + TA::kBytes, b, K, NT);
  flex::fence_proxy_async();
  __syncthreads();
  const unsigned base = (unsigned)__cvta_generic_to_shared(smem);
  float d[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; ++i) d[i] = 0.f;
  flex::wgmma_fence();
#pragma unroll
  for (int k = 0; k < K / 16; ++k)
    flex::Wgmma<N>::template ss<bf16, 1, 1>(d, flex::desc_mn_major<TA>(base, k * 16, 0),
                                            flex::desc_mn_major<TB>(base + TA::kBytes, k * 16, kCol0), 1);
  flex::wgmma_commit();
  flex::wgmma_wait<0>();
  flex::fence_operands(d);
  store_acc<N>(c, d, N);
}

static std::mt19937 rng(1234);

std::vector<bf16> random_bf16(int n, std::vector<float>& f) {
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<bf16> v(n);
  f.resize(n);
  for (int i = 0; i < n; ++i) {
    v[i] = __float2bfloat16(nd(rng));
    f[i] = __bfloat162float(v[i]);
  }
  return v;
}

template <class T>
T* to_device(const std::vector<T>& h) {
  T* d;
  CHECK(cudaMalloc(&d, h.size() * sizeof(T)));
  CHECK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

int failures = 0;

// ref(m, n) given; compares all 64 x N outputs.
template <class Ref>
void compare(const char* name, const float* dc, int n, Ref ref) {
  std::vector<float> c(64 * n);
  CHECK(cudaMemcpy(c.data(), dc, c.size() * 4, cudaMemcpyDeviceToHost));
  double max_err = 0, max_ref = 0;
  int bad = 0;
  for (int m = 0; m < 64; ++m)
    for (int j = 0; j < n; ++j) {
      const double r = ref(m, j), x = c[m * n + j];
      const double err = std::fabs(x - r);
      if (!(err <= 1e-3 * (1 + std::fabs(r)))) ++bad;
      max_err = std::fmax(max_err, std::isnan(x) ? INFINITY : err);
      max_ref = std::fmax(max_ref, std::fabs(r));
    }
  std::printf("%-40s %s  max|err| %.3g (max|ref| %.3g, %d bad)\n", name, bad ? "FAIL" : "ok  ", max_err, max_ref, bad);
  failures += bad ? 1 : 0;
}

float* poisoned_out(int n) {
  float* dc;
  CHECK(cudaMalloc(&dc, 64 * n * 4));
  CHECK(cudaMemset(dc, 0xff, 64 * n * 4));  // NaN
  return dc;
}

template <int K, int N, int kSw>
void run_ss_kmajor() {
  std::vector<float> af, bfv;
  auto a = random_bf16(64 * K, af), b = random_bf16(N * K, bfv);
  bf16 *da = to_device(a), *db = to_device(b);
  float* dc = poisoned_out(N);
  const int smem = (64 + N) * K * 2;
  CHECK(cudaFuncSetAttribute(k_ss_kmajor<K, N, kSw>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  k_ss_kmajor<K, N, kSw><<<1, 128, smem>>>(da, db, dc);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  char name[96];
  std::snprintf(name, sizeof name, "SS K-major  K=%d N=%d swizzle %d", K, N, kSw);
  compare(name, dc, N, [&](int m, int j) {
    double s = 0;
    for (int k = 0; k < K; ++k) s += (double)af[m * K + k] * bfv[j * K + k];
    return s;
  });
  cudaFree(da), cudaFree(db), cudaFree(dc);
}

template <int K, int N, int kSw>
void run_rs_mnmajor() {
  std::vector<float> af, bfv;
  auto a = random_bf16(64 * K, af), b = random_bf16(K * N, bfv);
  bf16 *da = to_device(a), *db = to_device(b);
  float* dc = poisoned_out(N);
  const int smem = K * N * 2;
  CHECK(cudaFuncSetAttribute(k_rs_mnmajor<K, N, kSw>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  k_rs_mnmajor<K, N, kSw><<<1, 128, smem>>>(da, db, dc);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  char name[96];
  std::snprintf(name, sizeof name, "RS MN-major B  K=%d N=%d swizzle %d", K, N, kSw);
  compare(name, dc, N, [&](int m, int j) {
    double s = 0;
    for (int k = 0; k < K; ++k) s += (double)af[m * K + k] * bfv[k * N + j];
    return s;
  });
  cudaFree(da), cudaFree(db), cudaFree(dc);
}

template <int K, int N, int NT, int kSw, int kCol0>
void run_ss_mnmajor() {
  std::vector<float> af, bfv;
  auto at = random_bf16(K * 64, af), b = random_bf16(K * NT, bfv);
  bf16 *da = to_device(at), *db = to_device(b);
  float* dc = poisoned_out(N);
  const int smem = K * 64 * 2 + K * NT * 2;
  CHECK(cudaFuncSetAttribute(k_ss_mnmajor<K, N, NT, kSw, kCol0>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  k_ss_mnmajor<K, N, NT, kSw, kCol0><<<1, 128, smem>>>(da, db, dc);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  char name[96];
  std::snprintf(name, sizeof name, "SS MN-major A,B  K=%d N=%d of %d from %d, swizzle %d", K, N, NT, kCol0, kSw);
  compare(name, dc, N, [&](int m, int j) {
    double s = 0;
    for (int k = 0; k < K; ++k) s += (double)af[k * 64 + m] * bfv[k * NT + kCol0 + j];
    return s;
  });
  cudaFree(da), cudaFree(db), cudaFree(dc);
}

int main() {
  // S = Q K^T tiles (N = 64 KV columns) for every head dim and swizzle the kernels pick.
  run_ss_kmajor<32, 64, 64>();
  run_ss_kmajor<32, 64, 32>();
  run_ss_kmajor<64, 64, 128>();
  run_ss_kmajor<64, 64, 64>();
  run_ss_kmajor<80, 64, 32>();
  run_ss_kmajor<96, 64, 64>();
  run_ss_kmajor<128, 64, 128>();
  run_ss_kmajor<128, 128, 128>();
  run_ss_kmajor<256, 64, 128>();
  // O = P V (K = 64 KV rows, N = head dim).
  run_rs_mnmajor<64, 32, 64>();
  run_rs_mnmajor<64, 32, 32>();
  run_rs_mnmajor<64, 64, 128>();
  run_rs_mnmajor<64, 64, 64>();
  run_rs_mnmajor<64, 80, 32>();
  run_rs_mnmajor<64, 96, 64>();
  run_rs_mnmajor<64, 128, 128>();
  run_rs_mnmajor<64, 256, 128>();
  // dQ halves: K = 128 KV rows, A = dS^T stored [kv][q], B = K tile from a region boundary.
  run_ss_mnmajor<128, 64, 128, 128, 0>();
  run_ss_mnmajor<128, 64, 128, 128, 64>();
  run_ss_mnmajor<128, 48, 80, 32, 0>();
  run_ss_mnmajor<128, 32, 80, 32, 48>();
  run_ss_mnmajor<128, 64, 96, 64, 0>();
  run_ss_mnmajor<128, 32, 96, 64, 64>();
  run_ss_mnmajor<128, 32, 64, 64, 32>();
  run_ss_mnmajor<128, 16, 32, 32, 16>();
  std::printf("%s: %d failing case(s)\n", failures ? "FAIL" : "PASS", failures);
  return failures ? 1 : 0;
}
