// Compiles the sm_90a backward main kernel through NVRTC the way the runtime compiles a backward module (in-memory
// headers, -default-device, C++17) with generated variants (nvrtc_variants.cuh), and prints ptxas resource usage.
// Also checks that a module including flex_backward_sm90.cuh still compiles for sm_80 (mma.sync kernel only).
// Needs no GPU.
//
// Build: g++ -std=c++17 -O1 nvrtc_check.cpp -I/usr/local/cuda/include -L/usr/local/cuda/lib64 -lnvrtc
// Usage: nvrtc_check <kernels_templates dir> <backward_harness dir> [head dims...]
#include <nvrtc.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  if (!f) {
    std::fprintf(stderr, "cannot read %s\n", path.c_str());
    std::exit(2);
  }
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct Result {
  bool ok;
  std::string log;
  double seconds;
};

Result compile(const std::vector<std::pair<std::string, std::string>>& headers, const std::string& source, const std::string& arch) {
  std::vector<const char*> names, texts;
  for (auto& h : headers) {
    names.push_back(h.first.c_str());
    texts.push_back(h.second.c_str());
  }
  nvrtcProgram prog;
  nvrtcCreateProgram(&prog, source.c_str(), "flexjit_generated.cu", (int)headers.size(), texts.data(), names.data());
  const std::string arch_opt = "--gpu-architecture=" + arch;
  const char* opts[] = {"-default-device", "--std=c++17", "-I/usr/local/cuda/include", arch_opt.c_str(), "-Xptxas=-v"};
  const auto t0 = std::chrono::steady_clock::now();
  const nvrtcResult rc = nvrtcCompileProgram(prog, 5, opts);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  size_t log_size = 0;
  nvrtcGetProgramLogSize(prog, &log_size);
  std::string log(log_size, '\0');
  nvrtcGetProgramLog(prog, log.data());
  size_t cubin = 0;
  if (rc == NVRTC_SUCCESS) nvrtcGetCUBINSize(prog, &cubin);
  nvrtcDestroyProgram(&prog);
  return {rc == NVRTC_SUCCESS && cubin > 0, log, secs};
}

// One line per entry: name, registers, spills (from the ptxas -v part of the log).
void print_usage(const std::string& log) {
  std::istringstream ls(log);
  std::string line, entry;
  while (std::getline(ls, line)) {
    auto p = line.find("Compiling entry function '");
    if (p != std::string::npos) {
      entry = line.substr(p + 26);
      entry = entry.substr(0, entry.find('\''));
      continue;
    }
    if (line.find("spill") != std::string::npos) std::printf("    %-28s %s\n", entry.c_str(), line.substr(line.find_first_not_of(' ')).c_str());
    if (line.find("Used") != std::string::npos && line.find("registers") != std::string::npos)
      std::printf("    %-28s %s\n", entry.c_str(), line.substr(line.find("Used")).c_str());
    if (line.find("wgmma") != std::string::npos) std::printf("    WARNING %s\n", line.c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: nvrtc_check <kernels_templates dir> <backward_harness dir> [head dims...]\n");
    return 2;
  }
  const std::string dir = argv[1];
  std::vector<std::pair<std::string, std::string>> headers;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().extension() == ".cuh") headers.emplace_back(e.path().filename().string(), read_file(e.path().string()));
  const std::string variants = read_file(std::string(argv[2]) + "/nvrtc_variants.cuh");
  std::vector<int> dims;
  for (int i = 3; i < argc; ++i) dims.push_back(std::atoi(argv[i]));
  if (dims.empty()) dims = {32, 64, 80, 96, 128};

  int failures = 0;
  struct Flavour {
    const char* element;
    bool det;
  };
  for (int d : dims) {
    for (Flavour f : {Flavour{"__nv_bfloat16", false}, Flavour{"__nv_bfloat16", true}, Flavour{"__half", false}}) {
      // The generated module's layout (compiler/codegen/backward_source.cpp) with the sm_90a main kernel.
      std::string src = "#include \"flex_backward.cuh\"\n#include \"flex_backward_sm90.cuh\"\n#include \"flex_ops.cuh\"\n\n" + variants;
      src += "\nusing FlexBwdTraits = FlexBackwardTraits<" + std::to_string(d) + ", " + f.element + ">;\n";
      for (const char* v : {"learnable_bias", "alibi_learnable", "softcap", "causal"}) {
        src += std::string("extern \"C\" __global__ void __launch_bounds__(FlexBwdTraits::kNThreads, 1)\nflexjit_bwd_main_") + v +
               "(const FlexBackwardParams p, const v_" + v + "::FlexGradVariant::Params vp) {\n  flex_backward_main_sm90<FlexBwdTraits, v_" + v +
               "::FlexGradVariant, " + (f.det ? "true" : "false") + ">(p, vp);\n}\n";
      }
      // The query-major pairing: dK / dV only.
      src += std::string("extern \"C\" __global__ void __launch_bounds__(FlexBwdTraits::kNThreads, 1)\nflexjit_bwd_main_nodq(const ") +
             "FlexBackwardParams p, const v_causal::FlexGradVariant::Params vp) {\n  flex_backward_main_sm90<FlexBwdTraits, " +
             "v_causal::FlexGradVariant, " + (f.det ? "true" : "false") + ", false>(p, vp);\n}\n";
      Result r = compile(headers, src, "sm_90a");
      std::printf("D%-3d %-13s %-6s sm_90a %s %5.1fs\n", d, f.element, f.det ? "det" : "atomic", r.ok ? "OK  " : "FAIL", r.seconds);
      if (r.ok) print_usage(r.log);
      else {
        std::printf("%s\n", r.log.c_str());
        ++failures;
      }
    }
    // sm_80: the header is included but only the mma.sync kernel is instantiated.
    std::string src = "#include \"flex_backward.cuh\"\n#include \"flex_backward_sm90.cuh\"\n#include \"flex_ops.cuh\"\n\n" + variants;
    src += "\nusing FlexBwdTraits = FlexBackwardTraits<" + std::to_string(d) + ", __nv_bfloat16>;\n";
    src += "extern \"C\" __global__ void __launch_bounds__(FlexBwdTraits::kNThreads, 1)\nflexjit_bwd_main(const FlexBackwardParams p, const "
           "v_causal::FlexGradVariant::Params vp) {\n  flex_backward_main<FlexBwdTraits, v_causal::FlexGradVariant, false>(p, vp);\n}\n";
    Result r = compile(headers, src, "sm_80");
    std::printf("D%-3d %-13s %-6s sm_80  %s %5.1fs (header included, mma.sync kernel)\n", d, "__nv_bfloat16", "atomic", r.ok ? "OK  " : "FAIL",
                r.seconds);
    if (!r.ok) {
      std::printf("%s\n", r.log.c_str());
      ++failures;
    }
  }
  std::printf("NVRTC SUMMARY: %d failed\n", failures);
  return failures ? 1 : 0;
}
