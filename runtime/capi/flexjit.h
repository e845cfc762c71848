/* The flexjit C API: opaque handles, status codes and error text; no C++ exception
 * crosses it. Thread-safe like the C++ API it wraps.
 *
 *   flexjit_runtime* rt; flexjit_kernel* k;
 *   flexjit_runtime_create(&rt);
 *   if (flexjit_compile(rt, spec_json, &k) != FLEXJIT_OK) puts(flexjit_last_error());
 *   flexjit_args* a; flexjit_args_create(&a);
 *   flexjit_args_set_qkvo(a, q, k, v, o, FLEXJIT_BF16, B, H, Hkv, Sq, Skv, D);
 *   flexjit_args_set_buffer(a, "doc", doc, FLEXJIT_I32, 1, shape, NULL);
 *   flexjit_forward(k, a);
 */
#ifndef FLEXJIT_H
#define FLEXJIT_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  FLEXJIT_OK = 0,
  FLEXJIT_ERROR_INVALID_ARGUMENT = 1, /* a null handle or a malformed argument */
  FLEXJIT_ERROR_COMPILE = 2,          /* the spec has errors: flexjit_last_error() holds the diagnostics */
  FLEXJIT_ERROR_USER = 3,             /* a launch the spec or the shapes reject (wrong device, shapes, ...) */
  FLEXJIT_ERROR_NO_DEVICE = 4,        /* no CUDA driver or device */
  FLEXJIT_ERROR_INTERNAL = 5          /* a bug in flexjit */
} flexjit_status;

typedef enum { FLEXJIT_F32 = 0, FLEXJIT_F16 = 1, FLEXJIT_BF16 = 2, FLEXJIT_I32 = 3, FLEXJIT_I64 = 4, FLEXJIT_U8 = 5, FLEXJIT_BOOL = 6 } flexjit_dtype;

typedef struct flexjit_runtime flexjit_runtime;
typedef struct flexjit_kernel flexjit_kernel;
typedef struct flexjit_args flexjit_args;

/* The message of this thread's last failed call ("" if none). Valid until the next call. */
const char* flexjit_last_error(void);
/* The diagnostics of this thread's last FLEXJIT_ERROR_COMPILE as JSON ("[]" if none). */
const char* flexjit_last_diagnostics_json(void);

flexjit_status flexjit_runtime_create(flexjit_runtime** out);
/* Makes launches with device -2 run on the CPU backend. Defined by the flexjit_cpu library
 * (link it to use the CPU backend; GPU-only builds do not have it). */
flexjit_status flexjit_enable_cpu_backend(void);
void flexjit_runtime_destroy(flexjit_runtime* rt);
int flexjit_device_count(void);

/* Compiles a spec given as JSON text (the format of `flexjit check SPEC`). */
flexjit_status flexjit_compile(flexjit_runtime* rt, const char* spec_json, flexjit_kernel** out);
void flexjit_kernel_destroy(flexjit_kernel* k);

flexjit_status flexjit_args_create(flexjit_args** out);
void flexjit_args_destroy(flexjit_args* a);
/* Contiguous [B,H,Sq,D] q and o, [B,Hkv,Skv,D] k and v, all of one dtype. */
flexjit_status flexjit_args_set_qkvo(flexjit_args* a, const void* q, const void* k, const void* v, void* o, flexjit_dtype dtype, int64_t B,
                                     int64_t H, int64_t Hkv, int64_t Sq, int64_t Skv, int64_t D);
/* Strides (elements, 4 each; NULL = contiguous) for layouts such as [B,S,H,D]. */
flexjit_status flexjit_args_set_strides(flexjit_args* a, const int64_t* q_strides, const int64_t* k_strides, const int64_t* v_strides,
                                        const int64_t* o_strides);
flexjit_status flexjit_args_set_lse(flexjit_args* a, float* lse);
flexjit_status flexjit_args_set_buffer(flexjit_args* a, const char* name, const void* data, flexjit_dtype dtype, int rank,
                                       const int64_t* shape, const int64_t* strides);
flexjit_status flexjit_args_set_param(flexjit_args* a, const char* name, double value);
flexjit_status flexjit_args_set_scale(flexjit_args* a, float scale);
/* The CUDA stream (a CUstream) and device; device -1 = the device q lives on; -2 = the CPU backend. */
flexjit_status flexjit_args_set_stream(flexjit_args* a, void* stream, int device);

flexjit_status flexjit_forward(flexjit_kernel* k, const flexjit_args* a);
/* Synchronises the stream and reports clamped loads since the last check. */
flexjit_status flexjit_check_errors(flexjit_kernel* k, int device, void* stream);

#ifdef __cplusplus
}
#endif
#endif /* FLEXJIT_H */
