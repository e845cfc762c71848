#include "runtime/ring_kernels.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <mutex>

#include "dsl/error.h"
#include "kernels_templates/flex_ring_params.cuh"
#include "runtime/cuda_driver.h"
#include "runtime/device.h"
#include "runtime/kernel_compiler.h"
#include "runtime/log.h"

namespace flexjit::runtime {

namespace {

constexpr int kThreads = 256;

int ring_dtype(DType t) {
  switch (t) {
    case DType::BF16: return kFlexRingBf16;
    case DType::F16: return kFlexRingF16;
    default: return kFlexRingF32;  // f32, or a raw copy, which ignores it
  }
}

FlexRingView view_of(const Tensor& t, RingView4& four) {
  four = ring_view4(t);
  FlexRingView v{};
  v.data = t.data;
  for (int i = 0; i < 4; ++i) v.stride[i] = four.stride[i];
  v.dtype = ring_dtype(t.dtype);
  return v;
}

// Grid-stride kernels: enough blocks to fill the device, at most one per `per_block` units of work.
unsigned grid_for(int64_t units, int64_t per_block, int sm_count) {
  const int64_t want = (units + per_block - 1) / per_block;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(want, int64_t(sm_count) * 16)));
}

}  // namespace

KernelSource ring_kernel_source() {
  KernelSource ks;
  ks.name = "flexjit_ring";
  ks.entries = {kRingCopyEntry, kRingMergeEntry};
  ks.source = fmt::format(
      "// flexjit ring attention: copies, conversions and fp32 sums between strided views, and the blocks' log-sum-exp merge.\n"
      "#include \"flex_ring.cuh\"\n\n"
      "extern \"C\" __global__ void __launch_bounds__({0})\n{1}(const FlexRingCopyParams p) {{\n  flex_ring_copy(p);\n}}\n\n"
      "extern \"C\" __global__ void __launch_bounds__({0})\n{2}(const FlexRingMergeParams p) {{\n  flex_ring_merge(p);\n}}\n",
      kThreads, kRingCopyEntry, kRingMergeEntry);
  ks.key_text = fmt::format("kind=ring\nthreads={}\n", kThreads);
  return ks;
}

const RingKernels& RingKernels::on(int device) {
  static std::mutex mutex;
  // Never destroyed: work queued on a stream may still use the module at exit.
  static auto* loaded = new std::map<int, std::unique_ptr<RingKernels>>();
  std::lock_guard<std::mutex> lock(mutex);
  std::unique_ptr<RingKernels>& slot = (*loaded)[device];
  if (!slot) slot.reset(new RingKernels(device));
  return *slot;
}

RingKernels::RingKernels(int device) : device_(device) {
  const DeviceInfo& info = device_info(device);  // throws without a driver or device
  sm_count_ = std::max(1, info.sm_count);
  const CacheLookup r = compile_kernel(ring_kernel_source(), kRingModuleIr, info.arch);
  log_info("flexjit: ring attention kernels for {}: {} in {:.3f} s", info.arch, cache_source_name(r.source), r.seconds);
  ScopedDevice scope(device);
  check_cu(library_.load(r.artefact->binary), "loading the ring attention kernels");
  copy_ = library_.function(kRingCopyEntry);
  merge_ = library_.function(kRingMergeEntry);
}

void RingKernels::copy(const Tensor& src, const Tensor& dst, RingCopy mode, CUstream stream) const {
  check_ring_copy(src, dst, mode);
  FlexRingCopyParams p{};
  RingView4 s4, d4;
  p.src = view_of(src, s4);
  p.dst = view_of(dst, d4);
  for (int i = 0; i < 4; ++i) p.shape[i] = s4.shape[i];
  const int64_t rows = p.shape[0] * p.shape[1] * p.shape[2];
  if (rows * p.shape[3] == 0) return;
  p.mode = mode == RingCopy::Add ? kFlexRingAdd : src.dtype == dst.dtype ? kFlexRingRaw : kFlexRingAssign;
  p.elem_bytes = dsl::dtype_size(src.dtype);
  // flex_ring_copy: a warp per row for rows of 32 or more elements, else a thread per element.
  const unsigned grid = p.shape[3] >= 32 ? grid_for(rows, kThreads / 32, sm_count_) : grid_for(rows * p.shape[3], kThreads, sm_count_);
  ScopedDevice scope(device_);
  void* args[] = {&p};
  check_cu(cuda_driver()->cuLaunchKernel(copy_, grid, 1, 1, kThreads, 1, 1, 0, stream, args, nullptr), "launching a ring attention copy");
}

void RingKernels::merge(const Tensor& o_part, const Tensor& lse_part, const Tensor& o_acc, const Tensor& lse_acc, CUstream stream) const {
  if (o_part.shape != o_acc.shape || o_part.shape.size() != 4 || lse_part.shape != lse_acc.shape || lse_part.shape.size() != 3 ||
      o_acc.dtype != DType::F32 || lse_part.dtype != DType::F32 || lse_acc.dtype != DType::F32)
    throw Error("ring attention: internal error, a merge of mismatched partial and running outputs");
  FlexRingMergeParams p{};
  RingView4 four;
  p.o_part = view_of(o_part, four);
  p.o_acc = view_of(o_acc, four);
  // The [B, H, rows] LSE views as the first three dims, like the outputs'.
  auto lse_view = [&](const Tensor& t) {
    const std::vector<int64_t> s = t.effective_strides();
    FlexRingView v{};
    v.data = t.data;
    v.stride[0] = s[0], v.stride[1] = s[1], v.stride[2] = s[2];
    v.dtype = kFlexRingF32;
    return v;
  };
  p.lse_part = lse_view(lse_part);
  p.lse_acc = lse_view(lse_acc);
  p.batch = o_part.shape[0];
  p.heads = o_part.shape[1];
  p.rows = o_part.shape[2];
  p.dv = static_cast<int>(o_part.shape[3]);
  const int64_t rows = p.batch * p.heads * p.rows;
  if (rows == 0) return;
  ScopedDevice scope(device_);
  void* args[] = {&p};
  check_cu(cuda_driver()->cuLaunchKernel(merge_, grid_for(rows, kThreads / 32, sm_count_), 1, 1, kThreads, 1, 1, 0, stream, args, nullptr),
           "launching the ring attention merge");
}

}  // namespace flexjit::runtime
