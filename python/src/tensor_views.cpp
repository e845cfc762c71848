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

const char* kSupportedDtypes = "float32, float16, bfloat16, int32, int64, uint8 or bool";

std::vector<int64_t> int_tuple(nb::handle seq) {
  std::vector<int64_t> out;
  for (nb::handle item : seq) out.push_back(nb::cast<int64_t>(item));
  return out;
}

DType dlpack_dtype(nb::dlpack::dtype t, const std::string& what) {
  using Code = nb::dlpack::dtype_code;
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
    if (!d) throw Error("register_torch: unknown flexjit dtype " + nb::cast<std::string>(name));
    t.dtypes.emplace_back(key.inc_ref().ptr(), *d);
  }
  t.tensor_type = tensor_type.inc_ref().ptr();
}

Tensor TensorViews::view(nb::handle obj, const std::string& what) {
  if (obj.is_none()) throw Error(what + " is None; it must be an array");
  Tensor out;
  const TorchTypes& torch = torch_types();
  if (torch.tensor_type && PyObject_IsInstance(obj.ptr(), torch.tensor_type) == 1) {
    nb::object dtype = obj.attr("dtype");
    bool known = false;
    for (const auto& [key, d] : torch.dtypes)
      if (key == dtype.ptr()) out.dtype = d, known = true;
    if (!known) throw Error(what + " has dtype " + nb::cast<std::string>(nb::str(dtype)) + "; flexjit takes " + kSupportedDtypes);
    Device d;
    if (nb::cast<bool>(obj.attr("is_cuda")))
      d = Device::cuda(nb::cast<int>(obj.attr("get_device")()));
    else if (nb::cast<bool>(obj.attr("is_cpu")))
      d = Device::cpu();
    else
      throw Error(what + " is on " + nb::cast<std::string>(nb::str(obj.attr("device"))) + "; flexjit runs on CPU and CUDA tensors");
    place(d, what);
    out.data = reinterpret_cast<void*>(nb::cast<uintptr_t>(obj.attr("data_ptr")()));
    out.shape = int_tuple(obj.attr("shape"));
    out.strides = int_tuple(obj.attr("stride")());
    return out;
  }
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
