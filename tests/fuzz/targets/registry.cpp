// The list of fuzz targets, by corpus name (the C API target only where the CPU backend is built).
#include "fuzz/targets/targets.h"

namespace flexjit::fuzz {

const std::vector<Target>& all_targets() {
  static const std::vector<Target> targets = {
      {"frontend", run_frontend},
      {"spec_json", run_spec_json},
      {"npy", run_npy},
      {"disk_cache", run_disk_cache},
#ifdef FLEXJIT_HAVE_CPU_BACKEND
      {"capi", run_capi},
#endif
  };
  return targets;
}

}  // namespace flexjit::fuzz
