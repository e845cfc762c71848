// The built-in names of the language: index variables (with their PyTorch aliases),
// functions with their arities, standard shape symbols and element types.
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace flexjit::dsl {

// Index variables. TileStart/TileCol never appear in source: the compiler rewrites kv as
// TileStart + TileCol (kv = k0 + j) to hoist work that is constant across a KV tile.
enum class VarId { B, H, Q, KV, KvHead, Score, TileStart, TileCol };
inline constexpr int kNumVars = 8;
const char* var_name(VarId v);                           // canonical spelling: b h q kv kv_head score k0 j
std::optional<VarId> lookup_variable(std::string_view);  // accepts aliases batch, head, q_idx, kv_idx

enum class Func {
  Abs, Min, Max, Clamp, Exp, Exp2, Log, Log2, Log1p, Sqrt, Rsqrt, Tanh, Sigmoid, Sin, Cos,
  Floor, Ceil, Round, Pow, Sign, Where, ToFloat, ToInt
};
struct FuncInfo {
  const char* name;
  Func func;
  int arity;
};
const std::vector<FuncInfo>& functions();
std::optional<FuncInfo> lookup_function(std::string_view);

// Shape symbols every spec knows; bound from q, k and v at launch.
const std::vector<std::string>& standard_symbols();  // B H Hkv Sq Skv D

// Element types of captured buffers.
// F8E4M3 and F8E5M2 are storage types of a decode KV cache only (DecodePlanOptions::kv_dtype): parse_dtype does
// not return them, so no buffer or spec can be declared with them.
enum class DType { F32, F16, BF16, I32, I64, U8, Bool, F8E4M3, F8E5M2 };
const char* dtype_name(DType);
std::optional<DType> parse_dtype(std::string_view);
// A KV cache's element type: bf16 / f16, or fp8 (= f8e4m3, e4m3) and f8e5m2 (e5m2).
std::optional<DType> parse_kv_cache_dtype(std::string_view);
int dtype_size(DType);
bool dtype_is_float(DType);

// The closest candidate to `name` by edit distance, if it is close enough to suggest.
std::optional<std::string> closest_name(std::string_view name, const std::vector<std::string>& candidates);

}  // namespace flexjit::dsl
