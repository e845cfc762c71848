// KernelImpl's backward launches (docs/BACKWARD.md): operand checks, the gradient variant, the
// backward workspace, the dQ strategy and the launch sequence tile classes -> preprocess -> main -> dQ
// (conversion, or the query-major pass) -> gradients.
#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
#include <map>
#include <mutex>

#include "compiler/codegen/backward_source.h"
#include "compiler/passes/autodiff.h"
#include "compiler/passes/row_constant_scatters.h"
#include "dsl/error.h"
#include "kernels_templates/flex_backward_params.cuh"
#include "runtime/cpu_executor.h"
#include "runtime/device.h"
#include "runtime/kernel_impl.h"
#include "runtime/log.h"
#include "runtime/tensor_maps.h"

namespace flexjit {

using runtime::check_cu;

namespace {

constexpr size_t kAlign = 256;
size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// Byte offsets of the backward scratch inside Workspace::backward_memory_.
struct BackwardLayout {
  size_t delta = 0, lse2 = 0, dq_accum = 0, tile_state = 0, grads = 0, total = 0;
};

// The dense tile classes: the forward block mask's tiles over (b, h).
size_t dense_tile_state_bytes(int64_t B, int64_t H, int64_t Sq, int64_t Skv, int64_t D) {
  const ForwardConfig fc = forward_config(static_cast<int>(D));
  return static_cast<size_t>(B * H * ((Sq + fc.block_m - 1) / fc.block_m) * ((Skv + fc.block_n - 1) / fc.block_n));
}

// rows: the query rows of the scratch (B * H * Sq; a ragged batch's H * total_q).
BackwardLayout backward_layout(int64_t rows, int64_t D, size_t tile_state_bytes, size_t grad_bytes) {
  BackwardLayout l;
  size_t off = 0;
  l.delta = off;
  off = align_up(off + static_cast<size_t>(rows) * 4);
  l.lse2 = off;
  off = align_up(off + static_cast<size_t>(rows) * 4);
  l.dq_accum = off;
  off = align_up(off + static_cast<size_t>(rows * D) * 8);  // 8 bytes: room for fixed point
  l.tile_state = off;
  off = align_up(off + tile_state_bytes);
  l.grads = off;
  off = align_up(off + grad_bytes);
  l.total = off;
  return l;
}

bool is_contiguous(const Tensor& t) {
  return t.strides.empty() || t.strides == contiguous_strides(t.shape);
}

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t e : shape) n *= e;
  return n;
}

// FLEXJIT_BWD_DQ overrides BackwardArgs::dq_mode, so benchmarks and users of the C API can compare the two
// strategies without code changes.
BackwardDqMode requested_dq_mode(BackwardDqMode given) {
  const char* env = std::getenv("FLEXJIT_BWD_DQ");
  if (env == nullptr || *env == 0) return given;
  const std::string v = env;
  if (v == "atomic") return BackwardDqMode::Atomic;
  if (v == "qmajor") return BackwardDqMode::QueryMajor;
  if (v == "auto") return BackwardDqMode::Auto;
  throw Error(fmt::format("FLEXJIT_BWD_DQ={} names no dQ strategy; use atomic, qmajor or auto", v));
}

}  // namespace

void CpuExecutor::backward(const SpecIR&, const BackwardArgs&) { throw Error("this CPU backend has no backward pass"); }
void CpuExecutor::backward_varlen(const SpecIR&, const VarlenBackwardArgs&) { throw Error("this CPU backend has no ragged backward"); }

// The gradient program (differentiated once), its range analysis and the compiled modules.
struct KernelImpl::BackwardState {
  // The score_mod's gradient and the range analysis over it, of the spec or of one of its value specialisations
  // (compiler/specialize.h), keyed by the specialised (parameter, value) pairs ("" for the spec's own).
  struct Gradient {
    ScoreModGradient grad;
    RangeInfo ranges;
  };
  std::map<std::string, std::unique_ptr<Gradient>> gradients;
  std::mutex mutex;
  // Auto's dQ strategy per (variant choice, arch, deterministic): finding the staged terms walks the IR, so
  // it runs once per key, not per launch.
  std::map<std::string, bool> auto_query_major;
  struct Functions {
    // dq: flexjit_bwd_dq (atomic modules) or flexjit_bwd_qmajor (query-major modules)
    CUfunction preprocess = nullptr, main = nullptr, dq = nullptr, convert = nullptr, tile_state = nullptr;
  };
  struct Module {
    BackwardKernelSource source;
    std::shared_ptr<const runtime::CompiledArtefact> artefact;
    runtime::LoadedLibrary library;
    std::map<int, Functions> fns;
  };
  std::map<std::string, std::unique_ptr<Module>> modules;
};

KernelImpl::BackwardState& KernelImpl::backward_state() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!backward_state_) backward_state_ = std::make_shared<BackwardState>();
  return *backward_state_;
}

std::unique_ptr<Workspace> KernelImpl::make_backward_workspace(int device, int batch, int heads, int seqlen_q, int seqlen_kv) {
  runtime::ScopedDevice scope(device);
  runtime::LaunchShape s{batch, heads, heads, seqlen_q, seqlen_kv, spec().head_dim, spec().value_head_dim()};
  BackwardLayout l = backward_layout(int64_t(batch) * heads * seqlen_q, spec().head_dim,
                                     dense_tile_state_bytes(batch, heads, seqlen_q, seqlen_kv, spec().head_dim), 0);
  return allocate_workspace(device, s, forward_config(spec().head_dim), l.total);
}

void KernelImpl::backward(const BackwardArgs& a) {
  if (a.device.kind == Device::Kind::Cpu) {
    auto cpu = cpu_executor();
    if (!cpu) throw Error("this build of flexjit has no CPU backend (configure with FLEXJIT_CPU_BACKEND=ON)");
    cpu->backward(ir_, a);
    return;
  }
  backward_gpu(a, nullptr);
}

// A dense launch, or (ragged) a ragged batch whose packed tensors `a` holds as [1, H, total, D] views.
void KernelImpl::backward_gpu(const BackwardArgs& a, const RaggedBatch* ragged) {
  const runtime::CudaDriver& d = require_driver();
  // A shard of a longer sequence (context parallelism): the tensors hold the shard's rows, the mods see global
  // positions (flex::ShardPositions), and Sq / Skv in the mods are the whole sequence's lengths.
  const runtime::SequenceWindow window = runtime::window_of(a);
  const bool shard = !window.whole();

  // ---- operands: the forward's rules for (q, k, v, o, lse), then the gradients as (q, k, v, o) ----
  AttentionArgs fa;
  fa.q = a.q, fa.k = a.k, fa.v = a.v, fa.o = a.o, fa.lse = a.lse;
  fa.scale = a.scale, fa.buffers = a.buffers, fa.params = a.params, fa.block_mask = a.block_mask, fa.workspace = a.workspace;
  fa.stream = a.stream, fa.device = a.device;
  fa.q_offset = a.q_offset, fa.kv_offset = a.kv_offset, fa.seqlen_q = a.seqlen_q, fa.seqlen_kv = a.seqlen_kv;
  if (!a.lse.data) throw Error("backward: lse is required (the forward's [B, H, Sq] f32 LSE, or a merged global one)");
  runtime::LaunchShape shape = runtime::validate_operands(spec(), fa, /*gpu=*/true);
  {
    AttentionArgs ga;
    ga.q = a.dq, ga.k = a.dk, ga.v = a.dv, ga.o = a.d_o;
    try {
      runtime::LaunchShape gs = runtime::validate_operands(spec(), ga, /*gpu=*/true);
      if (gs.batch != shape.batch || gs.heads != shape.heads || gs.kv_heads != shape.kv_heads || gs.seqlen_q != shape.seqlen_q ||
          gs.seqlen_kv != shape.seqlen_kv)
        throw Error("their shapes differ from q, k, v");
    } catch (const Error& e) {
      throw Error(fmt::format("backward: dq, dk, dv and d_o must match q, k, v and o in shape, dtype and alignment (checked as q=dq, "
                              "k=dk, v=dv, o=d_o): {}",
                              e.what()));
    }
  }
  if (shape.head_dim != shape.head_dim_v)
    throw Error(fmt::format("backward: the GPU backward needs the value head dim to equal the head dim (got {} and {})", shape.head_dim,
                            shape.head_dim_v));
  int device = launch_device(fa);
  std::vector<Tensor> buffers = runtime::collect_buffers(spec(), fa, bound_for(device));
  check_pointers(fa, buffers, device);
  auto check_ptr = [&](const void* p, const std::string& what) {
    int dev = runtime::pointer_device(p);
    if (dev != device)
      throw Error(dev < 0 ? fmt::format("backward: {} is not CUDA device memory, but this launch runs on cuda:{}", what, device)
                          : fmt::format("backward: {} lives on cuda:{}, but this launch runs on cuda:{}", what, dev, device));
  };
  check_ptr(a.d_o.data, "d_o");
  check_ptr(a.dq.data, "dq");
  check_ptr(a.dk.data, "dk");
  check_ptr(a.dv.data, "dv");

  BackwardState& st = backward_state();
  // The values first: a runtime divisor's value may be compiled in (compiler/specialize.h), which changes the
  // gradient's scatters (staged terms).
  // The mods' shape: the whole sequence's (a shard's), or a ragged batch's sequences with the bounds of their lengths.
  const runtime::LaunchShape seen = ragged ? runtime::LaunchShape{ragged->batch, shape.heads, shape.kv_heads, ragged->max_seqlen_q,
                                                                  ragged->max_seqlen_kv, shape.head_dim, shape.head_dim_v}
                                           : runtime::mods_shape(shape, window);
  BoundValues values = runtime::bind_launch(ir_.checked, seen, buffers, fa);
  std::vector<std::pair<int, int64_t>> specialized = specialized_params(values);
  const SpecIR& ir = specialized.empty() ? ir_ : specialization(specialized).ir;
  const BackwardState::Gradient& gradient = [&]() -> const BackwardState::Gradient& {
    std::lock_guard<std::mutex> lock(st.mutex);
    auto& slot = st.gradients[specialization_key(specialized)];
    if (!slot) {
      auto g = std::make_unique<BackwardState::Gradient>();
      g->grad = differentiate_score_mod(ir);
      drop_row_constant_scatters(g->grad);  // their gradient is exactly zero (compiler/passes/row_constant_scatters.h)
      g->ranges = analyze_ranges(backward_roots(g->grad), ir.checked, VarDomains::forward(ir.checked));
      slot = std::move(g);
    }
    return *slot;
  }();
  const ScoreModGradient& grad = gradient.grad;

  // Gradients of captured buffers: f32, the buffer's shape, contiguous, on the device.
  std::vector<const Tensor*> grad_of(spec().buffers.size(), nullptr);
  for (const auto& [name, t] : a.grads) {
    int idx = -1;
    for (size_t i = 0; i < spec().buffers.size(); ++i)
      if (spec().buffers[i].name == name) idx = static_cast<int>(i);
    if (idx < 0) throw Error(fmt::format("backward: grads names `{}`, which spec `{}` does not declare", name, spec().name));
    if (!spec().buffers[idx].requires_grad)
      throw Error(fmt::format("backward: buffer `{}` has no gradient: mark it in the spec (\"grad\": [\"{}\"])", name, name));
    if (t.dtype != DType::F32) throw Error(fmt::format("backward: the gradient of `{}` must be f32, got {}", name, dsl::dtype_name(t.dtype)));
    if (t.shape != buffers[idx].shape)
      throw Error(fmt::format("backward: the gradient of `{}` has shape [{}] but the buffer has [{}]", name, fmt::join(t.shape, ", "),
                              fmt::join(buffers[idx].shape, ", ")));
    if (!is_contiguous(t)) throw Error(fmt::format("backward: the gradient of `{}` must be contiguous", name));
    if (numel(t.shape) > 0) check_ptr(t.data, fmt::format("the gradient of `{}`", name));
    grad_of[idx] = &t;
  }
  if (grad.scatters.size() > 8)
    throw Error(fmt::format("backward: spec `{}` has {} gradient scatter terms; the GPU backward supports at most 8", spec().name,
                            grad.scatters.size()));
  // Scratch: fixed-point accumulators (deterministic) and a sink for marked buffers the caller wants
  // no gradient of (the kernels write every scatter somewhere).
  std::vector<bool> scattered(spec().buffers.size(), false);
  for (const GradScatter& s : grad.scatters) scattered[s.buffer] = true;
  size_t grad_bytes = 0;
  for (size_t i = 0; i < spec().buffers.size(); ++i)
    if (scattered[i] && (a.deterministic || !grad_of[i])) grad_bytes += align_up(static_cast<size_t>(numel(buffers[i].shape)) * 8);

  // ---- the dQ strategy: the query-major pass needs the forward's 128 x 64 geometry (or multiples) in the
  // block mask it walks, and its shared memory ----
  const runtime::DeviceInfo& info = runtime::device_info(device);
  runtime::VariantChoice choice = runtime::choose_variant(gradient.ranges, ir.checked, values);
  choice.specialized = std::move(specialized);
  choice.shard = shard;
  BackwardKernelOptions bo;
  bo.dtype = spec().dtype;
  bo.head_dim = spec().head_dim;
  bo.deterministic = a.deterministic;
  bo.arch = info.arch;
  bo.tma_operands = runtime::tensor_maps_describe(a.q, a.k, a.v) && runtime::tensor_map_describes(a.d_o);
  bo.ragged = ragged != nullptr;
  bo.variant.int32 = choice.int32;
  bo.variant.checked_loads = choice.checked_loads;
  bo.variant.unit_inner_stride = choice.unit_inner_stride;
  bo.variant.error_flags = options_.checked;
  bo.shard_positions = shard;
  // Auto: the query-major pass only for a row-owned scatter the atomic module's kernel does not stage (SAM's
  // rel_h / rel_w are staged by the Hopper kernel).
  BackwardDqMode dq_mode = requested_dq_mode(a.dq_mode);
  if ((shard || ragged) && dq_mode != BackwardDqMode::Atomic) {
    // The query-major pass forms its row-owned targets per 64-column tile of the launch's own rows; a shard's tiles
    // need not line up with the whole sequence's, so shards take dQ (and every buffer gradient) by the KV-major kernel.
    // A ragged batch's kernels work on sequence views that only the KV-major module has (flex_backward_ragged.cuh).
    if (dq_mode == BackwardDqMode::QueryMajor)
      runtime::log_info("flexjit: backward of `{}`: dq by atomics, not by the query-major pass: the launch is {}", spec().name,
                        ragged ? "a ragged batch" : "a shard of a longer sequence");
    dq_mode = BackwardDqMode::Atomic;
  }
  if (dq_mode == BackwardDqMode::Auto) {
    std::lock_guard<std::mutex> lock(st.mutex);
    const std::string auto_key = fmt::format("{}_{}_{}", choice.key(), info.arch, a.deterministic ? "det" : "atomic");
    auto it = st.auto_query_major.find(auto_key);
    if (it == st.auto_query_major.end()) it = st.auto_query_major.emplace(auto_key, auto_picks_query_major(grad, gradient.ranges, bo)).first;
    dq_mode = it->second ? BackwardDqMode::QueryMajor : BackwardDqMode::Atomic;
  }
  if (dq_mode == BackwardDqMode::QueryMajor) {
    const QueryMajorConfig qc = query_major_config(spec().head_dim);
    const ForwardConfig fc = forward_config(spec().head_dim);
    std::string why;
    if (ir_.mask_mod && (fc.block_m % qc.block_m != 0 || fc.block_n % qc.block_n != 0))
      why = fmt::format("the block mask's {}x{} tiles are not multiples of its {}x{}", fc.block_m, fc.block_n, qc.block_m, qc.block_n);
    else if (qc.shared_bytes() > info.max_shared_optin)
      why = fmt::format("it needs {} bytes of shared memory at head dim {}, {} allows {}", qc.shared_bytes(), spec().head_dim, info.name,
                        info.max_shared_optin);
    if (!why.empty()) {
      runtime::log_info("flexjit: backward of `{}`: dq by atomics, not by the query-major pass: {}", spec().name, why);
      dq_mode = BackwardDqMode::Atomic;
    }
  }
  const bool query_major = dq_mode == BackwardDqMode::QueryMajor;
  bo.query_major = query_major;

  // ---- the gradient variant for these values ----
  std::string key = fmt::format("{}_{}_{}{}{}{}", choice.key(), info.arch, a.deterministic ? "det" : "atomic", query_major ? "_qdq" : "",
                                bo.tma_operands ? "" : "_notma", ragged ? "_ragged" : "");
  BackwardState::Module* mod = nullptr;
  {
    std::lock_guard<std::mutex> lock(st.mutex);
    auto& slot = st.modules[key];
    if (!slot) {
      auto m = std::make_unique<BackwardState::Module>();
      m->source = backward_kernel_source(ir, grad, gradient.ranges, bo);
      runtime::CacheLookup r = runtime::compile_kernel(m->source.module, canonical_, info.arch);
      runtime::log_info("flexjit: kernel {} for {}: {} in {:.3f} s", m->source.module.name, info.arch, runtime::cache_source_name(r.source),
                        r.seconds);
      check_cu(m->library.load(r.artefact->binary),
               "loading the backward kernels");
      m->artefact = r.artefact;
      slot = std::move(m);
    }
    mod = slot.get();
    if (!mod->fns.count(device)) {
      runtime::ScopedDevice scope(device);
      const int smem = mod->source.config.shared_bytes();
      if (smem > info.max_shared_optin)
        throw Error(fmt::format("backward: head dim {} needs {} bytes of shared memory per block, but {} allows {}", spec().head_dim, smem,
                                info.name, info.max_shared_optin));
      auto get = [&](const char* name) { return mod->library.function(name); };
      BackwardState::Functions f;
      f.preprocess = get(kBwdPreprocessEntry);
      f.main = get(kBwdMainEntry);
      f.dq = get(query_major ? kBwdQMajorEntry : kBwdDqEntry);
      f.convert = get(kBwdConvertEntry);
      f.tile_state = get(kBwdTileStateEntry);
      check_cu(d.cuFuncSetAttribute(f.main, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem), "setting the backward kernel's shared memory");
      if (query_major)
        check_cu(d.cuFuncSetAttribute(f.dq, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, mod->source.qconfig.shared_bytes()),
                 "setting the query-major kernel's shared memory");
      mod->fns[device] = f;
    }
  }
  const BackwardState::Functions& fn = mod->fns.at(device);
  const BackwardConfig& cfg = mod->source.config;

  // ---- workspace, parameters ----
  runtime::ScopedDevice scope(device);
  // A ragged batch's tile classes are the backward's own tiles over (sequence, mask head) at the bounds of the lengths.
  const int ragged_heads = ragged ? mask_heads(shape) : 0;
  const int64_t ragged_nq = ragged ? (ragged->max_seqlen_q + cfg.block_m - 1) / cfg.block_m : 0;
  const int64_t ragged_nkv = ragged ? (ragged->max_seqlen_kv + cfg.block_n - 1) / cfg.block_n : 0;
  const size_t tile_state_bytes =
      !ir_.mask_mod ? 0
      : ragged      ? static_cast<size_t>(ragged->batch * ragged_heads * ragged_nq * ragged_nkv)
                    : dense_tile_state_bytes(shape.batch, shape.heads, shape.seqlen_q, shape.seqlen_kv, shape.head_dim);
  BackwardLayout lay = backward_layout(shape.batch * shape.heads * shape.seqlen_q, shape.head_dim, tile_state_bytes, grad_bytes);
  // A ragged batch has no forward block mask: a one-tile shape keeps the workspace's mask part minimal.
  Workspace& ws = workspace_for(a.workspace, a.stream, device, ragged ? runtime::LaunchShape{1, 1, 1, 1, 1, shape.head_dim, shape.head_dim_v} : shape,
                                forward_config(static_cast<int>(shape.head_dim)), lay.total);
  unsigned int* error_word = reinterpret_cast<unsigned int*>(ws.memory_);
  std::vector<uint64_t> vparams =
      runtime::fill_variant_params(mod->source.grad.layout, buffers, values, options_.checked ? error_word : nullptr);
  if (shard) {
    // flex::ShardPositions::Params: the shard's first positions after the layout's slots (mods_shape checked them).
    vparams.push_back(static_cast<uint64_t>(a.q_offset));
    vparams.push_back(static_cast<uint64_t>(a.kv_offset));
  }
  const CUdeviceptr bwd = static_cast<CUdeviceptr>(ws.backward_memory_);

  FlexBackwardParams p{};
  auto st3 = [](const Tensor& t, long long& sb, long long& sh, long long& ss) {
    auto s = t.effective_strides();
    sb = s[0], sh = s[1], ss = s[2];
  };
  p.q = a.q.data, p.k = a.k.data, p.v = a.v.data, p.o = a.o.data, p.d_o = a.d_o.data;
  p.lse = static_cast<const float*>(a.lse.data);
  p.dq = a.dq.data, p.dk = a.dk.data, p.dv = a.dv.data;
  p.delta = reinterpret_cast<float*>(bwd + lay.delta);
  p.lse2 = reinterpret_cast<float*>(bwd + lay.lse2);
  // The query-major pass writes dq directly: no accumulator to clear (preprocess) or fill (main).
  p.dq_accum = query_major ? nullptr : reinterpret_cast<void*>(bwd + lay.dq_accum);
  st3(a.q, p.q_stride_b, p.q_stride_h, p.q_stride_s);
  st3(a.k, p.k_stride_b, p.k_stride_h, p.k_stride_s);
  st3(a.v, p.v_stride_b, p.v_stride_h, p.v_stride_s);
  st3(a.o, p.o_stride_b, p.o_stride_h, p.o_stride_s);
  st3(a.d_o, p.do_stride_b, p.do_stride_h, p.do_stride_s);
  st3(a.dq, p.dq_stride_b, p.dq_stride_h, p.dq_stride_s);
  st3(a.dk, p.dk_stride_b, p.dk_stride_h, p.dk_stride_s);
  st3(a.dv, p.dv_stride_b, p.dv_stride_h, p.dv_stride_s);
  {
    auto ls = a.lse.effective_strides();
    p.lse_stride_b = ls[0], p.lse_stride_h = ls[1];
  }
  p.batch = static_cast<int>(seen.batch);
  p.heads = static_cast<int>(shape.heads);
  p.kv_heads = static_cast<int>(shape.kv_heads);
  p.seqlen_q = static_cast<int>(ragged ? seen.seqlen_q : shape.seqlen_q);
  p.seqlen_kv = static_cast<int>(ragged ? seen.seqlen_kv : shape.seqlen_kv);
  p.tma_b_scale = ragged ? 0 : 1;  // a ragged batch's maps describe its packed tensors as one batch
  if (ragged) {
    p.cu_seqlens_q = static_cast<const int*>(ragged->cu_seqlens_q.data);
    p.cu_seqlens_kv = static_cast<const int*>(ragged->cu_seqlens_kv.data);
    p.total_q = static_cast<int>(shape.seqlen_q);
    p.total_kv = static_cast<int>(shape.seqlen_kv);
    p.error_word = error_word;  // lengths outside the bounds are reported whether or not loads are checked
  }
  p.scale = a.scale > 0 ? a.scale : default_softmax_scale(static_cast<int>(shape.head_dim));

  // The staged gradients' blocked accumulators (BackwardConfig::staged_blocks, flex_bwd::blocked_index), where the
  // slices tile the buffer's columns: 16-column slices of the Col term (at least 64 columns, so every CTA's slice
  // exists), 8-column ones of the Tile term; the kernel adds per element into the others.
  struct Blocked {
    int w;
    int64_t rows, cols;
  };
  std::map<int, Blocked> blocked;
  if (cfg.staged_blocks()) {
    auto block = [&](int buffer, int w, int64_t min_cols, int bit) {
      if (buffer < 0) return;
      const auto& shp = buffers[static_cast<size_t>(buffer)].shape;
      if (shp.size() < 2 || shp.back() % w != 0 || shp.back() < min_cols) return;
      blocked[buffer] = Blocked{w, shp[shp.size() - 2], shp.back()};
      p.staged_blocks |= bit;
    };
    block(mod->source.staged_col_grad_buffer, 16, 64, 1);
    block(mod->source.staged_tile_grad_buffer, 8, 8, 2);
  }

  // Buffer gradients: zeroed f32 outputs (atomics), or zeroed fixed-point scratch (deterministic).
  struct Fixed {
    CUdeviceptr scratch;
    const Tensor* out;
    int buffer;
  };
  std::vector<Fixed> fixed;  // deterministic only
  {
    std::map<int, CUdeviceptr> target;
    size_t goff = lay.grads;
    for (size_t i = 0; i < spec().buffers.size(); ++i) {
      const size_t n = static_cast<size_t>(numel(buffers[i].shape));
      if (n == 0) continue;
      if (!scattered[i]) {
        // Marked for a gradient but read only by the mask (or not at all): no kernel writes it, and the
        // gradient is exactly zero.
        if (grad_of[i])
          check_cu(d.cuMemsetD32Async(reinterpret_cast<CUdeviceptr>(grad_of[i]->data), 0, n, a.stream), "clearing a buffer gradient");
        continue;
      }
      if (a.deterministic || !grad_of[i]) {
        CUdeviceptr scratch = bwd + goff;
        goff += align_up(n * 8);
        check_cu(d.cuMemsetD32Async(scratch, 0, n * 2, a.stream), "clearing a gradient accumulator");
        target[static_cast<int>(i)] = scratch;
        if (grad_of[i]) fixed.push_back(Fixed{scratch, grad_of[i], static_cast<int>(i)});
      } else {
        check_cu(d.cuMemsetD32Async(reinterpret_cast<CUdeviceptr>(grad_of[i]->data), 0, n, a.stream), "clearing a buffer gradient");
        target[static_cast<int>(i)] = reinterpret_cast<CUdeviceptr>(grad_of[i]->data);
      }
    }
    for (size_t s = 0; s < grad.scatters.size(); ++s) {
      auto it = target.find(grad.scatters[s].buffer);
      p.grad_ptr[s] = it != target.end() ? reinterpret_cast<void*>(it->second) : nullptr;
    }
  }
  std::vector<uint64_t> vp_copy = vparams;

  // ---- block sparsity: the forward mask's lists -> dense tile classes (the query-major pass walks the lists) ----
  FlexBlockMask fmask{};
  if (ir_.mask_mod && ragged) {
    FlexRaggedTileStateParams tp{};
    tp.cu_seqlens_q = p.cu_seqlens_q;
    tp.cu_seqlens_kv = p.cu_seqlens_kv;
    tp.tile_state = reinterpret_cast<unsigned char*>(bwd + lay.tile_state);
    tp.batch = p.batch;
    tp.mask_heads = ragged_heads;
    tp.group = p.heads / p.kv_heads;
    tp.nq = static_cast<int>(ragged_nq);
    tp.nkv = static_cast<int>(ragged_nkv);
    tp.q_tile = cfg.block_m;
    tp.kv_tile = cfg.block_n;
    tp.seqlen_q = p.seqlen_q;
    tp.seqlen_kv = p.seqlen_kv;
    tp.total_q = p.total_q;
    tp.total_kv = p.total_kv;
    void* targs[] = {&tp, vp_copy.data()};
    const int64_t n = static_cast<int64_t>(tile_state_bytes);
    if (n > 0)
      check_cu(d.cuLaunchKernel(fn.tile_state, static_cast<unsigned>((n + 127) / 128), 1, 1, 128, 1, 1, 0, a.stream, targs, nullptr),
               "launching the ragged tile-class builder");
    p.tile_state = tp.tile_state;
    p.ts_stride_b = static_cast<long long>(ragged_heads) * ragged_nq * ragged_nkv;
    p.ts_stride_h = ragged_heads == 1 ? 0 : ragged_nq * ragged_nkv;
    p.ts_nq = tp.nq;
    p.ts_nkv = tp.nkv;
    p.ts_q_tile = tp.q_tile;
    p.ts_kv_tile = tp.kv_tile;
  } else if (ir_.mask_mod) {
    ForwardConfig fcfg = forward_config(spec().head_dim);
    const BlockMask* mask = a.block_mask;
    if (mask && (mask->q_tile_ != fcfg.block_m || mask->kv_tile_ != fcfg.block_n)) {
      // The forward's mask (build_block_mask, reused for both passes as create_block_mask is), whose tiles are the
      // warp-specialised forward's: checked against the launch, then the backward builds its own at the tiles it
      // reads.
      ForwardConfig built_for = fcfg;
      built_for.block_m = mask->q_tile_;
      built_for.block_n = mask->kv_tile_;
      check_mask(*mask, shape, window, built_for, device);
      mask = nullptr;
    }
    if (mask) {
      check_mask(*mask, shape, window, fcfg, device);
    } else {
      VariantState& fvar = variant(forward_choice(values, runtime::tensor_maps_describe(a.q, a.k, a.v), shard), device);
      check_shard_alignment(fvar, fa);
      std::vector<uint64_t> fparams = runtime::fill_variant_params(fvar.source.variant.layout, buffers, values, nullptr);
      build_mask_into(*ws.mask_, fvar, fparams, shape, window, fcfg, device, a.stream, /*rank=*/false);
      mask = ws.mask_.get();
    }
    FlexTileStateParams tp{};
    set_mask(tp.mask, *mask);
    tp.tile_state = reinterpret_cast<unsigned char*>(bwd + lay.tile_state);
    tp.rows = mask->bm_ * mask->hm_ * mask->num_q_tiles_;
    check_cu(d.cuMemsetD8Async(bwd + lay.tile_state, 0, static_cast<size_t>(tp.rows) * mask->max_kv_tiles_, a.stream), "clearing tile classes");
    void* targs[] = {&tp};
    check_cu(d.cuLaunchKernel(fn.tile_state, static_cast<unsigned>((tp.rows + 3) / 4), 1, 1, 128, 1, 1, 0, a.stream, targs, nullptr),
             "launching the tile-class builder");
    p.tile_state = tp.tile_state;
    p.ts_stride_b = mask->bm_ == 1 ? 0 : static_cast<long long>(mask->hm_) * mask->num_q_tiles_ * mask->max_kv_tiles_;
    p.ts_stride_h = mask->hm_ == 1 ? 0 : static_cast<long long>(mask->num_q_tiles_) * mask->max_kv_tiles_;
    p.ts_nq = mask->num_q_tiles_;
    p.ts_nkv = mask->max_kv_tiles_;
    p.ts_q_tile = mask->q_tile_;
    p.ts_kv_tile = mask->kv_tile_;
    fmask = tp.mask;
  }

  // ---- launches ----
  const unsigned row_blocks = static_cast<unsigned>((p.seqlen_q + 7) / 8);
  void* pargs[] = {&p};
  check_cu(d.cuLaunchKernel(fn.preprocess, row_blocks, static_cast<unsigned>(shape.heads), static_cast<unsigned>(p.batch), 256, 1, 1, 0,
                            a.stream, pargs, nullptr),
           "launching the backward preprocessing");
  FlexBackwardTmaMaps maps{};
  if (cfg.warp_specialized) {
    const FlexBackwardPolicy pol = flex_backward_tiles(cfg.head_dim);
    maps = runtime::encode_backward_tensor_maps(d, a.q, a.k, a.v, a.d_o, cfg.block_m, cfg.block_n, pol.swizzle_bytes);
  }
  void* margs[] = {&p, vp_copy.data(), &maps};
  check_cu(d.cuLaunchKernel(fn.main, static_cast<unsigned>(cfg.main_grid_x(p.seqlen_kv)),
                            static_cast<unsigned>(shape.kv_heads), static_cast<unsigned>(p.batch), static_cast<unsigned>(cfg.threads()), 1,
                            1, static_cast<unsigned>(cfg.shared_bytes()), a.stream, margs, nullptr),
           "launching the backward kernel");
  if (query_major) {
    const QueryMajorConfig& qc = mod->source.qconfig;
    void* qargs[] = {&p, &fmask, vp_copy.data()};
    check_cu(d.cuLaunchKernel(fn.dq, static_cast<unsigned>((shape.seqlen_q + qc.block_m - 1) / qc.block_m), static_cast<unsigned>(shape.heads),
                              static_cast<unsigned>(shape.batch), static_cast<unsigned>(qc.threads()), 1, 1,
                              static_cast<unsigned>(qc.shared_bytes()), a.stream, qargs, nullptr),
             "launching the query-major backward pass");
  } else {
    check_cu(d.cuLaunchKernel(fn.dq, row_blocks, static_cast<unsigned>(shape.heads), static_cast<unsigned>(p.batch), 256, 1, 1, 0,
                              a.stream, pargs, nullptr),
             "launching the dQ conversion");
  }
  for (const Fixed& f : fixed) {
    FlexConvertParams c{};
    c.in = reinterpret_cast<const void*>(f.scratch);
    c.out = f.out->data;
    c.n = numel(f.out->shape);
    c.mult = 1.f;
    if (auto it = blocked.find(f.buffer); it != blocked.end()) {
      c.block_w = it->second.w;
      c.rows = it->second.rows;
      c.cols = it->second.cols;
    }
    void* cargs[] = {&c};
    const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((c.n + 255) / 256, 4096));
    check_cu(d.cuLaunchKernel(fn.convert, blocks, 1, 1, 256, 1, 1, 0, a.stream, cargs, nullptr), "launching the gradient conversion");
  }
}

void KernelImpl::backward_varlen(const VarlenBackwardArgs& a) {
  if (a.device.kind == Device::Kind::Cpu) {
    auto cpu = cpu_executor();
    if (!cpu) throw Error("this build of flexjit has no CPU backend (configure with FLEXJIT_CPU_BACKEND=ON)");
    cpu->backward_varlen(ir_, a);
    return;
  }
  const int64_t D = spec().head_dim, Dv = spec().value_head_dim();
  if (!a.q.data || a.q.shape.size() != 3) throw Error("backward_varlen: q must be [total_q, H, D]");
  if (!a.k.data || a.k.shape.size() != 3) throw Error("backward_varlen: k must be [total_kv, Hkv, D]");
  const int64_t H = a.q.shape[1], Hkv = a.k.shape[1], total_q = a.q.shape[0], total_kv = a.k.shape[0];
  const DType dt = spec().dtype;
  runtime::check_packed_operand(a.q, "backward_varlen", "q", H, D, dt);
  runtime::check_packed_operand(a.k, "backward_varlen", "k", Hkv, D, dt);
  runtime::check_packed_operand(a.v, "backward_varlen", "v", Hkv, Dv, dt);
  runtime::check_packed_operand(a.o, "backward_varlen", "o", H, Dv, dt);
  runtime::check_packed_operand(a.d_o, "backward_varlen", "d_o", H, Dv, dt);
  runtime::check_packed_operand(a.dq, "backward_varlen", "dq", H, D, dt);
  runtime::check_packed_operand(a.dk, "backward_varlen", "dk", Hkv, D, dt);
  runtime::check_packed_operand(a.dv, "backward_varlen", "dv", Hkv, Dv, dt);
  for (const Tensor* t : {&a.o, &a.d_o, &a.dq})
    if (t->shape[0] != total_q) throw Error("backward_varlen: o, d_o and dq must have as many rows as q");
  for (const Tensor* t : {&a.v, &a.dk, &a.dv})
    if (t->shape[0] != total_kv) throw Error("backward_varlen: v, dk and dv must have as many rows as k");
  if (total_q < 1 || total_kv < 1) throw Error("backward_varlen: q and k must have at least one row");
  const int64_t B = runtime::check_cu_seqlens(a.cu_seqlens_q, a.cu_seqlens_kv, "backward_varlen");
  if (a.max_seqlen_q < 1 || a.max_seqlen_kv < 1)
    throw Error("backward_varlen: max_seqlen_q and max_seqlen_kv must be >= 1 (the forward's bounds of the per-sequence lengths)");
  if (!a.lse.data || a.lse.dtype != DType::F32 || a.lse.shape != std::vector<int64_t>{H, total_q} || a.lse.effective_strides()[1] != 1)
    throw Error("backward_varlen: lse is required: the forward's f32 [H, total_q] LSE with a contiguous last dimension");
  const int device = a.device.index >= 0 ? a.device.index : runtime::pointer_device(a.q.data);
  if (device < 0) throw Error("backward_varlen: q is not device memory: pass device pointers, or Device::cpu() for host memory");
  for (const Tensor* t : {&a.cu_seqlens_q, &a.cu_seqlens_kv})
    if (runtime::pointer_device(t->data) != device)
      throw Error(fmt::format("backward_varlen: {} is not memory of cuda:{}", t == &a.cu_seqlens_q ? "cu_seqlens_q" : "cu_seqlens_kv", device));

  // The packed tensors as one batch of total rows: [1, heads, total, dim] views (row stride s[0], head stride s[1]).
  auto view = [](const Tensor& t) {
    const std::vector<int64_t> s = t.effective_strides();
    return Tensor{t.data, t.dtype, {1, t.shape[1], t.shape[0], t.shape[2]}, {0, s[1], s[0], 1}};
  };
  BackwardArgs b;
  b.q = view(a.q), b.k = view(a.k), b.v = view(a.v), b.o = view(a.o), b.d_o = view(a.d_o);
  b.dq = view(a.dq), b.dk = view(a.dk), b.dv = view(a.dv);
  b.lse = Tensor{a.lse.data, DType::F32, {1, H, total_q}, {0, a.lse.effective_strides()[0], 1}};
  b.scale = a.scale, b.buffers = a.buffers, b.params = a.params, b.grads = a.grads, b.deterministic = a.deterministic;
  b.workspace = a.workspace, b.stream = a.stream, b.device = Device::cuda(device);
  RaggedBatch r{a.cu_seqlens_q, a.cu_seqlens_kv, B, a.max_seqlen_q, a.max_seqlen_kv};
  backward_gpu(b, &r);
}

}  // namespace flexjit
