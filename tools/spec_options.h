// Command-line options shared by the subcommands that take a spec: a JSON file and/or
// flags (--score, --mask, --buffer, --param, --const, --head-dim, --dtype).
#pragma once
#include <CLI/CLI.hpp>
#include <optional>
#include <string>
#include <vector>

#include "dsl/spec.h"

namespace flexjit::tools {

struct SpecOptions {
  std::string file;
  std::optional<std::string> score, mask, name, dtype;
  std::vector<std::string> buffers, params, consts, grads;
  int head_dim = 0;
  int head_dim_v = 0;
  // Commands whose other inputs make the intent clear (`run` with q, k and v) take an empty
  // spec as plain attention; the others ask for it by --name so a forgotten file is an error.
  bool plain_attention_by_default = false;

  void add_to(CLI::App* cmd);
  // The spec from the file (if any) with the flags on top; throws CompileError with all
  // diagnostics, or flexjit::Error for an unreadable file or an empty spec.
  dsl::Spec load() const;
};

// A runtime parameter set on the command line (--set NAME=VALUE): the declaration, the value's text and its value as
// the launch arguments carry it. Throws flexjit::Error for a malformed setting or an undeclared name.
struct ParamSetting {
  const dsl::ParamDecl* param = nullptr;
  std::string text;
  double value = 0;
};
ParamSetting parse_param_setting(const dsl::Spec& spec, const std::string& setting);

// How diagnostics are printed: "text" (caret form) or "json".
std::string& diagnostics_format();

}  // namespace flexjit::tools
