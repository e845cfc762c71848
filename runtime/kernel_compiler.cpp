#include "runtime/kernel_compiler.h"

#include <fmt/format.h>

#include "runtime/log.h"

namespace flexjit::runtime {

namespace {
NvrtcRequest request_for(const KernelSource& ks, const std::string& arch) {
  NvrtcRequest req;
  req.source = ks.source;
  req.program_name = ks.name + ".cu";
  req.arch = arch;
  return req;
}
}  // namespace

CacheKey kernel_cache_key(const KernelSource& ks, const std::string& canonical_ir, const std::string& arch) {
  static const NvrtcCompiler compiler;
  NvrtcRequest req = request_for(ks, arch);
  return CacheKeyBuilder()
      .set("kernel", ks.name)
      .set("ir", canonical_ir)
      .set("specialisation", ks.key_text)
      .set("source_xxh3", xxh3_128_hex(ks.source.data(), ks.source.size()))
      .arch(arch)
      .nvrtc_version(nvrtc_version())
      .options(compiler.effective_options(req))
      .entries(ks.entries)
      .build();
}

CacheLookup compile_kernel(const KernelSource& ks, const std::string& canonical_ir, const std::string& arch, KernelCache& cache) {
  CacheKey key = kernel_cache_key(ks, canonical_ir, arch);
  return cache.get_or_compile(key, [&] {
    static const NvrtcCompiler compiler;
    NvrtcOutput out = compiler.compile(request_for(ks, arch));
    return make_artefact(out, ks.entries);
  });
}

}  // namespace flexjit::runtime
