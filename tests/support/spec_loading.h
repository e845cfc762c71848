// Loading gallery specs and building their IR in tests.
#pragma once
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "compiler/frontend.h"
#include "dsl/compile_error.h"
#include "support/test_paths.h"

namespace flexjit::test {

// Throws flexjit::Error when the file is missing, naming the checkout the tests read.
inline dsl::Spec load_spec(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec))
    throw Error("spec file '" + path.string() + "' not found (the tests read the checkout at '" + source_dir().string() +
                "'; set FLEXJIT_TEST_SOURCE_DIR to another)");
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  dsl::Diagnostics d;
  auto spec = dsl::parse_spec_json(ss.str(), path.string(), d);
  if (!spec) throw CompileError(d);
  return *spec;
}

// An f32 spec of head dim d from its parts ("" for a mod it lacks); the buffers named in `grads` require gradients.
inline dsl::Spec f32_spec(const std::string& name, const std::string& score_mod, const std::string& mask_mod,
                          const std::vector<std::string>& buffers, const std::vector<std::string>& grads, int d) {
  dsl::Spec spec;
  spec.name = name;
  if (!score_mod.empty()) spec.score_mod = score_mod;
  if (!mask_mod.empty()) spec.mask_mod = mask_mod;
  dsl::Diagnostics diags;
  for (const std::string& b : buffers) dsl::add_buffer(spec, b, "test", diags);
  if (diags.has_errors()) throw CompileError(diags);
  for (dsl::BufferDecl& b : spec.buffers) b.requires_grad = std::find(grads.begin(), grads.end(), b.name) != grads.end();
  spec.dtype = dsl::DType::F32;
  spec.head_dim = d;
  return spec;
}

inline std::vector<std::filesystem::path> gallery_specs() {
  std::vector<std::filesystem::path> out;
  for (const auto& e : std::filesystem::directory_iterator(gallery_dir()))
    if (e.path().extension() == ".json") out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace flexjit::test
