// `flexjit bench-backward SPEC --shape B,H,Hkv,Sq,Skv,D [--dq atomic|qmajor]`: times the forward, the backward
// and both together on random inputs with CUDA events (medians; tools/launch_timer.h); buffers marked `grad` get gradients.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>

#include "compiler/frontend.h"
#include "dsl/error.h"
#include "runtime/cuda_driver.h"
#include "runtime/device.h"
#include "runtime/flexjit.hpp"
#include "tools/commands.h"
#include "tools/launch_timer.h"
#include "tools/spec_options.h"
#include "tools/tensor_io.h"

namespace flexjit::tools {

namespace {

struct BenchBackwardOptions {
  SpecOptions spec;
  std::string shape, device = "cuda:0";
  int warmup = 5, iters = 30;
  bool deterministic = false;
  std::string dq = "auto";  // the dQ strategy (BackwardArgs::dq_mode)
  std::vector<std::string> sets;  // runtime parameters, NAME=VALUE
  bool json = false;
  bool no_flush = false;  // keep L2 warm between timed runs (default: flush it first, like triton's do_bench)
};

int run_bench_backward(const BenchBackwardOptions& o) {
  dsl::Spec spec = o.spec.load();
  std::vector<int64_t> s = parse_shape(o.shape, "--shape");
  if (s.size() != 6) throw Error("--shape expects B,H,Hkv,Sq,Skv,D");
  const int64_t B = s[0], H = s[1], Hkv = s[2], Sq = s[3], Skv = s[4], D = s[5];
  spec.head_dim = static_cast<int>(D);
  BenchDevice bench(o.device, "bench-backward");
  const Device device = bench.device();
  const runtime::CudaDriver* drv = &bench.driver();

  Runtime rt;
  auto kernel = rt.compile(spec);
  std::mt19937 rng(1234);
  auto add = [&](NpyArray a) { return bench.add(std::move(a)); };
  auto empty = [&](dsl::DType dt, std::vector<int64_t> shape) { return bench.empty(dt, std::move(shape)); };
  AttentionArgs fa;
  fa.device = device;
  fa.q = add(random_array(spec.dtype, {B, H, Sq, D}, rng, 0, 1));
  fa.k = add(random_array(spec.dtype, {B, Hkv, Skv, D}, rng, 0, 1));
  fa.v = add(random_array(spec.dtype, {B, Hkv, Skv, D}, rng, 0, 1));
  fa.o = empty(spec.dtype, {B, H, Sq, D});
  fa.lse = empty(dsl::DType::F32, {B, H, Sq});
  std::map<std::string, int64_t> values = {{"B", B}, {"H", H}, {"Hkv", Hkv}, {"Sq", Sq}, {"Skv", Skv}, {"D", D}, {"L", 2 * Skv - 1}};
  BackwardArgs ba;
  ba.device = device;
  for (const dsl::BufferDecl& b : spec.buffers) {
    std::vector<int64_t> shape;
    for (const dsl::Dim& d : b.shape) {
      if (!d.is_symbol) shape.push_back(d.value);
      else if (values.count(d.symbol)) shape.push_back(values[d.symbol]);
      else throw Error(fmt::format("buffer `{}` has symbol {} that the shape does not bind", b.name, d.symbol));
    }
    NpyArray a = random_array(b.dtype, shape, rng, 0, 8);
    if (b.dtype == dsl::DType::F32 || b.dtype == dsl::DType::BF16 || b.dtype == dsl::DType::F16) {
      // Small values: ALiBi-like slopes and biases, not N(0, 1) logits on top of the scores.
      for (int64_t i = 0; i < a.numel(); ++i)
        if (b.dtype == dsl::DType::F32) a.as<float>()[i] *= 0.05f;
    }
    fa.buffers.emplace_back(b.name, add(a));
    if (b.requires_grad) ba.grads.emplace_back(b.name, empty(dsl::DType::F32, shape));
  }
  for (const std::string& st : o.sets) {
    const ParamSetting set = parse_param_setting(spec, st);
    fa.params.emplace_back(set.param->name, set.value);
  }
  ba.q = fa.q, ba.k = fa.k, ba.v = fa.v, ba.o = fa.o, ba.lse = fa.lse, ba.buffers = fa.buffers, ba.params = fa.params;
  ba.d_o = add(random_array(spec.dtype, {B, H, Sq, D}, rng, 0, 1));
  ba.dq = empty(spec.dtype, {B, H, Sq, D});
  ba.dk = empty(spec.dtype, {B, Hkv, Skv, D});
  ba.dv = empty(spec.dtype, {B, Hkv, Skv, D});
  ba.deterministic = o.deterministic;
  ba.dq_mode = o.dq == "atomic" ? BackwardDqMode::Atomic : o.dq == "qmajor" ? BackwardDqMode::QueryMajor : BackwardDqMode::Auto;
  std::unique_ptr<BlockMask> mask;
  kernel->forward(fa);
  if (spec.mask_mod) {
    mask = kernel->build_block_mask(fa);
    fa.block_mask = mask.get();
    ba.block_mask = mask.get();
  }
  kernel->backward(ba);
  runtime::check_cu(drv->cuCtxSynchronize(), "synchronise");
  kernel->check_errors(device.index, nullptr);

  const LaunchTiming timing{o.warmup, o.iters, !o.no_flush};
  auto time = [&](const std::function<void()>& fn) { return median_ms(time_launches(timing, fn)); };
  double fwd = time([&] { kernel->forward(fa); });
  double bwd = time([&] { kernel->backward(ba); });
  double both = time([&] {
    kernel->forward(fa);
    kernel->backward(ba);
  });
  kernel->check_errors(device.index, nullptr);
  const runtime::DeviceInfo& info = runtime::device_info(device.index);
  if (o.json) {
    fmt::print("{{\"spec\": \"{}\", \"gpu\": \"{}\", \"B\": {}, \"H\": {}, \"Hkv\": {}, \"Sq\": {}, \"Skv\": {}, \"D\": {}, \"deterministic\": {}, "
               "\"dq\": \"{}\", \"fwd_ms\": {:.4f}, \"bwd_ms\": {:.4f}, \"fwd_bwd_ms\": {:.4f}}}\n",
               spec.name, info.name, B, H, Hkv, Sq, Skv, D, o.deterministic ? "true" : "false", o.dq, fwd, bwd, both);
  } else {
    fmt::print("{} on {}: B{} H{} Hkv{} Sq{} Skv{} D{}{}, dq {}: forward {:.4f} ms, backward {:.4f} ms, forward+backward {:.4f} ms\n",
               spec.name, info.name, B, H, Hkv, Sq, Skv, D, o.deterministic ? " deterministic" : "", o.dq, fwd, bwd, both);
  }
  return 0;
}

}  // namespace

void add_bench_backward_command(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand("bench-backward", "Time the forward and backward kernels of a spec on random inputs (GPU)");
  auto o = std::make_shared<BenchBackwardOptions>();
  o->spec.add_to(cmd);
  cmd->add_option("--shape", o->shape, "B,H,Hkv,Sq,Skv,D")->required();
  cmd->add_option("--device", o->device, "cuda:N")->capture_default_str();
  cmd->add_option("--warmup", o->warmup, "Untimed runs first")->capture_default_str();
  cmd->add_option("--iters", o->iters, "Timed runs (the median is reported)")->capture_default_str();
  cmd->add_flag("--deterministic", o->deterministic, "Deterministic backward (fixed-point accumulation)");
  cmd->add_option("--dq", o->dq, "dQ strategy: atomic (KV-major kernel), qmajor (query-major pass) or auto (FLEXJIT_BWD_DQ overrides)")
      ->check(CLI::IsMember({"auto", "atomic", "qmajor"}))
      ->capture_default_str();
  cmd->add_option("--set", o->sets, "A runtime parameter: NAME=VALUE");
  cmd->add_flag("--json", o->json, "One JSON object per run");
  cmd->add_flag("--no-flush", o->no_flush, "Do not evict L2 before each timed run");
  cmd->callback([o, &action] { action = [o] { return run_bench_backward(*o); }; });
}

}  // namespace flexjit::tools
