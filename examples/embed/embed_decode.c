/* An inference server's decode loop on flexjit's C API.
 *
 * The spec (spec.json: ALiBi plus a sliding window) is compiled once, a decode plan is made
 * for the batch, and every step appends one token per sequence to a paged KV cache and runs
 * attention for the new query. On a GPU one step is captured in a CUDA graph and the graph is
 * replayed while the sequences grow: the plan reads the KV lengths and the page table from
 * device memory, so nothing in the graph changes. Without a GPU the same calls run on
 * flexjit's CPU backend with host memory. Every step is checked against a float64 reference
 * computed here, so the program is also a test: it exits with status 1 on a mismatch.
 *
 *   embed_decode [SPEC.json]        EMBED_DEVICE=cpu forces the CPU backend
 */
#define _POSIX_C_SOURCE 200809L
#include <flexjit/flexjit.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef EMBED_HAVE_CUDA_H
#include <cuda.h>
#include <dlfcn.h>
#endif

enum {
  B = 2,              /* sequences in the batch */
  H = 4,              /* query heads */
  HKV = 2,            /* KV heads (GQA: two query heads per KV head) */
  D = 64,             /* head dim (the spec's) */
  PAGE = 16,          /* tokens per KV page */
  PAGES_PER_SEQ = 8,  /* page-table width: at most 128 tokens per sequence */
  NUM_PAGES = B * PAGES_PER_SEQ,
  STEPS = 20
};
static const int kPromptLens[B] = {37, 70};
static const float kSlopes[H] = {0.25f, 0.125f, 0.0625f, 0.03125f};
static const int kWindow = 48;
static const double kTolerance = 2e-2; /* bf16 inputs and output */

/* ---- bf16 and random numbers ------------------------------------------------------------ */

static uint16_t to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

static float from_bf16(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static float uniform(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return (float)((rng_state >> 11) * (1.0 / 9007199254740992.0));
}
/* Roughly normal: the sum of four uniforms, centred and scaled to unit variance. */
static float normal(void) { return (uniform() + uniform() + uniform() + uniform() - 2.0f) * 1.7320508f; }

static void fill_bf16(uint16_t* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = to_bf16(normal());
}

/* ---- Memory: host memory for the CPU backend, device memory through the CUDA driver ----- */

typedef struct {
  int device; /* -2: the CPU backend; else a CUDA ordinal */
  void* stream;
} Backend;

#ifdef EMBED_HAVE_CUDA_H
/* The driver is loaded with dlopen, as flexjit loads it, so the program runs without one. */
#define EMBED_CUDA_FUNCTIONS(X)                                                                  \
  X(cuInit) X(cuDeviceGet) X(cuDevicePrimaryCtxRetain) X(cuCtxSetCurrent) X(cuMemAlloc_v2)       \
  X(cuMemFree_v2) X(cuMemcpyHtoD_v2) X(cuMemcpyDtoH_v2) X(cuStreamCreate) X(cuStreamDestroy_v2)  \
  X(cuStreamSynchronize) X(cuStreamBeginCapture_v2) X(cuStreamEndCapture)                        \
  X(cuGraphInstantiateWithFlags) X(cuGraphLaunch) X(cuGraphExecDestroy) X(cuGraphDestroy)
static struct {
#define EMBED_CUDA_MEMBER(f) __typeof__(f)* f;
  EMBED_CUDA_FUNCTIONS(EMBED_CUDA_MEMBER)
#undef EMBED_CUDA_MEMBER
} cu;

static void cu_check(CUresult r, const char* what) {
  if (r != CUDA_SUCCESS) {
    fprintf(stderr, "embed_decode: %s failed (CUresult %d)\n", what, (int)r);
    exit(2);
  }
}

/* Opens device 0 in its primary context (the one flexjit uses). Returns 0 when impossible. */
static int cuda_open(Backend* be) {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) return 0;
#define EMBED_CUDA_LOAD(f)                        \
  *(void**)(&cu.f) = dlsym(lib, #f);             \
  if (!cu.f) return 0;
  EMBED_CUDA_FUNCTIONS(EMBED_CUDA_LOAD)
#undef EMBED_CUDA_LOAD
  CUdevice dev;
  CUcontext ctx;
  CUstream stream;
  if (cu.cuInit(0) != CUDA_SUCCESS || cu.cuDeviceGet(&dev, 0) != CUDA_SUCCESS) return 0;
  cu_check(cu.cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
  cu_check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
  /* A blocking stream: its work waits for the copies the program makes on the legacy stream. */
  cu_check(cu.cuStreamCreate(&stream, CU_STREAM_DEFAULT), "cuStreamCreate");
  be->device = 0;
  be->stream = stream;
  return 1;
}
#endif

static void* mem_alloc(const Backend* be, size_t bytes) {
#ifdef EMBED_HAVE_CUDA_H
  if (be->device >= 0) {
    CUdeviceptr p;
    cu_check(cu.cuMemAlloc_v2(&p, bytes), "cuMemAlloc");
    return (void*)(uintptr_t)p;
  }
#endif
  (void)be;
  void* p = calloc(1, bytes);
  if (!p) {
    fprintf(stderr, "embed_decode: out of memory\n");
    exit(2);
  }
  return p;
}

static void mem_free(const Backend* be, void* p) {
#ifdef EMBED_HAVE_CUDA_H
  if (be->device >= 0) {
    cu.cuMemFree_v2((CUdeviceptr)(uintptr_t)p);
    return;
  }
#endif
  (void)be;
  free(p);
}

static void upload(const Backend* be, void* dst, const void* src, size_t bytes) {
#ifdef EMBED_HAVE_CUDA_H
  if (be->device >= 0) {
    cu_check(cu.cuMemcpyHtoD_v2((CUdeviceptr)(uintptr_t)dst, src, bytes), "cuMemcpyHtoD");
    return;
  }
#endif
  (void)be;
  memcpy(dst, src, bytes);
}

static void download(const Backend* be, void* dst, const void* src, size_t bytes) {
#ifdef EMBED_HAVE_CUDA_H
  if (be->device >= 0) {
    cu_check(cu.cuMemcpyDtoH_v2(dst, (CUdeviceptr)(uintptr_t)src, bytes), "cuMemcpyDtoH");
    return;
  }
#endif
  (void)be;
  memcpy(dst, src, bytes);
}

/* ---- The paged KV cache (a host mirror of the device cache) ----------------------------- */

/* [NUM_PAGES, PAGE, HKV, D]: one token's K (or V) for every KV head is HKV * D contiguous values. */
static size_t slot_offset(const int32_t* page_table, int b, int pos) {
  const int page = page_table[b * PAGES_PER_SEQ + pos / PAGE];
  return ((size_t)page * PAGE + (size_t)(pos % PAGE)) * HKV * D;
}

/* The float64 reference of one query row: softmax(scale q.k + slope (kv - q)) over the window. */
static double check_row(const uint16_t* q, const uint16_t* k_cache, const uint16_t* v_cache, const int32_t* page_table, int b, int h,
                        int kv_len, const uint16_t* o) {
  const int kvh = h / (H / HKV), qpos = kv_len - 1;
  const double scale = 1.0 / sqrt((double)D);
  double scores[PAGE * PAGES_PER_SEQ], acc[D], max = -INFINITY, sum = 0;
  for (int kv = 0; kv < kv_len; ++kv) {
    scores[kv] = -INFINITY;
    if (qpos - kv >= kWindow) continue;
    const uint16_t* k = k_cache + slot_offset(page_table, b, kv) + (size_t)kvh * D;
    double dot = 0;
    for (int d = 0; d < D; ++d) dot += (double)from_bf16(q[d]) * from_bf16(k[d]);
    scores[kv] = scale * dot + (double)kSlopes[h] * (kv - qpos);
    if (scores[kv] > max) max = scores[kv];
  }
  memset(acc, 0, sizeof acc);
  for (int kv = 0; kv < kv_len; ++kv) {
    if (scores[kv] == -INFINITY) continue;
    const double p = exp(scores[kv] - max);
    const uint16_t* v = v_cache + slot_offset(page_table, b, kv) + (size_t)kvh * D;
    sum += p;
    for (int d = 0; d < D; ++d) acc[d] += p * from_bf16(v[d]);
  }
  double worst = 0;
  for (int d = 0; d < D; ++d) {
    const double err = fabs(acc[d] / sum - from_bf16(o[d]));
    if (!(err <= worst)) worst = err; /* NaN propagates */
  }
  return worst;
}

static char* read_file(const char* path) {
  FILE* f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char* text = malloc((size_t)n + 1);
  if (text && fread(text, 1, (size_t)n, f) != (size_t)n) n = 0;
  if (text) text[n] = '\0';
  fclose(f);
  return text;
}

static int fail(const char* what) {
  fprintf(stderr, "embed_decode: %s: %s\n", what, flexjit_last_error());
  return 1;
}

int main(int argc, char** argv) {
  /* The kernel cache the build filled with `flexjit compile` (unless the caller chose one). */
  setenv("FLEXJIT_CACHE_DIR", EMBED_CACHE_DIR, 0);
  const char* spec_path = argc > 1 ? argv[1] : EMBED_SPEC_FILE;
  char* spec = read_file(spec_path);
  if (!spec) {
    fprintf(stderr, "embed_decode: spec file '%s' not found\n", spec_path);
    return 1;
  }

  Backend be = {-2, NULL};
  const char* forced = getenv("EMBED_DEVICE");
  const int want_gpu = !(forced && strcmp(forced, "cpu") == 0);
#ifdef EMBED_HAVE_CUDA_H
  if (want_gpu && flexjit_device_count() > 0 && !cuda_open(&be)) be.device = -2;
#else
  (void)want_gpu;
#endif
  if (be.device == -2) {
#ifdef EMBED_HAVE_CPU_BACKEND
    if (flexjit_enable_cpu_backend() != FLEXJIT_OK) return fail("enabling the CPU backend");
#else
    fprintf(stderr, "embed_decode: no CUDA device, and this flexjit has no CPU backend\n");
    return 1;
#endif
  }

  /* Compile once: parse, check and optimize now; the kernels come from the disk cache. */
  flexjit_runtime* rt = NULL;
  flexjit_kernel* kernel = NULL;
  if (flexjit_runtime_create(&rt) != FLEXJIT_OK) return fail("flexjit_runtime_create");
  if (flexjit_compile(rt, spec, &kernel) != FLEXJIT_OK) {
    fprintf(stderr, "embed_decode: %s\n%s\n", flexjit_last_error(), flexjit_last_diagnostics_json());
    return 1;
  }
  free(spec);

  /* Host state and its device copies. */
  const size_t cache_elems = (size_t)NUM_PAGES * PAGE * HKV * D, q_elems = (size_t)B * H * D;
  uint16_t* k_host = malloc(cache_elems * 2);
  uint16_t* v_host = malloc(cache_elems * 2);
  uint16_t* q_host = malloc(q_elems * 2);
  uint16_t* o_host = malloc(q_elems * 2);
  int32_t page_table[B * PAGES_PER_SEQ], kv_lens[B];
  if (!k_host || !v_host || !q_host || !o_host) return 2;
  memset(k_host, 0, cache_elems * 2);
  memset(v_host, 0, cache_elems * 2);
  /* Sequences own interleaved pages, as an allocator serving many requests would hand them out. */
  for (int b = 0; b < B; ++b)
    for (int j = 0; j < PAGES_PER_SEQ; ++j) page_table[b * PAGES_PER_SEQ + j] = j * B + b;
  /* The prompts' K and V, as a prefill would have left them. */
  for (int b = 0; b < B; ++b) {
    kv_lens[b] = kPromptLens[b];
    for (int pos = 0; pos < kv_lens[b]; ++pos) {
      fill_bf16(k_host + slot_offset(page_table, b, pos), (size_t)HKV * D);
      fill_bf16(v_host + slot_offset(page_table, b, pos), (size_t)HKV * D);
    }
  }
  void* k_dev = mem_alloc(&be, cache_elems * 2);
  void* v_dev = mem_alloc(&be, cache_elems * 2);
  void* q_dev = mem_alloc(&be, q_elems * 2);
  void* o_dev = mem_alloc(&be, q_elems * 2);
  void* table_dev = mem_alloc(&be, sizeof page_table);
  void* lens_dev = mem_alloc(&be, sizeof kv_lens);
  void* slope_dev = mem_alloc(&be, sizeof kSlopes);
  upload(&be, k_dev, k_host, cache_elems * 2);
  upload(&be, v_dev, v_host, cache_elems * 2);
  upload(&be, table_dev, page_table, sizeof page_table);
  upload(&be, slope_dev, kSlopes, sizeof kSlopes);

  /* One plan for the batch shape; its runs never allocate or synchronise. */
  flexjit_decode_plan* plan = NULL;
  if (flexjit_plan_decode(kernel, be.device, B, H, HKV, 1, PAGE * PAGES_PER_SEQ, PAGE, 0, &plan) != FLEXJIT_OK)
    return fail("flexjit_plan_decode");
  flexjit_args* args = NULL;
  const int64_t cache_shape[4] = {NUM_PAGES, PAGE, HKV, D}, slope_shape[1] = {H};
  if (flexjit_args_create(&args) != FLEXJIT_OK ||
      flexjit_args_set_decode(args, q_dev, k_dev, v_dev, o_dev, FLEXJIT_BF16, B, H, 1, D, cache_shape, table_dev, PAGES_PER_SEQ, lens_dev,
                              NULL) != FLEXJIT_OK ||
      flexjit_args_set_buffer(args, "slope", slope_dev, FLEXJIT_F32, 1, slope_shape, NULL) != FLEXJIT_OK ||
      flexjit_args_set_param(args, "window", kWindow) != FLEXJIT_OK || flexjit_args_set_stream(args, be.stream, be.device) != FLEXJIT_OK)
    return fail("setting the decode arguments");

#ifdef EMBED_HAVE_CUDA_H
  CUgraph graph = NULL;
  CUgraphExec graph_exec = NULL;
#endif
  double worst = 0;
  for (int step = 0; step < STEPS; ++step) {
    /* The model produced one token per sequence: append its K and V, then its query. */
    for (int b = 0; b < B; ++b) {
      const size_t slot = slot_offset(page_table, b, kv_lens[b]);
      fill_bf16(k_host + slot, (size_t)HKV * D);
      fill_bf16(v_host + slot, (size_t)HKV * D);
      upload(&be, (uint16_t*)k_dev + slot, k_host + slot, (size_t)HKV * D * 2);
      upload(&be, (uint16_t*)v_dev + slot, v_host + slot, (size_t)HKV * D * 2);
      kv_lens[b] += 1;
    }
    fill_bf16(q_host, q_elems);
    upload(&be, q_dev, q_host, q_elems * 2);
    upload(&be, lens_dev, kv_lens, sizeof kv_lens);

#ifdef EMBED_HAVE_CUDA_H
    if (be.device >= 0) {
      CUstream stream = (CUstream)be.stream;
      if (step == 0) {
        /* The first run loads the kernels (from the cache the build filled), outside the capture. */
        if (flexjit_decode(kernel, plan, args) != FLEXJIT_OK) return fail("flexjit_decode");
        cu_check(cu.cuStreamBeginCapture_v2(stream, CU_STREAM_CAPTURE_MODE_GLOBAL), "cuStreamBeginCapture");
        if (flexjit_decode(kernel, plan, args) != FLEXJIT_OK) return fail("flexjit_decode (captured)");
        cu_check(cu.cuStreamEndCapture(stream, &graph), "cuStreamEndCapture");
        cu_check(cu.cuGraphInstantiateWithFlags(&graph_exec, graph, 0), "cuGraphInstantiate");
      } else {
        cu_check(cu.cuGraphLaunch(graph_exec, stream), "cuGraphLaunch");
      }
      cu_check(cu.cuStreamSynchronize(stream), "cuStreamSynchronize");
    } else
#endif
    {
      if (flexjit_decode(kernel, plan, args) != FLEXJIT_OK) return fail("flexjit_decode");
    }
    download(&be, o_host, o_dev, q_elems * 2);

    for (int b = 0; b < B; ++b)
      for (int h = 0; h < H; ++h) {
        const double err = check_row(q_host + ((size_t)b * H + h) * D, k_host, v_host, page_table, b, h, kv_lens[b],
                                     o_host + ((size_t)b * H + h) * D);
        if (!(err <= worst)) worst = err;
      }
  }
  if (be.device >= 0 && flexjit_check_errors(kernel, be.device, be.stream) != FLEXJIT_OK) return fail("flexjit_check_errors");

  const int ok = worst <= kTolerance;
  printf("embed_decode: %d decode steps on %s%s, %d decode plan split(s); sequences grew %d -> %d and %d -> %d tokens; "
         "max |O - float64 reference| = %.2e: %s\n",
         STEPS, be.device >= 0 ? "cuda:0" : "the CPU backend", be.device >= 0 ? " (one CUDA graph, replayed)" : "",
         flexjit_decode_plan_num_splits(plan), kPromptLens[0], kv_lens[0], kPromptLens[1], kv_lens[1], worst, ok ? "OK" : "MISMATCH");

#ifdef EMBED_HAVE_CUDA_H
  if (graph_exec) cu.cuGraphExecDestroy(graph_exec);
  if (graph) cu.cuGraphDestroy(graph);
  if (be.device >= 0) cu.cuStreamDestroy_v2((CUstream)be.stream);
#endif
  void* device_memory[] = {k_dev, v_dev, q_dev, o_dev, table_dev, lens_dev, slope_dev};
  for (size_t i = 0; i < sizeof device_memory / sizeof device_memory[0]; ++i) mem_free(&be, device_memory[i]);
  free(k_host);
  free(v_host);
  free(q_host);
  free(o_host);
  flexjit_args_destroy(args);
  flexjit_decode_plan_destroy(plan);
  flexjit_kernel_destroy(kernel);
  flexjit_runtime_destroy(rt);
  return ok ? 0 : 1;
}
