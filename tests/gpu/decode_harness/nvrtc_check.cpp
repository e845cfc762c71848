// Compiles the decode template through NVRTC the way the runtime will (in-memory headers, -default-device, C++17)
// with generated-style variants, for sm_80 and sm_90a, and prints ptxas resource usage. Needs no GPU.
//
// Build: g++ -std=c++17 -O1 nvrtc_check.cpp -I../../../kernels_templates -I/usr/local/cuda/include -L/usr/local/cuda/lib64 -lnvrtc
// Usage: nvrtc_check <kernels_templates dir>
#include <nvrtc.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "flex_decode_params.cuh"

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

// ALiBi slope hoisted per row, a per-tile load, and a causal-with-offset mask.
const char* kAlibiCausalVariant = R"(
struct Variant {
  struct Params { const float* slopes; const __nv_bfloat16* bias; long long bias_s0; };
  static constexpr bool kHasScoreMod = true;
  static constexpr bool kHasMaskMod = true;
  struct Row { float slope; }; struct Col {}; struct Tile { float t1; };
  __device__ static __forceinline__ void row(const Params& P, Row& r, int, int h, int, int) { r.slope = P.slopes[h]; }
  __device__ static __forceinline__ void col(const Params&, const Row&, Col&, int, int, int, int, int) {}
  __device__ static __forceinline__ void tile(const Params& P, const Row&, Tile& t, int b, int, int, int, int k0) {
    t.t1 = __bfloat162float(P.bias[b * P.bias_s0 + (k0 >> 6)]);
  }
  __device__ static __forceinline__ float score_mod(const Params&, const Row& r, const Col&, const Tile& t, int, int, int, int q, int k0, int j, float s) {
    return s + r.slope * (float)(k0 + j - q) + t.t1;
  }
  __device__ static __forceinline__ bool mask_mod(const Params&, const Row&, const Col&, const Tile&, int, int, int, int q, int k0, int j) {
    return q >= k0 + j;
  }
};
)";

struct Result {
  bool ok;
  std::string log;
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
  return {rc == NVRTC_SUCCESS && cubin > 0, log, secs};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: nvrtc_check <kernels_templates dir>\n");
    return 2;
  }
  const std::string dir = argv[1];
  std::vector<std::pair<std::string, std::string>> headers;
  for (const char* name : {"flex_decode_params.cuh", "flex_mma.cuh", "flex_decode.cuh"})
    headers.emplace_back(name, read_file(dir + "/" + name));
  int failures = 0;
  for (int d : {64, 128, 256}) {
    for (int mt : {1, 2}) {
      if (d > 128 && mt > 1) continue;
      // Both pipelines (FlexDecodeTraits::kAlternate); the one flex_decode_alternate() picks is marked "*".
      for (const bool alt : {false, true})
      for (int v = 0; v < 2; ++v) {
        const int stages = 2;
        std::string src = "#include \"flex_decode.cuh\"\n";
        src += v == 0 ? kPlainVariant : kAlibiCausalVariant;
        src += "using Traits = FlexDecodeTraits<" + std::to_string(d) + ", " + std::to_string(mt) + ", " +
               std::to_string(stages) + ", __nv_bfloat16, " + (alt ? "true" : "false") + ">;\n";
        src += "extern \"C\" __global__ void __launch_bounds__(Traits::kNThreads, 2) flexjit_decode(const FlexDecodeParams p, "
               "const Variant::Params vp) { flex_decode<Traits, Variant>(p, vp); }\n"
               "extern \"C\" __global__ void __launch_bounds__(128) flexjit_decode_combine(const FlexDecodeParams p) { "
               "flex_decode_combine<Traits::kHeadDim, Traits::Element>(p); }\n";
        const char* name = alt == flex_decode_alternate(d, mt, stages) ? (alt ? " alt*" : " pairs*") : (alt ? " alt" : " pairs");
        for (const char* arch : {"sm_80", "sm_90a"}) {
          Result r = compile(headers, src, arch);
          // One "Compiling entry" / "registers" / "spill" triple per kernel: keep the decode kernel's.
          std::string usage, spill, line, entry;
          for (std::istringstream ls(r.log); std::getline(ls, line);) {
            if (line.find("Compiling entry") != std::string::npos) entry = line;
            const bool decode = entry.find("flexjit_decode'") != std::string::npos;
            if (decode && line.find("registers") != std::string::npos) usage = line.substr(line.find("Used"));
            if (decode && line.find("spill") != std::string::npos) spill = line.substr(line.find("bytes stack") - 4);
          }
          std::printf("D%-3d mt%d %-13s%-9s %-6s %s %5.1fs | %s | %s\n", d, mt, v == 0 ? "plain" : "alibi+causal", name, arch,
                      r.ok ? "OK  " : "FAIL", r.seconds, usage.c_str(), spill.c_str());
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
