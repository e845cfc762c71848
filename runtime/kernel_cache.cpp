#include "runtime/kernel_cache.h"

#include <chrono>
#include <future>
#include <optional>

#include "runtime/log.h"

namespace flexjit::runtime {
namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

// One key's artefact, or the promise of it while the first requester compiles.
struct KernelCache::Slot {
  std::string key_text;  // compared on every hit: equal hashes of different keys must not share
  std::shared_future<std::shared_ptr<const CompiledArtefact>> artefact;
};

const char* cache_source_name(CacheSource source) {
  switch (source) {
    case CacheSource::memory: return "memory";
    case CacheSource::disk: return "disk";
    case CacheSource::compiled: return "compiled";
  }
  return "?";
}

KernelCache::KernelCache(std::shared_ptr<DiskCache> disk) : disk_(std::move(disk)) {}

CacheLookup KernelCache::get_or_compile(const CacheKey& key, const CompileFn& compile) {
  auto start = std::chrono::steady_clock::now();
  // Only the first requester makes a promise: a hit allocates nothing.
  std::optional<std::promise<std::shared_ptr<const CompiledArtefact>>> promise;
  std::shared_ptr<Slot> slot;
  bool owner = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = slots_.find(key.hash());
    if (it != slots_.end()) {
      slot = it->second;
    } else {
      promise.emplace();
      slot = std::make_shared<Slot>(Slot{key.text(), promise->get_future().share()});
      slots_.emplace(key.hash(), slot);
      owner = true;
    }
  }

  if (!owner) {
    if (slot->key_text != key.text()) {
      log_warn("kernel cache: two different keys share hash {}; compiling the second one without caching it in memory",
               key.hash());
      return compile_without_sharing(key, compile);
    }
    std::shared_ptr<const CompiledArtefact> artefact = slot->artefact.get();  // waits; rethrows a failed compile
    CacheLookup hit{std::move(artefact), CacheSource::memory, seconds_since(start)};
    log_debug("kernel cache: memory hit {} ({:.1f} us)", key.hash(), hit.seconds * 1e6);
    return hit;
  }

  CacheLookup result;
  try {
    if (disk_) {
      DiskLookup d = disk_->get_or_compile(key, compile);
      result.artefact = std::make_shared<const CompiledArtefact>(std::move(d.artefact));
      result.source = d.hit ? CacheSource::disk : CacheSource::compiled;
    } else {
      result.artefact = std::make_shared<const CompiledArtefact>(compile());
      result.source = CacheSource::compiled;
    }
  } catch (...) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = slots_.find(key.hash());
      if (it != slots_.end() && it->second == slot) slots_.erase(it);
    }
    promise->set_exception(std::current_exception());
    throw;
  }
  promise->set_value(result.artefact);
  result.seconds = seconds_since(start);
  if (result.source == CacheSource::disk)
    log_info("kernel cache: disk hit {} ({} bytes) in {:.1f} ms", key.hash(), result.artefact->binary.size(),
             result.seconds * 1e3);
  else
    log_info("kernel cache: miss {}, compiled in {:.3f} s", key.hash(), result.seconds);
  return result;
}

CacheLookup KernelCache::compile_without_sharing(const CacheKey& key, const CompileFn& compile) {
  auto start = std::chrono::steady_clock::now();
  CacheLookup result;
  if (disk_) {
    // The disk cache compares the full key text, so it cannot hand back the other key's entry.
    DiskLookup d = disk_->get_or_compile(key, compile);
    result.artefact = std::make_shared<const CompiledArtefact>(std::move(d.artefact));
    result.source = d.hit ? CacheSource::disk : CacheSource::compiled;
  } else {
    result.artefact = std::make_shared<const CompiledArtefact>(compile());
    result.source = CacheSource::compiled;
  }
  result.seconds = seconds_since(start);
  return result;
}

std::shared_ptr<const CompiledArtefact> KernelCache::find(const CacheKey& key) const {
  std::shared_ptr<Slot> slot;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = slots_.find(key.hash());
    if (it == slots_.end()) return nullptr;
    slot = it->second;
  }
  if (slot->key_text != key.text()) return nullptr;
  if (slot->artefact.wait_for(std::chrono::seconds(0)) != std::future_status::ready) return nullptr;
  try {
    return slot->artefact.get();
  } catch (...) {
    return nullptr;  // a failed compile; its requesters got the error
  }
}

void KernelCache::invalidate(const CacheKey& key) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = slots_.find(key.hash());
    if (it != slots_.end() && it->second->key_text == key.text()) slots_.erase(it);
  }
  if (disk_) disk_->remove(key);
  log_info("kernel cache: invalidated {}", key.hash());
}

std::size_t KernelCache::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return slots_.size();
}

void KernelCache::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  slots_.clear();
}

KernelCache& process_kernel_cache() {
  static KernelCache* cache = new KernelCache(std::make_shared<DiskCache>(DiskCache::default_root()));
  return *cache;
}

CompiledArtefact make_artefact(const NvrtcOutput& output, std::vector<std::string> entries) {
  CompiledArtefact a;
  a.binary = output.cubin;
  if (entries.empty()) {
    for (const auto& [expr, lowered] : output.lowered_names) entries.push_back(lowered);
    if (entries.empty())
      for (const KernelResources& r : output.resources) entries.push_back(r.name);
  }
  a.entries = std::move(entries);
  nlohmann::json resources = nlohmann::json::object();
  for (const KernelResources& r : output.resources) {
    resources[r.name] = {{"registers", r.registers},
                         {"shared_bytes", r.shared_bytes},
                         {"stack_bytes", r.stack_bytes},
                         {"spill_store_bytes", r.spill_store_bytes},
                         {"spill_load_bytes", r.spill_load_bytes},
                         {"barriers", r.barriers}};
  }
  nlohmann::json lowered = nlohmann::json::object();
  for (const auto& [expr, name] : output.lowered_names) lowered[expr] = name;
  a.metadata = {{"resources", std::move(resources)},
                {"lowered_names", std::move(lowered)},
                {"compile_seconds", output.seconds},
                {"nvrtc_log", output.log}};
  return a;
}

}  // namespace flexjit::runtime
