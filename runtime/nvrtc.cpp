#include "runtime/nvrtc.h"

#include <fmt/format.h>
#include <nvrtc.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string_view>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "dsl/error.h"
#include "kernels_templates/embedded.h"
#include "runtime/log.h"

#ifndef FLEXJIT_CUDA_HOME
#define FLEXJIT_CUDA_HOME ""
#endif

namespace flexjit::runtime {
namespace fs = std::filesystem;
namespace {

void check_nvrtc(nvrtcResult result, const char* what) {
  if (result != NVRTC_SUCCESS)
    throw Error(fmt::format("{} failed: {}", what, nvrtcGetErrorString(result)));
}

// Owns one nvrtcProgram; destroying it cannot throw.
class Program {
 public:
  Program() = default;
  Program(const Program&) = delete;
  Program& operator=(const Program&) = delete;
  ~Program() {
    if (prog_) nvrtcDestroyProgram(&prog_);
  }
  nvrtcProgram* out() { return &prog_; }
  nvrtcProgram get() const { return prog_; }

 private:
  nvrtcProgram prog_ = nullptr;
};

std::string program_log(nvrtcProgram prog) {
  size_t size = 0;
  if (nvrtcGetProgramLogSize(prog, &size) != NVRTC_SUCCESS || size == 0) return {};
  std::string log(size, '\0');
  if (nvrtcGetProgramLog(prog, log.data()) != NVRTC_SUCCESS) return {};
  while (!log.empty() && (log.back() == '\0' || log.back() == '\n')) log.pop_back();
  return log;
}

bool has_cuda_headers(const fs::path& include_dir) {
  std::error_code ec;
  return fs::is_regular_file(include_dir / "cuda_bf16.h", ec);
}

// The number that ends right before `suffix` in `line` ("1024 bytes smem" -> 1024), or -1.
int number_before(std::string_view line, std::string_view suffix) {
  size_t at = line.find(suffix);
  if (at == std::string_view::npos) return -1;
  size_t end = at;
  while (end > 0 && line[end - 1] == ' ') --end;
  size_t begin = end;
  while (begin > 0 && line[begin - 1] >= '0' && line[begin - 1] <= '9') --begin;
  if (begin == end) return -1;
  return std::atoi(std::string(line.substr(begin, end - begin)).c_str());
}

// Reads ptxas' -v report out of the log. The format is ptxas' human-readable text, so anything
// unrecognised is skipped rather than treated as an error.
std::vector<KernelResources> parse_resources(const std::string& log) {
  std::vector<KernelResources> out;
  size_t pos = 0;
  while (pos < log.size()) {
    size_t eol = log.find('\n', pos);
    if (eol == std::string::npos) eol = log.size();
    std::string_view line(log.data() + pos, eol - pos);
    pos = eol + 1;
    if (line.rfind("ptxas", 0) != 0) continue;
    constexpr std::string_view kEntry = "Compiling entry function '";
    if (size_t at = line.find(kEntry); at != std::string_view::npos) {
      size_t begin = at + kEntry.size();
      size_t end = line.find('\'', begin);
      if (end == std::string_view::npos) continue;
      KernelResources r;
      r.name = std::string(line.substr(begin, end - begin));
      out.push_back(std::move(r));
      continue;
    }
    if (out.empty()) continue;
    KernelResources& r = out.back();
    if (line.find("stack frame") != std::string_view::npos) {
      r.stack_bytes = number_before(line, " bytes stack frame");
      r.spill_store_bytes = number_before(line, " bytes spill stores");
      r.spill_load_bytes = number_before(line, " bytes spill loads");
    } else if (line.find(" registers") != std::string_view::npos) {
      r.registers = number_before(line, " registers");
      r.barriers = number_before(line, " barriers");
      int smem = number_before(line, " bytes smem");
      r.shared_bytes = smem < 0 ? 0 : smem;  // ptxas omits smem when it is zero
    }
  }
  return out;
}

std::string temp_dir() {
  const char* tmp = std::getenv("TMPDIR");
  return tmp && *tmp ? tmp : "/tmp";
}

// Writes the failing source where the user can compile it again; returns the path, or a note
// saying why it could not be written (the error message must still be produced).
std::string dump_failed_source(const NvrtcRequest& request, const std::vector<std::string>& options) {
  XXH64_hash_t h = XXH3_64bits(request.source.data(), request.source.size());
  for (const std::string& o : options) h = XXH3_64bits_withSeed(o.data(), o.size(), h);
  fs::path path = fs::path(temp_dir()) / fmt::format("flexjit-failed-{:016x}.cu", h);
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (f) f.write(request.source.data(), static_cast<std::streamsize>(request.source.size()));
  f.close();
  if (!f) return fmt::format("(could not write the source to {})", path.string());
  return path.string();
}

}  // namespace

std::string find_cuda_include_dir() {
  std::vector<std::string> tried;
  auto try_home = [&](const char* home) -> std::string {
    if (!home || !*home) return {};
    fs::path dir = fs::path(home) / "include";
    tried.push_back(dir.string());
    return has_cuda_headers(dir) ? dir.string() : std::string();
  };
  const char* homes[] = {std::getenv("CUDA_HOME"), std::getenv("CUDA_PATH"), FLEXJIT_CUDA_HOME, "/usr/local/cuda"};
  for (const char* home : homes) {
    std::string dir = try_home(home);
    if (!dir.empty()) return dir;
  }
  std::string list;
  for (const std::string& t : tried) list += fmt::format("\n  {}", t);
  throw Error(fmt::format(
      "the CUDA headers NVRTC needs (cuda_bf16.h, cuda_fp16.h) were not found; looked in:{}\n"
      "Install the CUDA 13 toolkit or set CUDA_HOME to its root (the directory holding include/).",
      list));
}

NvrtcCompiler::NvrtcCompiler() : NvrtcCompiler(std::string()) {}

NvrtcCompiler::NvrtcCompiler(const std::string& cuda_home) {
  if (cuda_home.empty()) {
    include_dir_ = find_cuda_include_dir();
  } else {
    fs::path dir = fs::path(cuda_home) / "include";
    if (!has_cuda_headers(dir))
      throw Error(fmt::format("{} has no cuda_bf16.h: {} is not a CUDA toolkit root", dir.string(), cuda_home));
    include_dir_ = dir.string();
  }
  include_options_.push_back("-I" + include_dir_);
  // CUDA 13 keeps libcu++ (cuda/std/...), CUB and Thrust in include/cccl.
  std::error_code ec;
  if (fs::is_directory(fs::path(include_dir_) / "cccl", ec))
    include_options_.push_back("-I" + (fs::path(include_dir_) / "cccl").string());
}

std::vector<std::string> NvrtcCompiler::effective_options(const NvrtcRequest& request) const {
  parse_arch(request.arch);
  std::vector<std::string> options = {"-default-device", "--std=c++17"};
  options.insert(options.end(), include_options_.begin(), include_options_.end());
  options.push_back("--gpu-architecture=" + request.arch);
  if (request.report_resources) options.push_back("-Xptxas=-v");
  options.insert(options.end(), request.options.begin(), request.options.end());
  return options;
}

NvrtcOutput NvrtcCompiler::compile(const std::string& source, const std::string& program_name,
                                   const std::vector<NvrtcHeader>& headers,
                                   const std::vector<std::string>& options, const std::string& arch) const {
  NvrtcRequest request;
  request.source = source;
  request.program_name = program_name;
  request.headers = headers;
  request.options = options;
  request.arch = arch;
  return compile(request);
}

NvrtcOutput NvrtcCompiler::compile(const NvrtcRequest& request) const {
  const std::vector<std::string> options = effective_options(request);
  auto start = std::chrono::steady_clock::now();

  // Extra headers first, then every embedded template the request did not replace.
  std::vector<const char*> header_names, header_texts;
  for (const NvrtcHeader& h : request.headers) {
    header_names.push_back(h.name.c_str());
    header_texts.push_back(h.text.c_str());
  }
  if (request.embedded_templates) {
    for (const templates::EmbeddedHeader& h : templates::all()) {
      bool replaced = std::any_of(request.headers.begin(), request.headers.end(),
                                  [&](const NvrtcHeader& x) { return x.name == h.name; });
      if (replaced) continue;
      header_names.push_back(h.name);
      header_texts.push_back(h.text);
    }
  }

  Program prog;
  check_nvrtc(nvrtcCreateProgram(prog.out(), request.source.c_str(), request.program_name.c_str(),
                                 static_cast<int>(header_names.size()), header_texts.data(), header_names.data()),
              "nvrtcCreateProgram");
  for (const std::string& expr : request.name_expressions)
    check_nvrtc(nvrtcAddNameExpression(prog.get(), expr.c_str()), "nvrtcAddNameExpression");

  std::vector<const char*> option_ptrs;
  for (const std::string& o : options) option_ptrs.push_back(o.c_str());
  nvrtcResult result = nvrtcCompileProgram(prog.get(), static_cast<int>(option_ptrs.size()), option_ptrs.data());

  NvrtcOutput out;
  out.log = program_log(prog.get());
  if (result != NVRTC_SUCCESS) {
    std::string dumped = dump_failed_source(request, options);
    std::string joined;
    for (const std::string& o : options) joined += (joined.empty() ? "" : " ") + o;
    throw Error(fmt::format(
        "NVRTC could not compile {} for {}: {}\n{}\n"
        "The source was written to {}\nOptions: {}",
        request.program_name, request.arch, nvrtcGetErrorString(result),
        out.log.empty() ? "(NVRTC wrote no log)" : out.log, dumped, joined));
  }

  size_t cubin_size = 0;
  check_nvrtc(nvrtcGetCUBINSize(prog.get(), &cubin_size), "nvrtcGetCUBINSize");
  if (cubin_size == 0)
    throw Error(fmt::format("NVRTC produced no cubin for {} ({}): the architecture must be a real one "
                            "(sm_XX or sm_XXa), not a virtual compute_XX",
                            request.program_name, request.arch));
  out.cubin.resize(cubin_size);
  check_nvrtc(nvrtcGetCUBIN(prog.get(), reinterpret_cast<char*>(out.cubin.data())), "nvrtcGetCUBIN");

  if (request.want_ptx) {
    size_t ptx_size = 0;
    check_nvrtc(nvrtcGetPTXSize(prog.get(), &ptx_size), "nvrtcGetPTXSize");
    out.ptx.assign(ptx_size, '\0');
    if (ptx_size) check_nvrtc(nvrtcGetPTX(prog.get(), out.ptx.data()), "nvrtcGetPTX");
    while (!out.ptx.empty() && out.ptx.back() == '\0') out.ptx.pop_back();
  }

  for (const std::string& expr : request.name_expressions) {
    const char* lowered = nullptr;
    check_nvrtc(nvrtcGetLoweredName(prog.get(), expr.c_str(), &lowered), "nvrtcGetLoweredName");
    out.lowered_names.emplace_back(expr, lowered ? lowered : "");
  }
  if (request.report_resources) out.resources = parse_resources(out.log);
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  log_info("NVRTC compiled {} for {} in {:.3f} s ({} bytes of cubin)", request.program_name, request.arch,
           out.seconds, out.cubin.size());
  for (const KernelResources& r : out.resources) {
    if (r.spill_store_bytes > 0)
      log_warn("kernel {} ({}) spills {} bytes of registers to local memory; it will run slower", r.name,
               request.arch, r.spill_store_bytes);
  }
  // ptxas C7520 / C7511: one wgmma under a run-time condition, or short of registers for the wgmma pipeline, makes
  // it serialise every wgmma of the kernel (the Hopper kernels lose their GEMM overlap).
  if (out.log.find("wgmma.mma_async instructions are serialized") != std::string::npos)
    log_warn("kernel {} ({}): ptxas serialises its wgmma instructions; it will run slower", request.program_name, request.arch);
  if (log_enabled(LogLevel::debug) && !out.log.empty()) log_debug("NVRTC log for {}:\n{}", request.program_name, out.log);
  return out;
}

std::string nvrtc_version() {
  int major = 0, minor = 0;
  check_nvrtc(nvrtcVersion(&major, &minor), "nvrtcVersion");
  return fmt::format("{}.{}", major, minor);
}

std::vector<int> nvrtc_supported_archs() {
  int count = 0;
  check_nvrtc(nvrtcGetNumSupportedArchs(&count), "nvrtcGetNumSupportedArchs");
  std::vector<int> archs(static_cast<size_t>(count));
  if (count > 0) check_nvrtc(nvrtcGetSupportedArchs(archs.data()), "nvrtcGetSupportedArchs");
  return archs;
}

std::string arch_for_compute_capability(int major, int minor) {
  if (major <= 0 || minor < 0 || minor > 9)
    throw Error(fmt::format("compute capability {}.{} is not a valid GPU architecture", major, minor));
  return fmt::format("sm_{}{}{}", major, minor, major >= 9 ? "a" : "");
}

int parse_arch(const std::string& arch, std::string* suffix) {
  auto bad = [&]() {
    return Error(fmt::format("'{}' is not a GPU architecture NVRTC can build a cubin for: write sm_<N> or "
                             "sm_<N>a, e.g. sm_80 (A100) or sm_90a (H100)",
                             arch));
  };
  if (arch.rfind("sm_", 0) != 0 || arch.size() < 5) throw bad();
  size_t i = 3;
  int number = 0;
  while (i < arch.size() && arch[i] >= '0' && arch[i] <= '9' && i < 7) number = number * 10 + (arch[i++] - '0');
  if (i == 3) throw bad();
  std::string rest = arch.substr(i);
  if (!rest.empty() && rest != "a" && rest != "f") throw bad();
  std::vector<int> supported = nvrtc_supported_archs();
  if (std::find(supported.begin(), supported.end(), number) == supported.end()) {
    std::string list;
    for (int s : supported) list += fmt::format("{}sm_{}", list.empty() ? "" : ", ", s);
    throw Error(fmt::format("NVRTC {} cannot compile for {}; it supports {}", nvrtc_version(), arch, list));
  }
  if (suffix) *suffix = rest;
  return number;
}

}  // namespace flexjit::runtime
