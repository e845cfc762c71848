// The C API over the C++ one: every entry point catches every exception and turns it into
// a status code plus this thread's error text (as fmt's C API does).
#include "runtime/capi/flexjit.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dsl/compile_error.h"
#include "dsl/spec.h"
#include "runtime/device.h"
#include "runtime/forward_launch.h"
#include "runtime/flexjit.hpp"
#include "runtime/ring.h"
#include "runtime/ring_nccl.h"

struct flexjit_runtime {
  flexjit::Runtime rt;
};
struct flexjit_kernel {
  std::shared_ptr<flexjit::Kernel> kernel;
};
struct flexjit_args {
  flexjit::AttentionArgs args;  // also holds what backward, varlen and decode launches share
  float* lse = nullptr;         // its shape depends on the launch kind
  // Backward.
  const void* d_o = nullptr;
  void *dq = nullptr, *dk = nullptr, *dv = nullptr;
  std::vector<std::pair<std::string, float*>> grads;
  bool deterministic = false;
  flexjit::BackwardDqMode dq_mode = flexjit::BackwardDqMode::Auto;
  // Ragged prefill.
  flexjit::Tensor cu_seqlens_q, cu_seqlens_kv;
  int max_seqlen_q = 0, max_seqlen_kv = 0;
  bool queries_at_kv_end = false;
  // Decode.
  flexjit::Tensor page_table, kv_lens, q_lens;
  std::optional<flexjit::DType> kv_dtype;  // k and v's when it is not q's (an FP8 cache)
  flexjit::Tensor k_scale, v_scale;
};
struct flexjit_decode_plan {
  std::unique_ptr<flexjit::DecodePlan> plan;
};
struct flexjit_ring {
  std::unique_ptr<flexjit::RingAttention> ring;
};

namespace {

thread_local std::string t_error;
thread_local std::string t_diagnostics = "[]";

template <class F>
flexjit_status guarded(F&& f) {
  t_error.clear();
  try {
    f();
    return FLEXJIT_OK;
  } catch (const flexjit::CompileError& e) {
    t_error = e.what();
    t_diagnostics = e.diagnostics().render_json();
    return FLEXJIT_ERROR_COMPILE;
  } catch (const flexjit::Error& e) {
    t_error = e.what();
    return t_error.rfind("no CUDA driver", 0) == 0 ? FLEXJIT_ERROR_NO_DEVICE : FLEXJIT_ERROR_USER;
  } catch (const std::exception& e) {
    t_error = std::string("internal error: ") + e.what();
    return FLEXJIT_ERROR_INTERNAL;
  } catch (...) {
    t_error = "internal error: unknown exception";
    return FLEXJIT_ERROR_INTERNAL;
  }
}

flexjit_status invalid(const char* what) {
  t_error = what;
  return FLEXJIT_ERROR_INVALID_ARGUMENT;
}

bool to_dtype(flexjit_dtype d, flexjit::DType* out) {
  switch (d) {
    case FLEXJIT_F32: *out = flexjit::DType::F32; return true;
    case FLEXJIT_F16: *out = flexjit::DType::F16; return true;
    case FLEXJIT_BF16: *out = flexjit::DType::BF16; return true;
    case FLEXJIT_I32: *out = flexjit::DType::I32; return true;
    case FLEXJIT_I64: *out = flexjit::DType::I64; return true;
    case FLEXJIT_U8: *out = flexjit::DType::U8; return true;
    case FLEXJIT_BOOL: *out = flexjit::DType::Bool; return true;
    case FLEXJIT_F8E4M3: case FLEXJIT_F8E5M2: return false;  // KV caches only: to_kv_dtype
  }
  return false;
}

// A KV cache's element type: any of to_dtype's (the C++ API rejects those it does not support) or FP8.
bool to_kv_dtype(flexjit_dtype d, flexjit::DType* out) {
  if (d == FLEXJIT_F8E4M3) *out = flexjit::DType::F8E4M3;
  else if (d == FLEXJIT_F8E5M2) *out = flexjit::DType::F8E5M2;
  else return to_dtype(d, out);
  return true;
}

// The LSE tensor of a [B, H, Sq, D] launch (none when no pointer was set).
flexjit::Tensor lse_of_bhsd(const flexjit_args& a) {
  const auto& s = a.args.q.shape;
  if (!a.lse) return {};
  if (s.size() != 4) throw flexjit::Error("the LSE needs q's shape: call flexjit_args_set_qkvo or flexjit_args_set_decode first");
  return flexjit::Tensor{a.lse, flexjit::DType::F32, {s[0], s[1], s[2]}, {}};
}

flexjit::AttentionArgs forward_args(const flexjit_args& a) {
  flexjit::AttentionArgs f = a.args;
  f.lse = lse_of_bhsd(a);
  return f;
}

flexjit::Tensor like(const flexjit::Tensor& t, const void* data) { return flexjit::Tensor{const_cast<void*>(data), t.dtype, t.shape, t.strides}; }

// flexjit_args_set_grad's gradients as tensors of their buffers' shapes.
std::vector<std::pair<std::string, flexjit::Tensor>> grads_of(const flexjit_args& a) {
  std::vector<std::pair<std::string, flexjit::Tensor>> out;
  for (const auto& [name, grad] : a.grads) {
    const flexjit::Tensor* buffer = nullptr;
    for (const auto& [bn, t] : a.args.buffers)
      if (bn == name) buffer = &t;
    if (!buffer) throw flexjit::Error("flexjit_args_set_grad: set buffer `" + name + "` with flexjit_args_set_buffer too (its shape is the gradient's)");
    out.emplace_back(name, flexjit::Tensor{grad, flexjit::DType::F32, buffer->shape, {}});
  }
  return out;
}

flexjit::BackwardArgs backward_args(const flexjit_args& a) {
  const flexjit::AttentionArgs& f = a.args;
  if (!a.d_o) throw flexjit::Error("flexjit_backward: call flexjit_args_set_backward first (dO, dq, dk, dv)");
  if (!a.lse) throw flexjit::Error("flexjit_backward: the backward needs the forward's LSE; call flexjit_args_set_lse");
  flexjit::BackwardArgs b;
  b.q = f.q, b.k = f.k, b.v = f.v, b.o = f.o;
  b.d_o = like(f.o, a.d_o);
  b.lse = lse_of_bhsd(a);
  b.dq = like(f.q, a.dq), b.dk = like(f.k, a.dk), b.dv = like(f.v, a.dv);
  b.scale = f.scale;
  b.buffers = f.buffers;
  b.params = f.params;
  b.grads = grads_of(a);
  b.deterministic = a.deterministic;
  b.dq_mode = a.dq_mode;
  b.stream = f.stream;
  b.device = f.device;
  return b;
}

void check_addressable(const std::vector<std::pair<std::string, flexjit::Tensor>>& named) {
  for (const auto& [name, t] : named) flexjit::runtime::check_addressable(t, "buffer `" + name + "`");
}

flexjit::Tensor i32_vector(const int32_t* data, int64_t n) {
  return data ? flexjit::Tensor{const_cast<int32_t*>(data), flexjit::DType::I32, {n}, {}} : flexjit::Tensor{};
}

// The ragged launch of flexjit_args_set_varlen (the LSE as [H, total_q]), for `fn`.
flexjit::VarlenArgs varlen_args(const flexjit_args& a, const char* fn) {
  const flexjit::AttentionArgs& f = a.args;
  if (f.q.shape.size() != 3) throw flexjit::Error(fmt::format("{}: call flexjit_args_set_varlen first", fn));
  flexjit::VarlenArgs v;
  v.q = f.q, v.k = f.k, v.v = f.v, v.o = f.o;
  if (a.kv_dtype) v.k.dtype = v.v.dtype = *a.kv_dtype;
  v.k_scale = a.k_scale, v.v_scale = a.v_scale;
  if (a.lse) v.lse = flexjit::Tensor{a.lse, flexjit::DType::F32, {f.q.shape[1], f.q.shape[0]}, {}};
  v.cu_seqlens_q = a.cu_seqlens_q, v.cu_seqlens_kv = a.cu_seqlens_kv;
  v.max_seqlen_q = a.max_seqlen_q, v.max_seqlen_kv = a.max_seqlen_kv;
  v.queries_at_kv_end = a.queries_at_kv_end;
  v.scale = f.scale, v.buffers = f.buffers, v.params = f.params, v.stream = f.stream, v.device = f.device;
  return v;
}

flexjit_status plan_decode(const char* fn, flexjit_kernel* k, int device, int batch, int heads, int kv_heads, int max_seqlen_q, int max_seqlen_kv,
                           int page_size, int head_major_pages, std::optional<flexjit::DType> kv_dtype, flexjit_decode_plan** out) {
  if (!k || !out || device < -2) return invalid(fmt::format("{}: NULL kernel or out, or a device below -2", fn).c_str());
  return guarded([&] {
    flexjit::DecodePlanOptions o;
    o.device = device == -2 ? flexjit::Device::cpu() : flexjit::Device::cuda(device < 0 ? 0 : device);
    o.batch = batch, o.heads = heads, o.kv_heads = kv_heads;
    o.max_seqlen_q = max_seqlen_q, o.max_seqlen_kv = max_seqlen_kv;
    o.page_size = page_size, o.head_major_pages = head_major_pages != 0;
    o.kv_dtype = kv_dtype;
    *out = new flexjit_decode_plan{k->kernel->plan_decode(o)};
  });
}

}  // namespace

extern "C" {

const char* flexjit_last_error(void) { return t_error.c_str(); }
const char* flexjit_last_diagnostics_json(void) { return t_diagnostics.c_str(); }

flexjit_status flexjit_runtime_create(flexjit_runtime** out) {
  if (!out) return invalid("flexjit_runtime_create: out is NULL");
  return guarded([&] { *out = new flexjit_runtime(); });
}

void flexjit_runtime_destroy(flexjit_runtime* rt) { delete rt; }

int flexjit_device_count(void) {
  int n = 0;
  guarded([&] { n = flexjit::Runtime::device_count(); });
  return n;
}

flexjit_status flexjit_compile(flexjit_runtime* rt, const char* spec_json, flexjit_kernel** out) {
  if (!rt || !spec_json || !out) return invalid("flexjit_compile: a handle, the spec or out is NULL");
  t_diagnostics = "[]";
  return guarded([&] {
    flexjit::dsl::Diagnostics diags;
    auto spec = flexjit::dsl::parse_spec_json(spec_json, "spec", diags);
    if (!spec) throw flexjit::CompileError(std::move(diags));
    *out = new flexjit_kernel{rt->rt.compile(*spec)};
  });
}

void flexjit_kernel_destroy(flexjit_kernel* k) { delete k; }

flexjit_status flexjit_args_create(flexjit_args** out) {
  if (!out) return invalid("flexjit_args_create: out is NULL");
  return guarded([&] { *out = new flexjit_args(); });
}

void flexjit_args_destroy(flexjit_args* a) { delete a; }

flexjit_status flexjit_args_set_qkvo(flexjit_args* a, const void* q, const void* k, const void* v, void* o, flexjit_dtype dtype, int64_t B,
                                     int64_t H, int64_t Hkv, int64_t Sq, int64_t Skv, int64_t D) {
  flexjit::DType dt;
  if (!a || !to_dtype(dtype, &dt)) return invalid("flexjit_args_set_qkvo: NULL args or unknown dtype");
  return guarded([&] {
    a->args.q = flexjit::Tensor{const_cast<void*>(q), dt, {B, H, Sq, D}, {}};
    a->args.k = flexjit::Tensor{const_cast<void*>(k), dt, {B, Hkv, Skv, D}, {}};
    a->args.v = flexjit::Tensor{const_cast<void*>(v), dt, {B, Hkv, Skv, D}, {}};
    a->args.o = flexjit::Tensor{o, dt, {B, H, Sq, D}, {}};
  });
}

flexjit_status flexjit_args_set_strides(flexjit_args* a, const int64_t* qs, const int64_t* ks, const int64_t* vs, const int64_t* os) {
  if (!a) return invalid("flexjit_args_set_strides: NULL args");
  return guarded([&] {
    auto set = [](flexjit::Tensor& t, const int64_t* s) { t.strides = s ? std::vector<int64_t>(s, s + 4) : std::vector<int64_t>{}; };
    set(a->args.q, qs);
    set(a->args.k, ks);
    set(a->args.v, vs);
    set(a->args.o, os);
  });
}

flexjit_status flexjit_args_set_lse(flexjit_args* a, float* lse) {
  if (!a) return invalid("flexjit_args_set_lse: NULL args");
  a->lse = lse;
  return FLEXJIT_OK;
}

flexjit_status flexjit_args_set_buffer(flexjit_args* a, const char* name, const void* data, flexjit_dtype dtype, int rank,
                                       const int64_t* shape, const int64_t* strides) {
  flexjit::DType dt;
  if (!a || !name || !shape || rank < 0 || rank > 16 || !to_dtype(dtype, &dt))
    return invalid("flexjit_args_set_buffer: NULL argument, bad rank or unknown dtype");
  return guarded([&] {
    flexjit::Tensor t{const_cast<void*>(data), dt, std::vector<int64_t>(shape, shape + rank),
                      strides ? std::vector<int64_t>(strides, strides + rank) : std::vector<int64_t>{}};
    a->args.buffers.emplace_back(name, std::move(t));
  });
}

flexjit_status flexjit_args_set_param(flexjit_args* a, const char* name, double value) {
  if (!a || !name) return invalid("flexjit_args_set_param: NULL argument");
  return guarded([&] { a->args.params.emplace_back(name, value); });
}

flexjit_status flexjit_args_set_scale(flexjit_args* a, float scale) {
  if (!a) return invalid("flexjit_args_set_scale: NULL args");
  return guarded([&] { a->args.scale = scale; });
}

flexjit_status flexjit_args_set_stream(flexjit_args* a, void* stream, int device) {
  if (!a || device < -2) return invalid("flexjit_args_set_stream: NULL args or a device below -2");
  return guarded([&] {
    a->args.stream = static_cast<CUstream>(stream);
    a->args.device = device == -2 ? flexjit::Device::cpu() : flexjit::Device::cuda(device);
  });
}

flexjit_status flexjit_forward(flexjit_kernel* k, const flexjit_args* a) {
  if (!k || !a) return invalid("flexjit_forward: NULL kernel or args");
  return guarded([&] {
    flexjit::AttentionArgs f = forward_args(*a);
    for (auto [t, name] : {std::pair{&f.q, "q"}, {&f.k, "k"}, {&f.v, "v"}, {&f.o, "o"}, {&f.lse, "lse"}}) flexjit::runtime::check_addressable(*t, name);
    check_addressable(f.buffers);
    k->kernel->forward(f);
  });
}

flexjit_status flexjit_args_set_backward(flexjit_args* a, const void* d_o, void* dq, void* dk, void* dv) {
  if (!a || !d_o || !dq || !dk || !dv) return invalid("flexjit_args_set_backward: NULL args, dO, dq, dk or dv");
  a->d_o = d_o, a->dq = dq, a->dk = dk, a->dv = dv;
  return FLEXJIT_OK;
}

flexjit_status flexjit_args_set_grad(flexjit_args* a, const char* name, float* grad) {
  if (!a || !name || !grad) return invalid("flexjit_args_set_grad: NULL args, name or gradient");
  return guarded([&] { a->grads.emplace_back(name, grad); });
}

flexjit_status flexjit_args_set_deterministic(flexjit_args* a, int deterministic) {
  if (!a) return invalid("flexjit_args_set_deterministic: NULL args");
  a->deterministic = deterministic != 0;
  return FLEXJIT_OK;
}

flexjit_status flexjit_args_set_backward_dq(flexjit_args* a, flexjit_bwd_dq mode) {
  if (!a) return invalid("flexjit_args_set_backward_dq: NULL args");
  switch (mode) {
    case FLEXJIT_BWD_DQ_AUTO: a->dq_mode = flexjit::BackwardDqMode::Auto; return FLEXJIT_OK;
    case FLEXJIT_BWD_DQ_ATOMIC: a->dq_mode = flexjit::BackwardDqMode::Atomic; return FLEXJIT_OK;
    case FLEXJIT_BWD_DQ_QUERY_MAJOR: a->dq_mode = flexjit::BackwardDqMode::QueryMajor; return FLEXJIT_OK;
  }
  return invalid("flexjit_args_set_backward_dq: mode must be FLEXJIT_BWD_DQ_AUTO, _ATOMIC or _QUERY_MAJOR");
}

flexjit_status flexjit_backward(flexjit_kernel* k, const flexjit_args* a) {
  if (!k || !a) return invalid("flexjit_backward: NULL kernel or args");
  return guarded([&] {
    flexjit::BackwardArgs g = backward_args(*a);
    for (auto [t, name] : {std::pair{&g.q, "q"}, {&g.k, "k"}, {&g.v, "v"}, {&g.o, "o"}, {&g.d_o, "dO"}, {&g.lse, "lse"}, {&g.dq, "dq"},
                           {&g.dk, "dk"}, {&g.dv, "dv"}})
      flexjit::runtime::check_addressable(*t, name);
    check_addressable(g.buffers);
    check_addressable(g.grads);
    k->kernel->backward(g);
  });
}

flexjit_status flexjit_args_set_varlen(flexjit_args* a, const void* q, const void* k, const void* v, void* o, flexjit_dtype dtype,
                                       int64_t total_q, int64_t total_kv, int64_t H, int64_t Hkv, int64_t D, int64_t batch,
                                       const int32_t* cu_seqlens_q, const int32_t* cu_seqlens_kv, int max_seqlen_q, int max_seqlen_kv) {
  flexjit::DType dt;
  if (!a || !to_dtype(dtype, &dt) || !cu_seqlens_q || !cu_seqlens_kv || batch < 1)
    return invalid("flexjit_args_set_varlen: NULL args or offsets, unknown dtype, or batch < 1");
  return guarded([&] {
    a->args.q = flexjit::Tensor{const_cast<void*>(q), dt, {total_q, H, D}, {}};
    a->args.k = flexjit::Tensor{const_cast<void*>(k), dt, {total_kv, Hkv, D}, {}};
    a->args.v = flexjit::Tensor{const_cast<void*>(v), dt, {total_kv, Hkv, D}, {}};
    a->args.o = flexjit::Tensor{o, dt, {total_q, H, D}, {}};
    a->cu_seqlens_q = i32_vector(cu_seqlens_q, batch + 1);
    a->cu_seqlens_kv = i32_vector(cu_seqlens_kv, batch + 1);
    a->max_seqlen_q = max_seqlen_q;
    a->max_seqlen_kv = max_seqlen_kv;
  });
}

flexjit_status flexjit_args_set_queries_at_kv_end(flexjit_args* a, int at_kv_end) {
  if (!a) return invalid("flexjit_args_set_queries_at_kv_end: NULL args");
  a->queries_at_kv_end = at_kv_end != 0;
  return FLEXJIT_OK;
}

flexjit_status flexjit_forward_varlen(flexjit_kernel* k, const flexjit_args* a) {
  if (!k || !a) return invalid("flexjit_forward_varlen: NULL kernel or args");
  return guarded([&] {
    flexjit::VarlenArgs v = varlen_args(*a, "flexjit_forward_varlen");
    for (auto [t, name] : {std::pair{&v.q, "q"}, {&v.k, "k"}, {&v.v, "v"}, {&v.o, "o"}, {&v.lse, "lse"}, {&v.k_scale, "k_scale"}, {&v.v_scale, "v_scale"}})
      flexjit::runtime::check_addressable(*t, name);
    check_addressable(v.buffers);
    k->kernel->forward_varlen(v);
  });
}

flexjit_status flexjit_backward_varlen(flexjit_kernel* k, const flexjit_args* a) {
  if (!k || !a) return invalid("flexjit_backward_varlen: NULL kernel or args");
  return guarded([&] {
    const flexjit::VarlenArgs f = varlen_args(*a, "flexjit_backward_varlen");
    if (f.queries_at_kv_end) throw flexjit::Error("flexjit_backward_varlen: the ragged backward has no queries_at_kv_end; set it to 0");
    if (!a->d_o) throw flexjit::Error("flexjit_backward_varlen: call flexjit_args_set_backward first (dO, dq, dk, dv)");
    if (!a->lse) throw flexjit::Error("flexjit_backward_varlen: the backward needs the forward's [H, total_q] LSE; call flexjit_args_set_lse");
    flexjit::VarlenBackwardArgs b;
    b.q = f.q, b.k = f.k, b.v = f.v, b.o = f.o, b.lse = f.lse;
    b.d_o = like(f.o, a->d_o);
    b.dq = like(f.q, a->dq), b.dk = like(f.k, a->dk), b.dv = like(f.v, a->dv);
    b.cu_seqlens_q = f.cu_seqlens_q, b.cu_seqlens_kv = f.cu_seqlens_kv;
    b.max_seqlen_q = f.max_seqlen_q, b.max_seqlen_kv = f.max_seqlen_kv;
    b.scale = f.scale, b.buffers = f.buffers, b.params = f.params;
    b.grads = grads_of(*a);
    b.deterministic = a->deterministic;
    b.stream = f.stream, b.device = f.device;
    for (auto [t, name] : {std::pair{&b.q, "q"}, {&b.k, "k"}, {&b.v, "v"}, {&b.o, "o"}, {&b.d_o, "dO"}, {&b.lse, "lse"}, {&b.dq, "dq"},
                           {&b.dk, "dk"}, {&b.dv, "dv"}})
      flexjit::runtime::check_addressable(*t, name);
    check_addressable(b.buffers);
    check_addressable(b.grads);
    k->kernel->backward_varlen(b);
  });
}

flexjit_status flexjit_plan_decode(flexjit_kernel* k, int device, int batch, int heads, int kv_heads, int max_seqlen_q, int max_seqlen_kv,
                                   int page_size, int head_major_pages, flexjit_decode_plan** out) {
  return plan_decode("flexjit_plan_decode", k, device, batch, heads, kv_heads, max_seqlen_q, max_seqlen_kv, page_size, head_major_pages,
                     std::nullopt, out);
}

flexjit_status flexjit_plan_decode_kv(flexjit_kernel* k, int device, int batch, int heads, int kv_heads, int max_seqlen_q, int max_seqlen_kv,
                                      int page_size, int head_major_pages, flexjit_dtype kv_dtype, flexjit_decode_plan** out) {
  flexjit::DType dt;
  if (!to_kv_dtype(kv_dtype, &dt))
    return invalid("flexjit_plan_decode_kv: unknown kv_dtype; use the spec's dtype (e.g. FLEXJIT_BF16), FLEXJIT_F8E4M3 or FLEXJIT_F8E5M2");
  return plan_decode("flexjit_plan_decode_kv", k, device, batch, heads, kv_heads, max_seqlen_q, max_seqlen_kv, page_size, head_major_pages, dt,
                     out);
}

void flexjit_decode_plan_destroy(flexjit_decode_plan* plan) { delete plan; }

int flexjit_decode_plan_num_splits(const flexjit_decode_plan* plan) { return plan ? plan->plan->num_splits() : 0; }

flexjit_status flexjit_args_set_decode(flexjit_args* a, const void* q, const void* k_cache, const void* v_cache, void* o, flexjit_dtype dtype,
                                       int64_t B, int64_t H, int64_t Sq, int64_t D, const int64_t* cache_shape, const int32_t* page_table,
                                       int64_t max_pages_per_seq, const int32_t* kv_lens, const int32_t* q_lens) {
  flexjit::DType dt;
  if (!a || !to_dtype(dtype, &dt) || !cache_shape || !kv_lens)
    return invalid("flexjit_args_set_decode: NULL args, cache shape or kv_lens, or unknown dtype");
  return guarded([&] {
    std::vector<int64_t> cs(cache_shape, cache_shape + 4);
    a->args.q = flexjit::Tensor{const_cast<void*>(q), dt, {B, H, Sq, D}, {}};
    a->args.k = flexjit::Tensor{const_cast<void*>(k_cache), dt, cs, {}};
    a->args.v = flexjit::Tensor{const_cast<void*>(v_cache), dt, cs, {}};
    a->args.o = flexjit::Tensor{o, dt, {B, H, Sq, D}, {}};
    a->page_table = page_table ? flexjit::Tensor{const_cast<int32_t*>(page_table), flexjit::DType::I32, {B, max_pages_per_seq}, {}}
                               : flexjit::Tensor{};
    a->kv_lens = i32_vector(kv_lens, B);
    a->q_lens = i32_vector(q_lens, B);
  });
}

flexjit_status flexjit_args_set_decode_kv_dtype(flexjit_args* a, flexjit_dtype kv_dtype) {
  flexjit::DType dt;
  if (!a) return invalid("flexjit_args_set_decode_kv_dtype: NULL args");
  if (!to_kv_dtype(kv_dtype, &dt))
    return invalid("flexjit_args_set_decode_kv_dtype: unknown kv_dtype; use FLEXJIT_F8E4M3, FLEXJIT_F8E5M2 or q's dtype");
  a->kv_dtype = dt;
  return FLEXJIT_OK;
}

flexjit_status flexjit_args_set_kv_scales(flexjit_args* a, const float* k_scale, const float* v_scale, int64_t n) {
  if (!a) return invalid("flexjit_args_set_kv_scales: NULL args");
  if ((k_scale || v_scale) && n < 1) return invalid("flexjit_args_set_kv_scales: n must be the number of KV heads or 1");
  auto scale = [n](const float* p) { return p ? flexjit::Tensor{const_cast<float*>(p), flexjit::DType::F32, {n}, {}} : flexjit::Tensor{}; };
  a->k_scale = scale(k_scale);
  a->v_scale = scale(v_scale);
  return FLEXJIT_OK;
}

flexjit_status flexjit_decode(flexjit_kernel* k, const flexjit_decode_plan* plan, const flexjit_args* a) {
  if (!k || !plan || !a) return invalid("flexjit_decode: NULL kernel, plan or args");
  return guarded([&] {
    const flexjit::AttentionArgs& f = a->args;
    if (!a->kv_lens.data) throw flexjit::Error("flexjit_decode: call flexjit_args_set_decode first");
    flexjit::DecodeArgs d;
    d.q = f.q, d.k = f.k, d.v = f.v, d.o = f.o;
    if (a->kv_dtype) d.k.dtype = d.v.dtype = *a->kv_dtype;
    d.k_scale = a->k_scale, d.v_scale = a->v_scale;
    d.lse = lse_of_bhsd(*a);
    d.page_table = a->page_table, d.kv_lens = a->kv_lens, d.q_lens = a->q_lens;
    d.scale = f.scale, d.buffers = f.buffers, d.params = f.params, d.stream = f.stream;
    for (auto [t, name] : {std::pair{&d.q, "q"}, {&d.k, "k cache"}, {&d.v, "v cache"}, {&d.o, "o"}, {&d.lse, "lse"}, {&d.page_table, "page_table"},
                           {&d.k_scale, "k_scale"}, {&d.v_scale, "v_scale"}})
      flexjit::runtime::check_addressable(*t, name);
    check_addressable(d.buffers);
    k->kernel->decode(*plan->plan, d);
  });
}

namespace {

bool to_sharding(flexjit_ring_sharding s, flexjit::RingSharding* out) {
  if (s == FLEXJIT_RING_ZIGZAG) *out = flexjit::RingSharding::Zigzag;
  else if (s == FLEXJIT_RING_CONTIGUOUS) *out = flexjit::RingSharding::Contiguous;
  else return false;
  return true;
}

// A device argument of the ring functions: -2 the CPU backend, -1 the device the shards live on, N cuda:N.
flexjit::Device to_device(int device) { return device == -2 ? flexjit::Device::cpu() : flexjit::Device::cuda(device); }

bool same_device(const flexjit::Device& a, const flexjit::Device& b) { return a.kind == b.kind && a.index == b.index; }

// The ring's shards from one flexjit_args per local rank, all on one device; buffers, parameters, scale, stream and
// gradients are the first's.
flexjit::RingArgs ring_args(const char* fn, const std::vector<int>& ranks, flexjit_args* const* rank_args, bool backward) {
  flexjit::RingArgs ring;
  for (size_t i = 0; i < ranks.size(); ++i) {
    const int r = ranks[i];
    const flexjit_args& a = *rank_args[i];
    if (!same_device(a.args.device, rank_args[0]->args.device))
      throw flexjit::Error(fmt::format("{}: rank {}'s args are on {} but rank {}'s on {}; every rank of this process runs on one device "
                                       "(flexjit_args_set_stream)",
                                       fn, r, a.args.device.str(), ranks[0], rank_args[0]->args.device.str()));
    if (!a.lse) throw flexjit::Error(fmt::format("{}: rank {} has no LSE; call flexjit_args_set_lse (f32 [B, H, rows])", fn, r));
    flexjit::RingShard shard;
    const flexjit::AttentionArgs f = forward_args(a);
    shard.q = f.q, shard.k = f.k, shard.v = f.v, shard.o = f.o, shard.lse = f.lse;
    if (backward) {
      const flexjit::BackwardArgs b = backward_args(a);
      shard.d_o = b.d_o, shard.dq = b.dq, shard.dk = b.dk, shard.dv = b.dv;
      if (i == 0) ring.grads = b.grads;
    }
    if (i == 0) {
      ring.scale = f.scale;
      ring.buffers = f.buffers;
      ring.params = f.params;
      ring.stream = f.stream;
    }
    ring.shards.push_back(shard);
  }
  return ring;
}

// Runs the ring's forward or backward over one flexjit_args per local rank.
void ring_run(const char* fn, flexjit::RingAttention& ring, flexjit_args* const* rank_args, bool backward) {
  const std::vector<int>& ranks = ring.local_ranks();
  const flexjit::Device want = ring.options().device;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (!rank_args[i]) throw flexjit::Error(fmt::format("{}: the args of rank {} are NULL", fn, ranks[i]));
    if (rank_args[i]->args.device.kind != want.kind || (want.index >= 0 && rank_args[i]->args.device.index >= 0 &&
                                                        rank_args[i]->args.device.index != want.index))
      throw flexjit::Error(fmt::format("{}: rank {}'s args are on {} but the ring runs on {}; set their device with flexjit_args_set_stream",
                                       fn, ranks[i], rank_args[i]->args.device.str(), want.str()));
  }
  const flexjit::RingArgs args = ring_args(fn, ranks, rank_args, backward);
  if (backward) ring.backward(args);
  else ring.forward(args);
}

flexjit_status ring_launch(const char* fn, flexjit_kernel* k, int ranks, flexjit_ring_sharding sharding, int64_t seqlen,
                           flexjit_args* const* rank_args, bool backward) {
  flexjit::RingSharding sh;
  if (!k || !rank_args) return invalid(fmt::format("{}: NULL kernel or rank_args", fn).c_str());
  if (!to_sharding(sharding, &sh)) return invalid(fmt::format("{}: unknown sharding {}", fn, int(sharding)).c_str());
  if (ranks < 1) return invalid(fmt::format("{}: {} ranks; a ring needs at least one", fn, ranks).c_str());
  for (int r = 0; r < ranks; ++r)
    if (!rank_args[r]) return invalid(fmt::format("{}: rank_args[{}] is NULL", fn, r).c_str());
  return guarded([&] {
    flexjit::RingAttention ring(k->kernel, flexjit::RingOptions{ranks, sh, seqlen, rank_args[0]->args.device});
    ring_run(fn, ring, rank_args, backward);
  });
}

}  // namespace

flexjit_status flexjit_ring_chunks(int64_t seqlen, int ranks, int rank, flexjit_ring_sharding sharding, int64_t first[2], int64_t rows[2],
                                   int* n) {
  flexjit::RingSharding sh;
  if (!first || !rows || !n) return invalid("flexjit_ring_chunks: NULL first, rows or n");
  if (!to_sharding(sharding, &sh)) return invalid("flexjit_ring_chunks: unknown sharding");
  return guarded([&] {
    const std::vector<flexjit::RingChunk> chunks = flexjit::ring_chunks(seqlen, ranks, rank, sh);
    *n = static_cast<int>(chunks.size());
    for (size_t i = 0; i < chunks.size(); ++i) first[i] = chunks[i].first, rows[i] = chunks[i].rows;
  });
}

flexjit_status flexjit_ring_forward(flexjit_kernel* k, int ranks, flexjit_ring_sharding sharding, int64_t seqlen,
                                    flexjit_args* const* rank_args) {
  return ring_launch("flexjit_ring_forward", k, ranks, sharding, seqlen, rank_args, false);
}

flexjit_status flexjit_ring_backward(flexjit_kernel* k, int ranks, flexjit_ring_sharding sharding, int64_t seqlen,
                                     flexjit_args* const* rank_args) {
  return ring_launch("flexjit_ring_backward", k, ranks, sharding, seqlen, rank_args, true);
}

flexjit_status flexjit_nccl_unique_id(unsigned char id[128]) {
  if (!id) return invalid("flexjit_nccl_unique_id: NULL id");
  return guarded([&] {
    const flexjit::runtime::NcclUniqueId u = flexjit::nccl_unique_id();
    std::memcpy(id, u.internal, sizeof u.internal);
  });
}

flexjit_status flexjit_ring_create(flexjit_kernel* k, int ranks, flexjit_ring_sharding sharding, int64_t seqlen, int device, flexjit_ring** out) {
  flexjit::RingSharding sh;
  if (!k || !out) return invalid("flexjit_ring_create: NULL kernel or out");
  *out = nullptr;
  if (!to_sharding(sharding, &sh)) return invalid("flexjit_ring_create: unknown sharding");
  if (device < -2) return invalid("flexjit_ring_create: a device below -2");
  return guarded([&] {
    auto ring = std::make_unique<flexjit_ring>();
    ring->ring = std::make_unique<flexjit::RingAttention>(k->kernel, flexjit::RingOptions{ranks, sh, seqlen, to_device(device)});
    *out = ring.release();
  });
}

flexjit_status flexjit_ring_create_nccl(flexjit_kernel* k, int ranks, int rank, flexjit_ring_sharding sharding, int64_t seqlen, int device,
                                        const unsigned char* unique_id, void* nccl_comm, flexjit_ring** out) {
  flexjit::RingSharding sh;
  if (!k || !out) return invalid("flexjit_ring_create_nccl: NULL kernel or out");
  *out = nullptr;
  if (!to_sharding(sharding, &sh)) return invalid("flexjit_ring_create_nccl: unknown sharding");
  if (device < 0) return invalid("flexjit_ring_create_nccl: give this process's GPU (device 0 or more)");
  if ((unique_id == nullptr) == (nccl_comm == nullptr))
    return invalid("flexjit_ring_create_nccl: pass exactly one of unique_id (from flexjit_nccl_unique_id) and nccl_comm (an ncclComm_t)");
  return guarded([&] {
    flexjit::NcclRingOptions o;
    o.ranks = ranks;
    o.rank = rank;
    o.device = device;
    std::shared_ptr<flexjit::RingTransport> transport;
    if (unique_id) {
      flexjit::runtime::NcclUniqueId id;
      std::memcpy(id.internal, unique_id, sizeof id.internal);
      transport = std::make_shared<flexjit::NcclRingTransport>(o, id);
    } else {
      transport = std::make_shared<flexjit::NcclRingTransport>(o, static_cast<flexjit::runtime::NcclComm>(nccl_comm));
    }
    auto ring = std::make_unique<flexjit_ring>();
    ring->ring = std::make_unique<flexjit::RingAttention>(k->kernel, flexjit::RingOptions{ranks, sh, seqlen, flexjit::Device::cuda(device)},
                                                          transport);
    *out = ring.release();
  });
}

void flexjit_ring_destroy(flexjit_ring* ring) { delete ring; }

flexjit_status flexjit_ring_run_forward(flexjit_ring* ring, flexjit_args* const* local_args) {
  if (!ring || !local_args) return invalid("flexjit_ring_run_forward: NULL ring or local_args");
  return guarded([&] { ring_run("flexjit_ring_run_forward", *ring->ring, local_args, false); });
}

flexjit_status flexjit_ring_run_backward(flexjit_ring* ring, flexjit_args* const* local_args) {
  if (!ring || !local_args) return invalid("flexjit_ring_run_backward: NULL ring or local_args");
  return guarded([&] { ring_run("flexjit_ring_run_backward", *ring->ring, local_args, true); });
}

flexjit_status flexjit_ring_check_errors(flexjit_ring* ring) {
  if (!ring) return invalid("flexjit_ring_check_errors: NULL ring");
  return guarded([&] { ring->ring->check_errors(); });
}

flexjit_status flexjit_check_errors(flexjit_kernel* k, int device, void* stream) {
  if (!k) return invalid("flexjit_check_errors: NULL kernel");
  return guarded([&] { k->kernel->check_errors(device, static_cast<CUstream>(stream)); });
}

}  // extern "C"
