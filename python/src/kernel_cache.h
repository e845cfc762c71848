// The specs Python launches compile: mods given as text, buffers and parameters declared from
// the arrays and values of the launch, one compiled kernel per distinct spec (process-wide).
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "runtime/flexjit.hpp"

namespace flexjit::python {

// A scalar parameter as given: runtime parameters are declared by type only (a new value
// does not recompile); constant ones are baked into the spec with their value.
struct ParamArg {
  std::string name;
  dsl::ValueType type = dsl::ValueType::Float;
  bool is_const = false;
  double value = 0;
};

// A captured buffer and the dimensions of its declaration ("B, H, Sq, 64").
struct BufferArg {
  std::string name;
  Tensor tensor;
  std::string dims;
};

// The sizes a launch binds to the standard symbols; buffer dimensions equal to one of them
// are declared with the symbol, so a new batch size or sequence length does not recompile.
struct LaunchSizes {
  int64_t batch = 0, heads = 0, kv_heads = 0, seqlen_q = 0, seqlen_kv = 0;
};

// The dimensions of a buffer's declaration: each extent equal to a launch size becomes that
// symbol (B only as the first of several dimensions), any other stays a literal.
std::string declared_dims(const std::vector<int64_t>& shape, const LaunchSizes& sizes);

struct SpecRequest {
  std::optional<std::string_view> score_mod, mask_mod;  // the caller's text, alive for the request
  DType dtype = DType::BF16;
  int64_t head_dim = 0, head_dim_v = 0;
  std::vector<BufferArg> buffers;
  std::vector<ParamArg> params;
  std::vector<std::string> grads;  // buffers whose gradient the backward computes
};

// The spec of a request; throws CompileError for declarations the language rejects.
dsl::Spec build_spec(const SpecRequest& request);

// The compiled kernel of a request's spec, compiled on first use. Throws CompileError with
// every diagnostic of the mods.
std::shared_ptr<Kernel> kernel_for(const SpecRequest& request);

// Every kernel compiled so far (for checking their error flags).
std::vector<std::shared_ptr<Kernel>> compiled_kernels();

// The buffers and parameters of a request in the form launches take.
std::vector<std::pair<std::string, Tensor>> launch_buffers(const SpecRequest& request);
std::vector<std::pair<std::string, double>> launch_params(const SpecRequest& request);

}  // namespace flexjit::python
