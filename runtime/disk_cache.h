// The on-disk kernel cache: one file per key under $FLEXJIT_CACHE_DIR, shared safely by processes.
#pragma once
#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/cache_key.h"

namespace flexjit::runtime {

// What a compile produces and a cache keeps: the binary plus what a launcher needs to use it.
struct CompiledArtefact {
  std::vector<std::uint8_t> binary;  // the cubin (ELF) for the key's architecture
  std::vector<std::string> entries;  // the kernels' (mangled) names, for cuLibraryGetKernel
  // Free-form facts kept with the binary, e.g. {"resources": {<entry>: {"registers": 128,
  // "shared_bytes": 0, ...}}, "compile_seconds": 1.2, "lowered_names": {...}}.
  nlohmann::json metadata = nlohmann::json::object();
};

// One file of the cache, as `flexjit cache ls` shows it.
struct DiskCacheEntry {
  std::filesystem::path path;
  std::string arch;                  // the directory it sits in, e.g. "sm_90a"
  std::string hash;                  // the key hash (file name without .bin)
  std::uint64_t size_bytes = 0;
  std::int64_t mtime_unix = 0;       // seconds since the epoch
  bool valid = false;                // header, lengths and checksum check out
  std::string problem;               // why it is not valid
  std::string key_text;              // the full key text (valid entries only)
  std::vector<std::string> entries;  // entry names (valid entries only)
  nlohmann::json metadata;           // (valid entries only)
};

struct DiskCacheInfo {
  std::filesystem::path root;
  std::size_t entries = 0;      // *.bin files
  std::uint64_t total_bytes = 0;
  bool writable = true;         // false once this process fell back to memory only
};

struct DiskLookup {
  CompiledArtefact artefact;
  bool hit = false;       // found on disk (possibly after waiting for another process's compile)
  double seconds = 0;     // time spent, compile included
};

// Layout: <root>/v1/<arch>/<first two hex digits>/<hash>.bin holding a header (magic, format
// version, key schema, lengths), the full key text, a JSON blob (entry names and metadata),
// the binary, and an XXH3-64 checksum of everything before it.
//
// Concurrency: writers write a temporary file in the entry's directory and rename it over the
// entry, so readers never lock and never see half a file. get_or_compile takes a per-key lock
// file (flock), so processes and threads asking for one key compile it once.
// Failure: an entry that is truncated, corrupt, of another format or another key (a hash
// collision or a stale file) is a miss: it is removed and recompiled. When the directory cannot
// be written (read-only, full, not a directory) the cache warns once and carries on without
// storing; everything still works, only later processes compile again.
// All methods are thread-safe.
class DiskCache {
 public:
  // The format version: the "v1" directory level.
  static constexpr std::uint32_t kFormatVersion = 1;

  // $FLEXJIT_CACHE_DIR, else $XDG_CACHE_HOME/flexjit, else ~/.cache/flexjit.
  static std::filesystem::path default_root();

  explicit DiskCache(std::filesystem::path root = default_root());

  const std::filesystem::path& root() const { return root_; }
  bool writable() const { return writable_.load(std::memory_order_relaxed); }

  // Where `key`'s entry lives. Throws flexjit::Error when the key has no architecture.
  std::filesystem::path entry_path(const CacheKey& key) const;

  // The entry for `key`, or nullopt. An unusable entry is removed (and reported at info level).
  std::optional<CompiledArtefact> load(const CacheKey& key) const;

  // Writes the entry atomically. Returns false when the cache is (or has just become) memory-only.
  bool store(const CacheKey& key, const CompiledArtefact& artefact);

  // Removes `key`'s entry, e.g. one the driver refused to load; the next lookup recompiles.
  void remove(const CacheKey& key) const;

  // load(); on a miss takes the key's lock, looks again (another process may have finished),
  // else runs `compile` and stores its result. Exceptions from `compile` propagate and store
  // nothing.
  DiskLookup get_or_compile(const CacheKey& key, const std::function<CompiledArtefact()>& compile);

  // Every entry, sorted by arch then hash; checks each one's checksum.
  std::vector<DiskCacheEntry> list() const;
  DiskCacheInfo info() const;
  // Removes every entry (and stale temporary and lock files); returns how many entries it removed.
  std::size_t clear();

 private:
  // Switches to memory-only and warns once per root.
  void degrade(const std::string& why);

  std::filesystem::path root_;
  std::atomic<bool> writable_{true};
};

// The entry's bytes for `key` and `artefact` (exposed for tests that corrupt entries on purpose).
std::vector<std::uint8_t> encode_cache_entry(const CacheKey& key, const CompiledArtefact& artefact);

}  // namespace flexjit::runtime
