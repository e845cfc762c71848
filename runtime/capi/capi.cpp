// The C API over the C++ one: every entry point catches every exception and turns it into
// a status code plus this thread's error text (as fmt's C API does).
#include "runtime/capi/flexjit.h"

#include <string>

#include "dsl/compile_error.h"
#include "dsl/spec.h"
#include "runtime/device.h"
#include "runtime/flexjit.hpp"

struct flexjit_runtime {
  flexjit::Runtime rt;
};
struct flexjit_kernel {
  std::shared_ptr<flexjit::Kernel> kernel;
};
struct flexjit_args {
  flexjit::AttentionArgs args;
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
  }
  return false;
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
  return guarded([&] {
    const auto& s = a->args.q.shape;
    if (s.size() != 4) throw flexjit::Error("flexjit_args_set_lse: call flexjit_args_set_qkvo first");
    a->args.lse = flexjit::Tensor{lse, flexjit::DType::F32, {s[0], s[1], s[2]}, {}};
  });
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
  return guarded([&] { k->kernel->forward(a->args); });
}

flexjit_status flexjit_check_errors(flexjit_kernel* k, int device, void* stream) {
  if (!k) return invalid("flexjit_check_errors: NULL kernel");
  return guarded([&] { k->kernel->check_errors(device, static_cast<CUstream>(stream)); });
}

}  // extern "C"
