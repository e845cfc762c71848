#include "tensor_views.h"

#include <cstdint>
#include <utility>

#include "dsl/error.h"

namespace flexjit::python {

namespace {

// torch.Tensor and its dtypes, registered by flexjit.torch (leaked references: they live as
// long as the interpreter).
struct TorchTypes {
  PyObject* tensor_type = nullptr;
  std::vector<std::pair<PyObject*, DType>> dtypes;
};

TorchTypes& torch_types() {
  static TorchTypes* types = new TorchTypes();
  return *types;
}

std::string python_type_name(nb::handle obj) { return nb::cast<std::string>(nb::type_name(obj.type())); }

const char* kSupportedDtypes = "float32, float16, bfloat16, int32, int64, uint8 or bool (float8_e4m3fn, float8_e5m2 for an FP8 KV cache)";

// DLPack's codes of the OCP FP8 formats (DLPack 1.1; numbers, as nanobind 2 has no names for them).
// float8_e4m3 (code 8, with infinities) and the fnuz variants are other formats.
constexpr uint8_t kDLFloat8_e4m3fn = 10, kDLFloat8_e5m2 = 12;

DType dlpack_dtype(nb::dlpack::dtype t, const std::string& what) {
  using Code = nb::dlpack::dtype_code;
  if (t.lanes == 1 && t.bits == 8 && t.code == kDLFloat8_e4m3fn) return DType::F8E4M3;
  if (t.lanes == 1 && t.bits == 8 && t.code == kDLFloat8_e5m2) return DType::F8E5M2;
  if (t.lanes == 1) {
    switch (static_cast<Code>(t.code)) {
      case Code::Float:
        if (t.bits == 32) return DType::F32;
        if (t.bits == 16) return DType::F16;
        break;
      case Code::Bfloat:
        if (t.bits == 16) return DType::BF16;
        break;
      case Code::Int:
        if (t.bits == 32) return DType::I32;
        if (t.bits == 64) return DType::I64;
        break;
      case Code::UInt:
        if (t.bits == 8) return DType::U8;
        break;
      case Code::Bool:
        if (t.bits == 8) return DType::Bool;
        break;
      default:
        break;
    }
  }
  static const char* names[] = {"int", "uint", "float", "opaque", "bfloat", "complex", "bool"};
  std::string name = t.code < 7 ? names[t.code] + std::to_string(t.bits) : "DLPack type " + std::to_string(t.code) + "/" + std::to_string(t.bits);
  if (t.lanes != 1) name += "x" + std::to_string(t.lanes);
  throw Error(what + " is " + name + "; flexjit takes " + kSupportedDtypes);
}

}  // namespace

void register_torch(nb::handle tensor_type, nb::dict dtypes) {
  TorchTypes& t = torch_types();
  if (t.tensor_type) return;
  for (auto [key, name] : dtypes) {
    std::optional<DType> d = dsl::parse_dtype(nb::cast<std::string>(name));
    if (!d) d = dsl::parse_kv_cache_dtype(nb::cast<std::string>(name));  // torch.float8_e4m3fn / float8_e5m2
    if (!d) throw Error("register_torch: unknown flexjit dtype " + nb::cast<std::string>(name));
    t.dtypes.emplace_back(key.inc_ref().ptr(), *d);
  }
  t.tensor_type = tensor_type.inc_ref().ptr();
}

Tensor TensorViews::torch_view(nb::handle obj, const std::string& what) {
  // Interned attribute names: these reads are most of the cost of a launch from Python.
  static PyObject* const kDtype = PyUnicode_InternFromString("dtype");
  static PyObject* const kIsCuda = PyUnicode_InternFromString("is_cuda");
  static PyObject* const kIsCpu = PyUnicode_InternFromString("is_cpu");
  static PyObject* const kGetDevice = PyUnicode_InternFromString("get_device");
  static PyObject* const kDataPtr = PyUnicode_InternFromString("data_ptr");
  static PyObject* const kShape = PyUnicode_InternFromString("shape");
  static PyObject* const kStride = PyUnicode_InternFromString("stride");
  auto attr = [&](PyObject* name) {
    nb::object value = nb::steal(PyObject_GetAttr(obj.ptr(), name));
    if (!value.is_valid()) throw nb::python_error();
    return value;
  };
  auto call = [&](PyObject* name) {
    nb::object value = nb::steal(PyObject_CallMethodNoArgs(obj.ptr(), name));
    if (!value.is_valid()) throw nb::python_error();
    return value;
  };
  Tensor out;
  nb::object dtype = attr(kDtype);
  bool known = false;
  for (const auto& [key, d] : torch_types().dtypes)
    if (key == dtype.ptr()) out.dtype = d, known = true;
  if (!known) throw Error(what + " has dtype " + nb::cast<std::string>(nb::str(dtype)) + "; flexjit takes " + kSupportedDtypes);
  if (attr(kIsCuda).ptr() == Py_True)
    place(Device::cuda(static_cast<int>(PyLong_AsLong(call(kGetDevice).ptr()))), what);
  else if (attr(kIsCpu).ptr() == Py_True)
    place(Device::cpu(), what);
  else
    throw Error(what + " is on " + nb::cast<std::string>(nb::str(obj.attr("device"))) + "; flexjit runs on CPU and CUDA tensors");
  out.data = PyLong_AsVoidPtr(call(kDataPtr).ptr());
  nb::object shape = attr(kShape), strides = call(kStride);
  const Py_ssize_t rank = PyTuple_GET_SIZE(shape.ptr());
  out.shape.resize(static_cast<size_t>(rank));
  out.strides.resize(static_cast<size_t>(rank));
  for (Py_ssize_t i = 0; i < rank; ++i) {
    out.shape[static_cast<size_t>(i)] = PyLong_AsLongLong(PyTuple_GET_ITEM(shape.ptr(), i));
    out.strides[static_cast<size_t>(i)] = PyLong_AsLongLong(PyTuple_GET_ITEM(strides.ptr(), i));
  }
  if (PyErr_Occurred()) throw nb::python_error();
  return out;
}

Tensor TensorViews::view(nb::handle obj, const std::string& what) {
  if (obj.is_none()) throw Error(what + " is None; it must be an array");
  const TorchTypes& torch = torch_types();
  // A type check, not isinstance(): torch.Tensor's metaclass makes isinstance() a Python call.
  if (torch.tensor_type && PyObject_TypeCheck(obj.ptr(), reinterpret_cast<PyTypeObject*>(torch.tensor_type))) return torch_view(obj, what);
  Tensor out;
  nb::ndarray<nb::ro> array;
  if (!nb::try_cast(obj, array, /*convert=*/false))
    throw Error(what + " is a " + python_type_name(obj) + ", not an array; pass a DLPack tensor (numpy, torch, cupy, ...)");
  out.dtype = dlpack_dtype(array.dtype(), what);
  switch (array.device_type()) {
    case nb::device::cpu::value: place(Device::cpu(), what); break;
    case nb::device::cuda::value:
    case nb::device::cuda_managed::value: place(Device::cuda(array.device_id()), what); break;
    default: throw Error(what + " lives on DLPack device type " + std::to_string(array.device_type()) + "; flexjit runs on CPU and CUDA arrays");
  }
  out.data = const_cast<void*>(array.data());
  for (size_t i = 0; i < array.ndim(); ++i) {
    out.shape.push_back(array.shape(i));
    if (array.stride(i) < 0) throw Error(what + " has a negative stride in dimension " + std::to_string(i) + "; pass a copy with positive strides");
    out.strides.push_back(array.stride(i));
  }
  imports_.push_back(std::move(array));
  return out;
}

Tensor TensorViews::view_optional(nb::handle obj, const std::string& what) { return obj.is_none() ? Tensor{} : view(obj, what); }

Device TensorViews::device() const {
  if (!placed_) throw Error("a launch needs at least one array");
  return device_;
}

void TensorViews::place(Device d, const std::string& what) {
  if (!placed_) {
    placed_ = true;
    device_ = d;
    first_ = what;
    return;
  }
  if (d.kind != device_.kind || d.index != device_.index)
    throw Error(what + " is on " + d.str() + " but " + first_ + " is on " + device_.str() + "; every array of a launch must be on one device");
}

}  // namespace flexjit::python
