// KernelImpl's ragged-prefill launches: the forward kernel's kVarlen instantiation (flex_params.cuh), over the work
// tiles of max_seqlen_q x H x B, those past their sequence's end skipped. No block mask (the lengths live on the
// device): the kernel classifies each work tile's KV tiles itself by the mask's interval arithmetic, skipping the
// excluded ones and running the fully kept ones without mask_mod (flex::TileScheduler::classify); a mask that reads
// buffers runs mask_mod on every tile below a sequence's KV length.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "dsl/error.h"
#include "compiler/codegen/decode_source.h"
#include "runtime/cpu_executor.h"
#include "runtime/device.h"
#include "runtime/kernel_impl.h"
#include "runtime/tensor_maps.h"
#include "kernels_templates/flex_fp8_widen_params.cuh"

namespace flexjit {

using runtime::check_cu;

void CpuExecutor::forward_varlen(const SpecIR&, const VarlenArgs&) { throw Error("this CPU backend has no ragged prefill"); }


// Ragged-prefill modules of this kernel, keyed by variant choice and architecture.
struct KernelImpl::VarlenState {
  std::map<std::string, std::unique_ptr<VariantState>> modules;
  // The ranges of launches whose queries sit at the end of their KV (VarlenArgs::queries_at_kv_end): query positions
  // among the KV positions, as decode's (compiler/codegen/decode_source.h).
  std::unique_ptr<RangeInfo> kv_end_ranges;
};

const RangeInfo& KernelImpl::varlen_kv_end_ranges() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!varlen_state_) varlen_state_ = std::make_shared<VarlenState>();
  if (!varlen_state_->kv_end_ranges) varlen_state_->kv_end_ranges = std::make_unique<RangeInfo>(analyze_decode_ranges(ir_));
  return *varlen_state_->kv_end_ranges;
}

KernelImpl::VariantState& KernelImpl::varlen_variant(const runtime::VariantChoice& choice, int device, std::optional<DType> fp8_kv) {
  const runtime::DeviceInfo& info = runtime::device_info(device);
  // Queries at the end of their KV (choice.shard in a ragged launch) compile with those ranges and no specialisation.
  const auto [ir, forward_ranges] = variant_ir(choice);
  const RangeInfo* ranges = choice.shard ? &varlen_kv_end_ranges() : forward_ranges;
  std::lock_guard<std::mutex> lock(mutex_);
  if (!varlen_state_) varlen_state_ = std::make_shared<VarlenState>();
  auto& slot = varlen_state_->modules[fmt::format("{}_{}{}", choice.key(), info.arch, fp8_kv ? dsl::dtype_name(*fp8_kv) : "")];
  if (!slot) {
    auto v = std::make_unique<VariantState>();
    ForwardKernelOptions fo = forward_options(choice, info.arch);
    fo.fp8_kv = fp8_kv;
    v->source = forward_varlen_kernel_source(*ir, *ranges, fo);
    load_library(*v, info.arch);
    slot = std::move(v);
  }
  VariantState& v = *slot;
  if (!v.forward_fn.count(device)) {
    const runtime::CudaDriver& d = require_driver();
    runtime::ScopedDevice scope(device);
    const int smem = v.source.config.shared_bytes();
    if (smem > info.max_shared_optin)
      throw Error(fmt::format("head dim {} needs {} bytes of shared memory per block, but {} allows {}", spec().head_dim, smem, info.name,
                              info.max_shared_optin));
    CUfunction f = v.library.function(kForwardVarlenEntry);
    check_cu(d.cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem), "setting the ragged-prefill kernel's shared memory");
    if (fp8_kv) v.widen_fn[device] = v.library.function(kWidenFp8Entry);
    v.forward_fn[device] = f;
  }
  return v;
}

void KernelImpl::forward_varlen(const VarlenArgs& a) {
  if (a.device.kind == Device::Kind::Cpu) {
    auto cpu = cpu_executor();
    if (!cpu) throw Error("this build of flexjit has no CPU backend (configure with FLEXJIT_CPU_BACKEND=ON)");
    cpu->forward_varlen(ir_, a);
    return;
  }
  const int64_t D = spec().head_dim, Dv = spec().value_head_dim();
  if (!a.q.data || a.q.shape.size() != 3) throw Error("forward_varlen: q must be [total_q, H, D]");
  if (!a.k.data || a.k.shape.size() != 3) throw Error("forward_varlen: k must be [total_kv, Hkv, D]");
  const int64_t H = a.q.shape[1], Hkv = a.k.shape[1];
  // An FP8 K / V (k's dtype says which format) is widened into the spec's dtype before the kernel reads it.
  const std::optional<DType> fp8_kv = runtime::is_fp8(a.k.dtype) ? std::optional<DType>(a.k.dtype) : std::nullopt;
  runtime::check_packed_operand(a.q, "forward_varlen", "q", H, D, spec().dtype);
  runtime::check_packed_operand(a.k, "forward_varlen", "k", Hkv, D, fp8_kv.value_or(spec().dtype));
  runtime::check_packed_operand(a.v, "forward_varlen", "v", Hkv, Dv, fp8_kv.value_or(spec().dtype));
  runtime::check_packed_operand(a.o, "forward_varlen", "o", H, Dv, spec().dtype);
  if (a.v.shape[0] != a.k.shape[0]) throw Error("forward_varlen: k and v must have the same number of rows");
  if (a.o.shape[0] != a.q.shape[0]) throw Error("forward_varlen: o must have as many rows as q");
  if (H < 1 || Hkv < 1 || H % Hkv != 0)
    throw Error(fmt::format("forward_varlen: q has {} heads and k {}: the query heads must be a positive multiple of the KV heads", H, Hkv));
  if (spec().gqa_group && H / Hkv != spec().gqa_group)
    throw Error(fmt::format("forward_varlen: the spec fixes gqa_group = {} but the launch has {} / {} heads", spec().gqa_group, H, Hkv));
  const int64_t B = runtime::check_cu_seqlens(a.cu_seqlens_q, a.cu_seqlens_kv, "forward_varlen");
  if (a.max_seqlen_q < 1 || a.max_seqlen_kv < 1)
    throw Error("forward_varlen: max_seqlen_q and max_seqlen_kv must be >= 1 (the bounds of the per-sequence lengths)");
  if (a.lse.data) {
    if (a.lse.dtype != DType::F32 || a.lse.shape != std::vector<int64_t>{H, a.q.shape[0]} || a.lse.effective_strides()[1] != 1)
      throw Error("forward_varlen: lse must be f32 [H, total_q] with a contiguous last dimension");
  }
  if (!(a.scale >= 0) || std::isinf(a.scale)) throw Error("forward_varlen: scale must be a finite number >= 0 (0 means 1/sqrt(D))");

  const int device = a.device.index >= 0 ? a.device.index : runtime::pointer_device(a.q.data);
  if (device < 0) throw Error("forward_varlen: q is not device memory: pass device pointers, or Device::cpu() for host memory");
  AttentionArgs shim;
  shim.buffers = a.buffers;
  shim.params = a.params;
  shim.workspace = a.workspace;
  shim.stream = a.stream;
  std::vector<Tensor> buffers = runtime::collect_buffers(spec(), shim, bound_for(device));
  auto check = [&](const void* ptr, const std::string& what) {
    if (runtime::pointer_device(ptr) != device) throw Error(fmt::format("forward_varlen: {} is not memory of cuda:{}", what, device));
  };
  check(a.q.data, "q");
  check(a.k.data, "k");
  check(a.v.data, "v");
  check(a.o.data, "o");
  check(a.cu_seqlens_q.data, "cu_seqlens_q");
  check(a.cu_seqlens_kv.data, "cu_seqlens_kv");
  if (a.lse.data) check(a.lse.data, "lse");
  for (size_t i = 0; i < buffers.size(); ++i) check(buffers[i].data, fmt::format("buffer `{}`", spec().buffers[i].name));
  for (const Tensor* t : {&a.k_scale, &a.v_scale}) {
    if (!t->data) continue;
    const char* name = t == &a.k_scale ? "k_scale" : "v_scale";
    if (!fp8_kv) throw Error(fmt::format("forward_varlen: {} is only for an FP8 k and v (f8e4m3 or f8e5m2), but k is {}", name, dsl::dtype_name(a.k.dtype)));
    runtime::check_kv_scale(*t, "forward_varlen", name, Hkv, device);
  }

  // The mods see Sq and Skv as the bounds of the per-sequence lengths.
  runtime::LaunchShape shape{B, H, Hkv, a.max_seqlen_q, a.max_seqlen_kv, D, Dv};
  BoundValues values = runtime::bind_launch(ir_.checked, shape, buffers, shim);
  // An FP8 K / V is read through its widened copy: contiguous [total_kv, Hkv, D] of the spec's dtype in the workspace.
  const int64_t total_kv = a.k.shape[0];
  const size_t esize = dsl::dtype_size(spec().dtype);
  const size_t k_bytes = fp8_kv ? (static_cast<size_t>(total_kv * Hkv * D) * esize + 255) / 256 * 256 : 0;
  const size_t widened_bytes = fp8_kv ? k_bytes + static_cast<size_t>(total_kv * Hkv * Dv) * esize : 0;
  Tensor k = a.k, v = a.v;
  if (fp8_kv) {
    k = Tensor{nullptr, spec().dtype, a.k.shape, {}};
    v = Tensor{nullptr, spec().dtype, a.v.shape, {}};
  }
  // Queries at the end of their KV (row i at kv_len - q_len + i): the offsets compiled in (FLEX_SHARD_POSITIONS) and
  // decode's ranges, without value specialisation (its ranges are the forward's).
  const runtime::VariantChoice choice = forward_choice(values, runtime::tensor_maps_describe(a.q, k, v), a.queries_at_kv_end,
                                                       a.queries_at_kv_end ? &varlen_kv_end_ranges() : nullptr);
  VariantState& var = varlen_variant(choice, device, fp8_kv);
  const ForwardConfig& cfg = var.source.config;

  if (shim.workspace && shim.workspace->backward_bytes_ < widened_bytes)
    throw Error(fmt::format("forward_varlen: an FP8 k / v is widened into {} bytes of workspace scratch, which the given workspace lacks ({} "
                            "bytes); launch without a workspace (the kernel's own grows) or pass one made by make_backward_workspace "
                            "with at least that much scratch",
                            widened_bytes, shim.workspace->backward_bytes_));
  runtime::ScopedDevice scope(device);
  // The error word, and the widened K and V of an FP8 launch: a one-tile shape keeps the block-mask part minimal.
  Workspace& ws = workspace_for(shim.workspace, shim.stream, device, runtime::LaunchShape{1, 1, 1, 1, 1, D, Dv}, cfg, widened_bytes);
  unsigned int* error_word = reinterpret_cast<unsigned int*>(ws.memory_);
  if (fp8_kv) {
    k.data = reinterpret_cast<void*>(ws.backward_memory_);
    v.data = reinterpret_cast<void*>(ws.backward_memory_ + k_bytes);
    const int sms = runtime::device_info(device).sm_count;
    for (int i = 0; i < 2; ++i) {
      const Tensor& src = i == 0 ? a.k : a.v;
      const Tensor& scale = i == 0 ? a.k_scale : a.v_scale;
      const auto st = src.effective_strides();
      FlexFp8WidenParams wp{};
      wp.src = static_cast<const unsigned char*>(src.data);
      wp.dst = (i == 0 ? k : v).data;
      wp.scale = static_cast<const float*>(scale.data);
      wp.src_stride_s = st[0];
      wp.src_stride_h = st[1];
      wp.rows = total_kv;
      wp.heads = static_cast<int>(Hkv);
      wp.dim = static_cast<int>(src.shape[2]);
      wp.scale_per_head = scale.data && scale.shape[0] > 1;
      const int64_t chunks = total_kv * Hkv * (wp.dim / 8);
      const unsigned blocks = static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>((chunks + 255) / 256, int64_t(sms) * 8)));
      void* wargs[] = {&wp};
      if (chunks > 0)
        check_cu(require_driver().cuLaunchKernel(var.widen_fn.at(device), blocks, 1, 1, 256, 1, 1, 0, a.stream, wargs, nullptr),
                 "launching the FP8 widening of a ragged prefill's k / v");
    }
  }
  std::vector<uint64_t> vparams = runtime::fill_variant_params(var.source.variant.layout, buffers, values, options_.checked ? error_word : nullptr);

  FlexForwardParams p{};
  auto qs = a.q.effective_strides(), ks = k.effective_strides(), vs = v.effective_strides(), os = a.o.effective_strides();
  p.q = a.q.data;
  p.k = k.data;
  p.v = v.data;
  p.o = a.o.data;
  p.lse = static_cast<float*>(a.lse.data);
  p.q_stride_s = qs[0], p.q_stride_h = qs[1];
  p.k_stride_s = ks[0], p.k_stride_h = ks[1];
  p.v_stride_s = vs[0], p.v_stride_h = vs[1];
  p.o_stride_s = os[0], p.o_stride_h = os[1];
  if (a.lse.data) p.lse_stride_h = a.lse.effective_strides()[0];
  p.batch = static_cast<int>(B);
  p.heads = static_cast<int>(H);
  p.kv_heads = static_cast<int>(Hkv);
  p.seqlen_q = a.max_seqlen_q;
  p.seqlen_kv = a.max_seqlen_kv;
  p.scale = a.scale > 0 ? a.scale : default_softmax_scale(static_cast<int>(D));
  p.cu_seqlens_q = static_cast<const int*>(a.cu_seqlens_q.data);
  p.cu_seqlens_kv = static_cast<const int*>(a.cu_seqlens_kv.data);
  p.total_q = static_cast<int>(a.q.shape[0]);
  p.total_kv = static_cast<int>(total_kv);
  p.error_word = error_word;  // lengths outside the bounds are reported whether or not loads are checked
  p.tile_counter = reinterpret_cast<int*>(ws.memory_ + kTileCounterOffset);
  FlexForwardTmaMaps maps;
  if (cfg.warp_specialized) maps = runtime::encode_forward_tensor_maps(require_driver(), a.q, k, v, cfg);
  void* args[] = {&p, vparams.data(), &maps};
  const int64_t work = B * H * ((a.max_seqlen_q + cfg.block_m - 1) / cfg.block_m);
  check_cu(require_driver().cuLaunchKernel(var.forward_fn.at(device), forward_grid(cfg, work, device), 1, 1,
                                           static_cast<unsigned>(cfg.threads()), 1, 1, static_cast<unsigned>(cfg.shared_bytes()), a.stream, args,
                                           nullptr),
           "launching the ragged-prefill forward kernel");
}

}  // namespace flexjit
