// `flexjit bench SPEC --shape B,H,Hkv,Sq,Skv,D`: times the forward kernel on random inputs
// with CUDA events (median), and reports TFLOP/s over the unmasked pairs, the host-side
// launch overhead and the compile / cache latencies.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>

#include "compiler/bindings.h"
#include "dsl/error.h"
#include "compiler/frontend.h"
#include "compiler/interpreter.h"
#include "runtime/cuda_driver.h"
#include "runtime/device.h"
#include "runtime/flexjit.hpp"
#include "tools/commands.h"
#include "tools/spec_options.h"
#include "tools/tensor_io.h"

namespace flexjit::tools {

namespace {

struct BenchOptions {
  SpecOptions spec;
  std::string shape, device = "cuda:0";
  std::vector<std::string> loads, sets;
  int warmup = 10, iters = 50;
  bool json = false;
  bool mask_per_launch = false;
};

// The fraction of (q, kv) pairs the mask keeps, from a strided sample evaluated with the
// interpreter (exact for masks that are periodic in the stride; close otherwise).
double mask_density(const SpecIR& ir, const BoundValues& values, const std::vector<NpyArray>& buffers, int64_t sq, int64_t skv) {
  if (!ir.mask_mod) return 1.0;
  EvalEnv env;
  env.symbols = values.symbols;
  env.params = values.params;
  for (const NpyArray& b : buffers) env.buffers.push_back(BufferView{b.dtype, b.data.data(), b.shape, contiguous_strides(b.shape)});
  int64_t qs = std::max<int64_t>(1, sq / 384), ks = std::max<int64_t>(1, skv / 384);
  int64_t kept = 0, total = 0;
  for (int64_t q = 0; q < sq; q += qs)
    for (int64_t kv = 0; kv < skv; kv += ks) {
      env.vars[int(dsl::VarId::Q)] = q;
      env.vars[int(dsl::VarId::KV)] = kv;
      kept += evaluate(ir.mask_mod, env).b;
      ++total;
    }
  return total ? double(kept) / double(total) : 1.0;
}

int run_bench(const BenchOptions& o) {
  dsl::Spec spec = o.spec.load();
  std::vector<int64_t> s = parse_shape(o.shape, "--shape");
  if (s.size() != 6) throw Error("--shape expects B,H,Hkv,Sq,Skv,D");
  const int64_t B = s[0], H = s[1], Hkv = s[2], Sq = s[3], Skv = s[4], D = s[5];
  spec.head_dim = static_cast<int>(D);
  Device device = parse_device(o.device);
  if (device.kind != Device::Kind::Cuda) throw Error("bench times GPU kernels; use --device cuda:N");
  const runtime::CudaDriver* drv = runtime::cuda_driver();
  if (!drv) throw Error("no CUDA driver: " + runtime::cuda_driver_unavailable_reason());
  runtime::ScopedDevice scope(device.index);

  auto t0 = std::chrono::steady_clock::now();
  Runtime rt;
  auto kernel = rt.compile(spec);
  SpecIR ir = build_spec_ir(spec);
  std::mt19937 rng(1234);
  std::vector<PlacedTensor> placed;
  placed.reserve(16);
  AttentionArgs args;
  args.device = device;
  auto add = [&](NpyArray a) {
    placed.push_back(place(std::move(a), device));
    return placed.back().tensor();
  };
  args.q = add(random_array(spec.dtype, {B, H, Sq, D}, rng, 0, 1));
  args.k = add(random_array(spec.dtype, {B, Hkv, Skv, D}, rng, 0, 1));
  args.v = add(random_array(spec.dtype, {B, Hkv, Skv, spec.value_head_dim()}, rng, 0, 1));
  placed.push_back(place_empty(spec.dtype, {B, H, Sq, spec.value_head_dim()}, device));
  args.o = placed.back().tensor();
  placed.push_back(place_empty(dsl::DType::F32, {B, H, Sq}, device));
  args.lse = placed.back().tensor();
  std::map<std::string, std::string> values = {{"B", std::to_string(B)}, {"H", std::to_string(H)}, {"Hkv", std::to_string(Hkv)},
                                               {"Sq", std::to_string(Sq)}, {"Skv", std::to_string(Skv)}, {"D", std::to_string(D)}};
  std::map<std::string, std::string> loads;
  for (const std::string& l : o.loads) {
    size_t eq = l.find('=');
    if (eq == std::string::npos) throw Error("--load expects NAME=FILE.npy");
    loads[l.substr(0, eq)] = l.substr(eq + 1);
  }
  std::vector<NpyArray> host_buffers;
  for (const dsl::BufferDecl& b : spec.buffers) {
    NpyArray a;
    if (loads.count(b.name)) {
      a = read_npy(loads[b.name]);
    } else {
      std::vector<int64_t> shape;
      for (const dsl::Dim& d : b.shape) {
        if (!d.is_symbol) shape.push_back(d.value);
        else if (values.count(d.symbol)) shape.push_back(std::stoll(values[d.symbol]));
        else throw Error(fmt::format("buffer `{}` has symbol {} that the shape does not bind; give the buffer with --load", b.name, d.symbol));
      }
      // Integer buffers get values that index their smallest dimension's worth of entries.
      a = random_array(b.dtype, shape, rng, 0, 8);
    }
    host_buffers.push_back(a);
    args.buffers.emplace_back(b.name, add(a));
  }
  for (const std::string& st : o.sets) {
    size_t eq = st.find('=');
    if (eq == std::string::npos) throw Error("--set expects NAME=VALUE");
    std::string name = st.substr(0, eq), value = st.substr(eq + 1);
    const dsl::ParamDecl* p = spec.find_param(name);
    if (!p) throw Error(fmt::format("--set names `{}`, which is not a parameter", name));
    Value v = parse_param_value(*p, value);
    args.params.emplace_back(name, v.type == ir::Type::Float ? double(v.f) : v.type == ir::Type::Bool ? double(v.b) : double(v.i));
    values[name] = value;
  }
  std::vector<std::optional<std::vector<int64_t>>> shapes;
  for (const NpyArray& a : host_buffers) shapes.push_back(a.shape);
  BoundValues bound = bind_values(ir.checked, values, shapes, true);
  double density = mask_density(ir, bound, host_buffers, Sq, Skv);

  // First call: front end, compile or cache load, module load and the launch.
  runtime::check_cu(drv->cuCtxSynchronize(), "synchronise");
  t0 = std::chrono::steady_clock::now();
  kernel->forward(args);
  runtime::check_cu(drv->cuCtxSynchronize(), "synchronise");
  double first_call_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  kernel->check_errors(device.index, nullptr);
  // Like FlexAttention's create_block_mask, the block mask is built once and reused by every
  // timed launch (--mask-per-launch times the builder too).
  std::unique_ptr<BlockMask> mask;
  if (ir.mask_mod && !o.mask_per_launch) {
    mask = kernel->build_block_mask(args);
    args.block_mask = mask.get();
  }

  for (int i = 0; i < o.warmup; ++i) kernel->forward(args);
  CUevent start, stop;
  runtime::check_cu(drv->cuEventCreate(&start, 0), "cuEventCreate");
  runtime::check_cu(drv->cuEventCreate(&stop, 0), "cuEventCreate");
  std::vector<double> ms;
  for (int i = 0; i < o.iters; ++i) {
    runtime::check_cu(drv->cuEventRecord(start, nullptr), "cuEventRecord");
    kernel->forward(args);
    runtime::check_cu(drv->cuEventRecord(stop, nullptr), "cuEventRecord");
    runtime::check_cu(drv->cuEventSynchronize(stop), "cuEventSynchronize");
    float t = 0;
    runtime::check_cu(drv->cuEventElapsedTime_v2(&t, start, stop), "cuEventElapsedTime");
    ms.push_back(t);
  }
  drv->cuEventDestroy_v2(start);
  drv->cuEventDestroy_v2(stop);
  // Host-side launch overhead: back-to-back launches (the GPU queue absorbs them), wall time
  // per call; the best of five rounds, since the host may be interrupted.
  double host = 1e30;
  for (int round = 0; round < 5; ++round) {
    runtime::check_cu(drv->cuCtxSynchronize(), "synchronise");
    const int n = 20;
    auto h0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) kernel->forward(args);
    host = std::min(host, std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - h0).count() / n);
  }
  runtime::check_cu(drv->cuCtxSynchronize(), "synchronise");
  kernel->check_errors(device.index, nullptr);
  std::sort(ms.begin(), ms.end());
  double med = ms[ms.size() / 2];
  double flops = 4.0 * B * H * Sq * Skv * D * density;
  double tflops = flops / (med * 1e-3) / 1e12;
  const runtime::DeviceInfo& info = runtime::device_info(device.index);
  if (o.json) {
    fmt::print("{{\"spec\": \"{}\", \"gpu\": \"{}\", \"B\": {}, \"H\": {}, \"Hkv\": {}, \"Sq\": {}, \"Skv\": {}, \"D\": {}, \"density\": {:.4f}, "
               "\"ms\": {:.4f}, \"tflops\": {:.1f}, \"launch_us\": {:.2f}, \"first_call_s\": {:.3f}}}\n",
               spec.name, info.name, B, H, Hkv, Sq, Skv, D, density, med, tflops, host, first_call_s);
  } else {
    fmt::print("{} on {}: B{} H{} Hkv{} Sq{} Skv{} D{} density {:.3f}: {:.4f} ms, {:.1f} TFLOP/s; host launch {:.2f} us; first call {:.3f} s\n",
               spec.name, info.name, B, H, Hkv, Sq, Skv, D, density, med, tflops, host, first_call_s);
  }
  return 0;
}

}  // namespace

void add_bench_command(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand("bench", "Time the forward kernel of a spec on random inputs (GPU)");
  auto o = std::make_shared<BenchOptions>();
  o->spec.add_to(cmd);
  cmd->add_option("--shape", o->shape, "B,H,Hkv,Sq,Skv,D")->required();
  cmd->add_option("--device", o->device, "cuda:N")->capture_default_str();
  cmd->add_option("--load", o->loads, "A captured buffer: NAME=FILE.npy (default: random contents)");
  cmd->add_option("--set", o->sets, "A runtime parameter: NAME=VALUE");
  cmd->add_option("--warmup", o->warmup, "Untimed launches first")->capture_default_str();
  cmd->add_option("--iters", o->iters, "Timed launches (the median is reported)")->capture_default_str();
  cmd->add_flag("--json", o->json, "One JSON object per run");
  cmd->add_flag("--mask-per-launch", o->mask_per_launch, "Rebuild the block mask in every timed launch (default: build once, reuse)");
  cmd->callback([o, &action] { action = [o] { return run_bench(*o); }; });
}

}  // namespace flexjit::tools
