// `flexjit run SPEC --q q.npy --k k.npy --v v.npy --out o.npy [--lse lse.npy] --device cuda:0|cpu
//  [--backward --do do.npy --dq dq.npy --dk dk.npy --dv dv.npy [--grad NAME=dNAME.npy]] [--ring R]`:
// one attention launch (and its backward) on files, for users checking a spec against
// their framework; with --ring, the same computed by ring attention over R virtual ranks.
#include <fmt/format.h>

#include <map>

#include "compiler/bindings.h"
#include "dsl/error.h"
#include "runtime/flexjit.hpp"
#include "tools/commands.h"
#include "tools/ring_run.h"
#include "tools/spec_options.h"
#include "tools/tensor_io.h"

namespace flexjit::tools {

namespace {

struct RunOptions {
  SpecOptions spec;
  std::string q, k, v, out, lse, device = "cuda:0";
  std::vector<std::string> loads, sets;
  float scale = 0;
  bool backward = false, deterministic = false;
  std::string d_o, dq, dk, dv;
  int ring = 0;  // virtual ranks of ring attention (0: one launch)
  std::string ring_sharding = "zigzag";
};

std::pair<std::string, std::string> split_eq(const std::string& s, const char* flag) {
  size_t eq = s.find('=');
  if (eq == std::string::npos || eq == 0) throw Error(fmt::format("{} expects NAME=VALUE, got '{}'", flag, s));
  return {s.substr(0, eq), s.substr(eq + 1)};
}

void check_backward_options(const RunOptions& o) {
  if (!o.backward) {
    if (!o.d_o.empty() || !o.dq.empty() || !o.dk.empty() || !o.dv.empty() || !o.spec.grads.empty() || o.deterministic)
      throw Error("--do, --dq, --dk, --dv, --grad and --deterministic need --backward");
    return;
  }
  if (o.d_o.empty() || o.dq.empty() || o.dk.empty() || o.dv.empty())
    throw Error("--backward needs --do (the gradient of O) and the output files --dq, --dk and --dv");
}

int run_run(const RunOptions& o) {
  check_backward_options(o);
  RingRun ring{o.ring, RingSharding::Zigzag};
  if (o.ring < 0) throw Error(fmt::format("--ring {}: give the number of virtual ranks (1 or more)", o.ring));
  ring.sharding = parse_ring_sharding(o.ring_sharding);
  dsl::Spec spec = o.spec.load();  // marks the --grad buffers
  std::vector<std::pair<std::string, std::string>> grad_files;
  for (const std::string& g : o.spec.grads) grad_files.push_back(split_eq(g, "--grad"));
  Device device = parse_device(o.device);
  NpyArray q = read_npy(o.q), k = read_npy(o.k), v = read_npy(o.v);
  if (q.shape.size() == 4) {
    spec.head_dim = static_cast<int>(q.shape[3]);
    if (v.shape.size() == 4 && v.shape[3] != q.shape[3]) spec.head_dim_v = static_cast<int>(v.shape[3]);
  }
  spec.dtype = q.dtype;
  Runtime rt;
  auto kernel = rt.compile(spec);
  std::vector<PlacedTensor> placed;
  placed.reserve(16 + o.loads.size() + o.spec.grads.size());
  auto add = [&](NpyArray a) -> Tensor {
    placed.push_back(place(std::move(a), device));
    return placed.back().tensor();
  };
  AttentionArgs args;
  args.device = device;
  args.scale = o.scale;
  std::vector<int64_t> o_shape = q.shape;
  if (o_shape.size() == 4 && v.shape.size() == 4) o_shape[3] = v.shape[3];
  std::vector<int64_t> lse_shape(q.shape.begin(), q.shape.size() >= 3 ? q.shape.begin() + 3 : q.shape.end());
  args.q = add(std::move(q));
  args.k = add(std::move(k));
  args.v = add(std::move(v));
  placed.push_back(place_empty(spec.dtype, o_shape, device));
  size_t o_index = placed.size() - 1;
  args.o = placed.back().tensor();
  size_t lse_index = 0;
  if (!o.lse.empty() || o.backward) {
    placed.push_back(place_empty(dsl::DType::F32, lse_shape, device));
    lse_index = placed.size() - 1;
    args.lse = placed.back().tensor();
  }
  for (const std::string& l : o.loads) {
    auto [name, path] = split_eq(l, "--load");
    args.buffers.emplace_back(name, add(read_npy(path)));
  }
  for (const std::string& s : o.sets) {
    auto [name, value] = split_eq(s, "--set");
    const dsl::ParamDecl* p = spec.find_param(name);
    if (!p) throw Error(fmt::format("--set names `{}`, which is not a parameter of the spec", name));
    Value val = parse_param_value(*p, value);
    args.params.emplace_back(name, val.as_double());
  }
  if (ring.ranks > 0) ring_forward(kernel, ring, args);
  else kernel->forward(args);
  if (device.kind == Device::Kind::Cuda) kernel->check_errors(device.index, args.stream);
  fetch(placed[o_index]);
  write_npy(o.out, placed[o_index].host);
  if (!o.lse.empty()) {
    fetch(placed[lse_index]);
    write_npy(o.lse, placed[lse_index].host);
  }
  if (!o.backward) return 0;

  BackwardArgs b;
  b.q = args.q, b.k = args.k, b.v = args.v, b.o = args.o, b.lse = args.lse;
  b.scale = args.scale, b.buffers = args.buffers, b.params = args.params, b.device = device;
  b.deterministic = o.deterministic;
  b.d_o = add(read_npy(o.d_o));
  std::vector<std::pair<std::string, size_t>> outputs;  // file, index into placed
  auto output = [&](const std::string& file, dsl::DType dtype, const std::vector<int64_t>& shape) {
    placed.push_back(place_empty(dtype, shape, device));
    outputs.emplace_back(file, placed.size() - 1);
    return placed.back().tensor();
  };
  b.dq = output(o.dq, spec.dtype, b.q.shape);
  b.dk = output(o.dk, spec.dtype, b.k.shape);
  b.dv = output(o.dv, spec.dtype, b.v.shape);
  for (const auto& [name, path] : grad_files) {
    const Tensor* buffer = nullptr;
    for (const auto& [bn, t] : args.buffers)
      if (bn == name) buffer = &t;
    if (!buffer) throw Error(fmt::format("--grad {}: load the buffer with --load {}=FILE.npy too", name, name));
    b.grads.emplace_back(name, output(path, dsl::DType::F32, buffer->shape));
  }
  if (ring.ranks > 0) ring_backward(kernel, ring, b);
  else kernel->backward(b);
  if (device.kind == Device::Kind::Cuda) kernel->check_errors(device.index, b.stream);
  for (const auto& [file, index] : outputs) {
    fetch(placed[index]);
    write_npy(file, placed[index].host);
  }
  return 0;
}

}  // namespace

void add_run_command(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand("run", "Run attention with the spec on .npy inputs (q [B,H,Sq,D], k/v [B,Hkv,Skv,D])");
  auto o = std::make_shared<RunOptions>();
  o->spec.plain_attention_by_default = true;  // q, k and v alone: plain attention
  o->spec.add_to(cmd);
  cmd->add_option("--q", o->q, "Queries [B, H, Sq, D] (.npy, bf16 as uint16, f16, or f32 on the CPU)")->required();
  cmd->add_option("--k", o->k, "Keys [B, Hkv, Skv, D]")->required();
  cmd->add_option("--v", o->v, "Values [B, Hkv, Skv, Dv]")->required();
  cmd->add_option("--out", o->out, "Output O [B, H, Sq, Dv] (.npy)")->required();
  cmd->add_option("--lse", o->lse, "Also write the natural-log LSE [B, H, Sq] (f32 .npy)");
  cmd->add_option("--load", o->loads, "A captured buffer: NAME=FILE.npy (repeatable)");
  cmd->add_option("--set", o->sets, "A runtime parameter: NAME=VALUE (repeatable)");
  cmd->add_option("--scale", o->scale, "Softmax scale (default 1/sqrt(D))");
  cmd->add_option("--device", o->device, "cuda:N or cpu")->capture_default_str();
  cmd->add_flag("--backward", o->backward, "Also run the backward pass (needs --do, --dq, --dk, --dv)");
  cmd->add_option("--do", o->d_o, "Gradient of the loss with respect to O [B, H, Sq, Dv] (.npy)");
  cmd->add_option("--dq", o->dq, "Output dQ [B, H, Sq, D] (.npy)");
  cmd->add_option("--dk", o->dk, "Output dK [B, Hkv, Skv, D] (.npy)");
  cmd->add_option("--dv", o->dv, "Output dV [B, Hkv, Skv, Dv] (.npy)");
  cmd->add_flag("--deterministic", o->deterministic, "Backward in a fixed summation order without float atomics");
  cmd->add_option("--ring", o->ring, "Ring attention over R virtual ranks of this process (context parallelism; on a GPU, one stream "
                  "per rank): the same outputs, computed shard by shard with global positions");
  cmd->add_option("--ring-sharding", o->ring_sharding, "With --ring: zigzag (rank r holds chunks r and 2R-1-r of 2R) or contiguous")
      ->capture_default_str();
  cmd->callback([o, &action] { action = [o] { return run_run(*o); }; });
}

}  // namespace flexjit::tools
