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

/* FLEXJIT_F8E4M3 and FLEXJIT_F8E5M2 (OCP FP8, one byte each) are for decode KV caches only:
 * flexjit_plan_decode_kv and flexjit_args_set_decode_kv_dtype take them, nothing else does. */
typedef enum {
  FLEXJIT_F32 = 0,
  FLEXJIT_F16 = 1,
  FLEXJIT_BF16 = 2,
  FLEXJIT_I32 = 3,
  FLEXJIT_I64 = 4,
  FLEXJIT_U8 = 5,
  FLEXJIT_BOOL = 6,
  FLEXJIT_F8E4M3 = 7,
  FLEXJIT_F8E5M2 = 8
} flexjit_dtype;

typedef struct flexjit_runtime flexjit_runtime;
typedef struct flexjit_kernel flexjit_kernel;
typedef struct flexjit_args flexjit_args;
typedef struct flexjit_decode_plan flexjit_decode_plan;

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

/* Backward (after flexjit_args_set_qkvo, _set_lse with the forward's LSE, buffers and
 * parameters as for the forward): dO like o, dq/dk/dv like q/k/v (written). */
flexjit_status flexjit_args_set_backward(flexjit_args* a, const void* d_o, void* dq, void* dk, void* dv);
/* The f32 gradient of a buffer the spec marks "grad": contiguous, the shape given to
 * flexjit_args_set_buffer, overwritten by flexjit_backward. */
flexjit_status flexjit_args_set_grad(flexjit_args* a, const char* name, float* grad);
/* Nonzero: fixed summation order and no float atomics (bitwise reproducible, slower). */
flexjit_status flexjit_args_set_deterministic(flexjit_args* a, int deterministic);
/* How the backward computes dq (flexjit::BackwardDqMode; FLEXJIT_BWD_DQ=atomic|qmajor|auto overrides it):
 * AUTO picks the query-major pass for specs with row-owned buffer gradients (SAM), else ATOMIC. */
typedef enum { FLEXJIT_BWD_DQ_AUTO = 0, FLEXJIT_BWD_DQ_ATOMIC = 1, FLEXJIT_BWD_DQ_QUERY_MAJOR = 2 } flexjit_bwd_dq;
flexjit_status flexjit_args_set_backward_dq(flexjit_args* a, flexjit_bwd_dq mode);
flexjit_status flexjit_backward(flexjit_kernel* k, const flexjit_args* a);

/* Ragged prefill: q/o [total_q, H, D], k/v [total_kv, Hkv, D] (contiguous), sequence b owning
 * rows [cu_seqlens[b], cu_seqlens[b+1]) of each (int32 arrays of batch + 1 entries on the
 * launch's device). flexjit_args_set_lse then takes an [H, total_q] array. An FP8 k/v: give its
 * format with flexjit_args_set_decode_kv_dtype and its scales with flexjit_args_set_kv_scales. */
flexjit_status flexjit_args_set_varlen(flexjit_args* a, const void* q, const void* k, const void* v, void* o, flexjit_dtype dtype,
                                       int64_t total_q, int64_t total_kv, int64_t H, int64_t Hkv, int64_t D, int64_t batch,
                                       const int32_t* cu_seqlens_q, const int32_t* cu_seqlens_kv, int max_seqlen_q, int max_seqlen_kv);
flexjit_status flexjit_forward_varlen(flexjit_kernel* k, const flexjit_args* a);
/* Its backward (Kernel::backward_varlen), after flexjit_args_set_varlen with the forward's sequences and bounds,
 * _set_lse with its [H, total_q] LSE and _set_backward (dO like o, dq/dk/dv like q/k/v, written); buffer gradients
 * (flexjit_args_set_grad) are summed over the sequences. Not with queries_at_kv_end or an FP8 k/v. */
flexjit_status flexjit_backward_varlen(flexjit_kernel* k, const flexjit_args* a);
/* Nonzero: each sequence's query rows are its last KV positions (row i at kv_len - q_len + i), as in decode:
 * a chunked prefill over a cached prefix (VarlenArgs::queries_at_kv_end). Default 0: row i at position i. */
flexjit_status flexjit_args_set_queries_at_kv_end(flexjit_args* a, int at_kv_end);

/* Decode: a plan fixes the split count and workspace for a batch shape (device -2: CPU);
 * page_size 0 means a contiguous KV cache. Runs within the plan never allocate. */
flexjit_status flexjit_plan_decode(flexjit_kernel* k, int device, int batch, int heads, int kv_heads, int max_seqlen_q, int max_seqlen_kv,
                                   int page_size, int head_major_pages, flexjit_decode_plan** out);
/* The same with the KV cache's element type: the spec's dtype, or FLEXJIT_F8E4M3 / FLEXJIT_F8E5M2
 * for an FP8 cache (K = k_scale * stored value, V likewise; Q, O and the softmax keep their precision). */
flexjit_status flexjit_plan_decode_kv(flexjit_kernel* k, int device, int batch, int heads, int kv_heads, int max_seqlen_q, int max_seqlen_kv,
                                      int page_size, int head_major_pages, flexjit_dtype kv_dtype, flexjit_decode_plan** out);
void flexjit_decode_plan_destroy(flexjit_decode_plan* plan);
int flexjit_decode_plan_num_splits(const flexjit_decode_plan* plan);
/* One decode step: q/o [B, H, Sq, D]; k/v caches of cache_shape (contiguous [B, Hkv, Skv_cap, D],
 * or paged [num_pages, page_size, Hkv, D] / head-major [num_pages, Hkv, page_size, D]);
 * page_table [B, max_pages_per_seq] (NULL when contiguous), kv_lens [B], q_lens [B] or NULL. */
flexjit_status flexjit_args_set_decode(flexjit_args* a, const void* q, const void* k_cache, const void* v_cache, void* o, flexjit_dtype dtype,
                                       int64_t B, int64_t H, int64_t Sq, int64_t D, const int64_t* cache_shape, const int32_t* page_table,
                                       int64_t max_pages_per_seq, const int32_t* kv_lens, const int32_t* q_lens);
/* The element type of the k/v caches of flexjit_args_set_decode (or of k/v of flexjit_args_set_varlen) when it
 * differs from q's (an FP8 cache: FLEXJIT_F8E4M3 or FLEXJIT_F8E5M2, as the plan's kv_dtype). Holds for later
 * decodes and ragged prefills of these args, whichever of the setters is called first. */
flexjit_status flexjit_args_set_decode_kv_dtype(flexjit_args* a, flexjit_dtype kv_dtype);
/* An FP8 cache's (or FP8 ragged prefill's) f32 dequantisation scales on the launch's device (host memory for the CPU backend):
 * n = kv_heads (one per KV head) or 1 (one for the cache); either pointer may be NULL (scale 1). */
flexjit_status flexjit_args_set_kv_scales(flexjit_args* a, const float* k_scale, const float* v_scale, int64_t n);
flexjit_status flexjit_decode(flexjit_kernel* k, const flexjit_decode_plan* plan, const flexjit_args* a);

/* Ring attention (context parallelism) over `ranks` virtual ranks of this process: on the CPU backend (device -2)
 * or on one CUDA device, one stream per rank there. Every rank holds the positions of its chunks (flexjit_ring_chunks:
 * one chunk, or two with ZIGZAG sharding, stored one after the other). rank_args[r] is a flexjit_args set up for rank
 * r's shard: flexjit_args_set_qkvo with Sq = Skv = the rank's rows, _set_lse (written by the forward, read by the
 * backward), _set_stream with the same device for every rank; buffers (whole, indexed by global position), parameters,
 * the scale and the stream are rank 0's (on a GPU the ring's work is ordered on that stream and nothing synchronises).
 * The backward also needs _set_backward on every rank (dO read, dq/dk/dv written) and takes the gradients set on rank 0
 * with _set_grad, written summed over all ranks. */
typedef enum { FLEXJIT_RING_ZIGZAG = 0, FLEXJIT_RING_CONTIGUOUS = 1 } flexjit_ring_sharding;
/* Rank `rank`'s chunks of a seqlen-long sequence: *n (1 or 2) chunks, chunk i starting at position first[i]
 * with rows[i] rows. */
flexjit_status flexjit_ring_chunks(int64_t seqlen, int ranks, int rank, flexjit_ring_sharding sharding, int64_t first[2], int64_t rows[2],
                                   int* n);
/* One forward or backward: the ring is planned, run and released in the call (a flexjit_ring keeps its streams and
 * memory between calls instead). */
flexjit_status flexjit_ring_forward(flexjit_kernel* k, int ranks, flexjit_ring_sharding sharding, int64_t seqlen,
                                    flexjit_args* const* rank_args);
flexjit_status flexjit_ring_backward(flexjit_kernel* k, int ranks, flexjit_ring_sharding sharding, int64_t seqlen,
                                     flexjit_args* const* rank_args);

/* A ring plan kept between calls. flexjit_ring_create: every rank in this process (virtual ranks; device -2 the CPU
 * backend, -1 the GPU the shards live on, N cuda:N). flexjit_ring_create_nccl: one process per GPU, this one rank
 * `rank` of `ranks` on cuda:`device`, the packets moving by NCCL (libnccl.so.2 or FLEXJIT_NCCL_LIBRARY, loaded at run
 * time); give exactly one of unique_id (128 bytes from flexjit_nccl_unique_id on one rank, sent to the others by the
 * caller: every rank then calls this at once) and nccl_comm (an existing ncclComm_t the caller keeps alive). The NCCL
 * path has not run on a multi-GPU machine yet (docs/notes/RING_NOTES.md). */
typedef struct flexjit_ring flexjit_ring;
flexjit_status flexjit_nccl_unique_id(unsigned char id[128]);
flexjit_status flexjit_ring_create(flexjit_kernel* k, int ranks, flexjit_ring_sharding sharding, int64_t seqlen, int device, flexjit_ring** out);
flexjit_status flexjit_ring_create_nccl(flexjit_kernel* k, int ranks, int rank, flexjit_ring_sharding sharding, int64_t seqlen, int device,
                                        const unsigned char* unique_id, void* nccl_comm, flexjit_ring** out);
/* Waits for the ring's work, then releases it. */
void flexjit_ring_destroy(flexjit_ring* ring);
/* local_args: one flexjit_args per rank this process runs (all of them for flexjit_ring_create, its own for
 * flexjit_ring_create_nccl), set up as for flexjit_ring_forward / _backward. */
flexjit_status flexjit_ring_run_forward(flexjit_ring* ring, flexjit_args* const* local_args);
flexjit_status flexjit_ring_run_backward(flexjit_ring* ring, flexjit_args* const* local_args);
/* Synchronises the ring's streams and reports clamped loads of its launches (no-op on the CPU backend). */
flexjit_status flexjit_ring_check_errors(flexjit_ring* ring);

/* Synchronises the stream and reports clamped loads since the last check. */
flexjit_status flexjit_check_errors(flexjit_kernel* k, int device, void* stream);

#ifdef __cplusplus
}
#endif
#endif /* FLEXJIT_H */
