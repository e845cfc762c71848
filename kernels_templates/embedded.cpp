#include "kernels_templates/embedded.h"

#include <fmt/format.h>
#include <stdexcept>
#define XXH_INLINE_ALL
#include <xxhash.h>

namespace flexjit::templates {

const std::vector<EmbeddedHeader>& all() {
  static const std::vector<EmbeddedHeader> headers = [] {
    std::vector<EmbeddedHeader> v;
    for (const EmbeddedHeader* h = detail::kEmbedded; h->name; ++h) v.push_back(*h);
    return v;
  }();
  return headers;
}

std::string_view get(std::string_view name) {
  for (const EmbeddedHeader& h : all())
    if (name == h.name) return h.text;
  throw std::out_of_range(fmt::format("kernel template '{}' is not embedded in this build", name));
}

std::string content_hash() {
  static const std::string hash = [] {
    XXH3_state_t* st = XXH3_createState();
    XXH3_64bits_reset(st);
    for (const EmbeddedHeader& h : all()) {
      XXH3_64bits_update(st, h.name, std::char_traits<char>::length(h.name) + 1);
      XXH3_64bits_update(st, h.text, std::char_traits<char>::length(h.text) + 1);
    }
    unsigned long long v = XXH3_64bits_digest(st);
    XXH3_freeState(st);
    return fmt::format("{:016x}", v);
  }();
  return hash;
}

}  // namespace flexjit::templates
