#include "tools/spec_options.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "compiler/bindings.h"
#include "dsl/compile_error.h"
#include "dsl/error.h"

namespace flexjit::tools {

ParamSetting parse_param_setting(const dsl::Spec& spec, const std::string& setting) {
  const size_t eq = setting.find('=');
  if (eq == std::string::npos) throw Error(fmt::format("--set expects NAME=VALUE, got `{}`", setting));
  const std::string name = setting.substr(0, eq);
  ParamSetting out;
  out.param = spec.find_param(name);
  if (!out.param) throw Error(fmt::format("--set names `{}`, which is not a parameter", name));
  out.text = setting.substr(eq + 1);
  out.value = parse_param_value(*out.param, out.text).as_double();
  return out;
}

std::string& diagnostics_format() {
  static std::string format = "text";
  return format;
}

void SpecOptions::add_to(CLI::App* cmd) {
  cmd->add_option("spec", file, "Spec file (JSON); flags below add to it or replace its fields");
  cmd->add_option("--score", score, "score_mod expression, e.g. 'score + bias[h, q - kv + Skv - 1]'");
  cmd->add_option("--mask", mask, "mask_mod expression, e.g. 'q >= kv'");
  cmd->add_option("--buffer", buffers, "Captured buffer declaration, e.g. 'rel_h: bf16[B, H, Sq, 64]' (repeatable)");
  cmd->add_option("--param", params, "Runtime scalar parameter, e.g. 'window: int' (repeatable)");
  cmd->add_option("--const", consts, "Constant parameter baked into the kernel, e.g. 'cap: float = 30' (repeatable)");
  cmd->add_option("--grad", grads, "Buffer that requires a gradient: NAME, or NAME=FILE.npy for `run --backward` (repeatable)");
  cmd->add_option("--head-dim", head_dim, "Head dimension of q and k (default 128)");
  cmd->add_option("--head-dim-v", head_dim_v, "Head dimension of v (default: --head-dim)");
  cmd->add_option("--dtype", dtype, "Element type of q, k, v: bf16, f16 (GPU and CPU) or f32 (CPU); fp16, fp32, float16, bfloat16, ... also work");
  cmd->add_option("--name", name, "Spec name (used in kernel names and logs)");
}

dsl::Spec SpecOptions::load() const {
  dsl::Diagnostics diags;
  dsl::Spec spec;
  if (!file.empty()) {
    std::error_code ec;
    if (!std::filesystem::exists(file, ec)) throw Error(fmt::format("spec file '{}' not found", file));
    std::ifstream f(file);
    if (!f) throw Error(fmt::format("cannot read spec file '{}'", file));
    std::stringstream ss;
    ss << f.rdbuf();
    auto parsed = dsl::parse_spec_json(ss.str(), file, diags);
    if (!parsed) throw CompileError(std::move(diags));
    spec = std::move(*parsed);
  }
  if (name) spec.name = *name;
  if (score) spec.score_mod = *score;
  if (mask) spec.mask_mod = *mask;
  for (size_t i = 0; i < buffers.size(); ++i) dsl::add_buffer(spec, buffers[i], fmt::format("--buffer[{}]", i), diags);
  for (size_t i = 0; i < params.size(); ++i) dsl::add_param(spec, params[i], fmt::format("--param[{}]", i), diags);
  for (size_t i = 0; i < consts.size(); ++i) dsl::add_param(spec, consts[i], fmt::format("--const[{}]", i), diags, /*force_const=*/true);
  for (const std::string& spelled : grads) {
    const std::string g = spelled.substr(0, spelled.find('='));  // `run` takes NAME=FILE
    bool found = false;
    for (dsl::BufferDecl& b : spec.buffers)
      if (b.name == g) b.requires_grad = found = true;
    if (!found) throw Error(fmt::format("--grad names `{}`, which is not a declared buffer", g));
  }
  if (head_dim) spec.head_dim = head_dim;
  if (head_dim_v) spec.head_dim_v = head_dim_v;
  if (dtype) {
    auto dt = dsl::parse_dtype(*dtype);
    if (!dt || (*dt != dsl::DType::BF16 && *dt != dsl::DType::F16 && *dt != dsl::DType::F32))
      throw Error(fmt::format("--dtype {} is not supported; use bf16, f16 or f32 (CPU only)", *dtype));
    spec.dtype = *dt;
  }
  if (diags.has_errors()) throw CompileError(std::move(diags));
  // Plain attention (no mods) is a valid spec, but outside `run` it must be asked for by name.
  if (file.empty() && !score && !mask && buffers.empty() && params.empty() && !name && !plain_attention_by_default)
    throw Error("no spec given: pass a spec file, --score / --mask expressions, or --name NAME for plain attention (see --help)");
  return spec;
}

}  // namespace flexjit::tools
