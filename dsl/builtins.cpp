#include "dsl/builtins.h"

#include <algorithm>

namespace flexjit::dsl {

const char* var_name(VarId v) {
  switch (v) {
    case VarId::B: return "b";
    case VarId::H: return "h";
    case VarId::Q: return "q";
    case VarId::KV: return "kv";
    case VarId::KvHead: return "kv_head";
    case VarId::Score: return "score";
    case VarId::TileStart: return "k0";
    case VarId::TileCol: return "j";
  }
  return "?";
}

std::optional<VarId> lookup_variable(std::string_view s) {
  if (s == "b" || s == "batch") return VarId::B;
  if (s == "h" || s == "head") return VarId::H;
  if (s == "q" || s == "q_idx") return VarId::Q;
  if (s == "kv" || s == "kv_idx") return VarId::KV;
  if (s == "kv_head") return VarId::KvHead;
  if (s == "score") return VarId::Score;
  return std::nullopt;
}

const std::vector<FuncInfo>& functions() {
  static const std::vector<FuncInfo> table = {
      {"abs", Func::Abs, 1},     {"min", Func::Min, 2},         {"max", Func::Max, 2},     {"clamp", Func::Clamp, 3},
      {"exp", Func::Exp, 1},     {"exp2", Func::Exp2, 1},       {"log", Func::Log, 1},     {"log2", Func::Log2, 1},
      {"log1p", Func::Log1p, 1}, {"sqrt", Func::Sqrt, 1},       {"rsqrt", Func::Rsqrt, 1}, {"tanh", Func::Tanh, 1},
      {"sigmoid", Func::Sigmoid, 1}, {"sin", Func::Sin, 1},     {"cos", Func::Cos, 1},     {"floor", Func::Floor, 1},
      {"ceil", Func::Ceil, 1},   {"round", Func::Round, 1},     {"pow", Func::Pow, 2},     {"sign", Func::Sign, 1},
      {"where", Func::Where, 3}, {"float", Func::ToFloat, 1},   {"int", Func::ToInt, 1},
  };
  return table;
}

std::optional<FuncInfo> lookup_function(std::string_view s) {
  for (const FuncInfo& f : functions())
    if (s == f.name) return f;
  return std::nullopt;
}

const std::vector<std::string>& standard_symbols() {
  static const std::vector<std::string> s = {"B", "H", "Hkv", "Sq", "Skv", "D"};
  return s;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::F16: return "f16";
    case DType::BF16: return "bf16";
    case DType::I32: return "i32";
    case DType::I64: return "i64";
    case DType::U8: return "u8";
    case DType::Bool: return "bool";
    case DType::F8E4M3: return "f8e4m3";
    case DType::F8E5M2: return "f8e5m2";
  }
  return "?";
}

std::optional<DType> parse_dtype(std::string_view s) {
  if (s == "f32" || s == "float32" || s == "fp32") return DType::F32;
  if (s == "f16" || s == "float16" || s == "fp16") return DType::F16;
  if (s == "bf16" || s == "bfloat16") return DType::BF16;
  if (s == "i32" || s == "int32") return DType::I32;
  if (s == "i64" || s == "int64") return DType::I64;
  if (s == "u8" || s == "uint8") return DType::U8;
  if (s == "bool") return DType::Bool;
  return std::nullopt;
}

std::optional<DType> parse_kv_cache_dtype(std::string_view s) {
  if (s == "fp8" || s == "f8e4m3" || s == "e4m3" || s == "float8_e4m3fn") return DType::F8E4M3;
  if (s == "f8e5m2" || s == "e5m2" || s == "float8_e5m2") return DType::F8E5M2;
  std::optional<DType> t = parse_dtype(s);
  if (t && (*t == DType::BF16 || *t == DType::F16)) return t;
  return std::nullopt;
}

int dtype_size(DType t) {
  switch (t) {
    case DType::F32: case DType::I32: return 4;
    case DType::F16: case DType::BF16: return 2;
    case DType::I64: return 8;
    case DType::U8: case DType::Bool: case DType::F8E4M3: case DType::F8E5M2: return 1;
  }
  return 1;
}

bool dtype_is_float(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }

namespace {
size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}
}  // namespace

std::optional<std::string> closest_name(std::string_view name, const std::vector<std::string>& candidates) {
  if (name.size() > 64) return std::nullopt;
  std::optional<std::string> best;
  size_t best_d = SIZE_MAX;
  for (const std::string& c : candidates) {
    size_t d = edit_distance(name, c);
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  // Suggest only plausible typos: at most a third of the name's letters (and at least one) wrong.
  size_t limit = std::max<size_t>(1, (name.size() + 2) / 3);
  if (best && best_d <= limit && best_d > 0) return best;
  return std::nullopt;
}

}  // namespace flexjit::dsl
