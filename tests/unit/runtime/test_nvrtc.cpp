// Tests of the NVRTC wrapper; they need the toolkit (always present) but no GPU.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "dsl/error.h"
#include "runtime/nvrtc.h"

using namespace flexjit::runtime;
namespace fs = std::filesystem;

namespace {

const char* kTinyKernel = R"(
#include <cuda_bf16.h>
#include "flexjit_test_scale.cuh"
extern "C" __global__ void scale_bf16(__nv_bfloat16* x, int n) {
  __shared__ float tile[128];
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  tile[threadIdx.x] = i < n ? __bfloat162float(x[i]) : 0.f;
  __syncthreads();
  if (i < n) x[i] = __float2bfloat16(tile[threadIdx.x] * kScale);
}
template <int N> __global__ void fill(float* y) { y[threadIdx.x] = N; }
)";

NvrtcRequest tiny_request(const std::string& arch) {
  NvrtcRequest r;
  r.source = kTinyKernel;
  r.program_name = "tiny.cu";
  r.arch = arch;
  r.headers = {{"flexjit_test_scale.cuh", "constexpr float kScale = 2.0f;\n"}};
  r.name_expressions = {"fill<3>"};
  return r;
}

bool is_elf(const std::vector<std::uint8_t>& b) {
  return b.size() > 4 && b[0] == 0x7f && b[1] == 'E' && b[2] == 'L' && b[3] == 'F';
}

}  // namespace

TEST_CASE("nvrtc: compiles a tiny kernel to sm_80 and sm_90a cubins without a GPU", "[runtime][nvrtc]") {
  NvrtcCompiler compiler;
  for (const char* arch : {"sm_80", "sm_90a"}) {
    INFO(arch);
    NvrtcOutput out = compiler.compile(tiny_request(arch));
    CHECK(is_elf(out.cubin));
    CHECK(out.seconds > 0);
    REQUIRE(out.lowered_names.size() == 1);
    CHECK(out.lowered_names[0].first == "fill<3>");
    CHECK(out.lowered_names[0].second == "_Z4fillILi3EEvPf");
    // ptxas' report: both entries, with the static shared memory of the tile.
    REQUIRE(out.resources.size() == 2);
    bool found = false;
    for (const KernelResources& r : out.resources) {
      CHECK(r.registers > 0);
      CHECK(r.spill_store_bytes == 0);
      if (r.name == "scale_bf16") {
        found = true;
        CHECK(r.shared_bytes == 512);
        CHECK(r.barriers == 1);
      }
    }
    CHECK(found);
  }
}

TEST_CASE("nvrtc: the positional overload and the default options", "[runtime][nvrtc]") {
  NvrtcCompiler compiler;
  NvrtcOutput out = compiler.compile(kTinyKernel, "tiny.cu", {{"flexjit_test_scale.cuh", "constexpr float kScale = 1;"}},
                                     {"-DUNUSED=1"}, "sm_86");
  CHECK(is_elf(out.cubin));

  CHECK(out.ptx.empty());  // only on request
  NvrtcRequest with_ptx = tiny_request("sm_90a");
  with_ptx.want_ptx = true;
  NvrtcOutput ptx_out = compiler.compile(with_ptx);
  CHECK(ptx_out.ptx.find(".target sm_90a") != std::string::npos);
  CHECK(ptx_out.ptx.find("scale_bf16") != std::string::npos);
  CHECK(is_elf(ptx_out.cubin));

  std::vector<std::string> options = compiler.effective_options(tiny_request("sm_90a"));
  auto has = [&](const std::string& o) { return std::find(options.begin(), options.end(), o) != options.end(); };
  CHECK(has("-default-device"));
  CHECK(has("--std=c++17"));
  CHECK(has("--gpu-architecture=sm_90a"));
  CHECK(has("-I" + compiler.cuda_include_dir()));
  CHECK(fs::exists(fs::path(compiler.cuda_include_dir()) / "cuda_bf16.h"));
}

TEST_CASE("nvrtc: a syntax error reports the log and the dumped source", "[runtime][nvrtc]") {
  NvrtcCompiler compiler;
  NvrtcRequest r;
  r.source = "extern \"C\" __global__ void broken(float* x) { x[0] = 1.0f +; }\n";
  r.program_name = "broken.cu";
  r.arch = "sm_80";
  std::string message;
  try {
    compiler.compile(r);
    FAIL("expected a compile error");
  } catch (const flexjit::Error& e) {
    message = e.what();
  }
  INFO(message);
  CHECK(message.find("broken.cu(1): error") != std::string::npos);  // NVRTC's log
  CHECK(message.find("sm_80") != std::string::npos);
  size_t at = message.find("flexjit-failed-");
  REQUIRE(at != std::string::npos);
  size_t begin = message.rfind(' ', at) + 1;
  size_t end = message.find('\n', at);
  fs::path dumped = message.substr(begin, end - begin);
  REQUIRE(fs::exists(dumped));
  std::ifstream f(dumped);
  std::string text((std::istreambuf_iterator<char>(f)), {});
  CHECK(text == r.source);
  fs::remove(dumped);
}

TEST_CASE("nvrtc: architectures", "[runtime][nvrtc]") {
  CHECK(arch_for_compute_capability(8, 0) == "sm_80");
  CHECK(arch_for_compute_capability(8, 6) == "sm_86");
  CHECK(arch_for_compute_capability(8, 9) == "sm_89");
  CHECK(arch_for_compute_capability(9, 0) == "sm_90a");
  CHECK(arch_for_compute_capability(10, 0) == "sm_100a");
  CHECK_THROWS_AS(arch_for_compute_capability(0, 0), flexjit::Error);

  std::string suffix;
  CHECK(parse_arch("sm_90a", &suffix) == 90);
  CHECK(suffix == "a");
  CHECK(parse_arch("sm_80", &suffix) == 80);
  CHECK(suffix.empty());
  CHECK_THROWS_AS(parse_arch("compute_90"), flexjit::Error);
  CHECK_THROWS_AS(parse_arch("sm_90x"), flexjit::Error);
  CHECK_THROWS_AS(parse_arch("sm_"), flexjit::Error);
  CHECK_THROWS_WITH(parse_arch("sm_20"), Catch::Contains("cannot compile for sm_20"));

  std::vector<int> archs = nvrtc_supported_archs();
  CHECK(std::find(archs.begin(), archs.end(), 80) != archs.end());
  CHECK(std::find(archs.begin(), archs.end(), 90) != archs.end());

  NvrtcCompiler compiler;
  NvrtcRequest r = tiny_request("compute_90");
  CHECK_THROWS_AS(compiler.compile(r), flexjit::Error);
}

TEST_CASE("nvrtc: version and include discovery", "[runtime][nvrtc]") {
  std::string v = nvrtc_version();
  CHECK(v.find('.') != std::string::npos);
  CHECK(v.find_first_not_of("0123456789.") == std::string::npos);
  CHECK(fs::exists(fs::path(find_cuda_include_dir()) / "cuda_fp16.h"));
  CHECK_THROWS_WITH(NvrtcCompiler("/nonexistent/cuda"), Catch::Contains("cuda_bf16.h"));
}
