/* The C API from C: status codes and error text for bad specs and bad launches, and a
 * forward launch on the CPU backend when this build has it (a GPU launch when a device is
 * present), the dense and ragged backward, decode with FP8 KV caches. Exits non-zero on failure; prints "N passed, N failed". */
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

static float* filled(int n, int seed) {
  float* p = malloc(sizeof(float) * (size_t)n);
  for (int i = 0; i < n; ++i) p[i] = (float)(((i + seed) * 2654435761u) % 1000u) / 500.0f - 1.0f;
  return p;
}

static float max_abs_diff(const float* a, const float* b, int n) {
  float m = 0;
  for (int i = 0; i < n; ++i) {
    float d = fabsf(a[i] - b[i]);
    if (!(d <= m)) m = d; /* NaN propagates */
  }
  return m;
}

#ifdef FLEXJIT_HAVE_CPU_BACKEND
/* The backward on the CPU backend with one key per row: softmax is 1, so O = V, dV is the sum
 * of dO over the rows, dQ = dK = 0, and a per-head bias gets zero gradient. */
static void test_backward(flexjit_runtime* rt) {
  enum { B = 1, H = 2, Sq = 6, Skv = 1, D = 16 };
  flexjit_kernel* k = NULL;
  CHECK(flexjit_compile(rt, "{\"score_mod\": \"score + bias[h]\", \"buffers\": [\"bias: f32[H]\"], \"grad\": [\"bias\"], "
                            "\"dtype\": \"f32\", \"head_dim\": 16}",
                        &k) == FLEXJIT_OK);
  float *q = filled(B * H * Sq * D, 1), *kk = filled(B * H * Skv * D, 2), *v = filled(B * H * Skv * D, 3);
  float *o = filled(B * H * Sq * D, 4), *d_o = filled(B * H * Sq * D, 5), *lse = filled(B * H * Sq, 6);
  float *dq = filled(B * H * Sq * D, 7), *dk = filled(B * H * Skv * D, 8), *dv = filled(B * H * Skv * D, 9);
  float bias[H] = {0.25f, -1.0f}, dbias[H] = {NAN, NAN};
  int64_t bias_shape[1] = {H};
  flexjit_args* a = NULL;
  CHECK(flexjit_args_create(&a) == FLEXJIT_OK);
  CHECK(flexjit_args_set_qkvo(a, q, kk, v, o, FLEXJIT_F32, B, H, H, Sq, Skv, D) == FLEXJIT_OK);
  CHECK(flexjit_args_set_buffer(a, "bias", bias, FLEXJIT_F32, 1, bias_shape, NULL) == FLEXJIT_OK);
  CHECK(flexjit_args_set_lse(a, lse) == FLEXJIT_OK);
  CHECK(flexjit_args_set_stream(a, NULL, -2) == FLEXJIT_OK);
  /* The backward needs dO and the gradient outputs. */
  CHECK(flexjit_backward(k, a) == FLEXJIT_ERROR_USER);
  CHECK(strstr(flexjit_last_error(), "flexjit_args_set_backward") != NULL);
  CHECK(flexjit_forward(k, a) == FLEXJIT_OK);
  CHECK(flexjit_args_set_backward(a, d_o, dq, dk, dv) == FLEXJIT_OK);
  CHECK(flexjit_args_set_grad(a, "bias", dbias) == FLEXJIT_OK);
  CHECK(flexjit_backward(k, a) == FLEXJIT_OK);
  float want[H * D];
  for (int h = 0; h < H; ++h)
    for (int d = 0; d < D; ++d) {
      float sum = 0;
      for (int r = 0; r < Sq; ++r) sum += d_o[(h * Sq + r) * D + d];
      want[h * D + d] = sum;
    }
  CHECK(max_abs_diff(dv, want, H * D) < 1e-4f);
  float zeros[B * H * Sq * D] = {0};
  CHECK(max_abs_diff(dq, zeros, B * H * Sq * D) < 1e-5f);
  CHECK(max_abs_diff(dk, zeros, B * H * Skv * D) < 1e-5f);
  CHECK(max_abs_diff(dbias, zeros, H) < 1e-5f);
  /* A gradient for a buffer the spec does not declare. */
  CHECK(flexjit_args_set_grad(a, "bais", dbias) == FLEXJIT_OK);
  CHECK(flexjit_backward(k, a) != FLEXJIT_OK);
  flexjit_args_destroy(a);
  flexjit_kernel_destroy(k);
  free(q), free(kk), free(v), free(o), free(d_o), free(lse), free(dq), free(dk), free(dv);
}

/* The ragged backward on the CPU backend equals a dense backward per sequence (one head, so a packed [T, 1, D]
 * sequence is a dense [1, 1, S, D] one), the slope's gradient the sum of the sequences'. */
static void test_backward_varlen(flexjit_runtime* rt) {
  enum { T = 12, D = 16 };
  flexjit_kernel* k = NULL;
  CHECK(flexjit_compile(rt, "{\"score_mod\": \"score + slope[h] * (kv - q)\", \"mask_mod\": \"q >= kv\", \"buffers\": [\"slope: f32[H]\"], "
                            "\"grad\": [\"slope\"], \"dtype\": \"f32\", \"head_dim\": 16}",
                        &k) == FLEXJIT_OK);
  const int32_t cu[3] = {0, 5, 12};
  float *q = filled(T * D, 11), *kk = filled(T * D, 12), *v = filled(T * D, 13), *d_o = filled(T * D, 14), *o = filled(T * D, 15);
  float *lse = filled(T, 16), *dq = filled(T * D, 17), *dk = filled(T * D, 18), *dv = filled(T * D, 19);
  float *dq1 = filled(T * D, 20), *dk1 = filled(T * D, 21), *dv1 = filled(T * D, 22);
  float slope[1] = {0.3f}, gslope[1] = {NAN}, gsum[1] = {0}, gseq[1] = {NAN};
  int64_t slope_shape[1] = {1};
  flexjit_args* a = NULL;
  CHECK(flexjit_args_create(&a) == FLEXJIT_OK);
  CHECK(flexjit_args_set_varlen(a, q, kk, v, o, FLEXJIT_F32, T, T, 1, 1, D, 2, cu, cu, 7, 7) == FLEXJIT_OK);
  CHECK(flexjit_args_set_buffer(a, "slope", slope, FLEXJIT_F32, 1, slope_shape, NULL) == FLEXJIT_OK);
  CHECK(flexjit_args_set_lse(a, lse) == FLEXJIT_OK);
  CHECK(flexjit_args_set_stream(a, NULL, -2) == FLEXJIT_OK);
  CHECK(flexjit_forward_varlen(k, a) == FLEXJIT_OK);
  CHECK(flexjit_backward_varlen(k, a) == FLEXJIT_ERROR_USER); /* no dO, dq, dk, dv yet */
  CHECK(strstr(flexjit_last_error(), "flexjit_args_set_backward") != NULL);
  CHECK(flexjit_args_set_backward(a, d_o, dq, dk, dv) == FLEXJIT_OK);
  CHECK(flexjit_args_set_grad(a, "slope", gslope) == FLEXJIT_OK);
  CHECK(flexjit_backward_varlen(k, a) == FLEXJIT_OK);
  for (int b = 0; b < 2; ++b) {
    const int r0 = cu[b], S = cu[b + 1] - cu[b];
    flexjit_args* s = NULL;
    CHECK(flexjit_args_create(&s) == FLEXJIT_OK);
    CHECK(flexjit_args_set_qkvo(s, q + r0 * D, kk + r0 * D, v + r0 * D, o + r0 * D, FLEXJIT_F32, 1, 1, 1, S, S, D) == FLEXJIT_OK);
    CHECK(flexjit_args_set_buffer(s, "slope", slope, FLEXJIT_F32, 1, slope_shape, NULL) == FLEXJIT_OK);
    CHECK(flexjit_args_set_lse(s, lse + r0) == FLEXJIT_OK);
    CHECK(flexjit_args_set_stream(s, NULL, -2) == FLEXJIT_OK);
    CHECK(flexjit_args_set_backward(s, d_o + r0 * D, dq1 + r0 * D, dk1 + r0 * D, dv1 + r0 * D) == FLEXJIT_OK);
    CHECK(flexjit_args_set_grad(s, "slope", gseq) == FLEXJIT_OK);
    CHECK(flexjit_backward(k, s) == FLEXJIT_OK);
    gsum[0] += gseq[0];
    flexjit_args_destroy(s);
  }
  CHECK(max_abs_diff(dq, dq1, T * D) < 1e-5f);
  CHECK(max_abs_diff(dk, dk1, T * D) < 1e-5f);
  CHECK(max_abs_diff(dv, dv1, T * D) < 1e-5f);
  CHECK(max_abs_diff(gslope, gsum, 1) < 1e-5f);
  /* Bounds below a sequence's length are reported, not skipped, on the CPU. */
  CHECK(flexjit_args_set_varlen(a, q, kk, v, o, FLEXJIT_F32, T, T, 1, 1, D, 2, cu, cu, 6, 7) == FLEXJIT_OK);
  CHECK(flexjit_backward_varlen(k, a) == FLEXJIT_ERROR_USER);
  CHECK(strstr(flexjit_last_error(), "max_seqlen_q") != NULL);
  CHECK(flexjit_backward_varlen(NULL, a) == FLEXJIT_ERROR_INVALID_ARGUMENT);
  flexjit_args_destroy(a);
  flexjit_kernel_destroy(k);
  free(q), free(kk), free(v), free(d_o), free(o), free(lse), free(dq), free(dk), free(dv), free(dq1), free(dk1), free(dv1);
}

/* Decode and ragged prefill on the CPU backend agree with plain forward launches: a decode
 * step over a paged cache (pages in shuffled order) equals the forward of its last query row,
 * and each sequence of a packed batch equals its own forward. */
static void test_decode_and_varlen(flexjit_runtime* rt) {
  enum { H = 2, Skv = 12, D = 16, P = 4 };
  flexjit_kernel* k = NULL;
  CHECK(flexjit_compile(rt, "{\"mask_mod\": \"q >= kv\", \"dtype\": \"f32\", \"head_dim\": 16}", &k) == FLEXJIT_OK);
  /* Forward with Sq = Skv (causal): the last row is what decode computes for q = Skv - 1. */
  float *q = filled(H * Skv * D, 11), *kk = filled(H * Skv * D, 12), *v = filled(H * Skv * D, 13), *o = filled(H * Skv * D, 14);
  flexjit_args* a = NULL;
  CHECK(flexjit_args_create(&a) == FLEXJIT_OK);
  CHECK(flexjit_args_set_qkvo(a, q, kk, v, o, FLEXJIT_F32, 1, H, H, Skv, Skv, D) == FLEXJIT_OK);
  CHECK(flexjit_args_set_stream(a, NULL, -2) == FLEXJIT_OK);
  CHECK(flexjit_forward(k, a) == FLEXJIT_OK);

  /* The same keys in pages of P positions, [num_pages, P, H, D], stored in reverse page order. */
  enum { Pages = Skv / P };
  float *kp = malloc(sizeof(float) * Skv * H * D), *vp = malloc(sizeof(float) * Skv * H * D);
  int32_t table[Pages], kv_len[1] = {Skv};
  for (int pg = 0; pg < Pages; ++pg) table[pg] = Pages - 1 - pg;
  for (int pos = 0; pos < Skv; ++pos)
    for (int h = 0; h < H; ++h)
      for (int d = 0; d < D; ++d) {
        int dst = ((table[pos / P] * P + pos % P) * H + h) * D + d;
        kp[dst] = kk[(h * Skv + pos) * D + d];
        vp[dst] = v[(h * Skv + pos) * D + d];
      }
  float qd[H * D], od[H * D];
  for (int h = 0; h < H; ++h)
    for (int d = 0; d < D; ++d) qd[h * D + d] = q[(h * Skv + Skv - 1) * D + d], od[h * D + d] = NAN;
  flexjit_decode_plan* plan = NULL;
  CHECK(flexjit_plan_decode(k, -2, 1, H, H, 1, Skv, P, 0, &plan) == FLEXJIT_OK);
  CHECK(flexjit_decode_plan_num_splits(plan) == 1);
  int64_t cache_shape[4] = {Pages, P, H, D};
  CHECK(flexjit_args_set_decode(a, qd, kp, vp, od, FLEXJIT_F32, 1, H, 1, D, cache_shape, table, Pages, kv_len, NULL) == FLEXJIT_OK);
  CHECK(flexjit_decode(k, plan, a) == FLEXJIT_OK);
  float last[H * D];
  for (int h = 0; h < H; ++h)
    for (int d = 0; d < D; ++d) last[h * D + d] = o[(h * Skv + Skv - 1) * D + d];
  CHECK(max_abs_diff(od, last, H * D) < 1e-5f);
  flexjit_decode_plan_destroy(plan);

  /* A chunked prefill: one query row at the end of the sequence's Skv KV positions ([total, H, D] rows) is the
   * forward's last row too. */
  float *kpk = malloc(sizeof(float) * Skv * H * D), *vpk = malloc(sizeof(float) * Skv * H * D), oc[H * D];
  for (int pos = 0; pos < Skv; ++pos)
    for (int h = 0; h < H; ++h)
      for (int d = 0; d < D; ++d) {
        kpk[(pos * H + h) * D + d] = kk[(h * Skv + pos) * D + d];
        vpk[(pos * H + h) * D + d] = v[(h * Skv + pos) * D + d];
      }
  int32_t cu_q1[2] = {0, 1}, cu_kv1[2] = {0, Skv};
  CHECK(flexjit_args_set_queries_at_kv_end(NULL, 1) != FLEXJIT_OK);
  CHECK(flexjit_args_set_varlen(a, qd, kpk, vpk, oc, FLEXJIT_F32, 1, Skv, H, H, D, 1, cu_q1, cu_kv1, 1, Skv) == FLEXJIT_OK);
  CHECK(flexjit_args_set_queries_at_kv_end(a, 1) == FLEXJIT_OK);
  CHECK(flexjit_forward_varlen(k, a) == FLEXJIT_OK);
  CHECK(max_abs_diff(oc, last, H * D) < 1e-5f);
  CHECK(flexjit_args_set_queries_at_kv_end(a, 0) == FLEXJIT_OK);
  free(kpk), free(vpk);

  /* Two packed sequences of 5 and 7 rows ([total, H, D]) against one forward each. */
  int32_t cu[3] = {0, 5, 12};
  float *qv = filled(Skv * H * D, 21), *kv = filled(Skv * H * D, 22), *vv = filled(Skv * H * D, 23), *ov = filled(Skv * H * D, 24);
  CHECK(flexjit_args_set_varlen(a, qv, kv, vv, ov, FLEXJIT_F32, Skv, Skv, H, H, D, 2, cu, cu, 7, 7) == FLEXJIT_OK);
  CHECK(flexjit_forward_varlen(k, a) == FLEXJIT_OK);
  for (int s = 0; s < 2; ++s) {
    int len = cu[s + 1] - cu[s];
    int64_t strides[4] = {0, D, H * D, 1}; /* [1, H, len, D] views of the packed rows */
    float* os = malloc(sizeof(float) * (size_t)(len * H * D));
    int64_t o_strides[4] = {0, D, H * D, 1};
    CHECK(flexjit_args_set_qkvo(a, qv + cu[s] * H * D, kv + cu[s] * H * D, vv + cu[s] * H * D, os, FLEXJIT_F32, 1, H, H, len, len, D) ==
          FLEXJIT_OK);
    CHECK(flexjit_args_set_strides(a, strides, strides, strides, o_strides) == FLEXJIT_OK);
    CHECK(flexjit_forward(k, a) == FLEXJIT_OK);
    CHECK(max_abs_diff(os, ov + cu[s] * H * D, len * H * D) < 1e-5f);
    free(os);
  }
  flexjit_args_destroy(a);
  flexjit_kernel_destroy(k);
  free(q), free(kk), free(v), free(o), free(kp), free(vp), free(qv), free(kv), free(vv), free(ov);
}

/* The test's own FP8 decoder (OCP e4m3 when e4m3, else e5m2), for codes that are not NaN or inf. */
static double fp8_value(unsigned char bits, int e4m3) {
  int mant_bits = e4m3 ? 3 : 2, bias = e4m3 ? 7 : 15;
  int exp = (bits & 0x7f) >> mant_bits, mant = bits & ((1 << mant_bits) - 1);
  double sign = (bits & 0x80) ? -1.0 : 1.0;
  if (exp == 0) return sign * ldexp((double)mant, 1 - bias - mant_bits);
  return sign * ldexp((double)(mant | (1 << mant_bits)), exp - bias - mant_bits);
}

/* Decode with an FP8 KV cache (e4m3 and e5m2, per-KV-head and single scales, GQA 2) on the CPU
 * backend against a float64 reference of the dequantised cache (scale * value), and the FP8
 * arguments' errors. */
static void test_decode_fp8(flexjit_runtime* rt) {
  enum { B = 2, H = 4, HKV = 2, D = 16, CAP = 10 };
  flexjit_kernel* k = NULL;
  CHECK(flexjit_compile(rt, "{\"dtype\": \"f32\", \"head_dim\": 16}", &k) == FLEXJIT_OK);
  float* q = filled(B * H * D, 31);
  float o[B * H * D], lse[B * H];
  unsigned char kc[B * HKV * CAP * D], vc[B * HKV * CAP * D];
  for (int i = 0; i < B * HKV * CAP * D; ++i) { /* non-zero codes below 0x60: finite in both formats */
    kc[i] = (unsigned char)((((unsigned)i * 2654435761u) >> 7) % 0x5f + 1) | (unsigned char)(i % 3 ? 0 : 0x80);
    vc[i] = (unsigned char)((((unsigned)i * 40503u) >> 3) % 0x5f + 1) | (unsigned char)(i % 5 ? 0x80 : 0);
  }
  int32_t kv_lens[B] = {7, CAP};
  int64_t cache_shape[4] = {B, HKV, CAP, D};
  const flexjit_dtype formats[2] = {FLEXJIT_F8E4M3, FLEXJIT_F8E5M2};
  flexjit_args* a = NULL;
  CHECK(flexjit_args_create(&a) == FLEXJIT_OK);
  CHECK(flexjit_args_set_stream(a, NULL, -2) == FLEXJIT_OK);
  CHECK(flexjit_args_set_lse(a, lse) == FLEXJIT_OK);
  for (int f = 0; f < 2; ++f)
    for (int n = 1; n <= HKV; n += HKV - 1) {
      const int e4m3 = formats[f] == FLEXJIT_F8E4M3;
      const float k_scale[HKV] = {e4m3 ? 0.05f : 0.004f, e4m3 ? 0.03f : 0.002f}, v_scale[HKV] = {e4m3 ? 0.02f : 0.003f, e4m3 ? 0.07f : 0.005f};
      flexjit_decode_plan* plan = NULL;
      CHECK(flexjit_plan_decode_kv(k, -2, B, H, HKV, 1, CAP, 0, 0, formats[f], &plan) == FLEXJIT_OK);
      CHECK(flexjit_args_set_decode(a, q, kc, vc, o, FLEXJIT_F32, B, H, 1, D, cache_shape, NULL, 0, kv_lens, NULL) == FLEXJIT_OK);
      CHECK(flexjit_args_set_decode_kv_dtype(a, formats[f]) == FLEXJIT_OK);
      CHECK(flexjit_args_set_kv_scales(a, k_scale, v_scale, n) == FLEXJIT_OK);
      for (int i = 0; i < B * H * D; ++i) o[i] = NAN;
      for (int i = 0; i < B * H; ++i) lse[i] = NAN;
      CHECK(flexjit_decode(k, plan, a) == FLEXJIT_OK);
      double worst = 0; /* the largest error of O and LSE; NaN stays NaN */
      for (int b = 0; b < B; ++b)
        for (int h = 0; h < H; ++h) {
          const int hk = h / (H / HKV), len = kv_lens[b];
          const double ks = k_scale[n == 1 ? 0 : hk], vs = v_scale[n == 1 ? 0 : hk];
          const float* qr = q + (b * H + h) * D;
          double s[CAP], mx = -INFINITY, sum = 0, out[D] = {0};
          for (int p = 0; p < len; ++p) {
            const unsigned char* kr = kc + ((b * HKV + hk) * CAP + p) * D;
            s[p] = 0;
            for (int d = 0; d < D; ++d) s[p] += (double)qr[d] * ks * fp8_value(kr[d], e4m3);
            s[p] /= sqrt((double)D);
            if (s[p] > mx) mx = s[p];
          }
          for (int p = 0; p < len; ++p) {
            const unsigned char* vr = vc + ((b * HKV + hk) * CAP + p) * D;
            const double w = exp(s[p] - mx);
            sum += w;
            for (int d = 0; d < D; ++d) out[d] += w * vs * fp8_value(vr[d], e4m3);
          }
          for (int d = 0; d < D; ++d) {
            const double err = fabs(o[(b * H + h) * D + d] - out[d] / sum);
            if (!(err <= worst)) worst = err;
          }
          const double lse_err = fabs(lse[b * H + h] - (mx + log(sum)));
          if (!(lse_err <= worst)) worst = lse_err;
        }
      CHECK(worst < 1e-4);
      if (!(worst < 1e-4)) fprintf(stderr, "FP8 decode (format %d, %d scales): error %g\n", f, n, worst);
      flexjit_decode_plan_destroy(plan);
    }

  /* Errors: bad values and NULLs, a cache dtype that is not the plan's, scales of the wrong size. */
  flexjit_decode_plan* plan = NULL;
  const float scales[3] = {1, 1, 1};
  CHECK(flexjit_plan_decode_kv(k, -2, B, H, HKV, 1, CAP, 0, 0, (flexjit_dtype)42, &plan) == FLEXJIT_ERROR_INVALID_ARGUMENT);
  CHECK(strstr(flexjit_last_error(), "unknown kv_dtype") != NULL);
  CHECK(flexjit_plan_decode_kv(k, -2, B, H, HKV, 1, CAP, 0, 0, FLEXJIT_F8E4M3, NULL) == FLEXJIT_ERROR_INVALID_ARGUMENT);
  CHECK(flexjit_args_set_decode_kv_dtype(NULL, FLEXJIT_F8E4M3) == FLEXJIT_ERROR_INVALID_ARGUMENT);
  CHECK(flexjit_args_set_decode_kv_dtype(a, (flexjit_dtype)42) == FLEXJIT_ERROR_INVALID_ARGUMENT);
  CHECK(flexjit_args_set_kv_scales(NULL, scales, scales, 1) == FLEXJIT_ERROR_INVALID_ARGUMENT);
  CHECK(flexjit_args_set_kv_scales(a, scales, NULL, 0) == FLEXJIT_ERROR_INVALID_ARGUMENT);
  CHECK(strstr(flexjit_last_error(), "n must be the number of KV heads or 1") != NULL);
  CHECK(flexjit_args_set_qkvo(a, q, kc, vc, o, FLEXJIT_F8E4M3, B, H, HKV, 1, CAP, D) == FLEXJIT_ERROR_INVALID_ARGUMENT);
  CHECK(flexjit_args_set_decode(a, q, kc, vc, o, FLEXJIT_F32, B, H, 1, D, cache_shape, NULL, 0, kv_lens, NULL) == FLEXJIT_OK);
  CHECK(flexjit_args_set_decode_kv_dtype(a, FLEXJIT_F8E4M3) == FLEXJIT_OK);
  CHECK(flexjit_plan_decode_kv(k, -2, B, H, HKV, 1, CAP, 0, 0, FLEXJIT_F8E4M3, &plan) == FLEXJIT_OK);
  CHECK(flexjit_args_set_kv_scales(a, scales, scales, 3) == FLEXJIT_OK);
  CHECK(flexjit_decode(k, plan, a) == FLEXJIT_ERROR_USER);
  CHECK(strstr(flexjit_last_error(), "must be an f32 tensor of shape [2] (one scale per KV head) or [1]") != NULL);
  CHECK(flexjit_args_set_kv_scales(a, NULL, NULL, 0) == FLEXJIT_OK);
  CHECK(flexjit_args_set_decode_kv_dtype(a, FLEXJIT_F8E5M2) == FLEXJIT_OK);
  CHECK(flexjit_decode(k, plan, a) == FLEXJIT_ERROR_USER);
  CHECK(strstr(flexjit_last_error(), "`k` is f8e5m2 but the plan's KV cache is f8e4m3") != NULL);
  CHECK(flexjit_args_set_decode_kv_dtype(a, FLEXJIT_F8E4M3) == FLEXJIT_OK);
  CHECK(flexjit_decode(k, plan, a) == FLEXJIT_OK); /* no scales: 1 */
  flexjit_decode_plan_destroy(plan);
  flexjit_args_destroy(a);
  flexjit_kernel_destroy(k);
  free(q);
}
#endif

/* Ring attention over 3 virtual ranks (zigzag) on the CPU backend equals one whole-sequence launch: O, LSE, dq,
 * dk, dv and a buffer gradient summed over the ranks. */
#ifdef FLEXJIT_HAVE_CPU_BACKEND
static void test_ring(flexjit_runtime* rt) {
  enum { B = 1, H = 2, S = 23, D = 16, R = 3 };
  flexjit_kernel* k = NULL;
  CHECK(flexjit_compile(rt, "{\"mask_mod\": \"q >= kv\", \"score_mod\": \"score + bias[h] * (kv - q)\", \"buffers\": [\"bias: f32[H]\"], "
                            "\"grad\": [\"bias\"], \"dtype\": \"f32\", \"head_dim\": 16}",
                        &k) == FLEXJIT_OK);
  const int n = B * H * S * D;
  float *q = filled(n, 11), *kk = filled(n, 12), *v = filled(n, 13), *d_o = filled(n, 14);
  float *o = filled(n, 15), *lse = filled(B * H * S, 16), *dq = filled(n, 17), *dk = filled(n, 18), *dv = filled(n, 19);
  float bias[H] = {0.125f, 0.5f}, dbias[H] = {NAN, NAN}, ring_dbias[H] = {NAN, NAN};
  int64_t bias_shape[1] = {H};
  flexjit_args* whole = NULL;
  CHECK(flexjit_args_create(&whole) == FLEXJIT_OK);
  CHECK(flexjit_args_set_qkvo(whole, q, kk, v, o, FLEXJIT_F32, B, H, H, S, S, D) == FLEXJIT_OK);
  CHECK(flexjit_args_set_buffer(whole, "bias", bias, FLEXJIT_F32, 1, bias_shape, NULL) == FLEXJIT_OK);
  CHECK(flexjit_args_set_lse(whole, lse) == FLEXJIT_OK);
  CHECK(flexjit_args_set_stream(whole, NULL, -2) == FLEXJIT_OK);
  CHECK(flexjit_forward(k, whole) == FLEXJIT_OK);
  CHECK(flexjit_args_set_backward(whole, d_o, dq, dk, dv) == FLEXJIT_OK);
  CHECK(flexjit_args_set_grad(whole, "bias", dbias) == FLEXJIT_OK);
  CHECK(flexjit_backward(k, whole) == FLEXJIT_OK);

  /* Each rank's shard: the rows of its chunks, one chunk after the other (H rows of each head). */
  float* shard[R][10]; /* q k v d_o o lse dq dk dv (+ spare) */
  int64_t rows[R], first[R][2], len[R][2];
  int chunks[R];
  flexjit_args* ra[R];
  for (int r = 0; r < R; ++r) {
    CHECK(flexjit_ring_chunks(S, R, r, FLEXJIT_RING_ZIGZAG, first[r], len[r], &chunks[r]) == FLEXJIT_OK);
    CHECK(chunks[r] == 2);
    rows[r] = len[r][0] + len[r][1];
    for (int t = 0; t < 9; ++t) shard[r][t] = filled((int)(B * H * rows[r] * D), 100 + t);
    const float* src[4] = {q, kk, v, d_o};
    for (int t = 0; t < 4; ++t)
      for (int h = 0; h < B * H; ++h) {
        int64_t local = 0;
        for (int c = 0; c < 2; ++c)
          for (int64_t i = 0; i < len[r][c]; ++i, ++local)
            memcpy(shard[r][t] + (h * rows[r] + local) * D, src[t] + (h * S + first[r][c] + i) * D, sizeof(float) * D);
      }
    CHECK(flexjit_args_create(&ra[r]) == FLEXJIT_OK);
    CHECK(flexjit_args_set_qkvo(ra[r], shard[r][0], shard[r][1], shard[r][2], shard[r][4], FLEXJIT_F32, B, H, H, rows[r], rows[r], D) ==
          FLEXJIT_OK);
    CHECK(flexjit_args_set_lse(ra[r], shard[r][5]) == FLEXJIT_OK);
    CHECK(flexjit_args_set_stream(ra[r], NULL, -2) == FLEXJIT_OK);
    CHECK(flexjit_args_set_backward(ra[r], shard[r][3], shard[r][6], shard[r][7], shard[r][8]) == FLEXJIT_OK);
  }
  CHECK(flexjit_args_set_buffer(ra[0], "bias", bias, FLEXJIT_F32, 1, bias_shape, NULL) == FLEXJIT_OK);
  CHECK(flexjit_args_set_grad(ra[0], "bias", ring_dbias) == FLEXJIT_OK);
  CHECK(flexjit_ring_forward(k, R, FLEXJIT_RING_ZIGZAG, S, ra) == FLEXJIT_OK);
  CHECK(flexjit_ring_backward(k, R, FLEXJIT_RING_ZIGZAG, S, ra) == FLEXJIT_OK);
  /* Compare every rank's rows with the whole launch's. */
  float worst = 0;
  const float* want[5] = {o, dq, dk, dv, lse};
  const int slot[5] = {4, 6, 7, 8, 5};
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < 5; ++t) {
      const int width = t == 4 ? 1 : D;
      for (int h = 0; h < B * H; ++h) {
        int64_t local = 0;
        for (int c = 0; c < 2; ++c)
          for (int64_t i = 0; i < len[r][c]; ++i, ++local) {
            const float d = max_abs_diff(shard[r][slot[t]] + (h * rows[r] + local) * width, want[t] + (h * S + first[r][c] + i) * width, width);
            if (!(d <= worst)) worst = d;
          }
      }
    }
  CHECK(worst < 1e-4f);
  CHECK(max_abs_diff(ring_dbias, dbias, H) < 1e-3f);
  /* Ranks on different devices are refused with a clear error, and so is a ring of no ranks. */
  CHECK(flexjit_args_set_stream(ra[1], NULL, 0) == FLEXJIT_OK);
  CHECK(flexjit_ring_forward(k, R, FLEXJIT_RING_ZIGZAG, S, ra) == FLEXJIT_ERROR_USER);
  CHECK(strstr(flexjit_last_error(), "but the ring runs on") != NULL);
  CHECK(flexjit_ring_forward(k, 0, FLEXJIT_RING_ZIGZAG, S, ra) == FLEXJIT_ERROR_INVALID_ARGUMENT);
  for (int r = 0; r < R; ++r) {
    flexjit_args_destroy(ra[r]);
    for (int t = 0; t < 9; ++t) free(shard[r][t]);
  }
  flexjit_args_destroy(whole);
  flexjit_kernel_destroy(k);
  free(q), free(kk), free(v), free(d_o), free(o), free(lse), free(dq), free(dk), free(dv);
}
#endif

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
#ifdef FLEXJIT_HAVE_CPU_BACKEND
  test_backward(rt);
  test_backward_varlen(rt);
  test_decode_and_varlen(rt);
  test_decode_fp8(rt);
  test_ring(rt);
#endif
  flexjit_kernel_destroy(k);
  flexjit_runtime_destroy(rt);
  free(q);
  free(kk);
  free(v);
  free(o);
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
