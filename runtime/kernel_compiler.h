// Compiling assembled kernel sources through the caches: the key, NVRTC, and the lookup
// order memory -> disk -> compile. The one path every kernel family takes to a cubin.
#pragma once
#include <string>

#include "compiler/codegen/kernel_source.h"
#include "runtime/kernel_cache.h"

namespace flexjit::runtime {

// The complete cache key of a kernel for an architecture: schema and flexjit version,
// template hash (from CacheKeyBuilder), the canonical IR, every specialisation, a hash of
// the final source, the architecture, the NVRTC version and the options. Sequence lengths
// and batch sizes never reach it.
CacheKey kernel_cache_key(const KernelSource& ks, const std::string& canonical_ir, const std::string& arch);

// The cubin for `ks` on `arch`, compiled at most once per key across threads and processes.
CacheLookup compile_kernel(const KernelSource& ks, const std::string& canonical_ir, const std::string& arch,
                           KernelCache& cache = process_kernel_cache());

}  // namespace flexjit::runtime
