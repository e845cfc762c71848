// The flexjit._flexjit extension module: the launches of launches.h, the block-mask and
// decode-plan handles, and flexjit errors raised as the Python exceptions of flexjit._errors.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>

#include "dsl/compile_error.h"
#include "launches.h"
#include "tensor_views.h"
#ifdef FLEXJIT_HAVE_CPU_BACKEND
#include "runtime/cpu/cpu_backend.h"
#endif

namespace nb = nanobind;
using namespace nb::literals;

namespace flexjit::python {

namespace {

// Raises flexjit._errors.<name>(message[, diagnostics_json]).
void raise_python(const char* name, const char* message, const std::string* diagnostics_json) {
  try {
    nb::object type = nb::module_::import_("flexjit._errors").attr(name);
    nb::object error = diagnostics_json ? type(message, *diagnostics_json) : type(message);
    PyErr_SetObject(type.ptr(), error.ptr());
  } catch (const nb::python_error& e) {
    PyErr_SetString(PyExc_RuntimeError, message);
  }
}

void translate_errors(const std::exception_ptr& p, void*) {
  try {
    std::rethrow_exception(p);
  } catch (const CompileError& e) {
    std::string json = e.diagnostics().render_json();
    raise_python("CompileError", e.what(), &json);
  } catch (const Error& e) {
    raise_python("FlexjitError", e.what(), nullptr);
  }
}

ModArgs mods(nb::handle score_mod, nb::handle mask_mod, nb::handle buffers, nb::handle params, nb::handle grads) {
  return ModArgs{score_mod, mask_mod, buffers, params, grads};
}

}  // namespace

}  // namespace flexjit::python

NB_MODULE(_flexjit, m) {
  using namespace flexjit::python;
  // Block masks and decode plans cached by Python objects may outlive the module's teardown.
  nb::set_leak_warnings(false);
  nb::register_exception_translator(translate_errors);
#ifdef FLEXJIT_HAVE_CPU_BACKEND
  flexjit::cpu::install();
  m.attr("cpu_backend") = true;
#else
  m.attr("cpu_backend") = false;
#endif

  nb::class_<BlockMasks>(m, "BlockMasks", "The device block masks of one flexjit.BlockMask, built per kernel and device on first use.")
      .def(nb::init<>());

  nb::class_<DecodeSession>(m, "DecodeSession", "A decode plan and the kernel it was made for.")
      .def_prop_ro("num_splits", [](const DecodeSession& s) { return s.plan->num_splits(); })
      .def_prop_ro("spec_json", [](const DecodeSession& s) { return flexjit::dsl::spec_to_json(s.kernel->spec()); })
      .def_prop_ro("kv_dtype", &decode_kv_dtype);

  m.def("device_count", [] { return flexjit::Runtime::device_count(); }, "The CUDA devices this process sees (0 without a driver).");
  m.def("register_torch", &register_torch, "tensor_type"_a, "dtypes"_a);

  m.def(
      "forward",
      [](nb::handle score_mod, nb::handle mask_mod, nb::handle buffers, nb::handle params, nb::handle grads, nb::handle q, nb::handle k, nb::handle v,
         nb::handle o, nb::handle lse, float scale, BlockMasks* block_mask, uintptr_t stream) {
        forward(mods(score_mod, mask_mod, buffers, params, grads), q, k, v, o, lse, scale, block_mask, stream);
      },
      "score_mod"_a.none(), "mask_mod"_a.none(), "buffers"_a.none(), "params"_a.none(), "grads"_a.none(), "q"_a, "k"_a, "v"_a, "o"_a,
      "lse"_a.none(), "scale"_a, "block_mask"_a.none(), "stream"_a);

  m.def(
      "time_forward",
      [](nb::handle score_mod, nb::handle mask_mod, nb::handle buffers, nb::handle params, nb::handle q, nb::handle k, nb::handle v, nb::handle o,
         nb::handle lse, float scale, uintptr_t stream, int iterations) {
        return time_forward(mods(score_mod, mask_mod, buffers, params, nb::none()), q, k, v, o, lse, scale, stream, iterations);
      },
      "score_mod"_a.none(), "mask_mod"_a.none(), "buffers"_a.none(), "params"_a.none(), "q"_a, "k"_a, "v"_a, "o"_a, "lse"_a.none(), "scale"_a,
      "stream"_a, "iterations"_a);

  m.def(
      "forward_spec",
      [](nb::handle score_mod, nb::handle mask_mod, nb::handle buffers, nb::handle params, nb::handle grads, nb::handle q, nb::handle k, nb::handle v) {
        return forward_spec(mods(score_mod, mask_mod, buffers, params, grads), q, k, v);
      },
      "score_mod"_a.none(), "mask_mod"_a.none(), "buffers"_a.none(), "params"_a.none(), "grads"_a.none(), "q"_a, "k"_a, "v"_a);

  m.def(
      "backward",
      [](nb::handle score_mod, nb::handle mask_mod, nb::handle buffers, nb::handle params, nb::handle q, nb::handle k, nb::handle v, nb::handle o,
         nb::handle lse, nb::handle d_o, nb::handle dq, nb::handle dk, nb::handle dv, nb::handle grad_outputs, float scale, bool deterministic,
         BlockMasks* block_mask, uintptr_t stream) {
        backward(mods(score_mod, mask_mod, buffers, params, nb::none()), q, k, v, o, lse, d_o, dq, dk, dv, grad_outputs, scale, deterministic, block_mask,
                 stream);
      },
      "score_mod"_a.none(), "mask_mod"_a.none(), "buffers"_a.none(), "params"_a.none(), "q"_a, "k"_a, "v"_a, "o"_a, "lse"_a, "grad_out"_a, "dq"_a,
      "dk"_a, "dv"_a, "grad_outputs"_a.none(), "scale"_a, "deterministic"_a, "block_mask"_a.none(), "stream"_a);

  m.def(
      "forward_varlen",
      [](nb::handle score_mod, nb::handle mask_mod, nb::handle buffers, nb::handle params, nb::handle q, nb::handle k, nb::handle v, nb::handle o,
         nb::handle lse, nb::handle cu_seqlens_q, nb::handle cu_seqlens_kv, int max_seqlen_q, int max_seqlen_kv, nb::handle k_scale,
         nb::handle v_scale, const std::string& kv_dtype, bool queries_at_kv_end, float scale, uintptr_t stream) {
        forward_varlen(mods(score_mod, mask_mod, buffers, params, nb::none()), q, k, v, o, lse, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q,
                       max_seqlen_kv, k_scale, v_scale, kv_dtype, queries_at_kv_end, scale, stream);
      },
      "score_mod"_a.none(), "mask_mod"_a.none(), "buffers"_a.none(), "params"_a.none(), "q"_a, "k"_a, "v"_a, "o"_a, "lse"_a.none(),
      "cu_seqlens_q"_a, "cu_seqlens_kv"_a, "max_seqlen_q"_a, "max_seqlen_kv"_a, "k_scale"_a.none(), "v_scale"_a.none(), "kv_dtype"_a,
      "queries_at_kv_end"_a, "scale"_a, "stream"_a);

  m.def(
      "backward_varlen",
      [](nb::handle score_mod, nb::handle mask_mod, nb::handle buffers, nb::handle params, nb::handle q, nb::handle k, nb::handle v, nb::handle o,
         nb::handle lse, nb::handle d_o, nb::handle dq, nb::handle dk, nb::handle dv, nb::handle cu_seqlens_q, nb::handle cu_seqlens_kv,
         int max_seqlen_q, int max_seqlen_kv, nb::handle grad_outputs, float scale, bool deterministic, uintptr_t stream) {
        backward_varlen(mods(score_mod, mask_mod, buffers, params, nb::none()), q, k, v, o, lse, d_o, dq, dk, dv, cu_seqlens_q, cu_seqlens_kv,
                        max_seqlen_q, max_seqlen_kv, grad_outputs, scale, deterministic, stream);
      },
      "score_mod"_a.none(), "mask_mod"_a.none(), "buffers"_a.none(), "params"_a.none(), "q"_a, "k"_a, "v"_a, "o"_a, "lse"_a, "grad_out"_a, "dq"_a,
      "dk"_a, "dv"_a, "cu_seqlens_q"_a, "cu_seqlens_kv"_a, "max_seqlen_q"_a, "max_seqlen_kv"_a, "grad_outputs"_a.none(), "scale"_a,
      "deterministic"_a, "stream"_a);

  m.def(
      "plan_decode",
      [](nb::handle score_mod, nb::handle mask_mod, nb::handle buffers, nb::handle params, const std::string& dtype, int head_dim, int head_dim_v,
         int device, int batch, int heads, int kv_heads, int max_seqlen_q, int max_seqlen_kv, int page_size, bool head_major_pages, int num_splits,
         const std::string& kv_dtype) {
        DecodeShape shape;
        shape.dtype = dtype;
        shape.kv_dtype = kv_dtype;
        shape.head_dim = head_dim;
        shape.head_dim_v = head_dim_v;
        flexjit::DecodePlanOptions& o = shape.options;
        o.device = device < 0 ? flexjit::Device::cpu() : flexjit::Device::cuda(device);
        o.batch = batch, o.heads = heads, o.kv_heads = kv_heads;
        o.max_seqlen_q = max_seqlen_q, o.max_seqlen_kv = max_seqlen_kv;
        o.page_size = page_size, o.head_major_pages = head_major_pages, o.num_splits = num_splits;
        return plan_decode(mods(score_mod, mask_mod, buffers, params, nb::none()), shape);
      },
      "score_mod"_a.none(), "mask_mod"_a.none(), "buffers"_a.none(), "params"_a.none(), "dtype"_a, "head_dim"_a, "head_dim_v"_a,
      "device"_a, "batch"_a, "heads"_a, "kv_heads"_a, "max_seqlen_q"_a, "max_seqlen_kv"_a, "page_size"_a, "head_major_pages"_a, "num_splits"_a,
      "kv_dtype"_a = "");

  m.def("decode", &decode, "session"_a, "buffers"_a.none(), "params"_a.none(), "q"_a, "k_cache"_a, "v_cache"_a, "o"_a, "lse"_a.none(),
        "page_table"_a.none(), "kv_lens"_a, "q_lens"_a.none(), "k_scale"_a.none(), "v_scale"_a.none(), "scale"_a, "stream"_a);

  m.def(
      "check_mods",
      [](nb::handle score_mod, nb::handle mask_mod, nb::handle buffers, nb::handle params, int64_t batch, int64_t heads, int64_t seqlen_q,
         int64_t seqlen_kv) { check_mods(mods(score_mod, mask_mod, buffers, params, nb::none()), batch, heads, seqlen_q, seqlen_kv); },
      "score_mod"_a.none(), "mask_mod"_a.none(), "buffers"_a.none(), "params"_a.none(), "batch"_a, "heads"_a, "seqlen_q"_a, "seqlen_kv"_a);

  m.def(
      "check_errors",
      [](int device, uintptr_t stream) {
        nb::gil_scoped_release release;
        check_errors(device, stream);
      },
      "device"_a, "stream"_a);
}
