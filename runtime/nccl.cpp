#include "runtime/nccl.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <cstdlib>

#include "dsl/error.h"

namespace flexjit::runtime {
namespace {

// ncclSend / ncclRecv came with 2.7, ncclBfloat16 with 2.10: older libraries lack what the ring sends.
constexpr int kMinVersion = 21000;

}  // namespace

NcclLoad load_nccl(const std::string& path) {
  NcclLoad out;
  out.nccl.path = path;
  // Never dlclose'd, like the driver: communicators may outlive any owner we could give the handle.
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* why = dlerror();
    out.reason = fmt::format(
        "NCCL is not available: dlopen(\"{}\") failed ({}). Multi-GPU ring attention needs NCCL 2.10 or later: install it "
        "(the libnccl2 package, or the nvidia-nccl-cu13 wheel that PyTorch brings) where the loader finds libnccl.so.2, or "
        "set FLEXJIT_NCCL_LIBRARY to the library's path",
        out.nccl.path, why ? why : "unknown reason");
    return out;
  }
#define FLEXJIT_NCCL_RESOLVE(name, ret, params)                                                                        \
  out.nccl.name = reinterpret_cast<ret(*) params>(dlsym(lib, #name));                                                  \
  if (!out.nccl.name) {                                                                                                \
    out.reason = fmt::format("{} has no entry point {}: it is not NCCL 2.10 or later; point FLEXJIT_NCCL_LIBRARY at " \
                             "a newer libnccl.so.2",                                                                   \
                             out.nccl.path, #name);                                                                    \
    return out;                                                                                                        \
  }
  FLEXJIT_NCCL_ENTRY_POINTS(FLEXJIT_NCCL_RESOLVE)
#undef FLEXJIT_NCCL_RESOLVE
  if (out.nccl.ncclGetVersion(&out.nccl.version) != 0 || out.nccl.version < kMinVersion) {
    out.reason = fmt::format("{} is NCCL {}; multi-GPU ring attention needs 2.10 or later (ncclSend, ncclRecv and bf16)",
                             out.nccl.path, out.nccl.version);
    return out;
  }
  out.ok = true;
  return out;
}

namespace {

const NcclLoad& loaded() {
  static const NcclLoad l = [] {
    const char* env = std::getenv("FLEXJIT_NCCL_LIBRARY");
    return load_nccl(env && *env ? env : "libnccl.so.2");
  }();
  return l;
}

}  // namespace

const Nccl& nccl() {
  const NcclLoad& l = loaded();
  if (!l.ok) throw Error(l.reason);
  return l.nccl;
}

bool nccl_available(std::string* why) {
  const NcclLoad& l = loaded();
  if (!l.ok && why) *why = l.reason;
  return l.ok;
}

void check_nccl(int result, const char* what) {
  if (result == 0) return;
  check_nccl(nccl(), result, what);
}

void check_nccl(const Nccl& library, int result, const char* what) {
  if (result == 0) return;
  const char* text = library.ncclGetErrorString(result);
  throw Error(fmt::format("NCCL failed {}: {} (ncclResult_t {})", what, text ? text : "no description", result));
}

}  // namespace flexjit::runtime
