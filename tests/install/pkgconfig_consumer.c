/* A one-file C program built against an installed flexjit with nothing but
 * `pkg-config --cflags --libs flexjit_cpu`: causal attention on the CPU backend, compared
 * with a float64 reference computed here. Exit status 0 when they agree. */
#include <flexjit/flexjit.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

enum { B = 1, H = 2, S = 19, D = 16 };

int main(void) {
  static float q[B * H * S * D], k[B * H * S * D], v[B * H * S * D], o[B * H * S * D];
  unsigned seed = 12345;
  for (int i = 0; i < B * H * S * D; ++i) {
    seed = seed * 1664525u + 1013904223u;
    q[i] = (float)((seed >> 8) & 0xffff) / 32768.0f - 1.0f;
    k[i] = (float)((seed >> 4) & 0xffff) / 32768.0f - 1.0f;
    v[i] = (float)(seed & 0xffff) / 32768.0f - 1.0f;
  }
  flexjit_runtime* rt;
  flexjit_kernel* kernel;
  flexjit_args* a;
  if (flexjit_enable_cpu_backend() != FLEXJIT_OK || flexjit_runtime_create(&rt) != FLEXJIT_OK) return 2;
  if (flexjit_compile(rt, "{\"mask_mod\": \"q >= kv\", \"dtype\": \"fp32\", \"head_dim\": 16}", &kernel) != FLEXJIT_OK) {
    fprintf(stderr, "%s\n", flexjit_last_error());
    return 1;
  }
  flexjit_args_create(&a);
  flexjit_args_set_qkvo(a, q, k, v, o, FLEXJIT_F32, B, H, H, S, S, D);
  flexjit_args_set_stream(a, NULL, -2);
  if (flexjit_forward(kernel, a) != FLEXJIT_OK) {
    fprintf(stderr, "%s\n", flexjit_last_error());
    return 1;
  }
  double worst = 0;
  for (int h = 0; h < H; ++h)
    for (int i = 0; i < S; ++i) {
      double s[S], max = -INFINITY, sum = 0, acc[D] = {0};
      for (int j = 0; j <= i; ++j) {
        double dot = 0;
        for (int d = 0; d < D; ++d) dot += (double)q[(h * S + i) * D + d] * k[(h * S + j) * D + d];
        s[j] = dot / sqrt((double)D);
        if (s[j] > max) max = s[j];
      }
      for (int j = 0; j <= i; ++j) {
        double p = exp(s[j] - max);
        sum += p;
        for (int d = 0; d < D; ++d) acc[d] += p * v[(h * S + j) * D + d];
      }
      for (int d = 0; d < D; ++d) {
        double err = fabs(acc[d] / sum - o[(h * S + i) * D + d]);
        if (!(err <= worst)) worst = err;
      }
    }
  printf("pkgconfig_consumer: causal attention on the CPU backend, max |O - float64 reference| = %.2e\n", worst);
  flexjit_args_destroy(a);
  flexjit_kernel_destroy(kernel);
  flexjit_runtime_destroy(rt);
  return worst <= 1e-4 ? 0 : 1;
}
