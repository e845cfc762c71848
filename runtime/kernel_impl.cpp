// The GPU implementation of flexjit::Kernel: variant selection, compile-once-per-variant,
// per-device module loading, pointer checks, block-mask building and the launches.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "compiler/codegen/codegen_cuda_interval.h"
#include "compiler/codegen/kernel_source.h"
#include "compiler/codegen/staged_terms.h"
#include "compiler/frontend.h"
#include "compiler/ir/ir_mutator.h"
#include "compiler/ir_report.h"
#include "compiler/passes/dependence.h"
#include "compiler/specialize.h"
#include "dsl/error.h"
#include "kernels_templates/flex_blockmask_params.cuh"
#include "kernels_templates/flex_params.cuh"
#include "runtime/cpu_executor.h"
#include "runtime/cuda_driver.h"
#include "runtime/device.h"
#include "runtime/forward_launch.h"
#include "runtime/kernel_compiler.h"
#include "runtime/kernel_impl.h"

#include "compiler/passes/interval_eval.h"
#include "runtime/log.h"
#include "runtime/tensor_maps.h"

namespace flexjit {

using runtime::check_cu;
using runtime::cuda_driver;

namespace {

const runtime::CudaDriver& drv() { return require_driver(); }

std::mutex& cpu_mutex() {
  static std::mutex m;
  return m;
}
std::shared_ptr<CpuExecutor>& cpu_slot() {
  static std::shared_ptr<CpuExecutor> e;
  return e;
}

}  // namespace

const runtime::CudaDriver& require_driver() {
  const runtime::CudaDriver* d = cuda_driver();
  if (!d) throw Error("no CUDA driver: " + runtime::cuda_driver_unavailable_reason());
  return *d;
}

void register_cpu_executor(std::shared_ptr<CpuExecutor> executor) {
  std::lock_guard<std::mutex> lock(cpu_mutex());
  cpu_slot() = std::move(executor);
}

std::shared_ptr<CpuExecutor> cpu_executor() {
  std::lock_guard<std::mutex> lock(cpu_mutex());
  return cpu_slot();
}

std::string Device::str() const { return kind == Kind::Cpu ? "cpu" : index < 0 ? "cuda" : fmt::format("cuda:{}", index); }

Tensor Tensor::contiguous(void* data, DType dtype, std::vector<int64_t> shape) { return Tensor{data, dtype, std::move(shape), {}}; }

std::vector<int64_t> Tensor::effective_strides() const { return strides.empty() ? contiguous_strides(shape) : strides; }

int64_t Tensor::stride(size_t dim) const {
  if (!strides.empty()) return strides.at(dim);
  int64_t s = 1;
  for (size_t i = shape.size(); i-- > dim + 1;) s *= shape[i];
  return s;
}

BlockMask::~BlockMask() {
  if (memory_ && owns_)
    if (const runtime::CudaDriver* d = cuda_driver()) {
      runtime::ScopedDevice dev(device_);
      d->cuMemFree_v2(static_cast<CUdeviceptr>(memory_));
    }
}

BlockMask::HostLists BlockMask::to_host() const {
  const runtime::CudaDriver& d = drv();
  runtime::ScopedDevice dev(device_);
  check_cu(d.cuCtxSynchronize(), "cuCtxSynchronize");
  size_t counts = static_cast<size_t>(bm_) * hm_ * num_q_tiles_;
  HostLists h;
  h.num_partial.resize(counts);
  h.num_full.resize(counts);
  h.partial.resize(counts * max_kv_tiles_);
  h.full.resize(counts * max_kv_tiles_);
  CUdeviceptr base = static_cast<CUdeviceptr>(memory_);
  check_cu(d.cuMemcpyDtoH_v2(h.num_partial.data(), base, counts * 4), "cuMemcpyDtoH");
  check_cu(d.cuMemcpyDtoH_v2(h.num_full.data(), base + counts * 4, counts * 4), "cuMemcpyDtoH");
  check_cu(d.cuMemcpyDtoH_v2(h.partial.data(), base + counts * 8, counts * max_kv_tiles_ * 4), "cuMemcpyDtoH");
  check_cu(d.cuMemcpyDtoH_v2(h.full.data(), base + counts * 8 + counts * max_kv_tiles_ * 4, counts * max_kv_tiles_ * 4), "cuMemcpyDtoH");
  if (ranked_) {
    std::vector<FlexQTileWork> work(counts);
    check_cu(d.cuMemcpyDtoH_v2(work.data(), base + block_mask_order_offset(bm_, hm_, num_q_tiles_, max_kv_tiles_), counts * sizeof(FlexQTileWork)),
             "cuMemcpyDtoH");
    for (const FlexQTileWork& w : work) h.order.push_back(w.m_block);
  }
  return h;
}

Workspace::~Workspace() {
  if (mask_) mask_->owns_ = false;
  if (memory_)
    if (const runtime::CudaDriver* d = cuda_driver()) {
      runtime::ScopedDevice dev(device_);
      d->cuMemFree_v2(static_cast<CUdeviceptr>(memory_));
    }
}

KernelImpl::KernelImpl(SpecIR ir, RuntimeOptions options) : ir_(std::move(ir)), options_(options) {
  ranges_ = analyze_ir_ranges(ir_);
  canonical_ = canonical_ir_text(ir_);
  if (ir_.score_mod) score_scales_ = split_score_scales(ir_.score_mod);
  divisor_params_ = divisor_params(ir_);
  if (ir_.mask_mod) {
    DependenceInfo deps({ir_.mask_mod});
    const Dependence& d = deps.of(ir_.mask_mod);
    mask_uses_b_ = d.uses(dsl::VarId::B);
    mask_uses_h_ = d.uses(dsl::VarId::H) || d.uses(dsl::VarId::KvHead);
  }
}

void KernelImpl::forward(const AttentionArgs& a) {
  if (a.device.kind == Device::Kind::Cpu) {
    // The same argument checks as on the GPU, so errors do not depend on the backend.
    runtime::validate_operands(spec(), a, /*gpu=*/false);
    runtime::collect_buffers(spec(), a, {});
    auto cpu = cpu_executor();
    if (!cpu) throw Error("this build of flexjit has no CPU backend (configure with FLEXJIT_CPU_BACKEND=ON)");
    cpu->forward(ir_, a);
    return;
  }
  const runtime::CudaDriver& d = drv();
  runtime::LaunchShape shape = runtime::validate_operands(spec(), a, /*gpu=*/true);
  const runtime::SequenceWindow window = runtime::window_of(a);
  int device = launch_device(a);
  std::vector<Tensor> buffers = runtime::collect_buffers(spec(), a, bound_for(device));
  check_pointers(a, buffers, device);
  BoundValues values;
  VariantState& var = variant_for_launch(shape, buffers, a, device, values);
  check_shard_alignment(var, a);
  const ForwardConfig& cfg = var.source.config;

  runtime::ScopedDevice scope(device);
  Workspace& ws = workspace_for(a.workspace, a.stream, device, shape, cfg);
  unsigned int* error_word = reinterpret_cast<unsigned int*>(ws.memory_);
  std::vector<uint64_t> vparams = runtime::fill_variant_params(var.source.variant.layout, buffers, values, options_.checked ? error_word : nullptr);

  FlexForwardParams p{};
  fill_forward_params(p, a, shape);
  if (ir_.mask_mod) {
    const BlockMask* mask = a.block_mask;
    if (mask) {
      check_mask(*mask, shape, window, cfg, device);
    } else {
      build_mask_into(*ws.mask_, var, vparams, shape, window, cfg, device, a.stream);
      mask = ws.mask_.get();
    }
    set_mask(p.block_mask, *mask);
  }
  p.tile_counter = reinterpret_cast<int*>(ws.memory_ + kTileCounterOffset);
  FlexForwardTmaMaps maps;
  if (cfg.warp_specialized) {
    std::lock_guard<std::mutex> lock(mutex_);
    maps = map_cache_.get(d, a.q, a.k, a.v, cfg);
  }
  void* args[] = {&p, vparams.data(), &maps};
  const int64_t work = shape.batch * shape.heads * ((shape.seqlen_q + cfg.block_m - 1) / cfg.block_m);
  check_cu(d.cuLaunchKernel(var.forward_fn.at(device), forward_grid(cfg, work, device), 1, 1, static_cast<unsigned>(cfg.threads()), 1, 1,
                            static_cast<unsigned>(cfg.shared_bytes()), a.stream, args, nullptr),
           "launching the forward kernel");
}

unsigned KernelImpl::forward_grid(const ForwardConfig& cfg, int64_t work, int device) {
  if (work > INT32_MAX) throw Error(fmt::format("the launch has {} work tiles (B x H x query tiles); at most 2^31 - 1 are supported", work));
  // The warp-specialised kernel is persistent: one CTA per SM walks the work tiles.
  if (cfg.warp_specialized) return static_cast<unsigned>(std::min<int64_t>(work, runtime::device_info(device).sm_count));
  return static_cast<unsigned>(work);
}

std::unique_ptr<BlockMask> KernelImpl::build_block_mask(const AttentionArgs& a) {
  if (!ir_.mask_mod) throw Error(fmt::format("spec `{}` has no mask_mod, so it has no block mask", spec().name));
  runtime::LaunchShape shape = runtime::validate_operands(spec(), a, /*gpu=*/true);
  const runtime::SequenceWindow window = runtime::window_of(a);
  int device = launch_device(a);
  std::vector<Tensor> buffers = runtime::collect_buffers(spec(), a, bound_for(device));
  check_pointers(a, buffers, device);
  BoundValues values = runtime::bind_launch(ir_.checked, runtime::mods_shape(shape, window), buffers, a);
  VariantState& var = variant(forward_choice(values, runtime::tensor_maps_describe(a.q, a.k, a.v), !window.whole()), device);
  check_shard_alignment(var, a);
  const ForwardConfig& cfg = var.source.config;
  runtime::ScopedDevice scope(device);
  std::unique_ptr<BlockMask> mask(new BlockMask());
  allocate_mask(*mask, shape, cfg, device);
  std::vector<uint64_t> vparams = runtime::fill_variant_params(var.source.variant.layout, buffers, values, nullptr);
  build_mask_into(*mask, var, vparams, shape, window, cfg, device, a.stream);
  return mask;
}

bool KernelImpl::may_attend(const AttentionArgs& a) {
  if (!ir_.mask_mod) return true;
  const bool cpu = a.device.kind == Device::Kind::Cpu;
  const runtime::LaunchShape shape = runtime::validate_operands(spec(), a, /*gpu=*/!cpu);
  const std::vector<Tensor> buffers = runtime::collect_buffers(spec(), a, cpu ? std::vector<Tensor>{} : bound_for(launch_device(a)));
  const BoundValues values = runtime::bind_launch(ir_.checked, runtime::mods_shape(shape, runtime::window_of(a)), buffers, a);
  IntervalEnv env;
  env.symbols = values.symbols;
  for (const Value& v : values.params) env.params.push_back(v.as_double());
  auto set = [&](dsl::VarId v, int64_t lo, int64_t hi) { env.vars[static_cast<int>(v)] = {lo, hi}; };
  set(dsl::VarId::B, 0, shape.batch - 1);
  set(dsl::VarId::H, 0, shape.heads - 1);
  set(dsl::VarId::KvHead, 0, shape.kv_heads - 1);
  set(dsl::VarId::Q, a.q_offset, a.q_offset + shape.seqlen_q - 1);
  set(dsl::VarId::KV, a.kv_offset, a.kv_offset + shape.seqlen_kv - 1);
  try {
    return classify_box(ir_.mask_mod, env) != TriBool::False;
  } catch (const std::exception&) {
    return true;  // undecided is always sound: the launch runs and masks per element
  }
}

std::unique_ptr<Workspace> KernelImpl::make_workspace(int device, int batch, int heads, int seqlen_q, int seqlen_kv) {
  runtime::ScopedDevice scope(device);
  runtime::LaunchShape s{batch, heads, heads, seqlen_q, seqlen_kv, spec().head_dim, spec().value_head_dim()};
  // The mma.sync kernel's tiles are the smallest any forward or backward launch builds its block mask for.
  return allocate_workspace(device, s, forward_config(spec().head_dim));
}

void KernelImpl::bind_buffer(const std::string& name, const Tensor& t) {
  int idx = -1;
  for (size_t i = 0; i < spec().buffers.size(); ++i)
    if (spec().buffers[i].name == name) idx = static_cast<int>(i);
  if (idx < 0) throw Error(fmt::format("bind_buffer: spec `{}` declares no buffer `{}`", spec().name, name));
  int dev = runtime::pointer_device(t.data);
  if (dev < 0) throw Error(fmt::format("bind_buffer: buffer `{}` is not device memory", name));
  std::lock_guard<std::mutex> lock(mutex_);
  auto& v = bound_[dev];
  v.resize(spec().buffers.size());
  v[idx] = t;
}

void KernelImpl::warm_up(int device, DType dtype) {
  if (dtype != spec().dtype) throw Error("warm_up: the spec's dtype differs");
  variant(runtime::VariantChoice{}, device);
}

void KernelImpl::check_errors(int device, CUstream stream, Workspace* workspace) {
  const runtime::CudaDriver& d = drv();
  runtime::ScopedDevice scope(device);
  check_cu(d.cuStreamSynchronize(stream), "synchronising the launch's stream");
  Workspace* ws = workspace;
  if (!ws) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = workspaces_.find(device);
    if (it == workspaces_.end()) return;
    ws = it->second.get();
  }
  unsigned int word = 0;
  check_cu(d.cuMemcpyDtoH_v2(&word, static_cast<CUdeviceptr>(ws->memory_), 4), "reading the error word");
  if (!word) return;
  check_cu(d.cuMemsetD32_v2(static_cast<CUdeviceptr>(ws->memory_), 0, 1), "clearing the error word");
  std::vector<std::string> problems;
  if (word & kZeroDivisorFlag) problems.push_back("an integer division or modulo met a zero divisor (the result was 0)");
  if (word & kFlexBadLengthsFlag)
    problems.push_back(
        "a sequence's lengths were outside the launch's bounds (forward_varlen, backward_varlen: a cu_seqlens length above max_seqlen_q / "
        "max_seqlen_kv, negative, or past the packed tensors' rows; decode: a q_len outside 1..max_seqlen_q or a kv_len outside "
        "q_len..max_seqlen_kv), so that sequence's outputs were not computed");
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& [key, var] : variants_) {
    for (const LoadSite& s : var->source.variant.loads)
      if (s.flag_bit && (word & s.flag_bit))
        problems.push_back(fmt::format("buffer `{}`: an index of `{}` was out of range and was clamped", s.buffer, s.expression));
    break;
  }
  if (problems.empty()) problems.push_back(fmt::format("error word {:#x}", word));
  const bool loads = (word & ~(kZeroDivisorFlag | kFlexBadLengthsFlag)) != 0;
  throw Error(fmt::format("spec `{}`: {}{}", spec().name, fmt::join(problems, "; "),
                          loads ? "; check the buffer's declared shape against the indices the expression produces"
                                : (word & kFlexBadLengthsFlag) ? "; check cu_seqlens / kv_lens / q_lens against the bounds given at launch" : ""));
}

int KernelImpl::launch_device(const AttentionArgs& a) const {
  if (a.device.index >= 0) return a.device.index;
  int dev = runtime::pointer_device(a.q.data);
  if (dev < 0) throw Error("q is not device memory: pass device pointers, or Device::cpu() for host memory");
  return dev;
}

std::vector<Tensor> KernelImpl::bound_for(int device) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = bound_.find(device);
  return it == bound_.end() ? std::vector<Tensor>{} : it->second;
}

void KernelImpl::check_pointers(const AttentionArgs& a, const std::vector<Tensor>& buffers, int device) const {
  // The name is only built for the message: this runs on every launch.
  auto check = [&](const void* p, auto&& name) {
    int dev = runtime::pointer_device(p);
    if (dev == device) return;
    const std::string what = name();
    if (dev < 0)
      throw Error(fmt::format("{} is not CUDA device memory, but this launch runs on cuda:{}", what, device));
    throw Error(fmt::format("{} lives on cuda:{}, but this launch runs on cuda:{}; copy it to cuda:{} or bind a replica with "
                            "Kernel::bind_buffer",
                            what, dev, device, device));
  };
  auto named = [](const char* n) { return [n] { return std::string(n); }; };
  check(a.q.data, named("q"));
  check(a.k.data, named("k"));
  check(a.v.data, named("v"));
  check(a.o.data, named("o"));
  if (a.lse.data) check(a.lse.data, named("lse"));
  for (size_t i = 0; i < buffers.size(); ++i) check(buffers[i].data, [&] { return fmt::format("buffer `{}`", spec().buffers[i].name); });
  if (a.block_mask && a.block_mask->device() != device)
    throw Error(fmt::format("the block mask was built on cuda:{}, but this launch runs on cuda:{}", a.block_mask->device(), device));
  if (a.workspace && a.workspace->device() != device)
    throw Error(fmt::format("the workspace lives on cuda:{}, but this launch runs on cuda:{}", a.workspace->device(), device));
}

KernelImpl::VariantState& KernelImpl::variant_for_launch(const runtime::LaunchShape& shape, const std::vector<Tensor>& buffers,
                                                        const AttentionArgs& a, int device, BoundValues& values) {
  thread_local std::vector<int64_t> key;
  key.assign({device, shape.batch, shape.heads, shape.kv_heads, shape.seqlen_q, shape.seqlen_kv, shape.head_dim, shape.head_dim_v,
              a.q_offset, a.kv_offset, a.seqlen_q, a.seqlen_kv});
  for (const Tensor& t : buffers) {
    key.push_back(static_cast<int64_t>(t.shape.size()));
    key.insert(key.end(), t.shape.begin(), t.shape.end());
  }
  const bool tma = runtime::tensor_maps_describe(a.q, a.k, a.v);  // the strides decide whether the warp-specialised kernel may run
  key.push_back(tma);
  for (const auto& [name, v] : a.params) {
    const dsl::ParamDecl* p = spec().find_param(name);
    int64_t bits = 0;
    std::memcpy(&bits, &v, sizeof bits);
    key.push_back(p ? p - spec().params.data() : -1);
    key.push_back(bits);
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (memo_.variant && memo_.key == key) {
      values = memo_.values;
      return *memo_.variant;
    }
  }
  values = runtime::bind_launch(ir_.checked, runtime::mods_shape(shape, runtime::window_of(a)), buffers, a);
  VariantState& var = variant(forward_choice(values, tma, !runtime::window_of(a).whole()), device);
  std::lock_guard<std::mutex> lock(mutex_);
  memo_.key = key;
  memo_.values = values;
  memo_.variant = &var;
  return var;
}

KernelImpl::VariantState& KernelImpl::variant(const runtime::VariantChoice& choice, int device) {
  const runtime::DeviceInfo& info = runtime::device_info(device);
  std::string key = fmt::format("{}_{}", choice.key(), info.arch);
  const auto [ir, ranges] = variant_ir(choice);
  std::lock_guard<std::mutex> lock(mutex_);
  auto& slot = variants_[key];
  if (!slot) {
    auto v = std::make_unique<VariantState>();
    v->source = forward_kernel_source(*ir, *ranges, forward_options(choice, info.arch));
    load_library(*v, info.arch);
    slot = std::move(v);
  }
  VariantState& v = *slot;
  if (!v.forward_fn.count(device)) {
    const runtime::CudaDriver& d = drv();
    runtime::ScopedDevice scope(device);
    int smem = v.source.config.shared_bytes();
    if (smem > info.max_shared_optin)
      throw Error(fmt::format("head dim {} needs {} bytes of shared memory per block, but {} allows {}", spec().head_dim, smem, info.name,
                              info.max_shared_optin));
    auto get = [&](const char* name) { return v.library.function(name); };
    CUfunction f = get(kForwardEntry);
    check_cu(d.cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem), "setting the forward kernel's shared memory");
    v.forward_fn[device] = f;
    if (ir_.mask_mod) v.mask_fn[device] = get(kBlockMaskEntry);
    if (std::find(v.source.entries.begin(), v.source.entries.end(), kRankEntry) != v.source.entries.end())
      v.rank_fn[device] = get(kRankEntry);
  }
  return v;
}

runtime::VariantChoice KernelImpl::forward_choice(const BoundValues& values, bool tma, bool shard, const RangeInfo* ranges) {
  std::vector<std::pair<int, int64_t>> specialized = ranges ? std::vector<std::pair<int, int64_t>>{} : specialized_params(values);
  runtime::VariantChoice c;
  if (ranges) {
    c = runtime::choose_variant(*ranges, ir_.checked, values);
  } else if (specialized.empty()) {
    c = runtime::choose_variant(ranges_, ir_.checked, values);
  } else {
    const Specialization& s = specialization(specialized);
    c = runtime::choose_variant(s.ranges, s.ir.checked, values);
    c.specialized = std::move(specialized);
  }
  c.tma = tma;
  c.shard = shard;
  c.runtime_split = runtime_split(values);
  return c;
}

std::vector<std::pair<int, int64_t>> KernelImpl::specialized_params(const BoundValues& values) {
  std::vector<std::pair<int, int64_t>> out;
  if (divisor_params_.empty()) return out;
  std::lock_guard<std::mutex> lock(mutex_);
  for (int index : divisor_params_) {
    const int64_t value = values.params.at(static_cast<size_t>(index)).i;
    std::set<int64_t>& seen = specialized_values_[index];
    if (!seen.count(value)) {
      if (seen.size() >= kMaxSpecializedValues) continue;
      seen.insert(value);
    }
    out.emplace_back(index, value);
  }
  return out;
}

std::string KernelImpl::specialization_key(const std::vector<std::pair<int, int64_t>>& values) {
  std::string key;
  for (const auto& [index, value] : values) key += fmt::format("{}={};", index, value);
  return key;
}

const KernelImpl::Specialization& KernelImpl::specialization(const std::vector<std::pair<int, int64_t>>& values) {
  const std::string key = specialization_key(values);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = specializations_.find(key);
    if (it != specializations_.end()) return *it->second;
  }
  auto s = std::make_unique<Specialization>();
  s->ir = specialize_params(ir_, values);
  s->ranges = analyze_ir_ranges(s->ir);
  std::lock_guard<std::mutex> lock(mutex_);
  auto& slot = specializations_[key];
  if (!slot) slot = std::move(s);
  return *slot;
}

std::pair<const SpecIR*, const RangeInfo*> KernelImpl::variant_ir(const runtime::VariantChoice& choice) {
  if (choice.specialized.empty()) return {&ir_, &ranges_};
  const Specialization& s = specialization(choice.specialized);
  return {&s.ir, &s.ranges};
}

RuntimeSplit KernelImpl::runtime_split(const BoundValues& values) const {
  if (!score_scales_.split || (!score_scales_.in.runtime() && !score_scales_.out.runtime())) return RuntimeSplit::RunningMax;
  std::vector<float> params;
  for (const Value& v : values.params) params.push_back(v.f);
  return runtime_split_for(score_scales_, params);
}

ForwardKernelOptions KernelImpl::forward_options(const runtime::VariantChoice& choice, const std::string& arch) const {
  ForwardKernelOptions fo;
  fo.dtype = spec().dtype;
  fo.head_dim = spec().head_dim;
  fo.arch = arch;
  fo.variant.int32 = choice.int32;
  fo.variant.checked_loads = choice.checked_loads;
  fo.variant.unit_inner_stride = choice.unit_inner_stride;
  fo.variant.error_flags = options_.checked;
  fo.tma_describable = choice.tma;
  fo.shard_positions = choice.shard;
  fo.variant.runtime_split = choice.runtime_split;
  return fo;
}

void KernelImpl::load_library(VariantState& v, const std::string& arch) {
  for (int attempt = 0; attempt < 2; ++attempt) {
    runtime::CacheLookup r = runtime::compile_kernel(v.source, canonical_, arch);
    runtime::log_info("flexjit: kernel {} for {}: {} in {:.3f} s", v.source.name, arch, runtime::cache_source_name(r.source), r.seconds);
    CUresult res = v.library.load(r.artefact->binary);
    if (res == CUDA_SUCCESS) {
      v.artefact = r.artefact;
      return;
    }
    // An entry the driver refuses is removed and compiled once more.
    runtime::process_kernel_cache().invalidate(runtime::kernel_cache_key(v.source, canonical_, arch));
    if (attempt == 1) check_cu(res, "loading the compiled kernel");
  }
}

void KernelImpl::fill_forward_params(FlexForwardParams& p, const AttentionArgs& a, const runtime::LaunchShape& s) const {
  auto qs = a.q.effective_strides(), ks = a.k.effective_strides(), vs = a.v.effective_strides(), os = a.o.effective_strides();
  p.q = a.q.data;
  p.k = a.k.data;
  p.v = a.v.data;
  p.o = a.o.data;
  p.lse = static_cast<float*>(a.lse.data);
  p.q_stride_b = qs[0], p.q_stride_h = qs[1], p.q_stride_s = qs[2];
  p.k_stride_b = ks[0], p.k_stride_h = ks[1], p.k_stride_s = ks[2];
  p.v_stride_b = vs[0], p.v_stride_h = vs[1], p.v_stride_s = vs[2];
  p.o_stride_b = os[0], p.o_stride_h = os[1], p.o_stride_s = os[2];
  if (a.lse.data) {
    auto ls = a.lse.effective_strides();
    p.lse_stride_b = ls[0], p.lse_stride_h = ls[1];
  }
  p.batch = static_cast<int>(s.batch);
  p.heads = static_cast<int>(s.heads);
  p.kv_heads = static_cast<int>(s.kv_heads);
  p.seqlen_q = static_cast<int>(s.seqlen_q);
  p.seqlen_kv = static_cast<int>(s.seqlen_kv);
  p.scale = a.scale > 0 ? a.scale : default_softmax_scale(static_cast<int>(s.head_dim));
  p.q_offset = static_cast<int>(a.q_offset);  // mods_shape checked offset + rows <= whole length < 2^31
  p.kv_offset = static_cast<int>(a.kv_offset);
}

void KernelImpl::check_shard_alignment(const VariantState& var, const AttentionArgs& a) const {
  constexpr int64_t kTileCols = 64;  // VariantBase::kTileCols, the width the staged hooks see
  if (var.source.variant.tile_aligned && a.kv_offset % kTileCols != 0)
    throw Error(fmt::format("kv_offset = {} is not a multiple of {}: spec `{}`'s mods index by KV tile (kv // {} or kv % {}, staged per "
                            "tile), which the GPU kernels keep aligned to the launch's own rows; cut KV shards at multiples of {} "
                            "(or run on the CPU backend, whose tiles follow the whole sequence)",
                            a.kv_offset, kTileCols, spec().name, kTileCols, kTileCols, kTileCols));
}

void KernelImpl::allocate_mask(BlockMask& m, const runtime::LaunchShape& s, const ForwardConfig& cfg, int device) {
  geometry(m, s, cfg, device);
  CUdeviceptr mem = 0;
  check_cu(drv().cuMemAlloc_v2(&mem, block_mask_bytes(m.bm_, m.hm_, m.num_q_tiles_, m.max_kv_tiles_)), "allocating a block mask");
  m.memory_ = mem;
}

void KernelImpl::geometry(BlockMask& m, const runtime::LaunchShape& s, const ForwardConfig& cfg, int device) const {
  m.device_ = device;
  m.bm_ = mask_batch(s);
  m.hm_ = mask_heads(s);
  m.q_tile_ = cfg.block_m;
  m.kv_tile_ = cfg.block_n;
  m.sq_ = static_cast<int>(s.seqlen_q);
  m.skv_ = static_cast<int>(s.seqlen_kv);
  m.num_q_tiles_ = static_cast<int>((s.seqlen_q + cfg.block_m - 1) / cfg.block_m);
  m.max_kv_tiles_ = static_cast<int>((s.seqlen_kv + cfg.block_n - 1) / cfg.block_n);
}

std::unique_ptr<Workspace> KernelImpl::allocate_workspace(int device, const runtime::LaunchShape& s, const ForwardConfig& cfg,
                                                          size_t backward_bytes, size_t min_mask_bytes) {
  std::unique_ptr<Workspace> ws(new Workspace());
  ws->device_ = device;
  ws->mask_.reset(new BlockMask());
  geometry(*ws->mask_, s, cfg, device);
  int64_t bm = s.batch, hm = s.heads;  // room for a mask that depends on b and h
  ws->bytes_ = std::max(min_mask_bytes, kErrorWordBytes + block_mask_bytes(bm, hm, ws->mask_->num_q_tiles_, ws->mask_->max_kv_tiles_));
  const size_t front = backward_bytes ? (ws->bytes_ + kErrorWordBytes - 1) / kErrorWordBytes * kErrorWordBytes : ws->bytes_;
  CUdeviceptr mem = 0;
  check_cu(drv().cuMemAlloc_v2(&mem, front + backward_bytes), "allocating a workspace");
  check_cu(drv().cuMemsetD8_v2(mem, 0, front + backward_bytes), "clearing a workspace");
  ws->memory_ = mem;
  ws->mask_->memory_ = mem + kErrorWordBytes;
  ws->mask_->owns_ = false;
  if (backward_bytes) {
    ws->backward_memory_ = mem + front;
    ws->backward_bytes_ = backward_bytes;
  }
  return ws;
}

Workspace& KernelImpl::workspace_for(Workspace* given, CUstream stream, int device, const runtime::LaunchShape& s, const ForwardConfig& cfg,
                                     size_t backward_bytes) {
  const size_t mask_need = kErrorWordBytes + block_mask_bytes(mask_batch(s), mask_heads(s), (s.seqlen_q + cfg.block_m - 1) / cfg.block_m,
                                                              (s.seqlen_kv + cfg.block_n - 1) / cfg.block_n);
  auto fits = [&](const Workspace& w) { return w.bytes_ >= mask_need && w.backward_bytes_ >= backward_bytes; };
  if (given) {
    if (!fits(*given))
      throw Error(fmt::format("the workspace is too small for this launch (it holds {} + {} bytes, the launch needs {} + {}); make it with "
                              "Kernel::make_workspace (make_backward_workspace for backward launches) for these sizes or larger",
                              given->bytes_, given->backward_bytes_, mask_need, backward_bytes));
    geometry(*given->mask_, s, cfg, device);
    return *given;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  auto& ws = workspaces_[device];
  if (!ws || !fits(*ws)) {
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    drv().cuStreamIsCapturing(stream, &status);
    if (status != CU_STREAM_CAPTURE_STATUS_NONE)
      throw Error("this launch needs a larger workspace, which cannot be allocated during CUDA graph capture; launch once before "
                  "capturing, or pass a workspace from Kernel::make_workspace (make_backward_workspace for backward launches)");
    if (ws) check_cu(drv().cuCtxSynchronize(), "synchronising before growing the workspace");
    // Both parts only grow: a launch that needs little of one (ragged prefill's one-tile mask, a forward's empty
    // scratch) must not shrink it under the next launch of another kind, or alternating kinds reallocate every time.
    ws = allocate_workspace(device, s, cfg, std::max(backward_bytes, ws ? ws->backward_bytes_ : 0), ws ? ws->bytes_ : 0);
  }
  geometry(*ws->mask_, s, cfg, device);
  return *ws;
}

void KernelImpl::check_mask(const BlockMask& m, const runtime::LaunchShape& s, const runtime::SequenceWindow& w, const ForwardConfig& cfg,
                            int device) const {
  const runtime::LaunchShape whole = runtime::mods_shape(s, w);  // 0 lengths mean the tensors' own
  if (m.q_offset_ != w.q_offset || m.kv_offset_ != w.kv_offset || m.seqlen_q_whole_ != whole.seqlen_q || m.seqlen_kv_whole_ != whole.seqlen_kv)
    throw Error(fmt::format("the block mask was built for q_offset={} kv_offset={} of a sequence of {} x {} positions but this launch has "
                            "{}, {}, {} x {}; build it with build_block_mask for the same shard of the sequence",
                            m.q_offset_, m.kv_offset_, m.seqlen_q_whole_, m.seqlen_kv_whole_, w.q_offset, w.kv_offset, whole.seqlen_q,
                            whole.seqlen_kv));
  if (m.q_tile_ != cfg.block_m || m.kv_tile_ != cfg.block_n)
    throw Error(fmt::format("the block mask was built for {}x{} tiles but this kernel uses {}x{}; build it with this kernel's "
                            "build_block_mask for the same launch shape",
                            m.q_tile_, m.kv_tile_, cfg.block_m, cfg.block_n));
  if (m.sq_ != s.seqlen_q || m.skv_ != s.seqlen_kv)
    throw Error(fmt::format("the block mask was built for Sq={} Skv={} but this launch has Sq={} Skv={}", m.sq_, m.skv_, s.seqlen_q, s.seqlen_kv));
  if ((m.bm_ != 1 && m.bm_ != s.batch) || (m.hm_ != 1 && m.hm_ != s.heads))
    throw Error(fmt::format("the block mask covers B={} H={} but this launch has B={} H={}", m.bm_, m.hm_, s.batch, s.heads));
  (void)device;
}

void KernelImpl::set_mask(FlexBlockMask& fm, const BlockMask& m) {
  const int64_t counts = static_cast<int64_t>(m.bm_) * m.hm_ * m.num_q_tiles_;
  const char* base = reinterpret_cast<const char*>(m.memory_);
  fm.kv_num_partial = reinterpret_cast<const int*>(base);
  fm.kv_num_full = reinterpret_cast<const int*>(base + counts * 4);
  fm.kv_partial_idx = reinterpret_cast<const int*>(base + counts * 8);
  fm.kv_full_idx = reinterpret_cast<const int*>(base + counts * 8 + counts * m.max_kv_tiles_ * 4);
  fm.stride_b = m.bm_ == 1 ? 0 : static_cast<int64_t>(m.hm_) * m.num_q_tiles_;
  fm.stride_h = m.hm_ == 1 ? 0 : m.num_q_tiles_;
  fm.num_q_tiles = m.num_q_tiles_;
  fm.max_kv_tiles = m.max_kv_tiles_;
  fm.q_tile = m.q_tile_;
  fm.kv_tile = m.kv_tile_;
  fm.q_order = m.ranked_ ? reinterpret_cast<const FlexQTileWork*>(base + block_mask_order_offset(m.bm_, m.hm_, m.num_q_tiles_, m.max_kv_tiles_))
                         : nullptr;
}

void KernelImpl::build_mask_into(BlockMask& m, VariantState& var, std::vector<uint64_t>& vparams, const runtime::LaunchShape& s,
                                 const runtime::SequenceWindow& w, const ForwardConfig& cfg, int device, CUstream stream, bool rank_tiles) {
  m.q_offset_ = w.q_offset;
  m.kv_offset_ = w.kv_offset;
  const runtime::LaunchShape whole = runtime::mods_shape(s, w);
  m.seqlen_q_whole_ = whole.seqlen_q;
  m.seqlen_kv_whole_ = whole.seqlen_kv;
  FlexBlockMask fm{};
  set_mask(fm, m);
  FlexBlockMaskBuildParams bp{};
  bp.kv_num_partial = const_cast<int*>(fm.kv_num_partial);
  bp.kv_num_full = const_cast<int*>(fm.kv_num_full);
  bp.kv_partial_idx = const_cast<int*>(fm.kv_partial_idx);
  bp.kv_full_idx = const_cast<int*>(fm.kv_full_idx);
  bp.stride_b = fm.stride_b;
  bp.stride_h = fm.stride_h;
  bp.num_q_tiles = m.num_q_tiles_;
  bp.max_kv_tiles = m.max_kv_tiles_;
  bp.q_tile = cfg.block_m;
  bp.kv_tile = cfg.block_n;
  bp.batch = static_cast<int>(s.batch);
  bp.heads = static_cast<int>(s.heads);
  bp.kv_heads = static_cast<int>(s.kv_heads);
  bp.seqlen_q = static_cast<int>(s.seqlen_q);
  bp.seqlen_kv = static_cast<int>(s.seqlen_kv);
  bp.query_offset = static_cast<int>(w.q_offset);
  bp.kv_offset = static_cast<int>(w.kv_offset);
  // Data-dependent masks: rank each row's query tiles by work for the kernel's schedule (flex_rank_q_tiles). A row
  // of more query tiles than 48 KB of shared memory holds (12288) stays unranked: the scheduler then takes the
  // reversed tile order.
  auto rank = var.rank_fn.find(device);
  // Rounded up to 4 counts: the ranking loop's reads are vectorised and may cover up to three past the last.
  const size_t rank_smem = static_cast<size_t>((m.num_q_tiles_ + 3) / 4 * 4) * 4;
  const bool ranked = rank_tiles && rank != var.rank_fn.end() && rank_smem <= 48 * 1024;
  if (ranked) bp.q_order = reinterpret_cast<FlexQTileWork*>(m.memory_ + block_mask_order_offset(m.bm_, m.hm_, m.num_q_tiles_, m.max_kv_tiles_));
  void* args[] = {&bp, vparams.data()};
  check_cu(drv().cuLaunchKernel(var.mask_fn.at(device), static_cast<unsigned>(m.num_q_tiles_), static_cast<unsigned>(m.hm_),
                                static_cast<unsigned>(m.bm_), 128, 1, 1, static_cast<unsigned>(m.max_kv_tiles_), stream, args, nullptr),
           "launching the block-mask builder");
  m.ranked_ = false;
  if (ranked) {
    void* rargs[] = {&bp};
    check_cu(drv().cuLaunchKernel(rank->second, static_cast<unsigned>(m.hm_), static_cast<unsigned>(m.bm_), 1, 128, 1, 1,
                                  static_cast<unsigned>(rank_smem), stream, rargs, nullptr),
             "launching the block-mask ranking");
    m.ranked_ = true;
  }
}

Runtime::Runtime(RuntimeOptions options) : options_(options) {}

std::shared_ptr<Kernel> Runtime::compile(const dsl::Spec& spec) { return std::make_shared<KernelImpl>(build_spec_ir(spec), options_); }

int Runtime::device_count() { return runtime::device_count(); }

}  // namespace flexjit
