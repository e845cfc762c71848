#include "dsl/spec.h"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>

namespace flexjit::dsl {

const BufferDecl* Spec::find_buffer(const std::string& n) const {
  for (const BufferDecl& b : buffers)
    if (b.name == n) return &b;
  return nullptr;
}

const ParamDecl* Spec::find_param(const std::string& n) const {
  for (const ParamDecl& p : params)
    if (p.name == n) return &p;
  return nullptr;
}

const std::vector<int>& supported_head_dims() {
  static const std::vector<int> dims = {32, 64, 80, 96, 128, 192, 256};
  return dims;
}

namespace {

void spec_error(Diagnostics& diags, const std::string& file, std::string message, std::vector<std::string> notes = {}) {
  diags.report(DiagCode::BadSpec, nullptr, Span{}, fmt::format("{}: {}", file, std::move(message)), "", std::move(notes));
}

bool name_taken(const Spec& spec, const std::string& n) { return spec.find_buffer(n) || spec.find_param(n); }

}  // namespace

bool add_buffer(Spec& spec, const std::string& decl, const std::string& source_name, Diagnostics& diags) {
  auto b = parse_buffer_decl(decl, source_name, diags);
  if (!b) return false;
  if (name_taken(spec, b->name)) {
    auto src = std::make_shared<Source>(source_name, decl);
    diags.report(DiagCode::DuplicateDeclaration, src, Span{0, static_cast<uint32_t>(b->name.size())},
                 fmt::format("`{}` is declared twice", b->name), "second declaration", {"give each buffer and parameter its own name"});
    return false;
  }
  spec.buffers.push_back(std::move(*b));
  return true;
}

bool add_param(Spec& spec, const std::string& decl, const std::string& source_name, Diagnostics& diags, bool force_const) {
  auto p = parse_param_decl(decl, source_name, diags, force_const);
  if (!p) return false;
  if (name_taken(spec, p->name)) {
    auto src = std::make_shared<Source>(source_name, decl);
    size_t at = decl.find(p->name);
    uint32_t b = at == std::string::npos ? 0 : static_cast<uint32_t>(at);
    diags.report(DiagCode::DuplicateDeclaration, src, Span{b, static_cast<uint32_t>(b + p->name.size())},
                 fmt::format("`{}` is declared twice", p->name), "second declaration", {"give each buffer and parameter its own name"});
    return false;
  }
  spec.params.push_back(std::move(*p));
  return true;
}

bool validate_spec(const Spec& spec, const std::string& source_name, Diagnostics& diags) {
  bool ok = true;
  const auto& dims = supported_head_dims();
  auto check_dim = [&](int d, const char* what) {
    if (d <= 0 || d > 512 || d % 8 != 0) {
      spec_error(diags, source_name, fmt::format("{} {} is not supported", what, d),
                 {"head dims must be positive multiples of 8 up to 512; the GPU kernels are tuned for 32, 64, 80, 96, 128, 192, 256"});
      ok = false;
    }
  };
  check_dim(spec.head_dim, "head_dim");
  if (spec.head_dim_v) check_dim(spec.head_dim_v, "head_dim_v");
  (void)dims;
  if (spec.gqa_group < 0) {
    spec_error(diags, source_name, "gqa_group must be positive (or 0 to take it from the launch)");
    ok = false;
  }
  return ok;
}

std::optional<Spec> parse_spec_json(const std::string& text, const std::string& file_name, Diagnostics& diags) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    auto src = std::make_shared<Source>(file_name, text);
    // nlohmann reports the byte after the end for truncated text: the caret then marks the end.
    uint32_t at = static_cast<uint32_t>(std::min<size_t>(e.byte ? e.byte - 1 : 0, text.size()));
    uint32_t end = static_cast<uint32_t>(std::min<size_t>(at + 1, text.size()));
    std::string what = e.what();
    size_t colon = what.rfind(": ");
    diags.report(DiagCode::BadSpec, src, Span{at, end}, "the spec file is not valid JSON", colon == std::string::npos ? what : what.substr(colon + 2));
    return std::nullopt;
  } catch (const nlohmann::json::exception& e) {
    // Valid syntax the reader cannot represent, e.g. a number beyond double (1e400).
    std::string what = e.what();
    size_t bracket = what.find("] ");
    spec_error(diags, file_name, "the spec file is not valid JSON: " + (bracket == std::string::npos ? what : what.substr(bracket + 2)));
    return std::nullopt;
  }
  if (!j.is_object()) {
    spec_error(diags, file_name, "a spec must be a JSON object", {R"(e.g. {"mask_mod": "q >= kv", "head_dim": 128})"});
    return std::nullopt;
  }
  Spec spec;
  size_t errors_before = diags.list().size();
  static const std::vector<std::string> known = {"name", "score_mod", "mask_mod", "buffers", "params", "grad",
                                                 "dtype", "head_dim", "head_dim_v", "gqa_group", "description"};
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (std::find(known.begin(), known.end(), it.key()) == known.end()) {
      auto guess = closest_name(it.key(), known);
      spec_error(diags, file_name, fmt::format("unknown key \"{}\"", it.key()),
                 {guess ? fmt::format("did you mean \"{}\"?", *guess) : fmt::format("known keys: {}", fmt::join(known, ", "))});
    }
  }
  auto get_string = [&](const char* key) -> std::optional<std::string> {
    if (!j.contains(key) || j[key].is_null()) return std::nullopt;
    if (!j[key].is_string()) {
      spec_error(diags, file_name, fmt::format("\"{}\" must be a string", key));
      return std::nullopt;
    }
    return j[key].get<std::string>();
  };
  auto get_int = [&](const char* key, int& out) {
    if (!j.contains(key) || j[key].is_null()) return;
    if (!j[key].is_number_integer()) {
      spec_error(diags, file_name, fmt::format("\"{}\" must be an integer", key));
      return;
    }
    out = j[key].get<int>();
  };
  if (auto n = get_string("name")) spec.name = *n;
  spec.score_mod = get_string("score_mod");
  spec.mask_mod = get_string("mask_mod");
  if (auto d = get_string("dtype")) {
    auto dt = parse_dtype(*d);
    if (!dt || (*dt != DType::BF16 && *dt != DType::F16 && *dt != DType::F32))
      spec_error(diags, file_name, fmt::format("dtype \"{}\" is not supported for q, k and v", *d), {"use \"bf16\", \"f16\" or \"f32\" (CPU only)"});
    else
      spec.dtype = *dt;
  }
  get_int("head_dim", spec.head_dim);
  get_int("head_dim_v", spec.head_dim_v);
  get_int("gqa_group", spec.gqa_group);
  if (j.contains("buffers")) {
    const auto& b = j["buffers"];
    if (b.is_array()) {
      for (size_t i = 0; i < b.size(); ++i) {
        if (!b[i].is_string()) {
          spec_error(diags, file_name, fmt::format("buffers[{}] must be a declaration string", i));
          continue;
        }
        add_buffer(spec, b[i].get<std::string>(), fmt::format("{}:buffers[{}]", file_name, i), diags);
      }
    } else if (b.is_object()) {
      for (auto it = b.begin(); it != b.end(); ++it) {
        if (!it.value().is_string()) {
          spec_error(diags, file_name, fmt::format("buffers.{} must be a string like \"bf16[B, H, Sq, 64]\"", it.key()));
          continue;
        }
        add_buffer(spec, it.key() + ": " + it.value().get<std::string>(), fmt::format("{}:buffers.{}", file_name, it.key()), diags);
      }
    } else {
      spec_error(diags, file_name, "\"buffers\" must be a list of declarations", {R"(e.g. ["rel_h: bf16[B, H, Sq, 64]"])"});
    }
  }
  if (j.contains("params")) {
    const auto& p = j["params"];
    if (!p.is_array()) {
      spec_error(diags, file_name, "\"params\" must be a list of declarations", {R"(e.g. ["window: int", "const cap: float = 30"])"});
    } else {
      for (size_t i = 0; i < p.size(); ++i) {
        if (!p[i].is_string()) {
          spec_error(diags, file_name, fmt::format("params[{}] must be a declaration string", i));
          continue;
        }
        add_param(spec, p[i].get<std::string>(), fmt::format("{}:params[{}]", file_name, i), diags);
      }
    }
  }
  if (j.contains("grad")) {
    const auto& g = j["grad"];
    if (!g.is_array()) spec_error(diags, file_name, "\"grad\" must be a list of buffer names");
    else
      for (const auto& n : g) {
        if (!n.is_string()) continue;
        bool found = false;
        for (BufferDecl& b : spec.buffers)
          if (b.name == n.get<std::string>()) b.requires_grad = found = true;
        if (!found) spec_error(diags, file_name, fmt::format("\"grad\" names `{}`, which is not a declared buffer", n.get<std::string>()));
      }
  }
  validate_spec(spec, file_name, diags);
  if (diags.list().size() != errors_before) return std::nullopt;
  return spec;
}

std::string spec_to_json(const Spec& spec) {
  nlohmann::json j;
  j["name"] = spec.name;
  if (spec.score_mod) j["score_mod"] = *spec.score_mod;
  if (spec.mask_mod) j["mask_mod"] = *spec.mask_mod;
  j["buffers"] = nlohmann::json::array();
  std::vector<std::string> grads;
  for (const BufferDecl& b : spec.buffers) {
    j["buffers"].push_back(b.str());
    if (b.requires_grad) grads.push_back(b.name);
  }
  j["params"] = nlohmann::json::array();
  for (const ParamDecl& p : spec.params) j["params"].push_back(p.str());
  if (!grads.empty()) j["grad"] = grads;
  j["dtype"] = dtype_name(spec.dtype);
  j["head_dim"] = spec.head_dim;
  if (spec.head_dim_v) j["head_dim_v"] = spec.head_dim_v;
  if (spec.gqa_group) j["gqa_group"] = spec.gqa_group;
  return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace flexjit::dsl
