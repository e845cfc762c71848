// NVRTC: compiles generated CUDA source, with the embedded kernel templates, to a cubin for one GPU architecture.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace flexjit::runtime {

// An in-memory header NVRTC resolves `#include "name"` / `#include <name>` to.
struct NvrtcHeader {
  std::string name;
  std::string text;
};

// What ptxas reported for one entry function (-Xptxas=-v); -1 where it said nothing.
struct KernelResources {
  std::string name;            // the entry's mangled name, as cuLibraryGetKernel wants it
  int registers = -1;          // per thread
  int shared_bytes = -1;       // static shared memory per block (dynamic comes on top)
  int stack_bytes = -1;        // stack frame per thread
  int spill_store_bytes = -1;  // non-zero means the kernel spills registers: worth a warning
  int spill_load_bytes = -1;
  int barriers = -1;
};

struct NvrtcRequest {
  std::string source;                           // the translation unit
  std::string program_name = "flexjit_kernel.cu";  // the file name NVRTC's log uses
  std::string arch;                             // "sm_90a", "sm_80": see arch_for_compute_capability
  std::vector<std::string> options;             // on top of the defaults, e.g. "-DFOO=1"
  std::vector<NvrtcHeader> headers;             // extra headers; one named like a template replaces it
  bool embedded_templates = true;               // also offer kernels_templates/*.cuh
  // Expressions naming __global__ templates ("flex_fwd<Variant, 128>") whose mangled names
  // compile() reports, so a templated kernel needs no extern "C" wrapper.
  std::vector<std::string> name_expressions;
  bool report_resources = true;                 // ask ptxas for register / shared memory use
  bool want_ptx = false;                        // also return the PTX (for `flexjit dump --emit=ptx`)
};

struct NvrtcOutput {
  std::vector<std::uint8_t> cubin;  // an ELF image for exactly request.arch
  std::string ptx;                  // the intermediate PTX, only when request.want_ptx
  std::string log;                  // NVRTC's log: warnings and ptxas' report; may be empty
  double seconds = 0;               // wall time of the compile
  std::vector<std::pair<std::string, std::string>> lowered_names;  // name expression -> mangled name
  std::vector<KernelResources> resources;                           // one per entry function
};

// Compiles CUDA C++ to cubins. Immutable after construction; compile() may be called from
// several threads at once.
class NvrtcCompiler {
 public:
  // Finds the CUDA headers (cuda_bf16.h) via find_cuda_include_dir(); throws flexjit::Error
  // saying where it looked when they are missing.
  NvrtcCompiler();
  // Uses `<cuda_home>/include`; throws flexjit::Error when cuda_bf16.h is not there.
  explicit NvrtcCompiler(const std::string& cuda_home);

  // Compiles `request` into a cubin. Always passes -default-device, --std=c++17,
  // -I<cuda include>, --gpu-architecture=<arch>. On a compile error throws flexjit::Error with
  // NVRTC's log and the path of the source written to $TMPDIR (or /tmp) as
  // flexjit-failed-<hash>.cu, so it can be reproduced.
  NvrtcOutput compile(const NvrtcRequest& request) const;

  // The same as compile() with the embedded templates plus `headers`.
  NvrtcOutput compile(const std::string& source, const std::string& program_name,
                      const std::vector<NvrtcHeader>& headers, const std::vector<std::string>& options,
                      const std::string& arch) const;

  // Exactly the options compile(request) passes to NVRTC, in order. A cache key must include
  // them (sorted) because each can change the cubin.
  std::vector<std::string> effective_options(const NvrtcRequest& request) const;

  const std::string& cuda_include_dir() const { return include_dir_; }

 private:
  std::string include_dir_;
  std::vector<std::string> include_options_;
};

// The directory holding cuda_bf16.h: $CUDA_HOME/include, else $CUDA_PATH/include, else the
// toolkit this library was built against (FLEXJIT_CUDA_HOME), else /usr/local/cuda/include.
// Throws flexjit::Error naming every place it looked.
std::string find_cuda_include_dir();

// "13.0": part of every cache key, because a new NVRTC may generate different code.
std::string nvrtc_version();

// The SM numbers NVRTC can target, e.g. {75, 80, 86, 87, 89, 90, 100, 120}.
std::vector<int> nvrtc_supported_archs();

// The architecture to compile for on a device of compute capability major.minor: sm_80, sm_86,
// sm_89 below Hopper; from Hopper on the architecture-specific form (sm_90a, sm_100a) whose
// cubin runs only on exactly that compute capability but may use wgmma / tcgen05.
std::string arch_for_compute_capability(int major, int minor);

// Splits "sm_90a" into 90 and "a"; throws flexjit::Error for anything else ("compute_90", "90").
int parse_arch(const std::string& arch, std::string* suffix = nullptr);

}  // namespace flexjit::runtime
