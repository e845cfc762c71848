// Compiles the forward template through NVRTC the way the runtime will (in-memory headers, -default-device,
// C++17) with generated-style variants, for sm_80 and sm_90a, and prints ptxas resource usage. Needs no GPU.
//
// Build: g++ -std=c++17 -O1 nvrtc_check.cpp -I/usr/local/cuda/include -L/usr/local/cuda/lib64 -lnvrtc
// Usage: nvrtc_check <kernels_templates dir> [head dims...]
#include <nvrtc.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
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

// What the code generator is expected to emit for a variant, plus the entry point of the contract.
const char* kPlainVariant = R"(
struct Variant {
  struct Params { int unused; };
  static constexpr bool kHasScoreMod = false;
  static constexpr bool kHasMaskMod = false;
  struct Row {}; struct Col {}; struct Tile {};
  __device__ static __forceinline__ void row(const Params&, Row&, int, int, int, int) {}
  __device__ static __forceinline__ void col(const Params&, const Row&, Col&, int, int, int, int, int) {}
  __device__ static __forceinline__ void tile(const Params&, const Row&, Tile&, int, int, int, int, int) {}
  __device__ static __forceinline__ float score_mod(const Params&, const Row&, const Col&, const Tile&, int, int, int, int, int, int, float s) { return s; }
  __device__ static __forceinline__ bool mask_mod(const Params&, const Row&, const Col&, const Tile&, int, int, int, int, int, int) { return true; }
};
)";

const char* kSamCausalVariant = R"(
struct Variant {
  struct Params {
    const __nv_bfloat16* rel_h; long long rel_h_s0, rel_h_s1, rel_h_s2;
    const __nv_bfloat16* rel_w; long long rel_w_s0, rel_w_s1, rel_w_s2;
  };
  static constexpr bool kHasScoreMod = true;
  static constexpr bool kHasMaskMod = true;
  struct Row {}; struct Col { float t0; }; struct Tile { float t1; };
  __device__ static __forceinline__ void row(const Params&, Row&, int, int, int, int) {}
  __device__ static __forceinline__ void col(const Params& P, const Row&, Col& c, int b, int h, int, int q, int j) {
    c.t0 = __bfloat162float(P.rel_w[b * P.rel_w_s0 + h * P.rel_w_s1 + q * P.rel_w_s2 + j]);
  }
  __device__ static __forceinline__ void tile(const Params& P, const Row&, Tile& t, int b, int h, int, int q, int k0) {
    t.t1 = __bfloat162float(P.rel_h[b * P.rel_h_s0 + h * P.rel_h_s1 + q * P.rel_h_s2 + (k0 >> 6)]);
  }
  __device__ static __forceinline__ float score_mod(const Params&, const Row&, const Col& c, const Tile& t, int, int, int, int, int, int, float score) {
    return score + t.t1 + c.t0;
  }
  __device__ static __forceinline__ bool mask_mod(const Params&, const Row&, const Col&, const Tile&, int, int, int, int q, int k0, int j) {
    return q >= k0 + j;
  }
};
)";

struct Result {
  bool ok;
  std::string log;
  size_t cubin_bytes;
  double seconds;
};

Result compile(const std::vector<std::pair<std::string, std::string>>& headers, const std::string& source,
               const std::string& arch) {
  std::vector<const char*> names, texts;
  for (auto& h : headers) {
    names.push_back(h.first.c_str());
    texts.push_back(h.second.c_str());
  }
  nvrtcProgram prog;
  nvrtcCreateProgram(&prog, source.c_str(), "flexjit_generated.cu", (int)headers.size(), texts.data(), names.data());
  const std::string arch_opt = "--gpu-architecture=" + arch;
  const char* opts[] = {"--std=c++17", "-default-device", "-I/usr/local/cuda/include", arch_opt.c_str(),
                        "--ptxas-options=-v"};
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
  return {rc == NVRTC_SUCCESS && cubin > 0, log, cubin, secs};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: nvrtc_check <kernels_templates dir> [head dims...]\n");
    return 2;
  }
  const std::string dir = argv[1];
  std::vector<std::pair<std::string, std::string>> headers;
  for (const char* name : {"flex_params.cuh", "flex_traits.cuh", "flex_mma.cuh", "flex_forward.cuh"})
    headers.emplace_back(name, read_file(dir + "/" + name));
  std::vector<int> dims;
  for (int i = 2; i < argc; ++i) dims.push_back(std::atoi(argv[i]));
  if (dims.empty()) dims = {32, 64, 80, 96, 128, 192, 256};

  int failures = 0;
  for (int d : dims) {
    const int warps = d <= 128 ? 4 : 8;
    for (int v = 0; v < 2; ++v) {
      for (const char* elem : {"__nv_bfloat16", "__half"}) {
        if (v == 1 && std::string(elem) == "__half") continue;
        std::string src = "#include \"flex_forward.cuh\"\n";
        src += v == 0 ? kPlainVariant : kSamCausalVariant;
        src += "using Traits = FlexForwardTraits<" + std::to_string(d) + ", 128, 64, " + std::to_string(warps) + ", " +
               elem + ">;\n";
        src +=
            "extern \"C\" __global__ void __launch_bounds__(Traits::kNThreads, 1) flexjit_forward(const "
            "FlexForwardParams p, const Variant::Params vp) { flex_forward<Traits, Variant>(p, vp); }\n";
        for (const char* arch : {"sm_80", "sm_90a"}) {
          Result r = compile(headers, src, arch);
          std::string usage;
          for (std::istringstream ls(r.log); std::getline(ls, usage);)
            if (usage.find("registers") != std::string::npos) break;
          std::string spill;
          for (std::istringstream ls(r.log); std::getline(ls, spill);)
            if (spill.find("spill") != std::string::npos) break;
          std::printf("D%-3d %-13s %-10s %-6s %s %5.1fs cubin %7zu B |%s |%s\n", d, elem, v == 0 ? "plain" : "sam+causal",
                      arch, r.ok ? "OK  " : "FAIL", r.seconds, r.cubin_bytes, usage.c_str(), spill.c_str());
          if (!r.ok) {
            std::printf("%s\n", r.log.c_str());
            ++failures;
          }
        }
      }
    }
  }
  std::printf("NVRTC SUMMARY: %d failed\n", failures);
  return failures ? 1 : 0;
}
