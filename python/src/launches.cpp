#include "launches.h"

#include <algorithm>
#include <chrono>

#include "dsl/error.h"
#include "launch_args.h"

namespace flexjit::python {

namespace {

// The common part of forward, backward and the spec query: q, k, v, the mods and captures.
struct DenseLaunch {
  LaunchArgs args;
  Tensor q, k, v;
};

void read_dense(DenseLaunch& l, const ModArgs& mods, nb::handle q, nb::handle k, nb::handle v) {
  l.args.read_mods(mods.score_mod, mods.mask_mod);
  l.q = l.args.views.view(q, "q");
  l.k = l.args.views.view(k, "k");
  l.v = l.args.views.view(v, "v");
  require_rank(l.q, 4, "q", "[B, H, Sq, D]");
  require_rank(l.k, 4, "k", "[B, Hkv, Skv, D]");
  require_rank(l.v, 4, "v", "[B, Hkv, Skv, Dv]");
  l.args.set_operands(l.q, l.v);
}

// Buffers are read after every operand, so a misplaced operand is named before a buffer.
void read_captures(LaunchArgs& args, const ModArgs& mods, const LaunchSizes& sizes) {
  args.read_buffers(mods.buffers, sizes);
  args.read_params(mods.params);
  args.read_grads(mods.grads);
}

LaunchSizes dense_sizes(const Tensor& q, const Tensor& k) { return {q.shape[0], q.shape[1], k.shape[1], q.shape[2], k.shape[2]}; }

// The packed q [total_q, H, D], k [total_kv, Hkv, D] and v [total_kv, Hkv, Dv] of a ragged launch, after its mods.
void read_packed(LaunchArgs& args, const ModArgs& mods, nb::handle q, nb::handle k, nb::handle v, Tensor& tq, Tensor& tk, Tensor& tv) {
  args.read_mods(mods.score_mod, mods.mask_mod);
  tq = args.views.view(q, "q");
  tk = args.views.view(k, "k");
  tv = args.views.view(v, "v");
  require_rank(tq, 3, "q", "[total_q, H, D]");
  require_rank(tk, 3, "k", "[total_kv, Hkv, D]");
  require_rank(tv, 3, "v", "[total_kv, Hkv, Dv]");
}

// The sizes a ragged launch's buffers see: B sequences, Sq and Skv the bounds of their lengths.
LaunchSizes ragged_sizes(const Tensor& q, const Tensor& k, const Tensor& cu_seqlens_q, int max_seqlen_q, int max_seqlen_kv) {
  require_rank(cu_seqlens_q, 1, "cu_seqlens_q", "[batch + 1]");
  return {cu_seqlens_q.shape[0] - 1, q.shape[1], k.shape[1], max_seqlen_q, max_seqlen_kv};
}

// grad_outputs ({buffer name: f32 array of its shape}, or None) as the launch's gradients, each buffer marked `grad` in the spec.
void read_grad_outputs(LaunchArgs& args, nb::handle grad_outputs, std::vector<std::pair<std::string, Tensor>>& grads) {
  if (grad_outputs.is_none()) return;
  for (auto [name, array] : nb::borrow<nb::dict>(grad_outputs)) {
    std::string n = nb::cast<std::string>(name);
    args.request.grads.push_back(n);
    grads.emplace_back(n, args.views.view(array, "the gradient of buffer `" + n + "`"));
  }
}

// A forward launch with its arguments read: what forward() runs, and what time_forward() repeats.
struct PreparedForward {
  DenseLaunch l;
  AttentionArgs a;
  std::shared_ptr<Kernel> kernel;
};

void prepare_forward(PreparedForward& p, const ModArgs& mods, nb::handle q, nb::handle k, nb::handle v, nb::handle o, nb::handle lse,
                     float scale, uintptr_t stream) {
  read_dense(p.l, mods, q, k, v);
  AttentionArgs& a = p.a;
  a.q = p.l.q, a.k = p.l.k, a.v = p.l.v;
  a.o = p.l.args.views.view(o, "o");
  a.lse = p.l.args.views.view_optional(lse, "lse");
  read_captures(p.l.args, mods, dense_sizes(p.l.q, p.l.k));
  p.kernel = kernel_for(p.l.args.request);
  a.buffers = launch_buffers(p.l.args.request);
  a.params = launch_params(p.l.args.request);
  a.scale = scale;
  a.stream = stream_of(stream);
  a.device = p.l.args.views.device();
}

}  // namespace

void forward(const ModArgs& mods, nb::handle q, nb::handle k, nb::handle v, nb::handle o, nb::handle lse, float scale, BlockMasks* block_mask,
             uintptr_t stream) {
  PreparedForward p;
  prepare_forward(p, mods, q, k, v, o, lse, scale, stream);
  nb::gil_scoped_release release;
  if (block_mask) p.a.block_mask = block_mask->for_forward(*p.kernel, p.a);
  p.kernel->forward(p.a);
}

double time_forward(const ModArgs& mods, nb::handle q, nb::handle k, nb::handle v, nb::handle o, nb::handle lse, float scale,
                    uintptr_t stream, int iterations) {
  PreparedForward p;
  prepare_forward(p, mods, q, k, v, o, lse, scale, stream);
  nb::gil_scoped_release release;
  p.kernel->forward(p.a);  // compiles and loads the kernel, allocates the workspace
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iterations; ++i) p.kernel->forward(p.a);
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() / std::max(iterations, 1);
}

std::string forward_spec(const ModArgs& mods, nb::handle q, nb::handle k, nb::handle v) {
  DenseLaunch l;
  read_dense(l, mods, q, k, v);
  read_captures(l.args, mods, dense_sizes(l.q, l.k));
  return dsl::spec_to_json(build_spec(l.args.request));
}

void backward(const ModArgs& mods, nb::handle q, nb::handle k, nb::handle v, nb::handle o, nb::handle lse, nb::handle d_o, nb::handle dq,
              nb::handle dk, nb::handle dv, nb::handle grad_outputs, float scale, bool deterministic, BlockMasks* block_mask, uintptr_t stream) {
  DenseLaunch l;
  read_dense(l, mods, q, k, v);
  BackwardArgs b;
  b.q = l.q, b.k = l.k, b.v = l.v;
  b.o = l.args.views.view(o, "o");
  b.lse = l.args.views.view(lse, "lse");
  b.d_o = l.args.views.view(d_o, "grad_out");
  b.dq = l.args.views.view(dq, "dq");
  b.dk = l.args.views.view(dk, "dk");
  b.dv = l.args.views.view(dv, "dv");
  read_captures(l.args, mods, dense_sizes(l.q, l.k));
  read_grad_outputs(l.args, grad_outputs, b.grads);
  std::shared_ptr<Kernel> kernel = kernel_for(l.args.request);
  b.buffers = launch_buffers(l.args.request);
  b.params = launch_params(l.args.request);
  b.scale = scale;
  b.deterministic = deterministic;
  b.stream = stream_of(stream);
  b.device = l.args.views.device();
  nb::gil_scoped_release release;
  if (block_mask) b.block_mask = block_mask->for_backward(*kernel, b);
  kernel->backward(b);
}

void forward_varlen(const ModArgs& mods, nb::handle q, nb::handle k, nb::handle v, nb::handle o, nb::handle lse, nb::handle cu_seqlens_q,
                    nb::handle cu_seqlens_kv, int max_seqlen_q, int max_seqlen_kv, nb::handle k_scale, nb::handle v_scale, const std::string& kv_dtype,
                    bool queries_at_kv_end, float scale, uintptr_t stream) {
  LaunchArgs args;
  VarlenArgs a;
  read_packed(args, mods, q, k, v, a.q, a.k, a.v);
  // numpy has no FP8 dtype: kv_dtype names the format of uint8 k and v bytes (torch's float8 tensors carry theirs).
  if (!kv_dtype.empty()) {
    const std::optional<DType> f = dsl::parse_kv_cache_dtype(kv_dtype);
    if (!f || (*f != DType::F8E4M3 && *f != DType::F8E5M2))
      throw Error("forward_varlen: unknown kv_dtype `" + kv_dtype + "`; use fp8 (f8e4m3, float8_e4m3fn) or f8e5m2 (float8_e5m2)");
    for (Tensor* t : {&a.k, &a.v})
      if (t->dtype == DType::U8) t->dtype = *f;
  }
  a.k_scale = args.views.view_optional(k_scale, "k_scale");
  a.v_scale = args.views.view_optional(v_scale, "v_scale");
  a.o = args.views.view(o, "o");
  a.lse = args.views.view_optional(lse, "lse");
  a.cu_seqlens_q = args.views.view(cu_seqlens_q, "cu_seqlens_q");
  a.cu_seqlens_kv = args.views.view(cu_seqlens_kv, "cu_seqlens_kv");
  const LaunchSizes sizes = ragged_sizes(a.q, a.k, a.cu_seqlens_q, max_seqlen_q, max_seqlen_kv);
  args.set_operands(a.q, a.v);
  read_captures(args, mods, sizes);
  std::shared_ptr<Kernel> kernel = kernel_for(args.request);
  a.max_seqlen_q = max_seqlen_q;
  a.max_seqlen_kv = max_seqlen_kv;
  a.queries_at_kv_end = queries_at_kv_end;
  a.buffers = launch_buffers(args.request);
  a.params = launch_params(args.request);
  a.scale = scale;
  a.stream = stream_of(stream);
  a.device = args.views.device();
  nb::gil_scoped_release release;
  kernel->forward_varlen(a);
}

void backward_varlen(const ModArgs& mods, nb::handle q, nb::handle k, nb::handle v, nb::handle o, nb::handle lse, nb::handle d_o, nb::handle dq,
                     nb::handle dk, nb::handle dv, nb::handle cu_seqlens_q, nb::handle cu_seqlens_kv, int max_seqlen_q, int max_seqlen_kv,
                     nb::handle grad_outputs, float scale, bool deterministic, uintptr_t stream) {
  LaunchArgs args;
  VarlenBackwardArgs b;
  read_packed(args, mods, q, k, v, b.q, b.k, b.v);
  b.o = args.views.view(o, "o");
  b.lse = args.views.view(lse, "lse");
  b.d_o = args.views.view(d_o, "grad_out");
  b.dq = args.views.view(dq, "dq");
  b.dk = args.views.view(dk, "dk");
  b.dv = args.views.view(dv, "dv");
  b.cu_seqlens_q = args.views.view(cu_seqlens_q, "cu_seqlens_q");
  b.cu_seqlens_kv = args.views.view(cu_seqlens_kv, "cu_seqlens_kv");
  const LaunchSizes sizes = ragged_sizes(b.q, b.k, b.cu_seqlens_q, max_seqlen_q, max_seqlen_kv);
  args.set_operands(b.q, b.v);
  read_captures(args, mods, sizes);
  read_grad_outputs(args, grad_outputs, b.grads);
  std::shared_ptr<Kernel> kernel = kernel_for(args.request);
  b.max_seqlen_q = max_seqlen_q;
  b.max_seqlen_kv = max_seqlen_kv;
  b.buffers = launch_buffers(args.request);
  b.params = launch_params(args.request);
  b.scale = scale;
  b.deterministic = deterministic;
  b.stream = stream_of(stream);
  b.device = args.views.device();
  nb::gil_scoped_release release;
  kernel->backward_varlen(b);
}

std::unique_ptr<DecodeSession> plan_decode(const ModArgs& mods, const DecodeShape& shape) {
  LaunchArgs args;
  args.read_mods(mods.score_mod, mods.mask_mod);
  std::optional<DType> dtype = dsl::parse_dtype(shape.dtype);
  if (!dtype) throw Error("plan_decode: unknown dtype `" + shape.dtype + "`; use bf16, f16 or f32");
  DecodePlanOptions o = shape.options;
  if (!shape.kv_dtype.empty()) {
    o.kv_dtype = dsl::parse_kv_cache_dtype(shape.kv_dtype);
    if (!o.kv_dtype) o.kv_dtype = dsl::parse_dtype(shape.kv_dtype);  // plan_decode says which of these it supports
    if (!o.kv_dtype)
      throw Error("plan_decode: unknown kv_dtype `" + shape.kv_dtype + "`; use fp8 (f8e4m3, float8_e4m3fn), f8e5m2 (float8_e5m2) or q's dtype");
  }
  args.views.place(o.device, "the decode plan");
  args.request.dtype = *dtype;
  args.request.head_dim = shape.head_dim;
  args.request.head_dim_v = shape.head_dim_v;
  read_captures(args, mods, {o.batch, o.heads, o.kv_heads, o.max_seqlen_q, o.max_seqlen_kv});
  auto session = std::make_unique<DecodeSession>();
  session->kernel = kernel_for(args.request);
  session->plan = session->kernel->plan_decode(o);
  return session;
}

void decode(DecodeSession& session, nb::handle buffers, nb::handle params, nb::handle q, nb::handle k, nb::handle v, nb::handle o, nb::handle lse,
            nb::handle page_table, nb::handle kv_lens, nb::handle q_lens, nb::handle k_scale, nb::handle v_scale, float scale, uintptr_t stream) {
  LaunchArgs args;
  const DecodePlanOptions& plan = session.plan->options();
  args.views.place(plan.device, "the decode plan");
  DecodeArgs a;
  a.q = args.views.view(q, "q");
  a.k = args.views.view(k, "k_cache");
  a.v = args.views.view(v, "v_cache");
  // numpy has no FP8 dtype: an FP8 plan takes uint8 arrays as the bytes of its format.
  const bool fp8 = plan.kv_dtype && (*plan.kv_dtype == DType::F8E4M3 || *plan.kv_dtype == DType::F8E5M2);
  for (Tensor* t : {&a.k, &a.v})
    if (fp8 && t->dtype == DType::U8) t->dtype = *plan.kv_dtype;
  a.k_scale = args.views.view_optional(k_scale, "k_scale");
  a.v_scale = args.views.view_optional(v_scale, "v_scale");
  a.o = args.views.view(o, "o");
  a.lse = args.views.view_optional(lse, "lse");
  a.page_table = args.views.view_optional(page_table, "page_table");
  a.kv_lens = args.views.view(kv_lens, "kv_lens");
  a.q_lens = args.views.view_optional(q_lens, "q_lens");
  // The plan's kernel fixes the declarations; these sizes only fill the unused dimension text.
  args.read_buffers(buffers, {plan.batch, plan.heads, plan.kv_heads, plan.max_seqlen_q, plan.max_seqlen_kv});
  args.read_params(params);
  a.buffers = launch_buffers(args.request);
  a.params = launch_params(args.request);
  a.scale = scale;
  a.stream = stream_of(stream);
  nb::gil_scoped_release release;
  session.kernel->decode(*session.plan, a);
}

std::string decode_kv_dtype(const DecodeSession& session) {
  return dsl::dtype_name(session.plan->options().kv_dtype.value_or(session.kernel->spec().dtype));
}

void check_mods(const ModArgs& mods, int64_t batch, int64_t heads, int64_t seqlen_q, int64_t seqlen_kv) {
  LaunchArgs args;
  args.read_mods(mods.score_mod, mods.mask_mod);
  args.request.head_dim = args.request.head_dim_v = 64;
  read_captures(args, mods, {batch, heads, heads, seqlen_q, seqlen_kv});
  kernel_for(args.request);
}

void check_errors(int device, uintptr_t stream) {
  for (const std::shared_ptr<Kernel>& kernel : compiled_kernels()) kernel->check_errors(device, stream_of(stream));
}

}  // namespace flexjit::python
