// Runs one generated case through the float64 reference (the interpreter, tests/support/) and
// the back ends - the CPU backend, the GPU through the public API, NVRTC compiles of its CUDA
// kernels - forward and backward, and says whether they all agree.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "fuzz/differential/random_spec.h"

namespace flexjit::fuzz {

struct RunOptions {
  bool cpu = true;                       // launch on the CPU backend (when this build has it)
  bool gpu = false;                      // launch on CUDA device 0 (when there is one)
  std::vector<std::string> nvrtc_archs;  // compile the case's forward and backward kernels for these
};

struct Outcome {
  std::string kind;     // "" when everything agreed; else a stable category ("cpu forward", "nvrtc", ...)
  std::string failure;  // what disagreed, where and by how much
  int forward_checks = 0, backward_checks = 0, nvrtc_compiles = 0, gpu_launches = 0;
  int64_t rows = 0, masked_rows = 0;  // query rows compared, and those the reference masks entirely
  bool ok() const { return kind.empty(); }
};

Outcome run_case(const GenCase& c, const RunOptions& options);

// The case as a regression file holds it (rendered programs, no expression trees), and back.
nlohmann::json case_to_json(const GenCase& c);
GenCase case_from_json(const nlohmann::json& j);

// A one-line description: spec, sizes, dtype, layout.
std::string describe(const GenCase& c);

}  // namespace flexjit::fuzz
