// `flexjit bench SPEC --shape B,H,Hkv,Sq,Skv,D`: times the forward kernel on random inputs
// with CUDA events (median; tools/launch_timer.h says how), and reports TFLOP/s over the unmasked pairs, the host-side
// launch overhead and the compile / cache latencies. --decode and --varlen time those launches instead; --ring R
// times ring attention over R virtual ranks of the one GPU against the unsharded launch.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <random>

#include "compiler/bindings.h"
#include "dsl/error.h"
#include "compiler/frontend.h"
#include "compiler/interpreter.h"
#include "runtime/cuda_driver.h"
#include "runtime/device.h"
#include "runtime/flexjit.hpp"
#include "runtime/ring.h"
#include "tools/commands.h"
#include "tools/launch_timer.h"
#include "tools/ring_run.h"
#include "tools/spec_options.h"
#include "tools/tensor_io.h"

namespace flexjit::tools {

namespace {

struct BenchOptions {
  SpecOptions spec;
  std::string shape, device = "cuda:0";
  std::vector<std::string> loads, sets;
  int warmup = 10, iters = 50;
  float scale = 0;  // 0: 1 / sqrt(D)
  bool json = false;
  bool mask_per_launch = false;
  // --decode: time Kernel::decode (shape's Sq = query rows per sequence, Skv = every sequence's KV length).
  bool decode = false;
  int page_size = 0;        // 0: contiguous cache
  int splits = 0;           // 0: the plan's heuristic
  std::string kv_dtype;     // --decode / --varlen: K and V's element type (empty: the spec's dtype)
  // --varlen: time Kernel::forward_varlen over B packed sequences of Sq query and Skv KV rows each.
  bool varlen = false;
  bool queries_at_kv_end = false;  // --varlen: each sequence's queries are its last KV positions (chunked prefill)
  bool no_flush = false;    // keep L2 warm between timed launches (default: flush 256 MB first, like triton's do_bench)
  // --ring R: ring attention over R virtual ranks of the one device against the unsharded launch.
  int ring = 0;
  std::string ring_sharding = "zigzag";
  bool backward = false;    // --ring: forward+backward too; --varlen: the ragged backward too
};

// The fraction of (q, kv) pairs the mask keeps, from a strided sample evaluated with the
// interpreter (exact for masks that are periodic in the stride; close otherwise). Query row i sits at position
// q_offset + i.
double mask_density(const SpecIR& ir, const BoundValues& values, const std::vector<NpyArray>& buffers, int64_t sq, int64_t skv,
                    int64_t q_offset = 0) {
  if (!ir.mask_mod) return 1.0;
  EvalEnv env;
  env.symbols = values.symbols;
  env.params = values.params;
  for (const NpyArray& b : buffers) env.buffers.push_back(BufferView{b.dtype, b.data.data(), b.shape, contiguous_strides(b.shape)});
  int64_t qs = std::max<int64_t>(1, sq / 384), ks = std::max<int64_t>(1, skv / 384);
  int64_t kept = 0, total = 0;
  for (int64_t q = 0; q < sq; q += qs)
    for (int64_t kv = 0; kv < skv; kv += ks) {
      env.vars[int(dsl::VarId::Q)] = q_offset + q;
      env.vars[int(dsl::VarId::KV)] = kv;
      kept += evaluate(ir.mask_mod, env).b;
      ++total;
    }
  return total ? double(kept) / double(total) : 1.0;
}

// K / V element type of --kv-dtype (the spec's when empty).
dsl::DType kv_dtype_of(const BenchOptions& o, dsl::DType spec_dtype) {
  if (o.kv_dtype.empty()) return spec_dtype;
  std::optional<dsl::DType> t = dsl::parse_kv_cache_dtype(o.kv_dtype);
  if (!t) throw Error(fmt::format("--kv-dtype `{}` is not a KV cache type; use bf16, f16, fp8 (e4m3) or e5m2", o.kv_dtype));
  return *t;
}

// Decode timing: one plan, random q and KV cache (paged through a shuffled page table when --page-size > 0),
// every sequence at length Skv.
int run_bench_decode(const BenchOptions& o, dsl::Spec spec, const std::vector<int64_t>& s) {
  const int64_t B = s[0], H = s[1], Hkv = s[2], Sq = s[3], Skv = s[4], D = s[5];
  BenchDevice bench(o.device, "bench");
  const Device device = bench.device();
  const runtime::CudaDriver* drv = &bench.driver();
  Runtime rt;
  auto kernel = rt.compile(spec);
  std::mt19937 rng(1234);
  auto add = [&](NpyArray a) { return bench.add(std::move(a)); };
  DecodeArgs args;
  args.scale = o.scale;
  args.q = add(random_array(spec.dtype, {B, H, Sq, D}, rng, 0, 1));
  const dsl::DType kv = kv_dtype_of(o, spec.dtype);
  const bool fp8 = dsl::dtype_size(kv) == 1;
  if (fp8) {
    // Normal values quantised as they are, and per-KV-head scales of 1 (the scales' loads are timed too).
    args.k_scale = add(unit_scales(Hkv));
    args.v_scale = add(unit_scales(Hkv));
  }
  const int ps = o.page_size;
  if (ps == 0) {
    args.k = add(random_array(kv, {B, Hkv, Skv, D}, rng, 0, 1));
    args.v = add(random_array(kv, {B, Hkv, Skv, D}, rng, 0, 1));
  } else {
    const int64_t per_seq = (Skv + ps - 1) / ps, pages = B * per_seq;
    args.k = add(random_array(kv, {pages, ps, Hkv, D}, rng, 0, 1));
    args.v = add(random_array(kv, {pages, ps, Hkv, D}, rng, 0, 1));
    NpyArray table;
    table.dtype = dsl::DType::I32;
    table.shape = {B, per_seq};
    table.data.resize(size_t(pages) * 4);
    std::vector<int32_t> perm(static_cast<size_t>(pages));
    for (int64_t i = 0; i < pages; ++i) perm[size_t(i)] = static_cast<int32_t>(i);
    std::shuffle(perm.begin(), perm.end(), rng);
    std::copy(perm.begin(), perm.end(), table.as<int32_t>());
    args.page_table = add(table);
  }
  NpyArray lens;
  lens.dtype = dsl::DType::I32;
  lens.shape = {B};
  lens.data.resize(size_t(B) * 4);
  for (int64_t b = 0; b < B; ++b) lens.as<int32_t>()[b] = static_cast<int32_t>(Skv);
  args.kv_lens = add(lens);
  args.o = bench.empty(spec.dtype, {B, H, Sq, D});
  args.lse = bench.empty(dsl::DType::F32, {B, H, Sq});
  std::map<std::string, std::string> loads;
  for (const std::string& l : o.loads) {
    size_t eq = l.find('=');
    if (eq == std::string::npos) throw Error("--load expects NAME=FILE.npy");
    loads[l.substr(0, eq)] = l.substr(eq + 1);
  }
  for (const dsl::BufferDecl& b : spec.buffers) {
    if (!loads.count(b.name)) throw Error(fmt::format("bench --decode needs buffer `{}` given with --load", b.name));
    args.buffers.emplace_back(b.name, add(read_npy(loads[b.name])));
  }
  for (const std::string& st : o.sets) {
    const ParamSetting set = parse_param_setting(spec, st);
    args.params.emplace_back(set.param->name, set.value);
  }
  DecodePlanOptions po;
  po.device = device;
  po.batch = static_cast<int>(B);
  po.heads = static_cast<int>(H);
  po.kv_heads = static_cast<int>(Hkv);
  po.max_seqlen_q = static_cast<int>(Sq);
  po.max_seqlen_kv = static_cast<int>(Skv);
  po.page_size = ps;
  po.num_splits = o.splits;
  if (kv != spec.dtype) po.kv_dtype = kv;
  auto t0 = std::chrono::steady_clock::now();
  auto plan = kernel->plan_decode(po);
  kernel->decode(*plan, args);
  runtime::check_cu(drv->cuCtxSynchronize(), "synchronise");
  double first_call_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  kernel->check_errors(device.index, nullptr);
  std::vector<double> ms = time_launches({o.warmup, o.iters, !o.no_flush}, [&] { kernel->decode(*plan, args); });
  const double host = host_launch_us([&] { kernel->decode(*plan, args); });
  runtime::check_cu(drv->cuCtxSynchronize(), "synchronise");
  kernel->check_errors(device.index, nullptr);
  const double med = median_ms(ms);
  const double gbs = 2.0 * dsl::dtype_size(kv) * B * Hkv * Skv * D / (med * 1e-3) / 1e9;  // K and V once
  const runtime::DeviceInfo& info = runtime::device_info(device.index);
  if (o.json) {
    fmt::print("{{\"spec\": \"{}\", \"mode\": \"decode\", \"gpu\": \"{}\", \"B\": {}, \"H\": {}, \"Hkv\": {}, \"Sq\": {}, \"Skv\": {}, "
               "\"D\": {}, \"kv_dtype\": \"{}\", \"page_size\": {}, \"splits\": {}, \"ms\": {:.4f}, \"kv_gbs\": {:.1f}, \"launch_us\": {:.2f}, \"first_call_s\": {:.3f}}}\n",
               spec.name, info.name, B, H, Hkv, Sq, Skv, D, dsl::dtype_name(kv), ps, plan->num_splits(), med, gbs, host, first_call_s);
  } else {
    fmt::print("{} decode on {}: B{} H{} Hkv{} Sq{} Skv{} D{} {} cache, page size {} splits {}: {:.4f} ms, KV {:.1f} GB/s; host launch {:.2f} us; "
               "first call {:.3f} s\n",
               spec.name, info.name, B, H, Hkv, Sq, Skv, D, dsl::dtype_name(kv), ps, plan->num_splits(), med, gbs, host, first_call_s);
  }
  return 0;
}

// Ragged-prefill timing: B sequences of Sq query rows and Skv KV rows packed without padding, random contents; an
// FP8 K / V with per-KV-head scales of 1 (their widening pass is timed with the launch). Specs without buffers.
int run_bench_varlen(const BenchOptions& o, const dsl::Spec& spec, const std::vector<int64_t>& s) {
  const int64_t B = s[0], H = s[1], Hkv = s[2], Sq = s[3], Skv = s[4], D = s[5], Dv = spec.value_head_dim();
  if (!spec.buffers.empty()) throw Error("bench --varlen times specs without buffers");
  BenchDevice bench(o.device, "bench");
  const Device device = bench.device();
  const runtime::CudaDriver* drv = &bench.driver();
  Runtime rt;
  auto kernel = rt.compile(spec);
  std::mt19937 rng(1234);
  auto add = [&](NpyArray a) { return bench.add(std::move(a)); };
  auto offsets = [&](int64_t len) {
    NpyArray a;
    a.dtype = dsl::DType::I32;
    a.shape = {B + 1};
    a.data.resize(size_t(B + 1) * 4);
    for (int64_t b = 0; b <= B; ++b) a.as<int32_t>()[b] = static_cast<int32_t>(b * len);
    return add(a);
  };
  const dsl::DType kv = kv_dtype_of(o, spec.dtype);
  VarlenArgs args;
  args.device = device;
  args.scale = o.scale;
  args.q = add(random_array(spec.dtype, {B * Sq, H, D}, rng, 0, 1));
  args.k = add(random_array(kv, {B * Skv, Hkv, D}, rng, 0, 1));
  args.v = add(random_array(kv, {B * Skv, Hkv, Dv}, rng, 0, 1));
  if (dsl::dtype_size(kv) == 1) {
    args.k_scale = add(unit_scales(Hkv));
    args.v_scale = add(unit_scales(Hkv));
  }
  args.o = bench.empty(spec.dtype, {B * Sq, H, Dv});
  args.cu_seqlens_q = offsets(Sq);
  args.cu_seqlens_kv = offsets(Skv);
  args.max_seqlen_q = static_cast<int>(Sq);
  args.max_seqlen_kv = static_cast<int>(Skv);
  args.queries_at_kv_end = o.queries_at_kv_end;
  if (o.backward) {
    if (o.queries_at_kv_end || dsl::dtype_size(kv) == 1)
      throw Error("bench --varlen --backward times the backward of a ragged prefill in the spec's dtype, without --queries-at-kv-end");
    args.lse = bench.empty(dsl::DType::F32, {H, B * Sq});
  }
  std::map<std::string, std::string> values = {{"B", std::to_string(B)}, {"H", std::to_string(H)}, {"Hkv", std::to_string(Hkv)},
                                               {"Sq", std::to_string(Sq)}, {"Skv", std::to_string(Skv)}, {"D", std::to_string(D)}};
  for (const std::string& st : o.sets) {
    const ParamSetting set = parse_param_setting(spec, st);
    args.params.emplace_back(set.param->name, set.value);
    values[set.param->name] = set.text;
  }
  SpecIR ir = build_spec_ir(spec);
  const double density = mask_density(ir, bind_values(ir.checked, values, {}, true), {}, Sq, Skv, o.queries_at_kv_end ? Skv - Sq : 0);
  auto t0 = std::chrono::steady_clock::now();
  kernel->forward_varlen(args);
  runtime::check_cu(drv->cuCtxSynchronize(), "synchronise");
  const double first_call_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  kernel->check_errors(device.index, nullptr);
  std::vector<double> ms = time_launches({o.warmup, o.iters, !o.no_flush}, [&] { kernel->forward_varlen(args); });
  const double host = host_launch_us([&] { kernel->forward_varlen(args); });
  runtime::check_cu(drv->cuCtxSynchronize(), "synchronise");
  kernel->check_errors(device.index, nullptr);
  const double med = median_ms(ms);
  const double flops = 4.0 * B * H * Sq * Skv * D * density;
  const double tflops = flops / (med * 1e-3) / 1e12;
  // --backward: Kernel::backward_varlen of that forward (a backward counts 2.5 forwards, FlashAttention's convention).
  double bwd_ms = 0;
  if (o.backward) {
    VarlenBackwardArgs b;
    b.device = device;
    b.scale = o.scale;
    b.q = args.q, b.k = args.k, b.v = args.v, b.o = args.o, b.lse = args.lse;
    b.d_o = add(random_array(spec.dtype, {B * Sq, H, Dv}, rng, 0, 1));
    b.dq = bench.empty(spec.dtype, {B * Sq, H, D});
    b.dk = bench.empty(spec.dtype, {B * Skv, Hkv, D});
    b.dv = bench.empty(spec.dtype, {B * Skv, Hkv, Dv});
    b.cu_seqlens_q = args.cu_seqlens_q, b.cu_seqlens_kv = args.cu_seqlens_kv;
    b.max_seqlen_q = args.max_seqlen_q, b.max_seqlen_kv = args.max_seqlen_kv;
    b.params = args.params;
    kernel->backward_varlen(b);
    runtime::check_cu(drv->cuCtxSynchronize(), "synchronise");
    kernel->check_errors(device.index, nullptr);
    bwd_ms = median_ms(time_launches({o.warmup, o.iters, !o.no_flush}, [&] { kernel->backward_varlen(b); }));
    kernel->check_errors(device.index, nullptr);
  }
  const double bwd_tflops = o.backward ? 2.5 * flops / (bwd_ms * 1e-3) / 1e12 : 0;
  const runtime::DeviceInfo& info = runtime::device_info(device.index);
  if (o.json) {
    fmt::print("{{\"spec\": \"{}\", \"mode\": \"varlen\", \"gpu\": \"{}\", \"B\": {}, \"H\": {}, \"Hkv\": {}, \"Sq\": {}, \"Skv\": {}, "
               "\"D\": {}, \"kv_dtype\": \"{}\", \"density\": {:.4f}, \"ms\": {:.4f}, \"tflops\": {:.1f}, \"launch_us\": {:.2f}, "
               "\"first_call_s\": {:.3f}{}}}\n",
               spec.name, info.name, B, H, Hkv, Sq, Skv, D, dsl::dtype_name(kv), density, med, tflops, host, first_call_s,
               o.backward ? fmt::format(", \"bwd_ms\": {:.4f}, \"bwd_tflops\": {:.1f}", bwd_ms, bwd_tflops) : std::string());
  } else {
    fmt::print("{} ragged prefill on {}: {} sequences of {} x {}, H{} Hkv{} D{}, {} K / V, density {:.3f}: {:.4f} ms, {:.1f} TFLOP/s; host "
               "launch {:.2f} us; first call {:.3f} s\n",
               spec.name, info.name, B, Sq, Skv, H, Hkv, D, dsl::dtype_name(kv), density, med, tflops, host, first_call_s);
    if (o.backward) fmt::print("  backward: {:.4f} ms, {:.1f} TFLOP/s\n", bwd_ms, bwd_tflops);
  }
  return 0;
}

// Ring attention over R virtual ranks on this one device (RingAttention: one stream per rank, every (query chunk, KV
// chunk) block a launch of its own, the merges and sums in device kernels) against the unsharded launch of the same
// inputs: forward, and forward+backward with --backward. One device runs every rank's blocks, so the ratio is the
// ring's overhead (more, smaller launches; merges; sums), not what R GPUs would gain.
int run_bench_ring(const BenchOptions& o, const dsl::Spec& spec, BenchDevice& bench, const std::shared_ptr<Kernel>& kernel,
                   AttentionArgs whole, const std::vector<int64_t>& s, double density) {
  const int64_t B = s[0], H = s[1], Hkv = s[2], S = s[3], D = s[5], Dv = spec.value_head_dim();
  if (s[3] != s[4]) throw Error(fmt::format("bench --ring shards one sequence: give Sq = Skv (got {} and {})", s[3], s[4]));
  const RingSharding sharding = parse_ring_sharding(o.ring_sharding);
  const Device device = bench.device();
  const runtime::CudaDriver& drv = bench.driver();
  std::mt19937 rng(4321);
  BackwardArgs whole_b;
  whole_b.device = device;
  whole_b.q = whole.q, whole_b.k = whole.k, whole_b.v = whole.v, whole_b.o = whole.o, whole_b.lse = whole.lse;
  whole_b.scale = whole.scale, whole_b.buffers = whole.buffers, whole_b.params = whole.params;
  whole_b.d_o = bench.add(random_array(spec.dtype, {B, H, S, Dv}, rng, 0, 1));
  whole_b.dq = bench.empty(spec.dtype, {B, H, S, D});
  whole_b.dk = bench.empty(spec.dtype, {B, Hkv, S, D});
  whole_b.dv = bench.empty(spec.dtype, {B, Hkv, S, Dv});
  RingArgs args;
  args.scale = whole.scale;
  args.buffers = whole.buffers;
  args.params = whole.params;
  for (const auto& [name, t] : whole.buffers)
    for (const dsl::BufferDecl& b : spec.buffers)
      if (b.name == name && b.requires_grad) {
        whole_b.grads.emplace_back(name, bench.empty(dsl::DType::F32, t.shape));
        args.grads.emplace_back(name, bench.empty(dsl::DType::F32, t.shape));
      }
  for (int r = 0; r < o.ring; ++r) {
    const std::vector<RingChunk> chunks = ring_chunks(S, o.ring, r, sharding);
    const int64_t rows = ring_shard_rows(S, o.ring, r, sharding);
    auto shard = [&](const Tensor& of, int64_t heads, int64_t width) {
      Tensor t = bench.empty(of.dtype, {B, heads, rows, width});
      ring_copy_to_shard(of, t, chunks, device);
      return t;
    };
    RingShard sh;
    sh.q = shard(whole.q, H, D);
    sh.k = shard(whole.k, Hkv, D);
    sh.v = shard(whole.v, Hkv, Dv);
    sh.o = bench.empty(spec.dtype, {B, H, rows, Dv});
    sh.lse = bench.empty(dsl::DType::F32, {B, H, rows});
    sh.d_o = shard(whole_b.d_o, H, Dv);
    sh.dq = bench.empty(spec.dtype, {B, H, rows, D});
    sh.dk = bench.empty(spec.dtype, {B, Hkv, rows, D});
    sh.dv = bench.empty(spec.dtype, {B, Hkv, rows, Dv});
    args.shards.push_back(sh);
  }
  RingAttention ring(kernel, RingOptions{o.ring, sharding, S, device});
  // First calls: the shard modules' compiles, the ring's memory and streams.
  auto t0 = std::chrono::steady_clock::now();
  ring.forward(args);
  if (o.backward) ring.backward(args);
  ring.check_errors();
  runtime::check_cu(drv.cuCtxSynchronize(), "synchronise");
  const double first_call_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  kernel->forward(whole);
  std::unique_ptr<BlockMask> mask;
  if (spec.mask_mod && !o.mask_per_launch) {
    mask = kernel->build_block_mask(whole);
    whole.block_mask = mask.get();
    whole_b.block_mask = mask.get();
  }
  if (o.backward) kernel->backward(whole_b);
  runtime::check_cu(drv.cuCtxSynchronize(), "synchronise");
  kernel->check_errors(device.index, nullptr);

  const LaunchTiming timing{o.warmup, o.iters, !o.no_flush};
  auto time = [&](const std::function<void()>& fn) { return median_ms(time_launches(timing, fn)); };
  const double fwd = time([&] { kernel->forward(whole); });
  const double ring_fwd = time([&] { ring.forward(args); });
  double both = 0, ring_both = 0;
  if (o.backward) {
    both = time([&] {
      kernel->forward(whole);
      kernel->backward(whole_b);
    });
    ring_both = time([&] {
      ring.forward(args);
      ring.backward(args);
    });
  }
  ring.check_errors();
  kernel->check_errors(device.index, nullptr);
  const RingStats blocks = ring.last_stats();
  // FLOPs of the unmasked pairs; a backward counts 2.5 forwards (FlashAttention's convention).
  const double flops = 4.0 * B * H * S * S * D * density;
  auto tflops = [](double f, double ms) { return ms > 0 ? f / (ms * 1e-3) / 1e12 : 0.0; };
  const runtime::DeviceInfo& info = runtime::device_info(device.index);
  if (o.json) {
    fmt::print("{{\"spec\": \"{}\", \"mode\": \"ring\", \"gpu\": \"{}\", \"ranks\": {}, \"sharding\": \"{}\", \"B\": {}, \"H\": {}, "
               "\"Hkv\": {}, \"S\": {}, \"D\": {}, \"density\": {:.4f}, \"blocks_launched\": {}, \"blocks_skipped\": {}, "
               "\"fwd_ms\": {:.4f}, \"ring_fwd_ms\": {:.4f}, \"fwd_tflops\": {:.1f}, \"ring_fwd_tflops\": {:.1f}",
               spec.name, info.name, o.ring, o.ring_sharding, B, H, Hkv, S, D, density, blocks.launched, blocks.skipped, fwd, ring_fwd,
               tflops(flops, fwd), tflops(flops, ring_fwd));
    if (o.backward)
      fmt::print(", \"fwd_bwd_ms\": {:.4f}, \"ring_fwd_bwd_ms\": {:.4f}, \"fwd_bwd_tflops\": {:.1f}, \"ring_fwd_bwd_tflops\": {:.1f}", both,
                 ring_both, tflops(3.5 * flops, both), tflops(3.5 * flops, ring_both));
    fmt::print(", \"first_call_s\": {:.3f}}}\n", first_call_s);
  } else {
    fmt::print("{} ring of {} virtual ranks ({}) on one {}: B{} H{} Hkv{} S{} D{} density {:.3f}, {} blocks launched, {} skipped\n", spec.name,
               o.ring, o.ring_sharding, info.name, B, H, Hkv, S, D, density, blocks.launched, blocks.skipped);
    fmt::print("  forward:          unsharded {:.4f} ms ({:.1f} TFLOP/s), ring {:.4f} ms ({:.1f} TFLOP/s), {:.2f}x\n", fwd, tflops(flops, fwd),
               ring_fwd, tflops(flops, ring_fwd), ring_fwd / fwd);
    if (o.backward)
      fmt::print("  forward+backward: unsharded {:.4f} ms ({:.1f} TFLOP/s), ring {:.4f} ms ({:.1f} TFLOP/s), {:.2f}x\n", both,
                 tflops(3.5 * flops, both), ring_both, tflops(3.5 * flops, ring_both), ring_both / both);
    fmt::print("  first ring call {:.3f} s; one device runs every rank, so this is the ring's overhead, not multi-GPU scaling\n", first_call_s);
  }
  return 0;
}

int run_bench(const BenchOptions& o) {
  dsl::Spec spec = o.spec.load();
  std::vector<int64_t> s = parse_shape(o.shape, "--shape");
  if (s.size() != 6) throw Error("--shape expects B,H,Hkv,Sq,Skv,D");
  const int64_t B = s[0], H = s[1], Hkv = s[2], Sq = s[3], Skv = s[4], D = s[5];
  spec.head_dim = static_cast<int>(D);
  if (o.ring < 0) throw Error(fmt::format("--ring {}: give the number of virtual ranks (1 or more)", o.ring));
  if (o.ring > 0 && (o.decode || o.varlen)) throw Error("--ring times dense attention; leave out --decode and --varlen");
  if (o.backward && o.ring == 0 && !o.varlen)
    throw Error("--backward goes with --ring or --varlen here; bench-backward times the backward of one launch");
  if (o.decode) return run_bench_decode(o, spec, s);
  if (o.varlen) return run_bench_varlen(o, spec, s);
  BenchDevice bench(o.device, "bench");
  const Device device = bench.device();
  const runtime::CudaDriver* drv = &bench.driver();

  auto t0 = std::chrono::steady_clock::now();
  Runtime rt;
  auto kernel = rt.compile(spec);
  SpecIR ir = build_spec_ir(spec);
  std::mt19937 rng(1234);
  AttentionArgs args;
  args.device = device;
  args.scale = o.scale;
  auto add = [&](NpyArray a) { return bench.add(std::move(a)); };
  args.q = add(random_array(spec.dtype, {B, H, Sq, D}, rng, 0, 1));
  args.k = add(random_array(spec.dtype, {B, Hkv, Skv, D}, rng, 0, 1));
  args.v = add(random_array(spec.dtype, {B, Hkv, Skv, spec.value_head_dim()}, rng, 0, 1));
  args.o = bench.empty(spec.dtype, {B, H, Sq, spec.value_head_dim()});
  args.lse = bench.empty(dsl::DType::F32, {B, H, Sq});
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
    const ParamSetting set = parse_param_setting(spec, st);
    args.params.emplace_back(set.param->name, set.value);
    values[set.param->name] = set.text;
  }
  std::vector<std::optional<std::vector<int64_t>>> shapes;
  for (const NpyArray& a : host_buffers) shapes.push_back(a.shape);
  BoundValues bound = bind_values(ir.checked, values, shapes, true);
  double density = mask_density(ir, bound, host_buffers, Sq, Skv);
  if (o.ring > 0) return run_bench_ring(o, spec, bench, kernel, args, s, density);

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

  std::vector<double> ms = time_launches({o.warmup, o.iters, !o.no_flush}, [&] { kernel->forward(args); });
  const double host = host_launch_us([&] { kernel->forward(args); });
  runtime::check_cu(drv->cuCtxSynchronize(), "synchronise");
  kernel->check_errors(device.index, nullptr);
  const double med = median_ms(ms);
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
  cmd->add_option("--scale", o->scale, "Softmax scale (0: 1/sqrt(D))")->capture_default_str();
  cmd->add_option("--warmup", o->warmup, "Untimed launches first")->capture_default_str();
  cmd->add_option("--iters", o->iters, "Timed launches (the median is reported)")->capture_default_str();
  cmd->add_flag("--json", o->json, "One JSON object per run");
  cmd->add_flag("--mask-per-launch", o->mask_per_launch, "Rebuild the block mask in every timed launch (default: build once, reuse)");
  cmd->add_flag("--decode", o->decode, "Time Kernel::decode: Sq = query rows per sequence (1..16), Skv = every sequence's KV length");
  cmd->add_flag("--varlen", o->varlen, "Time Kernel::forward_varlen: B packed sequences of Sq query and Skv KV rows each");
  cmd->add_flag("--queries-at-kv-end", o->queries_at_kv_end,
                "--varlen: each sequence's queries are its last KV positions (a chunked prefill over a cached prefix)");
  cmd->add_option("--page-size", o->page_size, "--decode: paged KV cache with this page size (0: contiguous)")->capture_default_str();
  cmd->add_option("--splits", o->splits, "--decode: KV splits (0: the plan's heuristic)")->capture_default_str();
  cmd->add_option("--kv-dtype", o->kv_dtype, "--decode / --varlen: the KV cache's type: bf16/f16 (default: the spec's dtype), fp8 (= e4m3) or e5m2 "
                                              "(random values quantised, per-KV-head scales of 1)");
  cmd->add_flag("--no-flush", o->no_flush, "Do not evict L2 before each timed launch");
  cmd->add_option("--ring", o->ring,
                  "Time ring attention over R virtual ranks of this one GPU (one stream per rank; Sq = Skv) against the unsharded "
                  "launch, in ms and effective TFLOP/s. One device runs every rank's blocks, so this measures the ring's overhead, "
                  "not multi-GPU scaling");
  cmd->add_option("--ring-sharding", o->ring_sharding, "With --ring: zigzag (rank r holds chunks r and 2R-1-r of 2R) or contiguous")
      ->capture_default_str();
  cmd->add_flag("--backward", o->backward,
                "With --ring: time forward+backward too (buffers marked grad get gradients); with --varlen: time Kernel::backward_varlen too");
  cmd->callback([o, &action] { action = [o] { return run_bench(*o); }; });
}

}  // namespace flexjit::tools
