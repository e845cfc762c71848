/* The C API from C: status codes and error text for bad specs and bad launches, and a
 * forward launch on the CPU backend when this build has it (a GPU launch when a device is
 * present). Exits non-zero on failure; prints "N passed, N failed". */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/capi/flexjit.h"

static int passed = 0, failed = 0;
#define CHECK(cond)                                                      \
  do {                                                                   \
    if (cond) {                                                          \
      ++passed;                                                          \
    } else {                                                             \
      ++failed;                                                          \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
    }                                                                    \
  } while (0)

int main(void) {
#ifdef FLEXJIT_HAVE_CPU_BACKEND
  CHECK(flexjit_enable_cpu_backend() == FLEXJIT_OK);
#endif
  flexjit_runtime* rt = NULL;
  CHECK(flexjit_runtime_create(&rt) == FLEXJIT_OK);
  CHECK(flexjit_runtime_create(NULL) == FLEXJIT_ERROR_INVALID_ARGUMENT);

  /* A spec with an unknown name: a compile error with positioned diagnostics. */
  flexjit_kernel* bad = NULL;
  CHECK(flexjit_compile(rt, "{\"mask_mod\": \"q >= kvv\", \"head_dim\": 64}", &bad) == FLEXJIT_ERROR_COMPILE);
  CHECK(bad == NULL);
  CHECK(strstr(flexjit_last_error(), "E0201") != NULL);
  CHECK(strstr(flexjit_last_diagnostics_json(), "\"col\": 6") != NULL);
  CHECK(flexjit_compile(rt, "not json", &bad) == FLEXJIT_ERROR_COMPILE);

  flexjit_kernel* k = NULL;
  CHECK(flexjit_compile(rt, "{\"mask_mod\": \"q >= kv\", \"score_mod\": \"score + bias[h]\", \"buffers\": [\"bias: f32[H]\"], "
                            "\"dtype\": \"f32\", \"head_dim\": 16}",
                        &k) == FLEXJIT_OK);
  CHECK(k != NULL);

  /* A launch on host memory on the CPU backend, or an error saying it is absent. */
  enum { B = 1, H = 2, S = 5, D = 16 };
  float* q = malloc(sizeof(float) * B * H * S * D);
  float* kk = malloc(sizeof(float) * B * H * S * D);
  float* v = malloc(sizeof(float) * B * H * S * D);
  float* o = malloc(sizeof(float) * B * H * S * D);
  float bias[H] = {0.5f, -0.25f};
  for (int i = 0; i < B * H * S * D; ++i) {
    q[i] = (float)((i * 37) % 11) / 11.0f - 0.5f;
    kk[i] = (float)((i * 17) % 13) / 13.0f - 0.5f;
    v[i] = (float)((i * 7) % 5) / 5.0f;
    o[i] = NAN;
  }
  flexjit_args* a = NULL;
  CHECK(flexjit_args_create(&a) == FLEXJIT_OK);
  CHECK(flexjit_args_set_qkvo(a, q, kk, v, o, FLEXJIT_F32, B, H, H, S, S, D) == FLEXJIT_OK);
  int64_t bias_shape[1] = {H};
  CHECK(flexjit_args_set_buffer(a, "bias", bias, FLEXJIT_F32, 1, bias_shape, NULL) == FLEXJIT_OK);
  CHECK(flexjit_args_set_stream(a, NULL, -2) == FLEXJIT_OK);
  flexjit_status st = flexjit_forward(k, a);
  if (st == FLEXJIT_OK) {
    /* Row 0 attends only to kv 0: O[0,0,0,:] == V[0,0,0,:]. */
    int ok = 1;
    for (int d = 0; d < D; ++d) ok &= fabsf(o[d] - v[d]) < 1e-5f;
    CHECK(ok);
    int finite = 1;
    for (int i = 0; i < B * H * S * D; ++i) finite &= !isnan(o[i]);
    CHECK(finite);
  } else {
    CHECK(strstr(flexjit_last_error(), "CPU backend") != NULL);
  }

  /* A bad launch: a buffer the spec does not declare. */
  CHECK(flexjit_args_set_buffer(a, "bais", bias, FLEXJIT_F32, 1, bias_shape, NULL) == FLEXJIT_OK);
  CHECK(flexjit_forward(k, a) == FLEXJIT_ERROR_USER);
  CHECK(strstr(flexjit_last_error(), "did you mean `bias`") != NULL);
  CHECK(flexjit_forward(NULL, a) == FLEXJIT_ERROR_INVALID_ARGUMENT);

  flexjit_args_destroy(a);
  flexjit_kernel_destroy(k);
  flexjit_runtime_destroy(rt);
  free(q);
  free(kk);
  free(v);
  free(o);
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
