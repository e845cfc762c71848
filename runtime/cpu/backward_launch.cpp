#include "runtime/cpu/backward_launch.h"

#include <fmt/format.h>

#include <cmath>

#include "compiler/codegen/kernel_source.h"
#include "compiler/passes/dependence.h"
#include "compiler/passes/row_constant_scatters.h"
#include "dsl/builtins.h"
#include "dsl/error.h"
#include "runtime/cpu/backward_cpu.h"
#include "runtime/cpu/cpu_backend.h"
#include "runtime/cpu/forward_common.h"
#include "runtime/cpu/mod_jit.h"
#include "runtime/forward_launch.h"

namespace flexjit::cpu {

namespace {

constexpr int kBlockM = 64;
constexpr int kBlockN = 64;

Operand operand(const Tensor& t) {
  Operand o;
  o.data = t.data;
  std::vector<int64_t> s = t.effective_strides();
  for (int i = 0; i < 4; ++i) o.stride[i] = s[i];
  return o;
}

OutOperand out_operand(const Tensor& t) {
  OutOperand o;
  o.data = t.data;
  std::vector<int64_t> s = t.effective_strides();
  for (int i = 0; i < 4; ++i) o.stride[i] = s[i];
  return o;
}

// d_o, dq, dk and dv: present, of the expected shape and dtype, with one stride per dimension.
void check_operand(const Tensor& t, const char* name, const std::vector<int64_t>& want, const char* layout, dsl::DType dtype) {
  if (!t.data)
    throw Error(fmt::format("backward (CPU): `{}` has no data; pass a {} = [{}] {} tensor in host memory", name, layout, fmt::join(want, ", "),
                            dsl::dtype_name(dtype)));
  if (t.shape != want)
    throw Error(fmt::format("backward (CPU): `{}` has shape [{}] but must be {} = [{}]", name, fmt::join(t.shape, ", "), layout, fmt::join(want, ", ")));
  if (t.dtype != dtype)
    throw Error(fmt::format("backward (CPU): `{}` is {} but must be {} (the spec's dtype, as q, k, v and o)", name, dsl::dtype_name(t.dtype),
                            dsl::dtype_name(dtype)));
  if (!t.strides.empty() && t.strides.size() != t.shape.size())
    throw Error(fmt::format("backward (CPU): `{}` has {} strides for {} dimensions; give one per dimension or none (contiguous)", name,
                            t.strides.size(), t.shape.size()));
  runtime::check_addressable(t, fmt::format("backward (CPU): `{}`", name));
}

// The gradient outputs in args.grads order, and for each scatter its output (-1: not wanted).
std::vector<GradOutput> check_grads(const dsl::Spec& spec, const BackwardSpec& bs, const std::vector<std::pair<std::string, Tensor>>& grad_args,
                                    const std::vector<Tensor>& buffers, std::vector<int>& scatter_target) {
  std::vector<GradOutput> out;
  std::vector<int> output_of(spec.buffers.size(), -1);
  for (const auto& [name, t] : grad_args) {
    int idx = -1;
    for (size_t i = 0; i < spec.buffers.size(); ++i)
      if (spec.buffers[i].name == name) idx = static_cast<int>(i);
    if (idx < 0) {
      std::vector<std::string> names;
      for (const auto& b : spec.buffers) names.push_back(b.name);
      auto guess = dsl::closest_name(name, names);
      throw Error(fmt::format("backward (CPU): grads names buffer `{}`, which spec `{}` does not declare{}", name, spec.name,
                              guess ? fmt::format("; did you mean `{}`?", *guess)
                                    : names.empty() ? std::string("; it declares no buffers")
                                                    : fmt::format("; it declares: {}", fmt::join(names, ", "))));
    }
    const dsl::BufferDecl& d = spec.buffers[static_cast<size_t>(idx)];
    if (!d.requires_grad)
      throw Error(fmt::format("backward (CPU): grads names buffer `{}`, which spec `{}` does not mark as requiring a gradient; add it to the "
                              "spec's \"grad\" list (BufferDecl::requires_grad) or drop the entry",
                              name, spec.name));
    if (output_of[static_cast<size_t>(idx)] >= 0)
      throw Error(fmt::format("backward (CPU): grads names buffer `{}` twice; give one gradient tensor per buffer", name));
    const std::vector<int64_t>& shape = buffers[static_cast<size_t>(idx)].shape;
    if (!t.data) throw Error(fmt::format("backward (CPU): the gradient of buffer `{}` has no data; pass an f32 tensor of shape [{}]", name, fmt::join(shape, ", ")));
    if (t.dtype != dsl::DType::F32)
      throw Error(fmt::format("backward (CPU): the gradient of buffer `{}` is {} but must be f32 (buffer gradients accumulate in fp32 for any "
                              "buffer dtype; convert afterwards)",
                              name, dsl::dtype_name(t.dtype)));
    if (t.shape != shape)
      throw Error(fmt::format("backward (CPU): the gradient of buffer `{}` has shape [{}] but the buffer has shape [{}]; pass a tensor of the "
                              "buffer's shape",
                              name, fmt::join(t.shape, ", "), fmt::join(shape, ", ")));
    if (!t.strides.empty() && t.strides.size() != t.shape.size())
      throw Error(fmt::format("backward (CPU): the gradient of buffer `{}` has {} strides for {} dimensions", name, t.strides.size(), t.shape.size()));
    output_of[static_cast<size_t>(idx)] = static_cast<int>(out.size());
    out.push_back(GradOutput{static_cast<float*>(t.data), t.shape, t.effective_strides()});
  }
  // A buffer with no elements has nothing to scatter into (its loads read zeros).
  for (size_t i = 0; i < buffers.size(); ++i)
    for (int64_t e : buffers[i].shape)
      if (e <= 0) output_of[i] = -1;
  for (const GradScatter& sc : bs.gradient.scatters) scatter_target.push_back(output_of[static_cast<size_t>(sc.buffer)]);
  return out;
}

}  // namespace

std::string backward_cache_key(const SpecIR& ir) {
  std::string key = canonical_ir_text(ir) + "grad:";
  for (const dsl::BufferDecl& b : ir.spec().buffers)
    if (b.requires_grad) key += " " + b.name;
  return key + "\n";
}

std::shared_ptr<const BackwardSpec> make_backward_spec(const SpecIR& ir) {
  auto bs = std::make_shared<BackwardSpec>();
  bs->gradient = differentiate_score_mod(ir);
  drop_row_constant_scatters(bs->gradient);  // their gradient is exactly zero (compiler/passes/row_constant_scatters.h)
  // The generator emits each node once per function: give it the programs the derivative
  // expressions were CSE'd with, so shared values (tanh(score / cap), a loaded bias) are the
  // same nodes.
  bs->ir = ir;
  bs->ir.score_mod = bs->gradient.score_mod;
  bs->ir.mask_mod = bs->gradient.mask_mod;
  bs->canonical = backward_cache_key(bs->ir);
  std::vector<ir::Expr> roots;
  if (bs->ir.score_mod) roots.push_back(bs->ir.score_mod);
  if (bs->ir.mask_mod) roots.push_back(bs->ir.mask_mod);
  bs->ranges = analyze_ranges(roots, bs->ir.checked, VarDomains::forward(bs->ir.checked));
  if (bs->ir.mask_mod) {
    DependenceInfo deps({bs->ir.mask_mod});
    const Dependence& d = deps.of(bs->ir.mask_mod);
    bs->mask_uses_b = d.uses(dsl::VarId::B);
    bs->mask_uses_h = d.uses(dsl::VarId::H) || d.uses(dsl::VarId::KvHead);
  }
  const ir::FloatImm* one = bs->gradient.d_score.as<ir::FloatImm>();
  bs->d_score_is_one = one && one->value == 1.0f;
  return bs;
}

BackwardLaunch::BackwardLaunch(const SpecIR& ir, const BackwardSpec& bs, const runtime::LaunchShape& mods_shape, const AttentionArgs& binding,
                               const std::vector<std::pair<std::string, Tensor>>& grads)
    : bs_(bs), cfg_(settings()) {
  const dsl::Spec& spec = ir.spec();
  const int64_t D = mods_shape.head_dim;
  buffers_ = runtime::collect_buffers(spec, binding, {});
  values_ = runtime::bind_launch(ir.checked, mods_shape, buffers_, binding);
  grads_ = check_grads(spec, bs, grads, buffers_, scatter_target_);

  base_.H = mods_shape.heads;
  base_.Hkv = mods_shape.kv_heads;
  base_.D = D;
  base_.Dv = mods_shape.head_dim_v;
  base_.scale = binding.scale > 0 ? binding.scale : static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
  base_.dtype = elem_type(spec.dtype);
  base_.block_m = cfg_.block_m > 0 ? cfg_.block_m : kBlockM;
  base_.block_n = cfg_.block_n > 0 ? cfg_.block_n : kBlockN;
  if (bs.ir.score_mod || bs.ir.mask_mod) {
    runtime::VariantChoice choice = runtime::choose_variant(bs.ranges, bs.ir.checked, values_);
    CodeGenOptions options;
    options.tile_size = base_.block_n;
    options.checked_loads = choice.checked_loads;
    options.vector_math = !cfg_.exact_math;
    // Nothing hoisted: the gradient expressions are not staged, and one module keeps the
    // recomputed scores and their derivatives consistent.
    options.hoist = false;
    options.gradient = &bs.gradient;
    mods_ = compile_mods(bs.ir, bs.ranges, options, bs.canonical);
    params_ = mod_params(*mods_, buffers_, values_);
    set_mod_fields(base_, *mods_, params_);
    base_.need_d_score = !bs.d_score_is_one;
    base_.num_scatters = static_cast<int>(scatter_target_.size());
    base_.scatter_target = scatter_target_.data();
  }
}

void BackwardLaunch::run(const std::vector<BackwardJob>& jobs) const {
  BlockSparsity sparsity;
  sparsity.ir = &bs_.ir;
  sparsity.values = &values_;
  sparsity.uses_b = bs_.mask_uses_b;
  sparsity.uses_h = bs_.mask_uses_h;
  DriverOptions driver;
  driver.threads = cfg_.threads;
  driver.isa = choose_isa(cfg_.isa);
  run_backward(jobs, sparsity, driver, grads_);
}

void launch_backward(const SpecIR& ir, const BackwardSpec& bs, const BackwardArgs& a) {
  const dsl::Spec& spec = ir.spec();
  elem_type(spec.dtype);
  if (!a.lse.data)
    throw Error("backward (CPU): `lse` is required: pass the [B, H, Sq] f32 natural-log LSE the forward wrote (set AttentionArgs::lse on the "
                "forward), or the merged LSE of a forward split into KV chunks");
  AttentionArgs fa;
  fa.q = a.q;
  fa.k = a.k;
  fa.v = a.v;
  fa.o = a.o;
  fa.lse = a.lse;
  fa.scale = a.scale;
  fa.buffers = a.buffers;
  fa.params = a.params;
  fa.device = a.device;
  fa.q_offset = a.q_offset;
  fa.kv_offset = a.kv_offset;
  fa.seqlen_q = a.seqlen_q;
  fa.seqlen_kv = a.seqlen_kv;
  runtime::LaunchShape shape = runtime::validate_operands(spec, fa, /*gpu=*/false);
  const int64_t B = shape.batch, H = shape.heads, Hkv = shape.kv_heads, Sq = shape.seqlen_q, Skv = shape.seqlen_kv, D = shape.head_dim,
                Dv = shape.head_dim_v;
  check_operand(a.d_o, "d_o", {B, H, Sq, Dv}, "[B, H, Sq, Dv]", spec.dtype);
  check_operand(a.dq, "dq", {B, H, Sq, D}, "[B, H, Sq, D]", spec.dtype);
  check_operand(a.dk, "dk", {B, Hkv, Skv, D}, "[B, Hkv, Skv, D]", spec.dtype);
  check_operand(a.dv, "dv", {B, Hkv, Skv, Dv}, "[B, Hkv, Skv, Dv]", spec.dtype);
  BackwardLaunch launch(ir, bs, runtime::mods_shape(shape, runtime::window_of(fa)), fa, a.grads);

  BackwardJob job = launch.job();
  job.B = B;
  job.Sq = Sq;
  job.Skv = Skv;
  job.q_offset = a.q_offset;
  job.kv_offset = a.kv_offset;
  job.q = operand(a.q);
  job.k = operand(a.k);
  job.v = operand(a.v);
  job.o = operand(a.o);
  job.d_o = operand(a.d_o);
  job.dq = out_operand(a.dq);
  job.dk = out_operand(a.dk);
  job.dv = out_operand(a.dv);
  job.lse = static_cast<const float*>(a.lse.data);
  std::vector<int64_t> ls = a.lse.effective_strides();
  for (int i = 0; i < 3; ++i) job.lse_stride[i] = ls[i];
  launch.run({job});
}

}  // namespace flexjit::cpu
