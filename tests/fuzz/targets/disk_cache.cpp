// Disk-cache entries (files under $FLEXJIT_CACHE_DIR that any process may have written or
// damaged): whatever a file holds, DiskCache::load returns an artefact only for an intact entry
// of exactly the requested key (checksum, lengths, key text, JSON blob) and otherwise misses
// and removes the file; list() describes it without failing.
//
// Input: one flags byte, then the file. Flag 1: write the requested key's text into the key
// field (and its length into the header); flag 2: recompute the checksum. Both let the fuzzer
// reach the JSON blob and the binary behind the checks a random file fails.
#include <stdlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "fuzz/targets/targets.h"
#include "runtime/disk_cache.h"

namespace flexjit::fuzz {

namespace {

namespace fs = std::filesystem;
constexpr size_t kHeaderBytes = 40;  // magic 8, format 4, schema 4, key, JSON and binary lengths 8 each
constexpr size_t kKeyLengthAt = 16;

// A cache directory for this process, removed at exit.
struct FuzzCache {
  fs::path root;
  runtime::DiskCache cache;
  runtime::CacheKey key;
  FuzzCache() : root(make_dir()), cache(root), key(runtime::CacheKeyBuilder().arch("sm_90a").nvrtc_version("13.0").set("fuzz", "disk-cache").build()) {}
  ~FuzzCache() {
    std::error_code ec;
    fs::remove_all(root, ec);
  }
  static fs::path make_dir() {
    std::string pattern = (fs::temp_directory_path() / "flexjit-fuzz-cache-XXXXXX").string();
    if (!::mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed");
    return pattern;
  }
};

void put_le64(std::vector<uint8_t>& b, size_t at, uint64_t v) {
  for (int i = 0; i < 8; ++i) b[at + i] = static_cast<uint8_t>(v >> (8 * i));
}

uint64_t get_le64(const std::vector<uint8_t>& b, size_t at) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(b[at + i]) << (8 * i);
  return v;
}

// The input's file with the requested fixes applied.
std::vector<uint8_t> entry_file(const uint8_t* data, size_t size, const std::string& key_text) {
  std::vector<uint8_t> file(data + 1, data + size);
  const uint8_t flags = data[0];
  if ((flags & 1) && file.size() >= kHeaderBytes) {
    uint64_t old_len = std::min<uint64_t>(get_le64(file, kKeyLengthAt), file.size() - kHeaderBytes);
    file.erase(file.begin() + kHeaderBytes, file.begin() + kHeaderBytes + static_cast<std::ptrdiff_t>(old_len));
    file.insert(file.begin() + kHeaderBytes, key_text.begin(), key_text.end());
    put_le64(file, kKeyLengthAt, key_text.size());
  }
  if ((flags & 2) && file.size() >= 8) put_le64(file, file.size() - 8, XXH3_64bits(file.data(), file.size() - 8));
  return file;
}

}  // namespace

std::string run_disk_cache(const uint8_t* data, size_t size) {
  if (size == 0) return "";
  static FuzzCache fc;
  try {
    const std::vector<uint8_t> file = entry_file(data, size, fc.key.text());
    const fs::path path = fc.cache.entry_path(fc.key);
    fs::create_directories(path.parent_path());
    {
      std::ofstream out(path, std::ios::binary | std::ios::trunc);
      out.write(reinterpret_cast<const char*>(file.data()), static_cast<std::streamsize>(file.size()));
      if (!out) return "cannot write the entry file";
    }
    std::vector<runtime::DiskCacheEntry> listed = fc.cache.list();
    if (listed.size() != 1) return "list() shows " + std::to_string(listed.size()) + " entries for one file";
    std::optional<runtime::CompiledArtefact> a = fc.cache.load(fc.key);
    const bool on_disk = fs::exists(path);
    if (!a) {
      if (listed[0].valid) return "list() calls the entry valid but load() misses";
      if (on_disk) return "load() missed but left the unusable entry on disk";
      return "";
    }
    if (!on_disk) return "load() returned an artefact and removed its entry";
    if (!listed[0].valid) return "load() returned an artefact for an entry list() calls invalid: " + listed[0].problem;
    if (file.size() < kHeaderBytes + 8 || std::memcmp(file.data(), "FLEXJITK", 8) != 0) return "load() accepted a file without the header";
    if (get_le64(file, file.size() - 8) != XXH3_64bits(file.data(), file.size() - 8)) return "load() accepted a bad checksum";
    const uint64_t key_len = get_le64(file, kKeyLengthAt);
    if (key_len != fc.key.text().size() || std::memcmp(file.data() + kHeaderBytes, fc.key.text().data(), key_len) != 0)
      return "load() accepted an entry of another key";
    const uint64_t bin_len = get_le64(file, 32);
    if (a->binary.size() != bin_len ||
        (bin_len && std::memcmp(a->binary.data(), file.data() + file.size() - 8 - bin_len, bin_len) != 0))
      return "load() returned a binary that is not the entry's";
    if (listed[0].entries != a->entries || listed[0].key_text != fc.key.text()) return "list() and load() disagree about the entry";
    fs::remove(path);
  } catch (const std::exception& e) {
    return std::string("unexpected exception: ") + e.what();
  }
  return "";
}

}  // namespace flexjit::fuzz
