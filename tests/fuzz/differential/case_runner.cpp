#include "fuzz/differential/case_runner.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <limits>
#include <random>

#include "compiler/bindings.h"
#include "compiler/codegen/backward_source.h"
#include "compiler/codegen/kernel_source.h"
#include "compiler/frontend.h"
#include "compiler/passes/autodiff.h"
#include "compiler/passes/range_analysis.h"
#include "dsl/error.h"
#include "runtime/cuda_driver.h"
#include "runtime/device_memory.h"
#include "runtime/flexjit.hpp"
#include "runtime/kernel_compiler.h"
#include "runtime/npy.h"
#include "support/attention_reference.h"
#include "support/attention_reference_backward.h"
#include "unit/cpu/gallery_inputs.h"
#ifdef FLEXJIT_HAVE_CPU_BACKEND
#include "runtime/cpu/cpu_backend.h"
#endif

namespace flexjit::fuzz {

namespace {

using dsl::DType;

// --- host data in the kernels' element types and layouts -------------------------------------

float round_to(DType t, float x) {
  if (t == DType::BF16) return bf16_to_float(float_to_bf16(x));
  if (t == DType::F16) return half_to_float(float_to_half(x));
  return x;
}

size_t elem_size(DType t) { return dsl::dtype_size(t); }

void store(DType t, void* p, float x) {
  if (t == DType::F32) std::memcpy(p, &x, 4);
  else {
    uint16_t b = t == DType::BF16 ? float_to_bf16(x) : float_to_half(x);
    std::memcpy(p, &b, 2);
  }
}

float fetch(DType t, const void* p) {
  if (t == DType::F32) {
    float x;
    std::memcpy(&x, p, 4);
    return x;
  }
  uint16_t b;
  std::memcpy(&b, p, 2);
  return t == DType::BF16 ? bf16_to_float(b) : half_to_float(b);
}

// A [B, X, S, D] operand: its values (rounded to the element type, contiguous) and its storage
// in the element type, contiguous or [B, S, X, D].
struct Operand {
  int64_t B = 0, X = 0, S = 0, D = 0;
  bool bshd = false;
  DType dtype = DType::F32;
  std::vector<float> values;
  std::vector<uint8_t> storage;

  Operand(int64_t b, int64_t x, int64_t s, int64_t d, bool bs, DType t) : B(b), X(x), S(s), D(d), bshd(bs), dtype(t) {
    values.assign(static_cast<size_t>(B * X * S * D), 0.0f);
    storage.assign(values.size() * elem_size(t), 0xff);  // NaN (f32, f16, bf16) until written
  }
  std::vector<int64_t> strides() const {
    return bshd ? std::vector<int64_t>{S * X * D, D, X * D, 1} : std::vector<int64_t>{X * S * D, S * D, D, 1};
  }
  size_t offset(size_t i) const {
    const int64_t d = static_cast<int64_t>(i) % D, s = static_cast<int64_t>(i) / D % S, x = static_cast<int64_t>(i) / (D * S) % X,
                  b = static_cast<int64_t>(i) / (D * S * X);
    const std::vector<int64_t> st = strides();
    return static_cast<size_t>(b * st[0] + x * st[1] + s * st[2] + d * st[3]);
  }
  void fill_random(std::mt19937_64& rng) {
    std::normal_distribution<float> nd(0.f, 1.f);
    for (auto& v : values) v = round_to(dtype, nd(rng));
    pack();
  }
  void set(const std::vector<float>& v) {
    for (size_t i = 0; i < values.size(); ++i) values[i] = round_to(dtype, v[i]);
    pack();
  }
  void pack() {
    for (size_t i = 0; i < values.size(); ++i) store(dtype, storage.data() + offset(i) * elem_size(dtype), values[i]);
  }
  // The storage read back as contiguous floats (after a launch wrote it).
  std::vector<float> unpack(const std::vector<uint8_t>& bytes) const {
    std::vector<float> out(values.size());
    for (size_t i = 0; i < out.size(); ++i) out[i] = fetch(dtype, bytes.data() + offset(i) * elem_size(dtype));
    return out;
  }
  Tensor tensor(void* data) const { return Tensor{data, dtype, {B, X, S, D}, bshd ? strides() : std::vector<int64_t>{}}; }
};

struct HostBuffer {
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

// The generator's one custom symbol is N; the standard ones as the gallery tests bind them.
int64_t extent(const dsl::Dim& d, const LaunchSizes& s, int64_t D) {
  if (d.is_symbol && d.symbol == "N") return s.N;
  return test::extent_of(d, test::Sizes{s.B, s.H, s.Hkv, s.Sq, s.Skv, D});
}

// Buffer contents the generated expressions expect: floats k/64 in [-1, 1] (exact in every
// float type), integers in [-20, 20] (u8 in [0, 255]), booleans.
HostBuffer make_buffer(const dsl::BufferDecl& decl, const LaunchSizes& s, int64_t D, std::mt19937_64& rng) {
  HostBuffer b;
  b.dtype = decl.dtype;
  int64_t n = 1;
  for (const dsl::Dim& d : decl.shape) {
    b.shape.push_back(extent(d, s, D));
    n *= b.shape.back();
  }
  b.bytes.resize(static_cast<size_t>(n) * elem_size(decl.dtype));
  for (int64_t i = 0; i < n; ++i) {
    uint8_t* p = b.bytes.data() + static_cast<size_t>(i) * elem_size(decl.dtype);
    switch (decl.dtype) {
      case DType::F32:
      case DType::F16:
      case DType::BF16: store(decl.dtype, p, static_cast<float>(std::uniform_int_distribution<int>(-64, 64)(rng)) / 64.0f); break;
      case DType::I32: {
        int32_t v = std::uniform_int_distribution<int32_t>(-20, 20)(rng);
        std::memcpy(p, &v, 4);
        break;
      }
      case DType::I64: {
        int64_t v = std::uniform_int_distribution<int64_t>(-20, 20)(rng);
        std::memcpy(p, &v, 8);
        break;
      }
      case DType::U8: *p = static_cast<uint8_t>(std::uniform_int_distribution<int>(0, 255)(rng)); break;
      case DType::Bool: *p = static_cast<uint8_t>(std::uniform_int_distribution<int>(0, 1)(rng)); break;
      case DType::F8E4M3:
      case DType::F8E5M2: break;  // KV-cache types, never a buffer's
    }
  }
  return b;
}

// Everything a launch of the case reads, on the host, plus the reference's environment.
struct Inputs {
  int64_t B, H, Hkv, Sq, Skv, D, Dv;
  double scale;
  Operand q, k, v, d_o;
  std::vector<HostBuffer> buffers;
  EvalEnv env;

  Inputs(const GenCase& c, const SpecIR& ir)
      : B(c.sizes.B), H(c.sizes.H), Hkv(c.sizes.Hkv), Sq(c.sizes.Sq), Skv(c.sizes.Skv), D(ir.spec().head_dim), Dv(ir.spec().value_head_dim()),
        scale(c.scale > 0 ? c.scale : 1.0 / std::sqrt(static_cast<double>(D))),
        q(B, H, Sq, D, c.bshd, c.dtype),
        k(B, Hkv, Skv, D, c.bshd, c.dtype),
        v(B, Hkv, Skv, Dv, c.bshd, c.dtype),
        d_o(B, H, Sq, Dv, c.bshd, c.dtype) {
    std::mt19937_64 rng(c.seed * 0x9e3779b97f4a7c15ull + 1);
    q.fill_random(rng);
    k.fill_random(rng);
    v.fill_random(rng);
    d_o.fill_random(rng);
    const dsl::CheckedSpec& cs = ir.checked;
    BindingInputs in;
    in.symbols = {B, H, Hkv, Sq, Skv, D};
    in.symbols.resize(cs.symbols.size());
    in.params.resize(cs.spec.params.size());
    for (const auto& [name, value] : c.values) {
      const dsl::ParamDecl* p = cs.spec.find_param(name);
      if (!p) continue;
      Value val = p->type == dsl::ValueType::Int     ? Value::of_int(static_cast<int64_t>(value))
                  : p->type == dsl::ValueType::Float ? Value::of_float(static_cast<float>(value))
                                                     : Value::of_bool(value != 0);
      in.params[static_cast<size_t>(p - cs.spec.params.data())] = val;
    }
    for (const dsl::BufferDecl& decl : cs.spec.buffers) {
      buffers.push_back(make_buffer(decl, c.sizes, D, rng));
      in.buffer_shapes.emplace_back(buffers.back().shape);
    }
    BoundValues bound = bind_typed(cs, in, /*require_all=*/true);
    env.symbols = bound.symbols;
    env.params = bound.params;
    for (const HostBuffer& b : buffers) env.buffers.push_back(BufferView{b.dtype, b.bytes.data(), b.shape, contiguous_strides(b.shape)});
  }

  test::RefShape shape() const { return {B, H, Hkv, Sq, Skv, D, Dv}; }
};

// --- comparisons ------------------------------------------------------------------------------

// Rows the reference masks entirely must be exactly O = 0, LSE = -inf; in the others O lies
// within `row_tol` of the reference relative to the row's largest |O| and LSE within
// `lse_tol` * max(1, |LSE|). NaN never passes.
std::string compare_forward(const std::vector<float>& o, const std::vector<float>& lse, const test::RefResult& ref, int64_t Dv, double row_tol,
                            double lse_tol) {
  const size_t rows = ref.lse.size();
  for (size_t r = 0; r < rows; ++r) {
    if (ref.lse[r] == -std::numeric_limits<double>::infinity()) {
      if (lse[r] != -std::numeric_limits<float>::infinity()) return fmt::format("row {} is fully masked but LSE is {}", r, lse[r]);
      for (int64_t d = 0; d < Dv; ++d)
        if (o[r * static_cast<size_t>(Dv) + static_cast<size_t>(d)] != 0.0f)
          return fmt::format("row {} is fully masked but O[{}] is {}", r, d, o[r * static_cast<size_t>(Dv) + static_cast<size_t>(d)]);
      continue;
    }
    if (!(std::abs(lse[r] - ref.lse[r]) <= lse_tol * std::max(1.0, std::abs(ref.lse[r]))))
      return fmt::format("row {}: LSE {} but the reference has {}", r, lse[r], ref.lse[r]);
    double row_max = 1e-30;
    for (int64_t d = 0; d < Dv; ++d) row_max = std::max(row_max, std::abs(ref.o[r * static_cast<size_t>(Dv) + static_cast<size_t>(d)]));
    for (int64_t d = 0; d < Dv; ++d) {
      const size_t i = r * static_cast<size_t>(Dv) + static_cast<size_t>(d);
      if (!(std::abs(o[i] - ref.o[i]) <= row_tol * row_max))
        return fmt::format("row {}: O[{}] = {} but the reference has {} (row max {:.3g}, tolerance {:.1e})", r, d, o[i], ref.o[i], row_max, row_tol);
    }
  }
  return "";
}

// ||out - ref|| <= rel * ||ref|| + abs * sqrt(n), nothing non-finite (as test_cpu_backward).
// `terms` is how many products each element sums: fp32 rounding grows like its square root,
// and sums that cancel to zero (a gradient of a buffer every row reads) leave only that.
std::string compare_norm(const char* what, const std::vector<float>& out, const std::vector<double>& ref, double rel, double abs, double terms) {
  abs *= std::max(1.0, std::sqrt(terms / 256));
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(out[i])) return fmt::format("{}[{}] is {}", what, i, out[i]);
    num += (out[i] - ref[i]) * (out[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  const double err = std::sqrt(num), bound = rel * std::sqrt(den) + abs * std::sqrt(static_cast<double>(ref.size()));
  if (err <= bound) return "";
  return fmt::format("{}: |out - ref| = {:.3g} but |ref| = {:.3g}, bound {:.3g}", what, err, std::sqrt(den), bound);
}

struct Tolerances {
  double row, lse, rel, abs, grad_rel, grad_abs;
};

// CPU: fp32 arithmetic from the same rounded inputs; half-precision outputs round once. The
// absolute terms bound the rounding of sums that cancel (dS sums to zero over a row: one key
// gives dK = 0 exactly, the fp32 sum a few ulp of |dO||V|).
Tolerances cpu_tolerances(DType t) {
  if (t == DType::F32) return {2e-4, 2e-4, 2e-5, 1e-5, 2e-4, 1e-5};
  if (t == DType::F16) return {2e-3, 5e-4, 2e-3, 2e-4, 2e-2, 2e-3};
  return {1e-2, 5e-4, 1e-2, 1e-3, 2e-2, 2e-3};
}

// GPU: P in half precision for P V, fast exp2 and tanh, atomics (tests/gpu use the same bounds).
Tolerances gpu_tolerances(DType) { return {3e-2, 2e-2, 2e-2, 2e-3, 4e-2, 4e-3}; }

// --- the back ends ----------------------------------------------------------------------------

// Storage a launch writes: poisoned with NaN bytes first, so anything left unwritten fails.
struct Output {
  std::vector<uint8_t> bytes;
  explicit Output(size_t n) : bytes(n, 0xff) {}
  void* data() { return bytes.data(); }
};

std::vector<float> as_floats(const std::vector<uint8_t>& bytes) {
  std::vector<float> out(bytes.size() / 4);
  std::memcpy(out.data(), bytes.data(), out.size() * 4);
  return out;
}

// Where a launch's operands live: host memory for the CPU backend, device 0 for the GPU.
class Memory {
 public:
  explicit Memory(bool device) : device_(device) {}
  void* put(const std::vector<uint8_t>& host) {
    if (!device_) return const_cast<uint8_t*>(host.data());
    auto& b = owned_.emplace_back(0, std::max<size_t>(host.size(), 16));
    b.upload(host.data(), host.size());
    return b.data();
  }
  // Memory the launch writes, poisoned; get() copies it back.
  void* out(Output& o) {
    if (!device_) return o.data();
    auto& b = owned_.emplace_back(0, std::max<size_t>(o.bytes.size(), 16));
    b.upload(o.bytes.data(), o.bytes.size());
    writes_.emplace_back(&o, &b);
    return b.data();
  }
  void get() {
    for (auto [o, b] : writes_) b->download(o->bytes.data(), o->bytes.size());
  }
  Device device() const { return device_ ? Device::cuda(0) : Device::cpu(); }

 private:
  bool device_;
  std::deque<runtime::DeviceBuffer> owned_;
  std::vector<std::pair<Output*, runtime::DeviceBuffer*>> writes_;
};

std::vector<std::pair<std::string, Tensor>> buffer_tensors(const dsl::Spec& spec, const Inputs& in, Memory& mem) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (size_t i = 0; i < spec.buffers.size(); ++i)
    out.emplace_back(spec.buffers[i].name, Tensor{mem.put(in.buffers[i].bytes), in.buffers[i].dtype, in.buffers[i].shape, {}});
  return out;
}

// The largest |e| of the expressions over 256 random points of the launch (at least 1): how
// much they amplify a rounding error, for the backward's absolute tolerances.
double largest_magnitude(const std::vector<ir::Expr>& exprs, const Inputs& in) {
  double most = 1;
  std::mt19937_64 rng(7);
  EvalEnv env = in.env;
  for (int i = 0; i < 256; ++i) {
    const int64_t b = std::uniform_int_distribution<int64_t>(0, in.B - 1)(rng), h = std::uniform_int_distribution<int64_t>(0, in.H - 1)(rng);
    env.vars[int(dsl::VarId::B)] = b;
    env.vars[int(dsl::VarId::H)] = h;
    env.vars[int(dsl::VarId::KvHead)] = h / (in.H / in.Hkv);
    env.vars[int(dsl::VarId::Q)] = std::uniform_int_distribution<int64_t>(0, in.Sq - 1)(rng);
    env.vars[int(dsl::VarId::KV)] = std::uniform_int_distribution<int64_t>(0, in.Skv - 1)(rng);
    env.score = std::normal_distribution<float>(0.f, 3.f)(rng);
    for (const ir::Expr& e : exprs) {
      const double v = std::abs(static_cast<double>(evaluate(e, env).f));
      if (std::isfinite(v)) most = std::max(most, v);
    }
  }
  return most;
}

// Runs one launch and brings its outputs back; "" or what it threw.
template <class F>
std::string launch(F&& run, Kernel& kernel, bool gpu, Memory& mem) {
  try {
    run();
    if (gpu) kernel.check_errors(0, nullptr);
    mem.get();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// One back end's forward and (when the case asks) backward, compared with the reference.
Outcome check_backend(const GenCase& c, const SpecIR& ir, Kernel& kernel, const Inputs& in, const test::RefResult& ref, bool gpu) {
  Outcome out;
  const char* where = gpu ? "gpu" : "cpu";
  const Tolerances tol = gpu ? gpu_tolerances(c.dtype) : cpu_tolerances(c.dtype);
  const dsl::Spec& spec = ir.spec();
  Memory mem(gpu);
  Operand o_layout(in.B, in.H, in.Sq, in.Dv, c.bshd, c.dtype);
  Output o(o_layout.storage.size()), lse(static_cast<size_t>(in.B * in.H * in.Sq) * 4);
  AttentionArgs a;
  a.q = in.q.tensor(mem.put(in.q.storage));
  a.k = in.k.tensor(mem.put(in.k.storage));
  a.v = in.v.tensor(mem.put(in.v.storage));
  a.o = o_layout.tensor(mem.out(o));
  a.lse = Tensor{mem.out(lse), DType::F32, {in.B, in.H, in.Sq}, {}};
  a.scale = c.scale;
  a.buffers = buffer_tensors(spec, in, mem);
  a.params = c.values;
  a.device = mem.device();
  if (std::string e = launch([&] { kernel.forward(a); }, kernel, gpu, mem); !e.empty())
    return Outcome{fmt::format("{} error", where), fmt::format("{} forward threw: {}", where, e)};
  ++out.forward_checks;
  out.rows += static_cast<int64_t>(ref.lse.size());
  out.masked_rows += std::count(ref.lse.begin(), ref.lse.end(), -std::numeric_limits<double>::infinity());
  if (std::string f = compare_forward(o_layout.unpack(o.bytes), as_floats(lse.bytes), ref, in.Dv, tol.row, tol.lse); !f.empty())
    return Outcome{fmt::format("{} forward", where), fmt::format("{} forward: {}", where, f)};
  if (!c.backward) return out;

  // The backward of the reference's O (rounded to the element type) and LSE (to fp32), given to
  // both sides, so only the backward itself is compared.
  Operand o_in(in.B, in.H, in.Sq, in.Dv, c.bshd, c.dtype);
  o_in.set(std::vector<float>(ref.o.begin(), ref.o.end()));
  std::vector<float> lse_in(ref.lse.begin(), ref.lse.end());
  std::vector<uint8_t> lse_bytes(lse_in.size() * 4);
  std::memcpy(lse_bytes.data(), lse_in.data(), lse_bytes.size());
  const test::RefBackward rb = test::reference_backward(ir, in.shape(), in.q.values, in.k.values, in.v.values, in.d_o.values,
                                                        std::vector<double>(o_in.values.begin(), o_in.values.end()),
                                                        std::vector<double>(lse_in.begin(), lse_in.end()), in.env, in.scale);
  Operand dq_l(in.B, in.H, in.Sq, in.D, c.bshd, c.dtype), dk_l(in.B, in.Hkv, in.Skv, in.D, c.bshd, c.dtype),
      dv_l(in.B, in.Hkv, in.Skv, in.Dv, c.bshd, c.dtype);
  Output dq(dq_l.storage.size()), dk(dk_l.storage.size()), dv(dv_l.storage.size());
  std::vector<Output> grads;
  grads.reserve(spec.buffers.size());
  BackwardArgs b;
  b.q = a.q, b.k = a.k, b.v = a.v;
  b.o = o_in.tensor(mem.put(o_in.storage));
  b.d_o = in.d_o.tensor(mem.put(in.d_o.storage));
  b.lse = Tensor{mem.put(lse_bytes), DType::F32, {in.B, in.H, in.Sq}, {}};
  b.dq = dq_l.tensor(mem.out(dq));
  b.dk = dk_l.tensor(mem.out(dk));
  b.dv = dv_l.tensor(mem.out(dv));
  b.scale = c.scale;
  b.buffers = a.buffers;
  b.params = c.values;
  for (size_t i = 0; i < spec.buffers.size(); ++i) {
    grads.emplace_back(rb.grads[i].size() * 4);
    if (spec.buffers[i].requires_grad) b.grads.emplace_back(spec.buffers[i].name, Tensor{mem.out(grads.back()), DType::F32, in.buffers[i].shape, {}});
  }
  b.deterministic = c.seed % 3 == 0;
  b.dq_mode = static_cast<BackwardDqMode>(c.seed / 3 % 3);
  b.device = mem.device();
  if (std::string e = launch([&] { kernel.backward(b); }, kernel, gpu, mem); !e.empty())
    return Outcome{fmt::format("{} error", where), fmt::format("{} backward threw: {}", where, e)};
  ++out.backward_checks;
  // The rounding of dS reaches dq and dk times d score_mod / d score, and the buffer gradients
  // times their coefficients: the absolute terms scale with the largest of those.
  const ScoreModGradient grad = differentiate_score_mod(ir);
  std::vector<ir::Expr> coefficients;
  for (const GradScatter& sc : grad.scatters) coefficients.push_back(sc.coefficient);
  // dS = P (dO . V - dO . O) cancels two Dv-long fp32 dot products of unit-variance values:
  // their partial sums grow like sqrt(Dv) and each addition rounds at that size, so what is left
  // grows like Dv. Up to 0.3 ulp x Dv per row was seen; allow 1 ulp x Dv per summed term (the
  // absolute terms are per 256 terms), which only loosens the fp32 bounds.
  const double ds_abs = std::max(tol.abs, 16 * double(std::numeric_limits<float>::epsilon()) * double(in.Dv)),
               ds_grad_abs = std::max(tol.grad_abs, ds_abs);
  const double d_score = largest_magnitude({grad.d_score}, in), coefficient = largest_magnitude(coefficients, in);
  const double kv_terms = double(in.H / in.Hkv) * double(in.Sq), all_terms = double(in.B * in.H) * double(in.Sq) * double(in.Skv);
  std::string f = compare_norm("dq", dq_l.unpack(dq.bytes), rb.dq, tol.rel, ds_abs * d_score, double(in.Skv));
  if (f.empty()) f = compare_norm("dk", dk_l.unpack(dk.bytes), rb.dk, tol.rel, ds_abs * d_score, kv_terms);
  if (f.empty()) f = compare_norm("dv", dv_l.unpack(dv.bytes), rb.dv, tol.rel, tol.abs, kv_terms);
  for (size_t i = 0; i < spec.buffers.size() && f.empty(); ++i)
    if (spec.buffers[i].requires_grad)
      f = compare_norm(("grad of " + spec.buffers[i].name).c_str(), as_floats(grads[i].bytes), rb.grads[i], tol.grad_rel,
                       ds_grad_abs * coefficient, all_terms / double(std::max<size_t>(rb.grads[i].size(), 1)));
  if (!f.empty()) return Outcome{fmt::format("{} backward", where), fmt::format("{} backward ({}, dq {}): {}", where, b.deterministic ? "deterministic" : "atomic",
                                                                         static_cast<int>(b.dq_mode), f)};
  return out;
}

// The case's CUDA modules through NVRTC: every forward module a launch needs, and the backward.
void compile_cuda(const SpecIR& ir, const GenCase& c, const std::vector<std::string>& archs, Outcome& out) {
  for (const std::string& arch : archs) {
    for (const KernelSource& ks : kernels_for_launch(ir, c.dtype, ir.spec().head_dim, arch)) {
      runtime::CacheLookup r = runtime::compile_kernel(ks, canonical_ir_text(ir), arch);
      if (!r.artefact || r.artefact->binary.size() < 4) throw Error(fmt::format("{} for {}: no cubin", ks.name, arch));
      ++out.nvrtc_compiles;
    }
    if (!c.backward) continue;
    ScoreModGradient grad = differentiate_score_mod(ir);
    BackwardKernelOptions bo;
    bo.dtype = c.dtype;
    bo.head_dim = ir.spec().head_dim;
    bo.arch = arch;
    bo.query_major = c.seed % 2 == 1;
    BackwardKernelSource bs = backward_kernel_source(ir, grad, analyze_ranges(backward_roots(grad), ir.checked, VarDomains::forward(ir.checked)), bo);
    runtime::CacheLookup r = runtime::compile_kernel(bs.module, canonical_ir_text(ir), arch);
    if (!r.artefact || r.artefact->binary.size() < 4) throw Error(fmt::format("{} for {}: no cubin", bs.module.name, arch));
    ++out.nvrtc_compiles;
  }
}

#ifdef FLEXJIT_HAVE_CPU_BACKEND
// Each case runs under other CPU settings: every instruction set, one or all threads, the
// vector math library or the exact scalar one.
void configure_cpu(const GenCase& c) {
  cpu::install();
  static const std::vector<std::string> isas = cpu::available_isas();
  cpu::CpuSettings s;
  s.isa = isas[c.seed % isas.size()];
  s.threads = c.seed / 7 % 2 ? 1 : 0;
  s.exact_math = c.seed / 11 % 2;
  cpu::configure(s);
}
#endif

void add(Outcome& total, const Outcome& part) {
  total.forward_checks += part.forward_checks;
  total.backward_checks += part.backward_checks;
  total.gpu_launches += part.gpu_launches;
  total.rows += part.rows;
  total.masked_rows += part.masked_rows;
}

}  // namespace

Outcome run_case(const GenCase& c, const RunOptions& options) {
  Outcome out;
  const dsl::Spec spec = c.spec();
  SpecIR ir;
  try {
    ir = build_spec_ir(spec);
  } catch (const CompileError& e) {
    return Outcome{"compile error", e.diagnostics().render_text()};
  }
  try {
    Inputs in(c, ir);
    const test::RefResult ref = test::reference_attention(ir, in.shape(), in.q.values, in.k.values, in.v.values, in.env, in.scale);
    Runtime rt;
    std::shared_ptr<Kernel> kernel = rt.compile(spec);
#ifdef FLEXJIT_HAVE_CPU_BACKEND
    if (options.cpu) {
      configure_cpu(c);
      Outcome cpu = check_backend(c, ir, *kernel, in, ref, /*gpu=*/false);
      if (!cpu.ok()) return cpu;
      add(out, cpu);
    }
#endif
    if (options.gpu && runtime::cuda_driver()) {
      Outcome gpu = check_backend(c, ir, *kernel, in, ref, /*gpu=*/true);
      if (!gpu.ok()) return gpu;
      add(out, gpu);
      out.gpu_launches += 1 + (c.backward ? 1 : 0);
    }
  } catch (const std::exception& e) {
    return Outcome{"harness error", e.what()};
  }
  if (!options.nvrtc_archs.empty()) {
    try {
      compile_cuda(ir, c, options.nvrtc_archs, out);
    } catch (const std::exception& e) {
      return Outcome{"nvrtc", e.what()};
    }
  }
  return out;
}

nlohmann::json case_to_json(const GenCase& c) {
  nlohmann::json j;
  j["seed"] = c.seed;
  j["spec"] = nlohmann::json::parse(dsl::spec_to_json(c.spec()));
  j["sizes"] = {{"B", c.sizes.B}, {"H", c.sizes.H}, {"Hkv", c.sizes.Hkv}, {"Sq", c.sizes.Sq}, {"Skv", c.sizes.Skv}, {"N", c.sizes.N}};
  j["values"] = nlohmann::json::object();
  for (const auto& [n, v] : c.values) j["values"][n] = v;
  j["scale"] = c.scale;
  j["bshd"] = c.bshd;
  j["backward"] = c.backward;
  return j;
}

GenCase case_from_json(const nlohmann::json& j) {
  GenCase c;
  c.seed = j.at("seed").get<uint64_t>();
  dsl::Diagnostics diags;
  std::optional<dsl::Spec> spec = dsl::parse_spec_json(j.at("spec").dump(), "case", diags);
  if (!spec) throw CompileError(diags);
  c.dtype = spec->dtype;
  c.head_dim = spec->head_dim;
  c.head_dim_v = spec->head_dim_v;
  c.gqa_group = spec->gqa_group;
  for (const dsl::BufferDecl& b : spec->buffers) {
    c.buffers.push_back(b.str());
    c.grads.push_back(b.requires_grad);
  }
  for (const dsl::ParamDecl& p : spec->params) c.params.push_back(p.str());
  if (spec->score_mod) c.score_mod = GenExpr{GenExpr::Type::Float, *spec->score_mod, {}, true};
  if (spec->mask_mod) c.mask_mod = GenExpr{GenExpr::Type::Bool, *spec->mask_mod, {}, true};
  const auto& s = j.at("sizes");
  c.sizes = LaunchSizes{s.at("B"), s.at("H"), s.at("Hkv"), s.at("Sq"), s.at("Skv"), s.at("N")};
  for (const auto& [n, v] : j.at("values").items()) c.values.emplace_back(n, v.get<double>());
  c.scale = j.at("scale").get<float>();
  c.bshd = j.at("bshd").get<bool>();
  c.backward = j.at("backward").get<bool>();
  return c;
}

std::string describe(const GenCase& c) {
  const dsl::Spec s = c.spec();
  std::vector<std::string> values;
  for (const auto& [n, v] : c.values) values.push_back(fmt::format("{}={}", n, v));
  return fmt::format("seed {}: {} D{} Dv{} B{} H{} Hkv{} Sq{} Skv{} N{} scale {} {}{} | buffers [{}] params [{}] values [{}] | score_mod: {} | mask_mod: {}",
                     c.seed, dsl::dtype_name(c.dtype), s.head_dim, s.value_head_dim(), c.sizes.B, c.sizes.H, c.sizes.Hkv, c.sizes.Sq, c.sizes.Skv,
                     c.sizes.N, c.scale, c.bshd ? "BSHD" : "BHSD", c.backward ? " +backward" : "", fmt::join(c.buffers, "; "),
                     fmt::join(c.params, "; "), fmt::join(values, ", "), s.score_mod.value_or("-"), s.mask_mod.value_or("-"));
}

}  // namespace flexjit::fuzz
