// The in-memory kernel cache in front of the disk cache: each key is compiled at most once per process.
#pragma once
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/cache_key.h"
#include "runtime/disk_cache.h"
#include "runtime/nvrtc.h"

namespace flexjit::runtime {

// Where a lookup's artefact came from.
enum class CacheSource { memory, disk, compiled };
const char* cache_source_name(CacheSource source);  // "memory", "disk", "compiled"

struct CacheLookup {
  std::shared_ptr<const CompiledArtefact> artefact;  // never null
  CacheSource source = CacheSource::memory;
  double seconds = 0;  // time this call took, waiting for another thread's compile included
};

// Maps key hash -> artefact. Concurrent requests for one key share one compile (single flight):
// the first caller compiles (through the disk cache, which does the same across processes) and
// the others wait for its result. A failed compile is reported to every waiter and not cached,
// so the next request tries again. Thread-safe.
class KernelCache {
 public:
  using CompileFn = std::function<CompiledArtefact()>;

  // `disk` may be null: memory only.
  explicit KernelCache(std::shared_ptr<DiskCache> disk = nullptr);
  KernelCache(const KernelCache&) = delete;
  KernelCache& operator=(const KernelCache&) = delete;

  // The artefact for `key`: from memory, else the disk cache, else `compile()`. Exceptions
  // from `compile` reach every caller waiting on that key.
  CacheLookup get_or_compile(const CacheKey& key, const CompileFn& compile);

  // The artefact if it is in memory and ready; null otherwise. Never compiles or touches the disk.
  std::shared_ptr<const CompiledArtefact> find(const CacheKey& key) const;

  // Forgets `key` here and on disk: for an artefact the driver refused to load. Holders of the
  // old artefact keep it; the next get_or_compile compiles again.
  void invalidate(const CacheKey& key);

  std::size_t size() const;  // keys held in memory, compiles in flight included
  void clear();              // empties memory only; the disk keeps its entries

  DiskCache* disk() const { return disk_.get(); }

 private:
  struct Slot;
  CacheLookup compile_without_sharing(const CacheKey& key, const CompileFn& compile);

  std::shared_ptr<DiskCache> disk_;
  mutable std::mutex mutex_;
  std::unordered_map<std::string, std::shared_ptr<Slot>> slots_;  // by key hash
};

// The process-wide cache over DiskCache(DiskCache::default_root()), created on first use and
// never destroyed (kernels may be released during static destruction).
KernelCache& process_kernel_cache();

// Packs an NVRTC result into an artefact. `entries` are the names to look kernels up by; when
// empty they are the lowered names of the name expressions, or else every entry ptxas reported.
// metadata gets "resources" (per entry: registers, shared_bytes, stack_bytes, spill_store_bytes,
// spill_load_bytes, barriers), "lowered_names", "compile_seconds" and "nvrtc_log".
CompiledArtefact make_artefact(const NvrtcOutput& output, std::vector<std::string> entries = {});

}  // namespace flexjit::runtime
