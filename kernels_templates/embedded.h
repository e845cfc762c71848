// Access to the kernel templates (kernels_templates/*.cuh) embedded into the library at build time.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace flexjit::templates {

struct EmbeddedHeader {
  const char* name;  // file name, e.g. "flex_forward.cuh"; the include name NVRTC sees
  const char* text;  // full contents
};

// Every embedded header, sorted by name.
const std::vector<EmbeddedHeader>& all();

// The text of one header; throws std::out_of_range naming the header if it is not embedded.
std::string_view get(std::string_view name);

// XXH3-64 of all names and texts: part of every kernel cache key, so editing a template
// invalidates the kernels compiled from it.
std::string content_hash();

namespace detail {
extern const EmbeddedHeader kEmbedded[];
}

}  // namespace flexjit::templates
