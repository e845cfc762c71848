// Shared machinery of the GPU tests: skipping without a device, random inputs in the
// kernel's precision, device copies in either [B,H,S,D] or [B,S,H,D] layout, and running
// a spec against the float64 reference.
#pragma once
#include <catch2/catch.hpp>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "compiler/frontend.h"
#include "runtime/cuda_driver.h"
#include "runtime/device.h"
#include "runtime/device_memory.h"
#include "runtime/flexjit.hpp"
#include "runtime/npy.h"
#include "support/attention_reference.h"
#include "support/spec_loading.h"

namespace flexjit::test {

inline bool have_gpu() { return runtime::cuda_driver() != nullptr; }
#define FLEXJIT_REQUIRE_GPU()                                                           \
  do {                                                                                  \
    if (!::flexjit::test::have_gpu()) {                                                 \
      WARN("skipped: no CUDA device (" << runtime::cuda_driver_unavailable_reason() << ")"); \
      return;                                                                           \
    }                                                                                   \
  } while (0)

// Random values rounded to the element type; returns the rounded floats and the raw bits.
inline std::vector<float> random_rounded(size_t n, dsl::DType dt, std::mt19937& rng, std::vector<uint16_t>& bits, float sd = 1.f) {
  std::normal_distribution<float> nd(0.f, sd);
  std::vector<float> f(n);
  bits.resize(n);
  for (size_t i = 0; i < n; ++i) {
    float x = nd(rng);
    bits[i] = dt == dsl::DType::BF16 ? float_to_bf16(x) : float_to_half(x);
    f[i] = dt == dsl::DType::BF16 ? bf16_to_float(bits[i]) : half_to_float(bits[i]);
  }
  return f;
}

// The float64 reference's environment: the spec's symbols from `sym` (1 where absent) and its parameters at their
// declared values or those `params` names (as the launches get them); the caller adds the buffers.
inline EvalEnv reference_env(const SpecIR& ir, const std::map<std::string, int64_t>& sym, const std::vector<std::pair<std::string, double>>& params) {
  const dsl::Spec& spec = ir.spec();
  EvalEnv env;
  env.symbols.resize(ir.checked.symbols.size());
  for (size_t i = 0; i < ir.checked.symbols.size(); ++i) {
    auto it = sym.find(ir.checked.symbols[i]);
    env.symbols[i] = it != sym.end() ? it->second : 1;
  }
  env.params.resize(spec.params.size());
  for (size_t i = 0; i < spec.params.size(); ++i) {
    const dsl::ParamDecl& p = spec.params[i];
    Value val;
    val.type = p.type == dsl::ValueType::Float ? ir::Type::Float : p.type == dsl::ValueType::Bool ? ir::Type::Bool : ir::Type::Int;
    double x = p.type == dsl::ValueType::Float ? p.float_value : p.type == dsl::ValueType::Bool ? double(p.bool_value) : double(p.int_value);
    for (auto& [n, pv] : params)
      if (n == p.name) x = pv;
    val.i = static_cast<int64_t>(x);
    val.f = static_cast<float>(x);
    val.b = x != 0;
    env.params[i] = val;
  }
  return env;
}

// A [B, X, S, D] tensor on the device in the requested layout: BHSD (contiguous) or BSHD
// (the heads interleaved per position, as many models store it).
struct DeviceTensor4 {
  runtime::DeviceBuffer mem;
  Tensor tensor;
};
inline DeviceTensor4 upload4(int device, const std::vector<uint16_t>& bits, dsl::DType dt, int64_t B, int64_t X, int64_t S, int64_t D,
                             bool bshd) {
  std::vector<uint16_t> laid(bits.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t x = 0; x < X; ++x)
      for (int64_t s = 0; s < S; ++s)
        for (int64_t d = 0; d < D; ++d) {
          size_t src = static_cast<size_t>(((b * X + x) * S + s) * D + d);
          size_t dst = bshd ? static_cast<size_t>(((b * S + s) * X + x) * D + d) : src;
          laid[dst] = bits[src];
        }
  DeviceTensor4 t{runtime::DeviceBuffer(device, laid.size() * 2), {}};
  t.mem.upload(laid.data(), laid.size() * 2);
  t.tensor.data = t.mem.data();
  t.tensor.dtype = dt;
  t.tensor.shape = {B, X, S, D};
  t.tensor.strides = bshd ? std::vector<int64_t>{S * X * D, D, X * D, 1} : std::vector<int64_t>{};
  return t;
}

inline std::vector<float> download4(const DeviceTensor4& t, dsl::DType dt) {
  int64_t B = t.tensor.shape[0], X = t.tensor.shape[1], S = t.tensor.shape[2], D = t.tensor.shape[3];
  std::vector<uint16_t> raw(static_cast<size_t>(B * X * S * D));
  t.mem.download(raw.data(), raw.size() * 2);
  bool bshd = !t.tensor.strides.empty();
  std::vector<float> out(raw.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t x = 0; x < X; ++x)
      for (int64_t s = 0; s < S; ++s)
        for (int64_t d = 0; d < D; ++d) {
          size_t logical = static_cast<size_t>(((b * X + x) * S + s) * D + d);
          size_t stored = bshd ? static_cast<size_t>(((b * S + s) * X + x) * D + d) : logical;
          out[logical] = dt == dsl::DType::BF16 ? bf16_to_float(raw[stored]) : half_to_float(raw[stored]);
        }
  return out;
}

// One host buffer for a captured tensor plus its device copy.
struct HostDeviceBuffer {
  NpyArray host;
  runtime::DeviceBuffer mem;
};

struct CaseOptions {
  int64_t B = 2, H = 4, Hkv = 4, Sq = 200, Skv = 300;
  dsl::DType dtype = dsl::DType::BF16;
  bool bshd = false;
  // k and v hold the same values in every batch and are read through batch stride 0 (no tensor map can describe
  // that, so the launch takes the mma.sync kernel instead of the warp-specialised one).
  bool kv_batch_broadcast = false;
  double max_rel_l2 = 1.5e-2;  // bf16 outputs; fp16 uses the same bound
  std::vector<std::pair<std::string, double>> params;
  unsigned seed = 1;
  double scale = 0;             // softmax scale of the launch and the reference; 0: 1 / sqrt(D)
  int64_t buffer_row_pad = 0;   // > 0: captured buffers of 2+ dims are stored with rows this many elements longer
  // Called on every captured buffer's host contents before upload (e.g. to plant -inf entries).
  std::function<void(const std::string& name, NpyArray& host)> edit_buffer;
  int device = 0;                    // the GPU the inputs, buffers and launch are on
  flexjit::Kernel* kernel = nullptr;  // a kernel compiled once and shared between cases (else one per case)
  bool bind_buffers = false;         // captured buffers bound to the kernel on `device` (replicas), not passed
  // > 0: compare this many random rows (and the last row of every (b, h)) with the reference instead of all of them,
  // for sequences too long for a float64 reference of every row.
  int64_t sample_rows = 0;
};

struct CaseResult {
  Comparison o, lse;
};

// Valid random contents for one captured buffer: float buffers normal, integer buffers uniform in [0, int_hi)
// (sorted for 1-d ones, like document ids); its shape from the launch's symbols.
inline NpyArray random_buffer(const dsl::BufferDecl& b, const std::map<std::string, int64_t>& sym, std::mt19937& rng, int64_t int_hi) {
  NpyArray a;
  a.dtype = b.dtype;
  for (const dsl::Dim& d : b.shape) a.shape.push_back(d.is_symbol ? sym.at(d.symbol) : d.value);
  int64_t n = a.numel();
  a.data.resize(static_cast<size_t>(n) * dsl::dtype_size(b.dtype));
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_int_distribution<int64_t> ui(0, int_hi - 1);
  for (int64_t i = 0; i < n; ++i) {
    switch (b.dtype) {
      case dsl::DType::F32: a.as<float>()[i] = nd(rng); break;
      case dsl::DType::BF16: a.as<uint16_t>()[i] = float_to_bf16(nd(rng)); break;
      case dsl::DType::F16: a.as<uint16_t>()[i] = float_to_half(nd(rng)); break;
      case dsl::DType::I32: a.as<int32_t>()[i] = static_cast<int32_t>(ui(rng)); break;
      case dsl::DType::I64: a.as<int64_t>()[i] = ui(rng); break;
      case dsl::DType::U8: a.as<uint8_t>()[i] = static_cast<uint8_t>(ui(rng)); break;
      case dsl::DType::Bool: a.as<uint8_t>()[i] = static_cast<uint8_t>(ui(rng) & 1); break;
      case dsl::DType::F8E4M3:
      case dsl::DType::F8E5M2: a.as<uint8_t>()[i] = float_to_fp8(nd(rng), b.dtype); break;
    }
  }
  if (b.shape.size() == 1 && b.dtype == dsl::DType::I32) std::sort(a.as<int32_t>(), a.as<int32_t>() + n);
  return a;
}

// Every captured buffer of the spec with random_buffer's contents, uploaded to `device`.
inline std::vector<HostDeviceBuffer> make_buffers(const dsl::Spec& spec, const std::map<std::string, int64_t>& sym, int device,
                                                  std::mt19937& rng, int64_t int_hi) {
  std::vector<HostDeviceBuffer> out;
  for (const dsl::BufferDecl& b : spec.buffers) {
    NpyArray a = random_buffer(b, sym, rng, int_hi);
    HostDeviceBuffer hb{a, runtime::DeviceBuffer(device, a.data.size())};
    hb.mem.upload(a.data.data(), a.data.size());
    out.push_back(std::move(hb));
  }
  return out;
}

}  // namespace flexjit::test
