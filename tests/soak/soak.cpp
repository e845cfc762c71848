// flexjit_soak: the runtime under a server's load on the GPU machine, through the public API.
//   1. Eight host threads (two devices when there are two) launch different gallery specs on
//      their own streams for --seconds, forward and backward, re-creating their kernels every
//      few launches while another thread clears the in-memory and disk kernel caches and
//      compiles new specialisations: kernels load, unload and recompile under way. Every
//      launch of the small shape is checked against the float64 reference.
//   2. A serving loop: --decode-steps decode steps of a paged KV cache, each a CUDA graph
//      replay after the sequence lengths change on the stream; spot-checked against the reference.
// Device memory (cuMemGetInfo) and host memory (RSS) are sampled throughout; the run fails on
// any error, a spot check out of tolerance, device memory more than 1 MiB away from its level
// after warm-up, or host memory more than 5% above it. Prints a summary table last.
//
//   flexjit_soak [--seconds 120] [--threads 8] [--decode-steps 1000000] [--log FILE]
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <fstream>
#include <mutex>
#include <random>
#include <thread>

#include "compiler/frontend.h"
#include "runtime/cuda_driver.h"
#include "runtime/device.h"
#include "runtime/device_memory.h"
#include "runtime/disk_cache.h"
#include "runtime/flexjit.hpp"
#include "runtime/kernel_cache.h"
#include "runtime/npy.h"
#include "support/attention_reference.h"
#include "support/spec_loading.h"
#include "unit/cpu/gallery_inputs.h"

using namespace flexjit;
using Clock = std::chrono::steady_clock;

namespace {

const runtime::CudaDriver& drv() { return *runtime::cuda_driver(); }

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

int64_t rss_bytes() {
  std::ifstream f("/proc/self/statm");
  int64_t pages = 0, resident = 0;
  f >> pages >> resident;
  return resident * ::sysconf(_SC_PAGESIZE);
}

int64_t device_used_bytes(int device) {
  runtime::ScopedDevice scope(device);
  size_t free = 0, total = 0;
  runtime::check_cu(drv().cuMemGetInfo_v2(&free, &total), "cuMemGetInfo");
  return static_cast<int64_t>(total - free);
}

// Everything that goes wrong, with the first few messages, from every thread.
class Errors {
 public:
  void add(const std::string& what) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (messages_.size() < 10) messages_.push_back(what);
    ++count_;
  }
  int count() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return count_;
  }
  std::vector<std::string> messages() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return messages_;
  }

 private:
  mutable std::mutex mutex_;
  std::vector<std::string> messages_;
  int count_ = 0;
};

// Memory levels: a baseline after warm-up, then every sample.
struct MemoryTrack {
  std::vector<int> devices;
  std::vector<int64_t> device_base, device_min, device_max, device_end;
  int64_t host_base = 0, host_max = 0, host_end = 0;
  std::mutex mutex;

  void baseline() {
    std::lock_guard<std::mutex> lock(mutex);
    device_base.clear();
    for (int d : devices) device_base.push_back(device_used_bytes(d));
    device_min = device_max = device_base;
    host_base = host_max = rss_bytes();
  }
  void sample() {
    std::lock_guard<std::mutex> lock(mutex);
    for (size_t i = 0; i < devices.size(); ++i) {
      const int64_t u = device_used_bytes(devices[i]);
      device_min[i] = std::min(device_min[i], u);
      device_max[i] = std::max(device_max[i], u);
    }
    host_max = std::max(host_max, rss_bytes());
  }
  void end() {
    sample();
    device_end.clear();
    for (int d : devices) device_end.push_back(device_used_bytes(d));
    host_end = rss_bytes();
  }
  // Within 1 MiB on every device and 5% on the host at the end of the phase.
  bool flat() const {
    for (size_t i = 0; i < devices.size(); ++i)
      if (std::abs(device_end[i] - device_base[i]) > (int64_t{1} << 20)) return false;
    return host_end <= host_base + host_base / 20;
  }
  std::string describe() const {
    std::string s;
    for (size_t i = 0; i < devices.size(); ++i)
      s += fmt::format("device {}: after warm-up {:.1f} MiB, range {:+.2f}..{:+.2f} MiB, end {:+.3f} MiB; ", devices[i], device_base[i] / 1048576.0,
                       (device_min[i] - device_base[i]) / 1048576.0, (device_max[i] - device_base[i]) / 1048576.0,
                       (device_end[i] - device_base[i]) / 1048576.0);
    return s + fmt::format("host RSS after warm-up {:.0f} MiB, max {:+.1f}%, end {:+.1f}%", host_base / 1048576.0,
                           100.0 * (host_max - host_base) / double(host_base), 100.0 * (host_end - host_base) / double(host_base));
  }
};

// A [B, H, S, D] bf16 tensor on a device and its values on the host.
struct DeviceTensor {
  runtime::DeviceBuffer mem;
  std::vector<float> host;
  Tensor tensor;
};

DeviceTensor random_tensor(int device, int64_t B, int64_t H, int64_t S, int64_t D, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<uint16_t> bits(static_cast<size_t>(B * H * S * D));
  DeviceTensor t{runtime::DeviceBuffer(device, bits.size() * 2), std::vector<float>(bits.size()), {}};
  for (size_t i = 0; i < bits.size(); ++i) {
    bits[i] = float_to_bf16(nd(rng));
    t.host[i] = bf16_to_float(bits[i]);
  }
  t.mem.upload(bits.data(), bits.size() * 2);
  t.tensor = Tensor{t.mem.data(), dsl::DType::BF16, {B, H, S, D}, {}};
  return t;
}

std::vector<float> download_bf16(const runtime::DeviceBuffer& mem, size_t n) {
  std::vector<uint16_t> bits(n);
  mem.download(bits.data(), n * 2);
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = bf16_to_float(bits[i]);
  return out;
}

// One launch shape of a spec with its inputs on a device; the small one keeps a reference.
struct Problem {
  test::Sizes sz;
  DeviceTensor q, k, v, d_o;
  runtime::DeviceBuffer o, lse, dq, dk, dv;
  std::vector<test::HostBuffer> host_buffers;
  std::vector<runtime::DeviceBuffer> buffers;
  std::vector<std::pair<std::string, double>> params;
  test::RefResult ref;  // only for the checked shape

  Problem(const dsl::Spec& spec, int device, test::Sizes s, bool with_reference, std::mt19937& rng)
      : sz(s),
        q(random_tensor(device, s.B, s.H, s.Sq, s.D, rng)),
        k(random_tensor(device, s.B, s.Hkv, s.Skv, s.D, rng)),
        v(random_tensor(device, s.B, s.Hkv, s.Skv, s.D, rng)),
        d_o(random_tensor(device, s.B, s.H, s.Sq, s.D, rng)),
        o(device, static_cast<size_t>(s.B * s.H * s.Sq * s.D) * 2),
        lse(device, static_cast<size_t>(s.B * s.H * s.Sq) * 4),
        dq(device, static_cast<size_t>(s.B * s.H * s.Sq * s.D) * 2),
        dk(device, static_cast<size_t>(s.B * s.Hkv * s.Skv * s.D) * 2),
        dv(device, static_cast<size_t>(s.B * s.Hkv * s.Skv * s.D) * 2) {
    std::mt19937_64 brng(rng());
    host_buffers = test::make_buffers(spec, sz, brng);
    for (const test::HostBuffer& hb : host_buffers) {
      buffers.emplace_back(device, std::max<size_t>(hb.bytes.size(), 16));
      buffers.back().upload(hb.bytes.data(), hb.bytes.size());
    }
    params = test::gallery_params(spec, sz);
    if (with_reference) {
      SpecIR ir = build_spec_ir(spec);
      EvalEnv env = test::eval_env(ir.checked, sz, host_buffers, params);
      ref = test::reference_attention(ir, {s.B, s.H, s.Hkv, s.Sq, s.Skv, s.D, s.D}, q.host, k.host, v.host, env, 1.0 / std::sqrt(double(s.D)));
    }
  }

  AttentionArgs forward_args(int device, CUstream stream, Workspace* ws) const {
    AttentionArgs a;
    a.q = q.tensor, a.k = k.tensor, a.v = v.tensor;
    a.o = Tensor{o.data(), dsl::DType::BF16, {sz.B, sz.H, sz.Sq, sz.D}, {}};
    a.lse = Tensor{lse.data(), dsl::DType::F32, {sz.B, sz.H, sz.Sq}, {}};
    for (size_t i = 0; i < host_buffers.size(); ++i)
      a.buffers.emplace_back(host_buffers[i].name, Tensor{buffers[i].data(), host_buffers[i].dtype, host_buffers[i].shape, {}});
    a.params = params;
    a.stream = stream;
    a.workspace = ws;
    a.device = Device::cuda(device);
    return a;
  }

  BackwardArgs backward_args(const AttentionArgs& f, Workspace* ws) const {
    BackwardArgs b;
    b.q = f.q, b.k = f.k, b.v = f.v, b.o = f.o, b.lse = f.lse;
    b.d_o = d_o.tensor;
    b.dq = Tensor{dq.data(), dsl::DType::BF16, {sz.B, sz.H, sz.Sq, sz.D}, {}};
    b.dk = Tensor{dk.data(), dsl::DType::BF16, {sz.B, sz.Hkv, sz.Skv, sz.D}, {}};
    b.dv = Tensor{dv.data(), dsl::DType::BF16, {sz.B, sz.Hkv, sz.Skv, sz.D}, {}};
    b.buffers = f.buffers, b.params = f.params, b.stream = f.stream, b.device = f.device;
    b.workspace = ws;
    return b;
  }

  // O against the reference: rel_l2 (returned) and every fully masked row exactly zero.
  test::Comparison check() const { return test::compare(download_bf16(o, static_cast<size_t>(sz.B * sz.H * sz.Sq * sz.D)), ref.o); }
};

struct PhaseStats {
  std::atomic<int64_t> launches{0}, backward{0}, checks{0}, recreated{0}, clears{0}, recompiles{0};
  std::mutex mutex;
  double worst_rel_l2 = 0;
  void check_result(double r) {
    std::lock_guard<std::mutex> lock(mutex);
    worst_rel_l2 = std::max(worst_rel_l2, r);
  }
};

constexpr double kForwardTolerance = 1.5e-2;  // bf16 output against float64 (tests/gpu use the same)

// One worker of phase 1: its spec, device and stream, until `stop`.
// After `stop` it parks, still holding its kernel and memory, until `release`, so the phase's
// last memory sample sees the state its first one did. The baseline is taken the same way: the
// workers hold still (`pause`) between launches, each with its kernel and workspace. Sampled
// while they run, a worker recompiling after a cache clear has freed its workspace (about
// 100 MiB), so the baseline could miss one and the end look like a leak.
struct Phase {
  std::atomic<bool> stop{false}, release{false}, pause{false};
  std::atomic<int> warm{0}, parked{0}, paused{0};
};

void launch_worker(const dsl::Spec& spec, int device, unsigned seed, Phase& phase, PhaseStats& st, Errors& errors) {
  std::atomic<bool>& stop = phase.stop;
  std::atomic<int>& warm = phase.warm;
  bool parked = false;
  auto park = [&] {
    if (parked) return;
    parked = true;
    ++phase.parked;
    while (!phase.release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  };
  try {
    runtime::ScopedDevice scope(device);
    CUstream stream = nullptr;
    runtime::check_cu(drv().cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    std::mt19937 rng(seed);
    const int64_t D = spec.head_dim;
    // A checked shape (an odd length: partial tiles; Sq = Skv, as the document mask's doc[Sq] needs)
    // and two bigger unchecked ones.
    std::vector<Problem> problems;
    problems.emplace_back(spec, device, test::Sizes{1, 4, 2, 333, 333, D}, true, rng);
    problems.emplace_back(spec, device, test::Sizes{2, 8, 4, 1024, 1024, D}, false, rng);
    problems.emplace_back(spec, device, test::Sizes{1, 16, 16, 2048, 2048, D}, false, rng);
    Runtime rt;
    std::shared_ptr<Kernel> kernel = rt.compile(spec);
    std::unique_ptr<Workspace> ws = kernel->make_backward_workspace(device, 2, 16, 2048, 2048);
    bool counted = false;
    for (int64_t i = 0; !stop.load(); ++i) {
      if (phase.pause.load()) {
        runtime::check_cu(drv().cuStreamSynchronize(stream), "cuStreamSynchronize");
        ++phase.paused;
        while (phase.pause.load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
        --phase.paused;
      }
      if (i % 24 == 23) {
        // A new kernel object loads its modules again: from memory, the disk, or NVRTC after a clear.
        runtime::check_cu(drv().cuStreamSynchronize(stream), "cuStreamSynchronize");
        ws.reset();
        kernel = rt.compile(spec);
        ws = kernel->make_backward_workspace(device, 2, 16, 2048, 2048);
        ++st.recreated;
      }
      const Problem& p = problems[static_cast<size_t>(i % problems.size())];
      AttentionArgs a = p.forward_args(device, stream, ws.get());
      kernel->forward(a);
      ++st.launches;
      if (i % 4 == 1) {
        kernel->backward(p.backward_args(a, ws.get()));
        ++st.backward;
      }
      if (&p == &problems[0]) {
        runtime::check_cu(drv().cuStreamSynchronize(stream), "cuStreamSynchronize");
        test::Comparison c = p.check();
        st.check_result(c.rel_l2);
        ++st.checks;
        if (c.bad || !(c.rel_l2 < kForwardTolerance))
          errors.add(fmt::format("{} on device {}: O off the reference (rel_l2 {:.3g}, {} bad)", spec.name, device, c.rel_l2, c.bad));
      }
      if (i % 16 == 15) kernel->check_errors(device, stream, ws.get());
      if (!counted && i >= static_cast<int64_t>(problems.size()) * 2) {
        counted = true;
        ++warm;
      }
    }
    kernel->check_errors(device, stream, ws.get());
    runtime::check_cu(drv().cuStreamSynchronize(stream), "cuStreamSynchronize");
    if (!counted) ++warm;
    park();
    drv().cuStreamDestroy_v2(stream);
  } catch (const std::exception& e) {
    errors.add(fmt::format("{} on device {}: {}", spec.name, device, e.what()));
    ++warm;
    park();
  }
}

// Phase 1. Returns its summary line.
std::string run_launch_phase(int threads, double seconds, const std::vector<int>& devices, Errors& errors, MemoryTrack& mem) {
  std::vector<dsl::Spec> specs;
  for (const char* name : {"causal", "sliding_window", "document", "softcap", "alibi", "prefix_lm", "relative_bias", "sam_relpos"})
    specs.push_back(test::load_spec(test::gallery_dir() / (std::string(name) + ".json")));
  PhaseStats st;
  Phase phase;
  std::vector<std::thread> pool;
  const auto start = Clock::now();
  for (int t = 0; t < threads; ++t)
    pool.emplace_back(launch_worker, std::cref(specs[static_cast<size_t>(t) % specs.size()]), devices[static_cast<size_t>(t) % devices.size()],
                      1000u + static_cast<unsigned>(t), std::ref(phase), std::ref(st), std::ref(errors));
  // Cache clears and new specialisations (a const cap never seen before: a new key, a real NVRTC
  // compile) while the workers launch.
  dsl::Spec variant = specs[3];
  std::mt19937 rng(7);
  auto chaos = [&] {
    try {
      runtime::process_kernel_cache().clear();
      runtime::DiskCache(runtime::DiskCache::default_root()).clear();
      ++st.clears;
      variant.params.clear();
      dsl::Diagnostics d;
      dsl::add_param(variant, fmt::format("const cap: float = {}", 10 + static_cast<int>(rng() % 1000) / 10.0), "soak", d);
      Runtime rt;
      rt.compile(variant)->warm_up(devices[rng() % devices.size()], dsl::DType::BF16);
      ++st.recompiles;
    } catch (const std::exception& e) {
      errors.add(fmt::format("cache clear / recompile: {}", e.what()));
    }
  };
  // Warm-up: every worker launched each shape twice; then one clear and recompile, and as many
  // kernels re-created (recompiled) as there are workers: the cycle the rest of the phase repeats.
  while (phase.warm.load() < threads && seconds_since(start) < seconds) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  chaos();
  const int64_t recreated = st.recreated.load();
  while (st.recreated.load() < recreated + threads && seconds_since(start) < seconds) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const double warm_seconds = seconds_since(start);
  phase.pause = true;  // a worker that failed is parked, and holds still too
  while (phase.paused.load() + phase.parked.load() < threads) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  mem.baseline();
  phase.pause = false;
  auto last_clear = Clock::now();
  while (seconds_since(start) < seconds) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    mem.sample();
    if (seconds_since(last_clear) < 8) continue;
    last_clear = Clock::now();
    chaos();
  }
  phase.stop = true;
  while (phase.parked.load() < threads) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  // The kernel cache may hold the last specialisation's artefact; the workers their kernels.
  mem.end();
  phase.release = true;
  for (auto& t : pool) t.join();
  return fmt::format("launch phase: {} threads on {} device(s), {:.0f} s (warm-up {:.0f} s): {} forward + {} backward launches, {} kernels "
                     "re-created, {} cache clears, {} new specialisations compiled, {} spot checks (worst rel_l2 {:.2e})",
                     threads, devices.size(), seconds_since(start), warm_seconds, st.launches.load(), st.backward.load(), st.recreated.load(),
                     st.clears.load(), st.recompiles.load(), st.checks.load(), st.worst_rel_l2);
}

// Phase 2: decode steps of a paged cache replayed from one CUDA graph while the lengths change.
std::string run_decode_phase(int64_t steps, Errors& errors, MemoryTrack& mem) {
  const int device = 0;
  runtime::ScopedDevice scope(device);
  const int B = 8, H = 32, Hkv = 8, D = 128, P = 16, max_kv = 2048, pages_per_seq = max_kv / P;
  dsl::Spec spec = test::load_spec(test::gallery_dir() / "sliding_window.json");
  spec.head_dim = D;
  std::mt19937 rng(11);
  const int64_t num_pages = int64_t{B} * pages_per_seq;
  DeviceTensor q = random_tensor(device, B, H, 1, D, rng);
  DeviceTensor k = random_tensor(device, num_pages, P, Hkv, D, rng);  // [num_pages, page_size, Hkv, D]
  DeviceTensor v = random_tensor(device, num_pages, P, Hkv, D, rng);
  runtime::DeviceBuffer o(device, size_t(B) * H * D * 2), lse(device, size_t(B) * H * 4), table(device, size_t(num_pages) * 4), lens(device, size_t(B) * 4);
  std::vector<int32_t> host_table(static_cast<size_t>(num_pages));
  for (int64_t i = 0; i < num_pages; ++i) host_table[static_cast<size_t>(i)] = static_cast<int32_t>(i);  // sequence b owns pages [b * 128, (b + 1) * 128)
  table.upload(host_table.data(), host_table.size() * 4);
  std::vector<std::pair<std::string, double>> params = {{"window", 700}};
  Runtime rt;
  std::shared_ptr<Kernel> kernel = rt.compile(spec);
  DecodePlanOptions po;
  po.device = Device::cuda(device);
  po.batch = B, po.heads = H, po.kv_heads = Hkv, po.max_seqlen_q = 1, po.max_seqlen_kv = max_kv, po.page_size = P;
  std::unique_ptr<DecodePlan> plan = kernel->plan_decode(po);
  CUstream stream = nullptr;
  runtime::check_cu(drv().cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  DecodeArgs a;
  a.q = q.tensor;
  a.k = k.tensor;
  a.v = v.tensor;
  a.page_table = Tensor{table.data(), dsl::DType::I32, {B, pages_per_seq}, {}};
  a.kv_lens = Tensor{lens.data(), dsl::DType::I32, {B}, {}};
  a.o = Tensor{o.data(), dsl::DType::BF16, {B, H, 1, D}, {}};
  a.lse = Tensor{lse.data(), dsl::DType::F32, {B, H, 1}, {}};
  a.params = params;
  a.stream = stream;
  // Lengths of a serving batch: each sequence grows by one token a step and restarts when full.
  std::vector<int32_t> host_lens(B);
  auto lengths_at = [&](int64_t step) {
    for (int b = 0; b < B; ++b) host_lens[static_cast<size_t>(b)] = static_cast<int32_t>(1 + (step + int64_t{b} * 251) % max_kv);
  };
  lengths_at(0);
  lens.upload(host_lens.data(), host_lens.size() * 4);
  kernel->decode(*plan, a);  // warm: compiles and loads outside the capture
  runtime::check_cu(drv().cuStreamSynchronize(stream), "sync");
  runtime::check_cu(drv().cuStreamBeginCapture_v2(stream, CU_STREAM_CAPTURE_MODE_GLOBAL), "cuStreamBeginCapture");
  kernel->decode(*plan, a);
  CUgraph graph = nullptr;
  runtime::check_cu(drv().cuStreamEndCapture(stream, &graph), "cuStreamEndCapture");
  CUgraphExec exec = nullptr;
  runtime::check_cu(drv().cuGraphInstantiateWithFlags(&exec, graph, 0), "cuGraphInstantiate");
  SpecIR ir = build_spec_ir(spec);
  EvalEnv env;
  env.symbols.assign(ir.checked.symbols.size(), 1);
  env.params = {Value::of_int(700)};
  // The reference of one step: sequence b's query at position len - 1 over its first len positions.
  auto check_step = [&](int64_t step) {
    std::vector<float> got = download_bf16(o, size_t(B) * H * D);
    double worst = 0;
    for (int b = 0; b < B; ++b) {
      const int64_t L = host_lens[static_cast<size_t>(b)];
      std::vector<float> kb(static_cast<size_t>(Hkv * L * D)), vb(kb.size());
      for (int64_t pos = 0; pos < L; ++pos)
        for (int h = 0; h < Hkv; ++h)
          for (int d = 0; d < D; ++d) {
            const size_t src = static_cast<size_t>((((int64_t{b} * pages_per_seq + pos / P) * P + pos % P) * Hkv + h) * D + d);
            kb[static_cast<size_t>((h * L + pos) * D + d)] = k.host[src];
            vb[static_cast<size_t>((h * L + pos) * D + d)] = v.host[src];
          }
      std::vector<float> qb(q.host.begin() + int64_t{b} * H * D, q.host.begin() + int64_t{b + 1} * H * D);
      env.symbols[static_cast<size_t>(ir.checked.symbol_index("Sq"))] = 1;
      env.symbols[static_cast<size_t>(ir.checked.symbol_index("Skv"))] = max_kv;
      test::RefResult ref = test::reference_attention(ir, {1, H, Hkv, 1, L, D, D}, qb, kb, vb, env, 1.0 / std::sqrt(double(D)), L - 1);
      std::vector<float> gb(got.begin() + int64_t{b} * H * D, got.begin() + int64_t{b + 1} * H * D);
      test::Comparison c = test::compare(gb, ref.o);
      worst = std::max(worst, c.rel_l2);
      if (c.bad || !(c.rel_l2 < kForwardTolerance))
        errors.add(fmt::format("decode step {} sequence {} (length {}): O off the reference (rel_l2 {:.3g}, {} bad)", step, b, L, c.rel_l2, c.bad));
    }
    return worst;
  };
  const auto start = Clock::now();
  double worst = 0;
  int checks = 0;
  const int64_t warm_steps = std::min<int64_t>(1000, steps);
  for (int64_t step = 1; step <= steps; ++step) {
    lengths_at(step);
    runtime::check_cu(drv().cuMemcpyHtoDAsync_v2(reinterpret_cast<CUdeviceptr>(lens.data()), host_lens.data(), host_lens.size() * 4, stream),
                      "cuMemcpyHtoDAsync");
    runtime::check_cu(drv().cuGraphLaunch(exec, stream), "cuGraphLaunch");
    if (step == warm_steps) {
      runtime::check_cu(drv().cuStreamSynchronize(stream), "sync");
      mem.baseline();
    }
    if (step % 50000 == 0 || step == steps) {
      runtime::check_cu(drv().cuStreamSynchronize(stream), "sync");
      worst = std::max(worst, check_step(step));
      ++checks;
      kernel->check_errors(device, stream);
      mem.sample();
    }
  }
  runtime::check_cu(drv().cuStreamSynchronize(stream), "sync");
  const double secs = seconds_since(start);
  mem.end();
  drv().cuGraphExecDestroy(exec);
  drv().cuGraphDestroy(graph);
  drv().cuStreamDestroy_v2(stream);
  return fmt::format("decode phase: {} steps of B{} H{} Hkv{} D{} over a paged cache (lengths 1..{}), one CUDA graph, {:.1f} s ({:.1f} us a step), "
                     "{} spot checks (worst rel_l2 {:.2e})",
                     steps, B, H, Hkv, D, max_kv, secs, 1e6 * secs / double(std::max<int64_t>(steps, 1)), checks, worst);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"flexjit runtime soak on the GPU: concurrent launches with recompiles, and a CUDA-graph decode loop"};
  double seconds = 120;
  int threads = 8;
  int64_t decode_steps = 1000000;
  std::string log_path;
  app.add_option("--seconds", seconds, "Length of the launch phase")->capture_default_str();
  app.add_option("--threads", threads, "Host threads of the launch phase")->capture_default_str();
  app.add_option("--decode-steps", decode_steps, "Decode steps of the serving loop (0: skip it)")->capture_default_str();
  app.add_option("--log", log_path, "Also append the summary to this file");
  CLI11_PARSE(app, argc, argv);
  if (!runtime::cuda_driver()) {
    fmt::print("flexjit_soak: no CUDA device ({}); nothing to do\n", runtime::cuda_driver_unavailable_reason());
    return 2;
  }
  std::vector<int> devices = {0};
  if (runtime::device_count() >= 2) devices.push_back(1);
  Errors errors;
  std::vector<std::string> lines;
  bool flat = true;
  {
    MemoryTrack mem;
    mem.devices = devices;
    lines.push_back(run_launch_phase(threads, seconds, devices, errors, mem));
    lines.push_back("  memory: " + mem.describe());
    flat = flat && mem.flat();
  }
  if (decode_steps > 0) {
    MemoryTrack mem;
    mem.devices = {0};
    try {
      lines.push_back(run_decode_phase(decode_steps, errors, mem));
      lines.push_back("  memory: " + mem.describe());
      flat = flat && mem.flat();
    } catch (const std::exception& e) {
      errors.add(fmt::format("decode phase: {}", e.what()));
    }
  }
  const bool pass = errors.count() == 0 && flat;
  lines.push_back(fmt::format("errors: {}{}", errors.count(), errors.count() ? " (first: " + errors.messages().front() + ")" : ""));
  for (const std::string& m : errors.messages()) lines.push_back("  error: " + m);
  lines.push_back(fmt::format("soak: {} (memory {})", pass ? "PASS" : "FAIL", flat ? "flat" : "NOT flat: over 1 MiB on a device or 5% on the host"));
  for (const std::string& l : lines) fmt::print("{}\n", l);
  if (!log_path.empty()) {
    std::ofstream f(log_path, std::ios::app);
    for (const std::string& l : lines) f << l << "\n";
  }
  return pass ? 0 : 1;
}
