// Kernel cache keys: a canonical text of everything that determines a cubin, and its XXH3-128 hash.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace flexjit::runtime {

// Bump when the key text's layout or meaning changes, so old disk entries stop matching.
inline constexpr int kCacheKeySchema = 1;

// An immutable key: the canonical text (stored in each disk entry and compared on load, so a
// hash collision or a stale entry is a miss, never a wrong kernel) and its hash (which names
// the entry). Safe to share between threads.
class CacheKey {
 public:
  // One `name=value` per line, in a stable order (see CacheKeyBuilder::build).
  const std::string& text() const { return text_; }
  // XXH3-128 of text(), 32 lowercase hex digits.
  const std::string& hash() const { return hash_; }
  // The architecture field ("sm_90a"); empty when none was set. Picks the disk directory.
  const std::string& arch() const { return arch_; }

  bool operator==(const CacheKey& other) const { return text_ == other.text_; }

 private:
  friend class CacheKeyBuilder;
  std::string text_, hash_, arch_;
};

// Collects the fields of a key. The constructor adds what every key holds: the key schema
// (kCacheKeySchema), the flexjit version (FLEXJIT_VERSION) and the hash of the embedded kernel
// templates. The caller adds the rest: the canonical IR of each mod, specialisation constants
// that reach the source, entry names, architecture, NVRTC version, options. Sequence lengths
// and batch sizes are launch arguments and must not be added.
class CacheKeyBuilder {
 public:
  CacheKeyBuilder();

  // A scalar field. Names are [A-Za-z0-9_.-]+ (anything else throws flexjit::Error); setting a
  // name again replaces its value. Values may hold any bytes: newlines, backslashes and other
  // control characters are escaped so each field stays on one line.
  CacheKeyBuilder& set(const std::string& name, const std::string& value);
  CacheKeyBuilder& set(const std::string& name, const char* value) { return set(name, std::string(value)); }
  CacheKeyBuilder& set(const std::string& name, std::int64_t value);
  CacheKeyBuilder& set(const std::string& name, int value) { return set(name, static_cast<std::int64_t>(value)); }
  CacheKeyBuilder& set(const std::string& name, bool value) { return set(name, std::string(value ? "true" : "false")); }

  // A list field, written as `name[#]=<count>`, then `name[0]=...`, `name[1]=...` in the order given.
  CacheKeyBuilder& set_list(const std::string& name, std::vector<std::string> values);

  // Shorthands for the standard fields.
  CacheKeyBuilder& arch(const std::string& arch);  // "arch"; must be [A-Za-z0-9_]+ (a path part)
  CacheKeyBuilder& nvrtc_version(const std::string& version);                 // "nvrtc"
  CacheKeyBuilder& options(std::vector<std::string> options);                 // "options", sorted
  CacheKeyBuilder& entries(std::vector<std::string> entry_names);             // "entries", in order

  // The key. Text layout: schema, flexjit_version, templates, arch, nvrtc first (those present),
  // then every other field sorted by name, lists element by element.
  CacheKey build() const;

 private:
  struct Field {
    bool is_list = false;
    std::vector<std::string> values;
  };
  std::map<std::string, Field> fields_;
};

// XXH3-128 of the bytes as 32 lowercase hex digits (high half first).
std::string xxh3_128_hex(const void* data, std::size_t size);

}  // namespace flexjit::runtime
