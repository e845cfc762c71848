// KernelImpl's decode plans and runs: the split-KV decode module (kernels_templates/flex_decode.cuh)
// compiled per (variant, arch, m-tiles), a plan that fixes splits and workspace, and runs that only
// enqueue kernels (graph-capturable).
#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "compiler/codegen/decode_source.h"
#include "dsl/error.h"
#include "kernels_templates/flex_decode_params.cuh"
#include "runtime/cpu_executor.h"
#include "runtime/device.h"
#include "runtime/device_memory.h"
#include "runtime/kernel_impl.h"

namespace flexjit {

using runtime::check_cu;

void CpuExecutor::decode(const SpecIR&, const DecodePlanOptions&, const DecodeArgs&) { throw Error("this CPU backend has no decode"); }

namespace {

class CpuDecodePlan : public DecodePlan {
 public:
  explicit CpuDecodePlan(DecodePlanOptions o) : options_(o) {}
  const DecodePlanOptions& options() const override { return options_; }
  int num_splits() const override { return 1; }

 private:
  DecodePlanOptions options_;
};

// A GPU plan: the decode configuration, the split count and one device allocation holding the split
// workspace (partial O and LSE) and the tile-window arrays.
class GpuDecodePlan : public DecodePlan {
 public:
  const DecodePlanOptions& options() const override { return options_; }
  int num_splits() const override { return num_splits_; }
  std::vector<int> listed_tiles() const override {
    if (lists_per_seq == 0) return {};
    std::vector<int> counts(size_t(options_.batch) * lists_per_seq);
    runtime::ScopedDevice scope(device);
    memory.download(counts.data(), counts.size() * sizeof(int));  // the counts lead the allocation
    return counts;
  }

  DecodePlanOptions options_;
  const void* owner = nullptr;  // the KernelImpl that made the plan
  int device = 0;
  DecodeConfig config;
  int num_splits_ = 1;
  bool evict_first = false;
  bool fused_combine = false;  // the decode kernel's last split CTA merges (no combine launch)
  int lists_per_seq = 0;      // tile lists per sequence: Hkv when the mask reads h, 1, or 0 without a mask
  int list_capacity = 0;      // tiles per list: ceil(max_seqlen_kv / 64)
  runtime::DeviceBuffer memory;
  size_t list_offset = 0, ws_o_offset = 0, ws_lse_offset = 0, counters_offset = 0;
};

void check_rank(const Tensor& t, const char* name, size_t rank) {
  if (!t.data) throw Error(fmt::format("decode: {} has no data pointer", name));
  if (t.shape.size() != rank) throw Error(fmt::format("decode: {} must have {} dimensions, but has {}", name, rank, t.shape.size()));
  if (!t.strides.empty() && t.strides.size() != rank)
    throw Error(fmt::format("decode: {} has {} strides for {} dimensions", name, t.strides.size(), rank));
}

void check_vector_layout(const Tensor& t, const char* name) {
  runtime::check_addressable(t, fmt::format("decode: {}", name));
  std::vector<int64_t> s = t.effective_strides();
  if (s.back() != 1) throw Error(fmt::format("decode: {} must be contiguous in its last dimension", name));
  const int per16 = 16 / dsl::dtype_size(t.dtype);  // elements per 16-byte copy
  for (size_t i = 0; i + 1 < s.size(); ++i)
    if (s[i] % per16 != 0)
      throw Error(fmt::format("decode: {} stride {} is {} elements; the GPU kernel needs multiples of {} elements (16 bytes)", name, i, s[i], per16));
  if (reinterpret_cast<uintptr_t>(t.data) % 16 != 0) throw Error(fmt::format("decode: {} must be 16-byte aligned", name));
}

void check_i32_vector(const Tensor& t, const char* name, int64_t min_len) {
  if (t.dtype != DType::I32) throw Error(fmt::format("decode: {} must be i32", name));
  if (t.shape.size() != 1 || t.shape[0] < min_len)
    throw Error(fmt::format("decode: {} must be a 1-d i32 tensor of at least {} entries", name, min_len));
  if (!t.strides.empty() && t.strides[0] != 1) throw Error(fmt::format("decode: {} must be contiguous", name));
}

// The plan's cache element type: an FP8 type, or the spec's dtype (also when kv_dtype names it).
DType plan_kv_dtype(const DecodePlanOptions& o, DType spec_dtype) {
  if (!o.kv_dtype) return spec_dtype;
  if (runtime::is_fp8(*o.kv_dtype) || *o.kv_dtype == spec_dtype) return *o.kv_dtype;
  throw Error(fmt::format("plan_decode: kv_dtype {} is not supported for a {} spec; use {} (the spec's dtype), f8e4m3 or f8e5m2",
                          dsl::dtype_name(*o.kv_dtype), dsl::dtype_name(spec_dtype), dsl::dtype_name(spec_dtype)));
}

}  // namespace

// One compiled decode module and its kernels per device.
struct KernelImpl::DecodeModule {
  VariantState var;  // source, artefact and library (forward_fn holds the decode kernel)
  std::map<int, CUfunction> combine_fn, tiles_fn;
};

// Decode modules of this kernel, keyed by variant choice, architecture and configuration.
struct KernelImpl::DecodeState {
  RangeInfo ranges;  // over decode_var_domains
  bool tile_list = false;
  std::map<std::string, std::unique_ptr<DecodeModule>> modules;
};

std::unique_ptr<DecodePlan> KernelImpl::plan_decode(const DecodePlanOptions& o) {
  if (o.device.kind == Device::Kind::Cpu) {
    plan_kv_dtype(o, spec().dtype);  // the same kv_dtype rule as the GPU's, checked at plan time
    return std::make_unique<CpuDecodePlan>(o);
  }
  const int D = spec().head_dim;
  if (spec().value_head_dim() != D) throw Error("decode on the GPU needs the value head dim to equal the head dim");
  if (o.batch < 1 || o.heads < 1 || o.kv_heads < 1)
    throw Error(fmt::format("plan_decode: batch, heads and kv_heads must be >= 1 (got {}, {}, {})", o.batch, o.heads, o.kv_heads));
  if (o.heads % o.kv_heads != 0)
    throw Error(fmt::format("plan_decode: heads ({}) must be a multiple of kv_heads ({})", o.heads, o.kv_heads));
  if (spec().gqa_group && o.heads / o.kv_heads != spec().gqa_group)
    throw Error(fmt::format("plan_decode: the spec fixes gqa_group = {} but the plan has {} / {} heads", spec().gqa_group, o.heads, o.kv_heads));
  if (o.max_seqlen_q < 1 || o.max_seqlen_q > 16) throw Error(fmt::format("plan_decode: max_seqlen_q must be in [1, 16], got {}", o.max_seqlen_q));
  if (o.max_seqlen_kv < o.max_seqlen_q)
    throw Error(fmt::format("plan_decode: max_seqlen_kv ({}) must be at least max_seqlen_q ({})", o.max_seqlen_kv, o.max_seqlen_q));
  if (o.page_size < 0 || o.page_size > 256) throw Error(fmt::format("plan_decode: page_size must be 0 (contiguous) or 1..256, got {}", o.page_size));
  if (o.num_splits < 0 || o.num_splits > kFlexDecodeMaxSplits)
    throw Error(fmt::format("plan_decode: num_splits must be 0 (automatic) or 1..{}, got {}", kFlexDecodeMaxSplits, o.num_splits));
  const runtime::CudaDriver& d = require_driver();
  const int device = o.device.index >= 0 ? o.device.index : 0;
  const runtime::DeviceInfo& info = runtime::device_info(device);
  runtime::ScopedDevice scope(device);

  auto plan = std::make_unique<GpuDecodePlan>();
  plan->options_ = o;
  plan->options_.device = Device::cuda(device);
  plan->owner = this;
  plan->device = device;
  const int group = o.heads / o.kv_heads;
  const DType kv_dtype = plan_kv_dtype(o, spec().dtype);
  plan->config = decode_config(D, group * o.max_seqlen_q, runtime::is_fp8(kv_dtype) ? std::optional<DType>(kv_dtype) : std::nullopt);
  // For comparisons (docs/notes/DECODE_NOTES.md): FLEXJIT_DECODE_STAGES=2..4 overrides the stage count (the default
  // pipeline choice follows it), FLEXJIT_DECODE_ALTERNATE=0/1 the pipeline (1 needs two stages).
  if (const char* e = std::getenv("FLEXJIT_DECODE_STAGES")) {
    const int st = std::atoi(e);
    if (st < 2 || st > 4) throw Error(fmt::format("FLEXJIT_DECODE_STAGES must be 2, 3 or 4, got `{}`", e));
    plan->config.stages = st;
    plan->config.alternate = !plan->config.kv_fp8 && flex_decode_alternate(D, plan->config.m_tiles, st);
  }
  if (const char* e = std::getenv("FLEXJIT_DECODE_ALTERNATE")) {
    plan->config.alternate = std::atoi(e) != 0;
    if (plan->config.alternate && plan->config.stages != 2)
      throw Error(fmt::format("FLEXJIT_DECODE_ALTERNATE=1 needs two stages, but FLEXJIT_DECODE_STAGES is {}", plan->config.stages));
    if (plan->config.alternate && plan->config.kv_fp8) throw Error("FLEXJIT_DECODE_ALTERNATE=1 is not available for FP8 caches");
  }
  if (plan->config.shared_bytes() > info.max_shared_optin)
    throw Error(fmt::format("decode with head dim {} needs {} bytes of shared memory per block, but {} allows {}", D, plan->config.shared_bytes(),
                            info.name, info.max_shared_optin));

  // The module of the plain variant choice, compiled now so the first run does not compile.
  runtime::VariantChoice choice;
  DecodeModule& m = decode_module(choice, device, plan->config);
  const int row_blocks = (group * o.max_seqlen_q + plan->config.block_m() - 1) / plan->config.block_m();
  if (o.num_splits > 0) {
    plan->num_splits_ = o.num_splits;
  } else {
    int ctas_per_sm = 0;
    check_cu(d.cuOccupancyMaxActiveBlocksPerMultiprocessor(&ctas_per_sm, m.var.forward_fn.at(device), 128, plan->config.shared_bytes()),
             "reading the decode kernel's occupancy");
    const int max_tiles = (o.max_seqlen_kv + kFlexDecodeBlockN - 1) / kFlexDecodeBlockN;
    // The alternating D128 kernel has 2 resident CTAs per SM (registers), the pairs 3; bandwidth wants 2 in both,
    // so on an H100 (132 SMs) B8 x Hkv 8 gets 4 splits (256 CTAs in one wave of 264 slots) either way.
    const int ctas = flex_decode_bandwidth_ctas(ctas_per_sm, D, plan->config.stages, plan->config.kv_bytes());
    plan->num_splits_ = flex_decode_num_splits(info.sm_count, ctas, o.batch * o.kv_heads * row_blocks, max_tiles);
  }
  // FLEXJIT_DECODE_NUM_SPLITS=n overrides the automatic count (for comparisons; an explicit num_splits wins).
  if (const char* e = std::getenv("FLEXJIT_DECODE_NUM_SPLITS"); e && o.num_splits == 0) {
    const int n = std::atoi(e);
    if (n < 1 || n > kFlexDecodeMaxSplits) throw Error(fmt::format("FLEXJIT_DECODE_NUM_SPLITS must be in 1..{}, got `{}`", kFlexDecodeMaxSplits, e));
    plan->num_splits_ = n;
  }
  // The L2 policy of the K/V loads (flex_decode_evict_first). FLEXJIT_DECODE_EVICT_FIRST=0/1 overrides.
  const double kv_bytes = 2.0 * plan->config.kv_bytes() * o.batch * o.kv_heads * double(o.max_seqlen_kv) * D;
  plan->evict_first = flex_decode_evict_first(kv_bytes, decode_state_->tile_list);
  if (const char* e = std::getenv("FLEXJIT_DECODE_EVICT_FIRST")) plan->evict_first = std::atoi(e) != 0;

  // The last split CTA of each row block merges the partials in the decode kernel (fused combine): saves the
  // combine launch and its gap. FLEXJIT_DECODE_FUSED_COMBINE=0 brings the separate combine kernel back.
  plan->fused_combine = true;
  if (const char* e = std::getenv("FLEXJIT_DECODE_FUSED_COMBINE")) plan->fused_combine = std::atoi(e) != 0;

  // One allocation: [tile counts: B x lists ints][tile lists: B x lists x capacity ints][ws_o][ws_lse]
  // [split counters: B x Hkv x row_blocks ints], 256-byte aligned pieces.
  auto align = [](size_t x) { return (x + 255) / 256 * 256; };
  plan->lists_per_seq = decode_state_->tile_list ? (mask_uses_h_ ? o.kv_heads : 1) : 0;
  plan->list_capacity = (o.max_seqlen_kv + kFlexDecodeBlockN - 1) / kFlexDecodeBlockN;
  const size_t lists = size_t(o.batch) * plan->lists_per_seq;
  plan->list_offset = align(lists * 4);
  const size_t tiles_bytes = plan->list_offset + align(lists * plan->list_capacity * 4);
  const long long ws = flex_decode_workspace_bytes(o.batch, o.heads, o.max_seqlen_q, D, plan->num_splits_);
  const size_t rows = size_t(o.batch) * o.heads * o.max_seqlen_q * plan->num_splits_;
  const size_t counters = size_t(o.batch) * o.kv_heads * row_blocks;
  plan->ws_o_offset = tiles_bytes;
  plan->ws_lse_offset = tiles_bytes + align(rows * D * 4);
  plan->counters_offset = plan->ws_lse_offset + align(rows * 4);
  // At least one aligned piece: a plan without a mask or splits still owns (empty) memory.
  size_t total = std::max<size_t>(ws > 0 ? plan->counters_offset + align(counters * 4) : tiles_bytes, 256);
  plan->memory = runtime::DeviceBuffer(device, total);
  if (ws > 0) {
    // The counters start at zero; every launch leaves them at zero again (the last CTA resets its counter).
    const CUdeviceptr c = reinterpret_cast<CUdeviceptr>(static_cast<char*>(plan->memory.data()) + plan->counters_offset);
    check_cu(d.cuMemsetD32Async(c, 0, counters, nullptr), "zeroing the decode split counters");
    check_cu(d.cuStreamSynchronize(nullptr), "zeroing the decode split counters");
  }

  // The error word of checked loads lives in the kernel's per-device workspace (read by check_errors).
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& w = workspaces_[device];
    if (!w) w = allocate_workspace(device, runtime::LaunchShape{1, 1, 1, 1, 1, D, D}, forward_config(D));
  }
  return plan;
}

KernelImpl::DecodeModule& KernelImpl::decode_module(const runtime::VariantChoice& choice, int device, const DecodeConfig& cfg) {
  const runtime::DeviceInfo& info = runtime::device_info(device);
  std::lock_guard<std::mutex> lock(mutex_);
  if (!decode_state_) {
    decode_state_ = std::make_shared<DecodeState>();
    decode_state_->ranges = analyze_decode_ranges(ir_);
    decode_state_->tile_list = decode_has_tile_list(ir_);
  }
  auto& slot = decode_state_->modules[fmt::format("{}_{}_{}", choice.key(), info.arch, cfg.str())];
  if (!slot) {
    auto m = std::make_unique<DecodeModule>();
    DecodeKernelOptions o;
    o.dtype = spec().dtype;
    o.config = cfg;
    o.variant.int32 = choice.int32;
    o.variant.checked_loads = choice.checked_loads;
    o.variant.unit_inner_stride = choice.unit_inner_stride;
    o.variant.error_flags = options_.checked;
    m->var.source = decode_kernel_source(ir_, decode_state_->ranges, o);
    load_library(m->var, info.arch);
    slot = std::move(m);
  }
  DecodeModule& m = *slot;
  if (!m.var.forward_fn.count(device)) {
    const runtime::CudaDriver& d = require_driver();
    runtime::ScopedDevice scope(device);
    auto get = [&](const char* name) { return m.var.library.function(name); };
    CUfunction f = get(kDecodeEntry);
    check_cu(d.cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, cfg.shared_bytes()),
             "setting the decode kernel's shared memory");
    m.combine_fn[device] = get(kDecodeCombineEntry);
    if (decode_state_->tile_list) m.tiles_fn[device] = get(kDecodeTilesEntry);
    m.var.forward_fn[device] = f;
  }
  return m;
}

void KernelImpl::decode(const DecodePlan& plan_base, const DecodeArgs& a) {
  if (plan_base.options().device.kind == Device::Kind::Cpu) {
    auto cpu = cpu_executor();
    if (!cpu) throw Error("this build of flexjit has no CPU backend (configure with FLEXJIT_CPU_BACKEND=ON)");
    cpu->decode(ir_, plan_base.options(), a);
    return;
  }
  const auto* plan = dynamic_cast<const GpuDecodePlan*>(&plan_base);
  if (!plan || plan->owner != this) throw Error("decode: the plan was made by another kernel; plan with this kernel's plan_decode");
  const DecodePlanOptions& o = plan->options_;
  const int D = spec().head_dim;
  const int device = plan->device;

  // Operands.
  check_rank(a.q, "q", 4);
  check_rank(a.o, "o", 4);
  const int64_t B = a.q.shape[0], H = a.q.shape[1], Sq = a.q.shape[2];
  if (B > o.batch) throw Error(fmt::format("decode: q has batch {} but the plan was made for at most {}", B, o.batch));
  if (H != o.heads) throw Error(fmt::format("decode: q has {} heads but the plan has {}", H, o.heads));
  if (Sq > o.max_seqlen_q) throw Error(fmt::format("decode: q has {} rows per sequence but the plan allows at most {}", Sq, o.max_seqlen_q));
  if (a.q.shape[3] != D) throw Error(fmt::format("decode: q has head dim {} but the spec has {}", a.q.shape[3], D));
  if (a.o.shape != a.q.shape) throw Error(fmt::format("decode: o has shape [{}] but must be [{}] like q", fmt::join(a.o.shape, ", "),
                                                      fmt::join(a.q.shape, ", ")));
  const bool paged = o.page_size > 0;
  check_rank(a.k, "k", 4);
  check_rank(a.v, "v", 4);
  if (a.k.shape != a.v.shape) throw Error("decode: k and v must have the same shape");
  const int64_t Hkv = o.kv_heads;
  if (paged) {
    const int64_t ps = o.head_major_pages ? a.k.shape[2] : a.k.shape[1], hk = o.head_major_pages ? a.k.shape[1] : a.k.shape[2];
    if (ps != o.page_size || hk != Hkv || a.k.shape[3] != D)
      throw Error(fmt::format("decode: k has shape [{}] but the plan's paged layout is {} with page_size {}, Hkv {}, D {}",
                              fmt::join(a.k.shape, ", "), o.head_major_pages ? "[num_pages, Hkv, page_size, D]" : "[num_pages, page_size, Hkv, D]",
                              o.page_size, Hkv, D));
    check_rank(a.page_table, "page_table", 2);
    if (a.page_table.dtype != DType::I32 || a.page_table.shape[0] < B || a.page_table.effective_strides()[1] != 1)
      throw Error("decode: page_table must be i32 [B, max_pages_per_seq] with contiguous rows");
  } else {
    if (a.k.shape[0] < B || a.k.shape[1] != Hkv || a.k.shape[3] != D)
      throw Error(fmt::format("decode: k has shape [{}] but must be [B, Hkv={}, Skv_cap, D={}]", fmt::join(a.k.shape, ", "), Hkv, D));
    if (a.k.shape[2] < o.max_seqlen_kv)
      throw Error(fmt::format("decode: the contiguous cache holds {} positions but the plan's max_seqlen_kv is {}", a.k.shape[2],
                              o.max_seqlen_kv));
  }
  for (const Tensor* t : {&a.q, &a.o})
    if (t->dtype != spec().dtype) throw Error(fmt::format("decode: q and o must be {} (the spec's dtype)", dsl::dtype_name(spec().dtype)));
  const DType kv_dtype = plan_kv_dtype(o, spec().dtype);
  for (const Tensor* t : {&a.k, &a.v})
    if (t->dtype != kv_dtype)
      throw Error(fmt::format("decode: k and v must be {} (the plan's kv_dtype), but {} is {}", dsl::dtype_name(kv_dtype), t == &a.k ? "k" : "v",
                              dsl::dtype_name(t->dtype)));
  int64_t kv_scale_stride = 0;
  for (const Tensor* t : {&a.k_scale, &a.v_scale}) {
    if (!t->data) continue;
    const char* name = t == &a.k_scale ? "k_scale" : "v_scale";
    if (!runtime::is_fp8(kv_dtype)) throw Error(fmt::format("decode: {} is only for FP8 caches (plan with kv_dtype f8e4m3 or f8e5m2)", name));
    const int64_t stride = runtime::check_kv_scale(*t, "decode", name, o.kv_heads, device);
    if (a.k_scale.data && a.v_scale.data && a.k_scale.shape != a.v_scale.shape)
      throw Error("decode: k_scale and v_scale must have the same shape ([Hkv] or [1])");
    kv_scale_stride = stride;
  }
  check_vector_layout(a.q, "q");
  check_vector_layout(a.o, "o");
  check_vector_layout(a.k, "k");
  check_vector_layout(a.v, "v");
  if (a.k.effective_strides() != a.v.effective_strides()) throw Error("decode: k and v must have the same strides");
  if (a.kv_lens.data) check_i32_vector(a.kv_lens, "kv_lens", B);
  else if (paged) throw Error("decode: a paged cache needs kv_lens");
  if (a.q_lens.data) check_i32_vector(a.q_lens, "q_lens", B);
  if (a.lse.data) {
    check_rank(a.lse, "lse", 3);
    if (a.lse.dtype != DType::F32 || a.lse.shape != std::vector<int64_t>{B, H, Sq} || a.lse.effective_strides()[2] != 1)
      throw Error("decode: lse must be f32 [B, H, Sq] with a contiguous last dimension");
  }
  if (!(a.scale >= 0) || std::isinf(a.scale)) throw Error("decode: scale must be a finite number >= 0 (0 means 1/sqrt(D))");

  // Buffers, symbols (Sq, Skv = the plan's bounds) and the variant.
  AttentionArgs shim;
  shim.buffers = a.buffers;
  shim.params = a.params;
  std::vector<Tensor> buffers = runtime::collect_buffers(spec(), shim, bound_for(device));
  for (size_t i = 0; i < buffers.size(); ++i)
    if (runtime::pointer_device(buffers[i].data) != device)
      throw Error(fmt::format("decode: buffer `{}` is not memory of cuda:{}", spec().buffers[i].name, device));
  if (runtime::pointer_device(a.q.data) != device) throw Error(fmt::format("decode: q is not memory of cuda:{} (the plan's device)", device));
  runtime::LaunchShape shape{B, H, Hkv, o.max_seqlen_q, o.max_seqlen_kv, D, D};
  BoundValues values = runtime::bind_launch(ir_.checked, shape, buffers, shim);
  runtime::VariantChoice choice = runtime::choose_variant(decode_state_->ranges, ir_.checked, values);
  DecodeModule& m = decode_module(choice, device, plan->config);

  runtime::ScopedDevice scope(device);
  unsigned int* error_word = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = workspaces_.find(device);
    if (it != workspaces_.end() && it->second) error_word = reinterpret_cast<unsigned int*>(it->second->memory_);
  }
  std::vector<uint64_t> vparams = runtime::fill_variant_params(m.var.source.variant.layout, buffers, values, options_.checked ? error_word : nullptr);

  const int group = static_cast<int>(H / Hkv);
  FlexDecodeParams p{};
  auto qs = a.q.effective_strides(), os = a.o.effective_strides(), ks = a.k.effective_strides();
  p.q = a.q.data;
  p.k = a.k.data;
  p.v = a.v.data;
  p.o = a.o.data;
  p.lse = static_cast<float*>(a.lse.data);
  char* base = static_cast<char*>(plan->memory.data());
  if (plan->num_splits_ > 1) {
    p.ws_o = reinterpret_cast<float*>(base + plan->ws_o_offset);
    p.ws_lse = reinterpret_cast<float*>(base + plan->ws_lse_offset);
    if (plan->fused_combine) p.split_counters = reinterpret_cast<int*>(base + plan->counters_offset);
  }
  p.kv_lens = static_cast<const int*>(a.kv_lens.data);
  p.q_lens = static_cast<const int*>(a.q_lens.data);
  // Lengths are checked on the device (flex_decode_lengths): outside the plan's bounds a sequence is skipped and the
  // error word says so, whether or not loads are checked.
  p.max_kv_len = o.max_seqlen_kv;
  p.error_word = error_word;
  p.q_stride_b = qs[0], p.q_stride_h = qs[1], p.q_stride_s = qs[2];
  p.o_stride_b = os[0], p.o_stride_h = os[1], p.o_stride_s = os[2];
  if (a.lse.data) {
    auto ls = a.lse.effective_strides();
    p.lse_stride_b = ls[0], p.lse_stride_h = ls[1];
  }
  if (paged) {
    p.page_table = static_cast<const int*>(a.page_table.data);
    p.page_table_stride = a.page_table.effective_strides()[0];
    p.kv_stride_page = ks[0];
    p.kv_stride_row = o.head_major_pages ? ks[2] : ks[1];
    p.kv_stride_head = o.head_major_pages ? ks[1] : ks[2];
    p.page_size = o.page_size;
    p.page_shift = -1;
    if ((o.page_size & (o.page_size - 1)) == 0) {
      p.page_shift = 0;
      while ((1 << p.page_shift) < o.page_size) ++p.page_shift;
    }
  } else {
    p.kv_stride_page = ks[0];
    p.kv_stride_head = ks[1];
    p.kv_stride_row = ks[2];
    p.page_size = 1;
    p.page_shift = 0;
  }
  p.batch = static_cast<int>(B);
  p.heads = static_cast<int>(H);
  p.kv_heads = static_cast<int>(Hkv);
  p.max_q_len = static_cast<int>(Sq);
  p.kv_len = paged ? o.max_seqlen_kv : static_cast<int>(std::min<int64_t>(a.k.shape[2], o.max_seqlen_kv));
  p.num_splits = plan->num_splits_;
  p.row_blocks = static_cast<int>((group * Sq + plan->config.block_m() - 1) / plan->config.block_m());
  p.kv_evict_first = plan->evict_first ? 1 : 0;
  p.scale = a.scale > 0 ? a.scale : default_softmax_scale(static_cast<int>(D));
  p.k_scale = static_cast<const float*>(a.k_scale.data);
  p.v_scale = static_cast<const float*>(a.v_scale.data);
  p.kv_scale_stride = kv_scale_stride;

  const runtime::CudaDriver& d = require_driver();
  if (plan->lists_per_seq > 0) {
    FlexDecodeTileListParams wp{};
    const int lists = plan->lists_per_seq;
    wp.count = reinterpret_cast<int*>(base);
    wp.list = reinterpret_cast<int*>(base + plan->list_offset);
    wp.capacity = plan->list_capacity;
    wp.kv_lens = p.kv_lens;
    wp.q_lens = p.q_lens;
    wp.kv_len = p.kv_len;
    wp.max_q_len = p.max_q_len;
    wp.max_kv_len = p.max_kv_len;
    wp.heads = p.heads;
    wp.kv_heads = p.kv_heads;
    wp.per_head = mask_uses_h_ ? 1 : 0;
    void* wargs[] = {&wp, vparams.data()};
    check_cu(d.cuLaunchKernel(m.tiles_fn.at(device), static_cast<unsigned>(lists), static_cast<unsigned>(B), 1, kFlexDecodeTileListThreads, 1,
                              1, 0, a.stream, wargs, nullptr),
             "launching the decode tile-list kernel");
    p.tiles.list = wp.list;
    p.tiles.count = wp.count;
    p.tiles.capacity = wp.capacity;
    p.tiles.stride_b = lists;
    p.tiles.stride_h = mask_uses_h_ ? 1 : 0;
  }
  void* args[] = {&p, vparams.data()};
  check_cu(d.cuLaunchKernel(m.var.forward_fn.at(device), static_cast<unsigned>(p.num_splits), static_cast<unsigned>(Hkv * p.row_blocks),
                            static_cast<unsigned>(B), 128, 1, 1, static_cast<unsigned>(plan->config.shared_bytes()), a.stream, args, nullptr),
           "launching the decode kernel");
  if (p.num_splits > 1 && p.split_counters == nullptr) {
    void* cargs[] = {&p};
    const long long rows = B * H * Sq;
    check_cu(d.cuLaunchKernel(m.combine_fn.at(device), static_cast<unsigned>((rows + 3) / 4), 1, 1, 128, 1, 1, 0, a.stream, cargs, nullptr),
             "launching the decode combine kernel");
  }
}

}  // namespace flexjit
