// Ring attention's device module (kernels_templates/flex_ring.cuh through runtime/ring_kernels.h) compiles through NVRTC
// for sm_80 and sm_90a without a GPU: both entries present, no spills, no stack; and its cache key does not change
// between calls (one compile per architecture).
#include <catch2/catch.hpp>

#include <cstdio>

#include "runtime/kernel_compiler.h"
#include "runtime/ring_kernels.h"

using namespace flexjit;

TEST_CASE("ring kernels compile through NVRTC for sm_80 and sm_90a", "[nvrtc][ring]") {
  const KernelSource ks = runtime::ring_kernel_source();
  REQUIRE(ks.entries.size() == 2);
  for (const char* arch : {"sm_80", "sm_90a"}) {
    INFO(ks.name << " for " << arch);
    CHECK(runtime::kernel_cache_key(ks, runtime::kRingModuleIr, arch).hash() ==
          runtime::kernel_cache_key(runtime::ring_kernel_source(), runtime::kRingModuleIr, arch).hash());
    const runtime::CacheLookup r = runtime::compile_kernel(ks, runtime::kRingModuleIr, arch);
    REQUIRE(r.artefact);
    REQUIRE(r.artefact->binary.size() > 1000);
    CHECK(r.artefact->binary[0] == 0x7f);  // an ELF cubin
    const nlohmann::json& res = r.artefact->metadata.value("resources", nlohmann::json::object());
    for (const char* entry : {runtime::kRingCopyEntry, runtime::kRingMergeEntry}) {
      INFO(entry);
      REQUIRE(res.contains(entry));
      const nlohmann::json& e = res[entry];
      std::printf("%-20s %-7s regs %3d spill %3d stack %3d\n", entry, arch, e.value("registers", -1), e.value("spill_store_bytes", -1),
                  e.value("stack_bytes", -1));
      CHECK(e.value("spill_store_bytes", -1) == 0);
      CHECK(e.value("stack_bytes", -1) == 0);
    }
  }
}
