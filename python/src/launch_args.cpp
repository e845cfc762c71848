#include "launch_args.h"

#include <cmath>

#include "dsl/error.h"

namespace flexjit::python {

namespace {

std::optional<std::string_view> optional_text(nb::handle obj, const char* what) {
  if (obj.is_none()) return std::nullopt;
  if (!nb::isinstance<nb::str>(obj))
    throw Error(std::string(what) + " must be a str (the mod's program text) or None, got " + nb::cast<std::string>(nb::type_name(obj.type())));
  Py_ssize_t size = 0;
  const char* text = PyUnicode_AsUTF8AndSize(obj.ptr(), &size);
  if (!text) throw nb::python_error();
  return std::string_view(text, static_cast<size_t>(size));
}

nb::dict require_dict(nb::handle obj, const char* what) {
  if (!nb::isinstance<nb::dict>(obj)) throw Error(std::string(what) + " must be a dict or None, got " + nb::cast<std::string>(nb::type_name(obj.type())));
  return nb::borrow<nb::dict>(obj);
}

std::string key_name(nb::handle key, const char* what) {
  if (!nb::isinstance<nb::str>(key)) throw Error(std::string(what) + " names must be str, got " + nb::cast<std::string>(nb::type_name(key.type())));
  return nb::cast<std::string>(key);
}

ParamArg read_param(const std::string& name, nb::handle value) {
  ParamArg p;
  p.name = name;
  if (nb::hasattr(value, "__flexjit_const__")) {
    p.is_const = true;
    value = value.attr("value");
  }
  PyObject* v = value.ptr();
  if (PyBool_Check(v)) {
    p.type = dsl::ValueType::Bool;
    p.value = v == Py_True ? 1 : 0;
  } else if (PyLong_Check(v) || (!PyFloat_Check(v) && nb::hasattr(value, "__index__"))) {
    p.type = dsl::ValueType::Int;
    long long i = nb::cast<long long>(value.attr("__index__")());
    if (std::llabs(i) > (1LL << 53)) throw Error("parameter `" + name + "` = " + std::to_string(i) + " is too large (the limit is 2^53)");
    p.value = static_cast<double>(i);
  } else if (PyFloat_Check(v) || nb::hasattr(value, "__float__")) {
    p.type = dsl::ValueType::Float;
    p.value = PyFloat_AsDouble(v);
    if (PyErr_Occurred()) throw nb::python_error();
  } else {
    throw Error("parameter `" + name + "` must be a bool, int or float, got " + nb::cast<std::string>(nb::type_name(value.type())));
  }
  return p;
}

}  // namespace

void LaunchArgs::read_mods(nb::handle score_mod, nb::handle mask_mod) {
  request.score_mod = optional_text(score_mod, "score_mod");
  request.mask_mod = optional_text(mask_mod, "mask_mod");
}

void LaunchArgs::read_buffers(nb::handle buffers, const LaunchSizes& sizes) {
  if (buffers.is_none()) return;
  for (auto [key, value] : require_dict(buffers, "buffers")) {
    BufferArg b;
    b.name = key_name(key, "buffer");
    nb::handle array = value;
    bool dims_given = false;
    if (nb::isinstance<nb::tuple>(value) && nb::len(value) == 2 && nb::isinstance<nb::str>(value[1])) {
      array = value[0];
      b.dims = nb::cast<std::string>(value[1]);
      dims_given = true;
    }
    b.tensor = views.view(array, "buffer `" + b.name + "`");
    if (b.tensor.shape.empty())
      throw Error("buffer `" + b.name + "` has no dimensions; pass a scalar as a parameter, or the array reshaped to [1] and index it with [0]");
    if (!dims_given) b.dims = declared_dims(b.tensor.shape, sizes);
    request.buffers.push_back(std::move(b));
  }
}

void LaunchArgs::read_params(nb::handle params) {
  if (params.is_none()) return;
  for (auto [key, value] : require_dict(params, "params")) request.params.push_back(read_param(key_name(key, "parameter"), value));
}

void LaunchArgs::read_grads(nb::handle grads) {
  if (grads.is_none()) return;
  for (nb::handle name : grads) request.grads.push_back(key_name(name, "gradient buffer"));
}

void LaunchArgs::set_operands(const Tensor& q, const Tensor& v) {
  request.dtype = q.dtype;
  request.head_dim = q.shape.back();
  request.head_dim_v = v.shape.back();
}

void require_rank(const Tensor& t, size_t rank, const char* name, const char* layout) {
  if (t.shape.size() != rank)
    throw Error(std::string(name) + " must have " + std::to_string(rank) + " dimensions " + layout + ", but has " + std::to_string(t.shape.size()));
}

CUstream stream_of(uintptr_t handle) { return reinterpret_cast<CUstream>(handle); }

}  // namespace flexjit::python
