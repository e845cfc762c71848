// CPU backend benchmark: causal attention, B1 H8 S2048 D64, fp32, through the public API with
// Device::cpu(), against a naive dense reference written here and against the machine's
// estimated peak. Prints a markdown table (one row per instruction set) for bench/RESULTS.md.
//
// FLOPs = 4 * B * H * S * S * D * density (density 0.5 for causal): only the attended pairs,
// two multiply-adds per pair and head-dim element (S = Q.K^T and O = P.V), so sparse masks are
// compared fairly and every implementation is credited the same work.
//
// Peak = physical cores * clock * FLOPs per cycle per core, where the clock is /proc/cpuinfo's
// "cpu MHz" (nominal, no boost) and a core issues two FMA instructions per cycle at its
// widest vector width (16 floats with AVX-512, 8 with AVX2 + FMA, 4 with SSE, which has no
// FMA: one add and one multiply), except AMD family 0x19 (Zen 4), which runs 512-bit
// instructions at half rate. An assumption, not a measurement: memory, caches and clock
// behaviour are ignored.
//
//   flexjit_cpu_bench [--threads N] [--iters N] [--seq S] [--no-naive] [--block-m M] [--block-n N] [--chunk-n C] [--isa NAME] [--more] [--append FILE]
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <limits>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "runtime/cpu/cpu_backend.h"
#include "runtime/flexjit.hpp"

namespace {

struct Machine {
  std::string model = "unknown CPU";
  int logical = 1, physical = 1;
  double ghz = 0;
  int flops_per_cycle = 8;
  std::string vector_note;
  double peak_gflops_per_core() const { return ghz * flops_per_cycle; }
};

Machine read_machine() {
  Machine m;
  std::ifstream f("/proc/cpuinfo");
  std::string line, flags;
  int family = 0, cpu_cores = 0, siblings = 0;
  std::set<std::pair<std::string, std::string>> cores;  // (physical id, core id)
  std::string phys_id;
  bool amd = false;
  m.logical = 0;
  while (std::getline(f, line)) {
    auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = line.substr(0, line.find_last_not_of(" \t", colon - 1) + 1);
    std::string val = colon + 2 <= line.size() ? line.substr(colon + 2) : "";
    if (key == "processor") ++m.logical;
    else if (key == "model name") m.model = val;
    else if (key == "cpu MHz" && m.ghz == 0) m.ghz = std::atof(val.c_str()) / 1000.0;
    else if (key == "flags" && flags.empty()) flags = " " + val + " ";
    else if (key == "cpu family") family = std::atoi(val.c_str());
    else if (key == "vendor_id") amd = val.find("AMD") != std::string::npos;
    else if (key == "cpu cores") cpu_cores = std::atoi(val.c_str());
    else if (key == "siblings") siblings = std::atoi(val.c_str());
    else if (key == "physical id") phys_id = val;
    else if (key == "core id") cores.insert({phys_id, val});
  }
  if (m.logical == 0) m.logical = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  m.physical = !cores.empty() ? static_cast<int>(cores.size())
               : (cpu_cores > 0 && siblings > 0) ? m.logical * cpu_cores / siblings
                                                 : m.logical;
  auto has = [&](const char* fl) { return flags.find(std::string(" ") + fl + " ") != std::string::npos; };
  if (has("avx512f")) {
    bool half_rate = amd && family == 0x19;
    m.flops_per_cycle = half_rate ? 32 : 64;
    m.vector_note = half_rate ? "AVX-512 at half rate (Zen 4): 2 x 8-wide FMA" : "AVX-512: 2 x 16-wide FMA";
  } else if (has("avx2") && has("fma")) {
    m.flops_per_cycle = 32;
    m.vector_note = "AVX2: 2 x 8-wide FMA";
  } else {
    m.flops_per_cycle = 8;
    m.vector_note = "SSE: 4-wide add + 4-wide multiply";
  }
  return m;
}

std::string shell_line(const std::string& cmd) {
  std::string out;
  if (FILE* p = popen(cmd.c_str(), "r")) {
    char buf[256];
    while (fgets(buf, sizeof buf, p)) out += buf;
    pclose(p);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out;
}

// The naive dense reference: every (q, kv) pair's dot product, then the causal mask, a
// two-pass softmax and P.V, in plain loops on one thread.
void naive_causal(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v, std::vector<float>& o, int64_t BH,
                  int64_t S, int64_t D, float scale) {
  std::vector<float> s(static_cast<size_t>(S));
  for (int64_t bh = 0; bh < BH; ++bh)
    for (int64_t i = 0; i < S; ++i) {
      const float* qi = &q[static_cast<size_t>((bh * S + i) * D)];
      float mx = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < S; ++j) {
        const float* kj = &k[static_cast<size_t>((bh * S + j) * D)];
        float dot = 0;
        for (int64_t d = 0; d < D; ++d) dot += qi[d] * kj[d];
        s[static_cast<size_t>(j)] = j <= i ? dot * scale : -std::numeric_limits<float>::infinity();
        mx = std::max(mx, s[static_cast<size_t>(j)]);
      }
      float sum = 0;
      for (int64_t j = 0; j < S; ++j) sum += (s[static_cast<size_t>(j)] = std::exp(s[static_cast<size_t>(j)] - mx));
      float* oi = &o[static_cast<size_t>((bh * S + i) * D)];
      for (int64_t d = 0; d < D; ++d) oi[d] = 0;
      for (int64_t j = 0; j < S; ++j) {
        const float* vj = &v[static_cast<size_t>((bh * S + j) * D)];
        for (int64_t d = 0; d < D; ++d) oi[d] += s[static_cast<size_t>(j)] * vj[d];
      }
      for (int64_t d = 0; d < D; ++d) oi[d] /= sum;
    }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 0, iters = 5, block_m = 0, block_n = 0, chunk_n = 0;
  int64_t S = 2048;
  bool naive = true, more = false;
  std::string append, only_isa;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--threads") threads = std::atoi(next().c_str());
    else if (a == "--iters") iters = std::max(1, std::atoi(next().c_str()));
    else if (a == "--seq") S = std::atoll(next().c_str());
    else if (a == "--no-naive") naive = false;
    else if (a == "--more") more = true;
    else if (a == "--block-m") block_m = std::atoi(next().c_str());
    else if (a == "--block-n") block_n = std::atoi(next().c_str());
    else if (a == "--chunk-n") chunk_n = std::atoi(next().c_str());
    else if (a == "--append") append = next();
    else if (a == "--isa") only_isa = next();
    else {
      std::fprintf(stderr, "usage: %s [--threads N] [--iters N] [--seq S] [--no-naive] [--block-m M] [--block-n N] [--chunk-n C] [--isa NAME] [--more] [--append FILE]\n", argv[0]);
      return 2;
    }
  }
  const int64_t B = 1, H = 8, D = 64;
  const double density = 0.5;  // causal, as the formula above counts it
  const double flops = 4.0 * B * H * static_cast<double>(S) * static_cast<double>(S) * D * density;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));

  Machine m = read_machine();
  if (threads <= 0) threads = m.logical;
  flexjit::cpu::install();

  std::mt19937 rng(42);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> q(static_cast<size_t>(B * H * S * D)), k(q.size()), v(q.size()), o(q.size()), lse(static_cast<size_t>(B * H * S));
  for (auto* t : {&q, &k, &v})
    for (float& x : *t) x = u(rng);

  flexjit::dsl::Spec spec;
  spec.name = "causal";
  spec.mask_mod = "q >= kv";
  spec.dtype = flexjit::DType::F32;
  spec.head_dim = static_cast<int>(D);
  flexjit::Runtime rt;
  auto kernel = rt.compile(spec);
  flexjit::AttentionArgs a;
  a.q = flexjit::Tensor::contiguous(q.data(), flexjit::DType::F32, {B, H, S, D});
  a.k = flexjit::Tensor::contiguous(k.data(), flexjit::DType::F32, {B, H, S, D});
  a.v = flexjit::Tensor::contiguous(v.data(), flexjit::DType::F32, {B, H, S, D});
  a.o = flexjit::Tensor::contiguous(o.data(), flexjit::DType::F32, {B, H, S, D});
  a.lse = flexjit::Tensor::contiguous(lse.data(), flexjit::DType::F32, {B, H, S});
  a.device = flexjit::Device::cpu();

  double naive_ms = 0, max_diff = 0;
  if (naive) {
    std::vector<float> ref(q.size());
    auto t0 = std::chrono::steady_clock::now();
    naive_causal(q, k, v, ref, B * H, S, D, scale);
    naive_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    flexjit::cpu::configure({threads, "", block_m, block_n, chunk_n});
    kernel->forward(a);
    for (size_t i = 0; i < o.size(); ++i) max_diff = std::max(max_diff, static_cast<double>(std::abs(o[i] - ref[i])));
  }

  char date[32];
  std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d", std::localtime(&now));
  std::string commit = shell_line(fmt::format("git -C '{}' rev-parse --short HEAD 2>/dev/null", FLEXJIT_SOURCE_DIR));
  if (commit.empty()) commit = "unknown";
  std::string machine = fmt::format("{} ({} cores, {:.2f} GHz)", m.model, m.physical, m.ghz);

  std::string table;
  table += fmt::format("\n### CPU backend, causal B{} H{} S{} D{} fp32, {}, {}, commit {}\n\n", B, H, S, D, date, machine, commit);
  table += fmt::format(
      "Peak estimate: {} cores x {:.2f} GHz x {} FLOP/cycle ({}) = {:.0f} GFLOP/s ({:.0f} per core). FLOPs = 4·B·H·S²·D·0.5. "
      "Median of {} runs after one warm-up.\n\n",
      m.physical, m.ghz, m.flops_per_cycle, m.vector_note, m.physical * m.peak_gflops_per_core(), m.peak_gflops_per_core(), iters);
  table += "| ISA | threads | flexjit ms | GFLOP/s | GFLOP/s per core | % of peak | naive dense ms · GFLOP/s (1 thread) | flexjit / naive |\n";
  table += "| --- | --- | --- | --- | --- | --- | --- | --- |\n";
  std::printf("%s", table.c_str());
  std::string rows;
  for (const std::string& isa : flexjit::cpu::available_isas()) {
    if (!only_isa.empty() && isa != only_isa) continue;
    for (int t : threads == 1 ? std::vector<int>{1} : std::vector<int>{1, threads}) {
      flexjit::cpu::configure({t, isa, block_m, block_n, chunk_n});
      kernel->forward(a);  // warm-up (JIT on the first)
      std::vector<double> ms;
      for (int i = 0; i < iters; ++i) {
        auto t0 = std::chrono::steady_clock::now();
        kernel->forward(a);
        ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      }
      double med = median(ms);
      double gflops = flops / (med * 1e6);
      int cores_used = std::min(t, m.physical);
      std::string naive_col = naive ? fmt::format("{:.0f} · {:.2f}", naive_ms, flops / (naive_ms * 1e6)) : "–";
      std::string ratio = naive ? fmt::format("{:.0f}×", naive_ms / med) : "–";
      std::string row = fmt::format("| {} | {} | {:.1f} | {:.1f} | {:.1f} | {:.0f}% | {} | {} |\n", isa, t, med, gflops, gflops / cores_used,
                                    100.0 * gflops / (cores_used * m.peak_gflops_per_core()), naive_col, ratio);
      std::printf("%s", row.c_str());
      std::fflush(stdout);
      rows += row;
    }
  }
  if (naive) std::printf("\nmax |O - naive| = %.3g\n", max_diff);

  // --more: other gallery-style mods at the same shape, one thread, the best ISA; the
  // density of each mask is measured by counting, for the FLOP formula.
  std::string extra;
  if (more) {
    struct Case {
      const char* name;
      const char* score;
      const char* mask;
      bool exact_math;
      int64_t window;  // the mask keeps 0 <= q - kv < window (0: no mask)
    };
    const Case cases[] = {{"full (no mods)", nullptr, nullptr, false, 0},
                          {"softcap 30 (libmvec tanh)", "30.0 * tanh(score / 30.0)", nullptr, false, 0},
                          {"softcap 30 (scalar tanhf)", "30.0 * tanh(score / 30.0)", nullptr, true, 0},
                          {"alibi + causal", "score + slope[h] * float(kv - q)", "q >= kv", false, S},
                          {"sliding window 256", nullptr, "q >= kv && q - kv < 256", false, 256}};
    extra += "\n| spec (1 thread, best ISA) | density | flexjit ms | GFLOP/s |\n| --- | --- | --- | --- |\n";
    std::vector<float> slope(static_cast<size_t>(H), 0.05f);
    for (const Case& c : cases) {
      flexjit::dsl::Spec sp;
      sp.name = "bench";
      if (c.score) sp.score_mod = c.score;
      if (c.mask) sp.mask_mod = c.mask;
      sp.dtype = flexjit::DType::F32;
      sp.head_dim = static_cast<int>(D);
      flexjit::dsl::Diagnostics diags;
      flexjit::dsl::add_buffer(sp, "slope: f32[H]", "bench", diags);
      auto kern = rt.compile(sp);
      flexjit::AttentionArgs ca = a;
      ca.buffers = {{"slope", flexjit::Tensor::contiguous(slope.data(), flexjit::DType::F32, {H})}};
      flexjit::cpu::CpuSettings st;
      st.threads = 1;
      st.exact_math = c.exact_math;
      flexjit::cpu::configure(st);
      kern->forward(ca);
      std::vector<double> ms;
      for (int i = 0; i < iters; ++i) {
        auto t0 = std::chrono::steady_clock::now();
        kern->forward(ca);
        ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      }
      double dens = 1.0;
      if (c.window > 0) {
        int64_t kept = 0;
        for (int64_t i = 0; i < S; ++i) kept += std::min(i + 1, c.window);
        dens = static_cast<double>(kept) / static_cast<double>(S * S);
      }
      double med = median(ms);
      std::string row = fmt::format("| {} | {:.3f} | {:.1f} | {:.1f} |\n", c.name, dens, med, 4.0 * B * H * S * S * D * dens / (med * 1e6));
      std::printf("%s", row.c_str());
      extra += row;
    }
  }
  if (!append.empty()) {
    std::ofstream out(append, std::ios::app);
    out << table << rows;
    if (naive) out << fmt::format("\nmax |O - naive| = {:.2g}; target: ≥ 25 GFLOP/s per core.\n", max_diff);
    out << extra;
    std::printf("appended to %s\n", append.c_str());
  }
  return 0;
}
