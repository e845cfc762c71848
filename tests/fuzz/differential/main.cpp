// flexjit_differential: random well-typed specs (random_spec.h) through the float64 reference,
// the CPU backend, NVRTC and the GPU, forward and backward. A disagreement is shrunk to a small
// case, printed and saved as a regression (JSON) that --replay runs again.
//
//   flexjit_differential --count 10000 --seed 1                  CPU backend against the reference
//   flexjit_differential --seconds 60 --seed $(date +%s)         as many cases as fit in a minute
//   flexjit_differential --gpu-specs --gpu --count 1000          on a GPU machine (bf16 / f16, GPU head dims)
//   flexjit_differential --gpu-specs --nvrtc-every 1 --count 3   compile the cases' kernels for sm_80 and sm_90a
//   flexjit_differential --replay tests/fuzz/regressions/differential
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "fuzz/differential/case_runner.h"
#include "fuzz/differential/shrink.h"
#include "runtime/cuda_driver.h"

using namespace flexjit::fuzz;
namespace fs = std::filesystem;

namespace {

struct Totals {
  int cases = 0, failures = 0;
  Outcome checks;
  void add(const Outcome& o) {
    ++cases;
    checks.forward_checks += o.forward_checks;
    checks.backward_checks += o.backward_checks;
    checks.nvrtc_compiles += o.nvrtc_compiles;
    checks.gpu_launches += o.gpu_launches;
    checks.rows += o.rows;
    checks.masked_rows += o.masked_rows;
  }
};

std::vector<fs::path> case_files(const std::string& path) {
  std::vector<fs::path> out;
  if (fs::is_directory(path)) {
    for (const auto& e : fs::directory_iterator(path))
      if (e.path().extension() == ".json") out.push_back(e.path());
    std::sort(out.begin(), out.end());
  } else if (fs::exists(path)) {
    out.push_back(path);
  }
  return out;
}

void save(const GenCase& c, const Outcome& o, const std::string& dir) {
  fs::create_directories(dir);
  std::string kind = o.kind;
  std::replace(kind.begin(), kind.end(), ' ', '_');
  const fs::path path = fs::path(dir) / fmt::format("{}_{}.json", kind, c.seed);
  nlohmann::json j = case_to_json(c);
  j["failure"] = o.failure;
  std::ofstream(path) << j.dump(2) << "\n";
  fmt::print("  saved {}\n", path.string());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Differential testing of flexjit's back ends on random specs"};
  uint64_t seed = 1;
  int count = 100, nvrtc_every = 0, shrink_budget = 400;
  double seconds = 0;
  bool gpu = false, gpu_specs = false, no_cpu = false, quiet = false;
  std::vector<std::string> archs = {"sm_80", "sm_90a"}, replay;
  std::string save_dir;
  app.add_option("--seed", seed, "First case's seed (cases are seed, seed + 1, ...)");
  app.add_option("--count", count, "Number of cases (with --seconds: at most)");
  app.add_option("--seconds", seconds, "Stop starting cases after this many seconds");
  app.add_flag("--gpu", gpu, "Also launch on CUDA device 0 (when present)");
  app.add_flag("--gpu-specs", gpu_specs, "Generate what the GPU kernels take: bf16 / f16 and their head dims");
  app.add_flag("--no-cpu", no_cpu, "Do not launch on the CPU backend");
  app.add_option("--nvrtc-every", nvrtc_every, "Compile the CUDA kernels of every Nth case (bf16 / f16 specs; 0: never)");
  app.add_option("--arch", archs, "Architectures for --nvrtc-every")->capture_default_str();
  app.add_option("--save", save_dir, "Write shrunk failing cases here as JSON");
  app.add_option("--shrink-budget", shrink_budget, "Most candidate runs spent shrinking one failure (0: do not shrink)");
  app.add_option("--replay", replay, "Run saved cases (files or directories) instead of generating");
  app.add_flag("--quiet", quiet, "Print only failures and the summary");
  CLI11_PARSE(app, argc, argv);

  RunOptions base;
  base.cpu = !no_cpu;
  base.gpu = gpu;
  if (gpu && !flexjit::runtime::cuda_driver())
    fmt::print("note: --gpu without a usable CUDA device ({}): GPU launches skipped\n", flexjit::runtime::cuda_driver_unavailable_reason());
  GenOptions gen;
  gen.gpu = gpu_specs;
  Totals totals;
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };

  auto run_one = [&](const GenCase& c, bool generated) {
    RunOptions o = base;
    const bool half = c.dtype != flexjit::dsl::DType::F32;
    if (nvrtc_every > 0 && half && totals.cases % nvrtc_every == 0) o.nvrtc_archs = archs;
    Outcome r = run_case(c, o);
    totals.add(r);
    if (!quiet) fmt::print("{:6} {} rows {:5} masked {:5} {}\n", totals.cases, r.ok() ? "ok  " : "FAIL", r.rows, r.masked_rows, describe(c));
    else if (totals.cases % 500 == 0) fmt::print("progress: {} cases, {} disagreements, {:.0f} s\n", totals.cases, totals.failures, elapsed());
    std::fflush(stdout);
    if (r.ok()) return;
    ++totals.failures;
    fmt::print("FAIL [{}] {}\n  {}\n", r.kind, describe(c), r.failure);
    GenCase small = c;
    if (generated && shrink_budget > 0) {
      small = shrink_case(c, [&](const GenCase& cand) { return run_case(cand, o).kind == r.kind; }, shrink_budget);
      r = run_case(small, o);
      fmt::print("  shrunk to: {}\n  {}\n", describe(small), r.failure);
    }
    if (!save_dir.empty()) save(small, r, save_dir);
  };

  if (!replay.empty()) {
    for (const std::string& p : replay)
      for (const fs::path& f : case_files(p)) {
        std::ifstream in(f);
        run_one(case_from_json(nlohmann::json::parse(in)), /*generated=*/false);
      }
  } else {
    for (int i = 0; i < count && (seconds <= 0 || elapsed() < seconds); ++i) run_one(generate_case(seed + static_cast<uint64_t>(i), gen), true);
  }
  fmt::print("--- differential: {} cases from seed {} in {:.0f} s: {} forward ({} rows, {} of them fully masked) and {} backward comparisons, "
             "{} NVRTC compiles, {} GPU launches; {} disagreements\n",
             totals.cases, replay.empty() ? fmt::format("{}", seed) : "(replay)", elapsed(), totals.checks.forward_checks, totals.checks.rows,
             totals.checks.masked_rows, totals.checks.backward_checks, totals.checks.nvrtc_compiles, totals.checks.gpu_launches, totals.failures);
  return totals.failures ? 1 : 0;
}
