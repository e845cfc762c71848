// The expression front end through code generation (frontend_property.h). The input is split
// at NUL bytes into score_mod, mask_mod and extra declarations; its length picks the
// architecture, head dim, backward strategy and whether the backward or the decode module is
// generated besides the forward one, so every code generator path gets inputs.
#include <string>

#include "fuzz/frontend_property.h"
#include "fuzz/targets/targets.h"

namespace flexjit::fuzz {

std::string run_frontend(const uint8_t* data, size_t size) {
  std::string in(reinterpret_cast<const char*>(data), size);
  std::string parts[3];
  size_t at = 0;
  for (int i = 0; i < 3 && at <= in.size(); ++i) {
    size_t nul = i < 2 ? in.find('\0', at) : std::string::npos;
    parts[i] = in.substr(at, nul == std::string::npos ? std::string::npos : nul - at);
    at = nul == std::string::npos ? in.size() + 1 : nul + 1;
  }
  CodegenChoice c;
  c.arch = size & 1 ? "sm_90a" : "sm_80";
  c.query_major = size & 2;
  c.head_dim = size & 4 ? 128 : 64;
  c.backward = size & 8;
  c.decode = !c.backward;
  return check_one(parts[0], parts[1], nullptr, parts[2], c);
}

}  // namespace flexjit::fuzz
