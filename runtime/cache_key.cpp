#include "runtime/cache_key.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "dsl/error.h"
#include "kernels_templates/embedded.h"

#ifndef FLEXJIT_VERSION
#define FLEXJIT_VERSION "unknown"
#endif

namespace flexjit::runtime {
namespace {

// The fields that lead the text, in this order, so a key reads from the general to the specific.
constexpr std::array<const char*, 5> kLeadingFields = {"schema", "flexjit_version", "templates", "arch", "nvrtc"};

void check_name(const std::string& name) {
  bool ok = !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.' ||
           c == '-';
  });
  if (!ok)
    throw Error(fmt::format("cache key field name '{}' is invalid: use letters, digits, '_', '.' and '-'", name));
}

// The architecture names a directory of the disk cache, so it must be a plain path component.
void check_arch(const std::string& arch) {
  bool ok = !arch.empty() && std::all_of(arch.begin(), arch.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  });
  if (!ok)
    throw Error(fmt::format("cache key architecture '{}' is invalid: expected something like sm_90a", arch));
}

// Escapes so that each field is one line and distinct values stay distinct.
void append_escaped(std::string& out, const std::string& value) {
  for (char c : value) {
    switch (c) {
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f)
          out += fmt::format("\\x{:02x}", static_cast<unsigned char>(c));
        else
          out += c;
    }
  }
}

}  // namespace

std::string xxh3_128_hex(const void* data, std::size_t size) {
  XXH128_hash_t h = XXH3_128bits(data, size);
  return fmt::format("{:016x}{:016x}", h.high64, h.low64);
}

CacheKeyBuilder::CacheKeyBuilder() {
  set("schema", static_cast<std::int64_t>(kCacheKeySchema));
  set("flexjit_version", std::string(FLEXJIT_VERSION));
  set("templates", templates::content_hash());
}

CacheKeyBuilder& CacheKeyBuilder::set(const std::string& name, const std::string& value) {
  check_name(name);
  if (name == "arch") check_arch(value);
  fields_[name] = Field{false, {value}};
  return *this;
}

CacheKeyBuilder& CacheKeyBuilder::set(const std::string& name, std::int64_t value) {
  return set(name, std::to_string(value));
}

CacheKeyBuilder& CacheKeyBuilder::set_list(const std::string& name, std::vector<std::string> values) {
  check_name(name);
  if (name == "arch") throw Error("cache key field 'arch' must be a single value, not a list");
  fields_[name] = Field{true, std::move(values)};
  return *this;
}

CacheKeyBuilder& CacheKeyBuilder::arch(const std::string& arch) { return set("arch", arch); }

CacheKeyBuilder& CacheKeyBuilder::nvrtc_version(const std::string& version) { return set("nvrtc", version); }

CacheKeyBuilder& CacheKeyBuilder::options(std::vector<std::string> options) {
  std::sort(options.begin(), options.end());
  return set_list("options", std::move(options));
}

CacheKeyBuilder& CacheKeyBuilder::entries(std::vector<std::string> entry_names) {
  return set_list("entries", std::move(entry_names));
}

CacheKey CacheKeyBuilder::build() const {
  CacheKey key;
  std::string& text = key.text_;
  auto emit = [&text](const std::string& name, const Field& field) {
    if (!field.is_list) {
      text += name;
      text += '=';
      append_escaped(text, field.values.front());
      text += '\n';
      return;
    }
    // The count line keeps an empty list distinct from an absent one.
    text += fmt::format("{}[#]={}\n", name, field.values.size());
    for (size_t i = 0; i < field.values.size(); ++i) {
      text += fmt::format("{}[{}]=", name, i);
      append_escaped(text, field.values[i]);
      text += '\n';
    }
  };
  for (const char* name : kLeadingFields) {
    auto it = fields_.find(name);
    if (it != fields_.end()) emit(it->first, it->second);
  }
  for (const auto& [name, field] : fields_) {
    if (std::find_if(kLeadingFields.begin(), kLeadingFields.end(), [&](const char* n) { return name == n; }) !=
        kLeadingFields.end())
      continue;
    emit(name, field);
  }
  key.hash_ = xxh3_128_hex(text.data(), text.size());
  if (auto it = fields_.find("arch"); it != fields_.end()) key.arch_ = it->second.values.front();
  return key;
}

}  // namespace flexjit::runtime
