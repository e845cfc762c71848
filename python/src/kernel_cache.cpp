#include "kernel_cache.h"

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <unordered_map>

#include "dsl/compile_error.h"

namespace flexjit::python {

namespace {

const char* type_name(dsl::ValueType t) {
  switch (t) {
    case dsl::ValueType::Int: return "int";
    case dsl::ValueType::Bool: return "bool";
    default: return "float";
  }
}

// A constant's value as the declaration parser reads it back exactly.
std::string const_value_text(const ParamArg& p) {
  if (p.type == dsl::ValueType::Bool) return p.value != 0 ? "true" : "false";
  char text[40];
  if (p.type == dsl::ValueType::Int)
    std::snprintf(text, sizeof text, "%lld", static_cast<long long>(p.value));
  else
    std::snprintf(text, sizeof text, "%.9g", p.value);
  return text;
}

std::string param_decl(const ParamArg& p) {
  std::string decl = std::string(p.is_const ? "const " : "") + p.name + ": " + type_name(p.type);
  if (p.is_const) decl += " = " + const_value_text(p);
  return decl;
}

std::string buffer_decl(const BufferArg& b) { return b.name + ": " + dsl::dtype_name(b.tensor.dtype) + "[" + b.dims + "]"; }

bool wants_grad(const SpecRequest& r, const std::string& name) { return std::find(r.grads.begin(), r.grads.end(), name) != r.grads.end(); }

// Everything that decides the spec, as one string.
std::string cache_key(const SpecRequest& r) {
  std::string key;
  key.reserve(256);
  for (const auto& mod : {r.score_mod, r.mask_mod}) {
    if (mod) key.append("+").append(*mod);
    key += '\x1f';
  }
  key.append(dsl::dtype_name(r.dtype)).append(std::to_string(r.head_dim)).append(" ").append(std::to_string(r.head_dim_v));
  for (const BufferArg& b : r.buffers) {
    key.append("\x1f").append(b.name).append(":").append(dsl::dtype_name(b.tensor.dtype)).append("[").append(b.dims).append("]");
    if (wants_grad(r, b.name)) key.append(" grad");
  }
  for (const ParamArg& p : r.params) key.append("\x1f").append(param_decl(p));
  return key;
}

Runtime& runtime() {
  static Runtime* rt = new Runtime();
  return *rt;
}

}  // namespace

std::string declared_dims(const std::vector<int64_t>& shape, const LaunchSizes& s) {
  std::string dims;
  for (size_t i = 0; i < shape.size(); ++i) {
    int64_t v = shape[i];
    const char* symbol = i == 0 && shape.size() > 1 && v == s.batch ? "B"
                         : v == s.heads                               ? "H"
                         : v == s.kv_heads                            ? "Hkv"
                         : v == s.seqlen_q                            ? "Sq"
                         : v == s.seqlen_kv                           ? "Skv"
                                                                      : nullptr;
    if (i) dims += ", ";
    dims += symbol ? std::string(symbol) : std::to_string(v);
  }
  return dims;
}

dsl::Spec build_spec(const SpecRequest& r) {
  dsl::Spec spec;
  spec.name = "flex_attention";
  if (r.score_mod) spec.score_mod = std::string(*r.score_mod);
  if (r.mask_mod) spec.mask_mod = std::string(*r.mask_mod);
  spec.dtype = r.dtype;
  spec.head_dim = static_cast<int>(r.head_dim);
  spec.head_dim_v = r.head_dim_v == r.head_dim ? 0 : static_cast<int>(r.head_dim_v);
  dsl::Diagnostics diags;
  for (const BufferArg& b : r.buffers)
    if (dsl::add_buffer(spec, buffer_decl(b), "buffers", diags)) spec.buffers.back().requires_grad = wants_grad(r, b.name);
  for (const ParamArg& p : r.params) dsl::add_param(spec, param_decl(p), "params", diags);
  if (diags.has_errors()) throw CompileError(diags);
  for (const std::string& g : r.grads)
    if (!spec.find_buffer(g)) throw Error("a gradient was asked for buffer `" + g + "`, which the launch does not pass");
  return spec;
}

namespace {

// Kernels by cache_key. Never destroyed: kernels outlive the interpreter's teardown, whose
// order relative to the CUDA driver's is unknown.
struct KernelCache {
  std::mutex mutex;
  std::unordered_map<std::string, std::shared_ptr<Kernel>> kernels;
};

KernelCache& kernel_cache() {
  static auto* cache = new KernelCache();
  return *cache;
}

}  // namespace

std::shared_ptr<Kernel> kernel_for(const SpecRequest& r) {
  KernelCache& cache = kernel_cache();
  std::string key = cache_key(r);
  {
    std::lock_guard<std::mutex> lock(cache.mutex);
    auto it = cache.kernels.find(key);
    if (it != cache.kernels.end()) return it->second;
  }
  std::shared_ptr<Kernel> kernel = runtime().compile(build_spec(r));
  std::lock_guard<std::mutex> lock(cache.mutex);
  return cache.kernels.emplace(std::move(key), std::move(kernel)).first->second;
}

std::vector<std::shared_ptr<Kernel>> compiled_kernels() {
  KernelCache& cache = kernel_cache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  std::vector<std::shared_ptr<Kernel>> out;
  for (const auto& [key, kernel] : cache.kernels) out.push_back(kernel);
  return out;
}

std::vector<std::pair<std::string, Tensor>> launch_buffers(const SpecRequest& r) {
  std::vector<std::pair<std::string, Tensor>> out;
  out.reserve(r.buffers.size());
  for (const BufferArg& b : r.buffers) out.emplace_back(b.name, b.tensor);
  return out;
}

std::vector<std::pair<std::string, double>> launch_params(const SpecRequest& r) {
  std::vector<std::pair<std::string, double>> out;
  for (const ParamArg& p : r.params)
    if (!p.is_const) out.emplace_back(p.name, p.value);
  return out;
}

}  // namespace flexjit::python
