// Valid random inputs for the gallery specs in CPU tests: captured buffers with contents the
// expressions expect (sorted document ids, offsets in range, distances below 256), extents
// for custom symbols, and parameter values small enough to matter at test sizes.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "compiler/bindings.h"
#include "compiler/interpreter.h"
#include "dsl/sema.h"
#include "dsl/spec.h"
#include "runtime/flexjit.hpp"

namespace flexjit::test {

struct Sizes {
  int64_t B = 1, H = 1, Hkv = 1, Sq = 1, Skv = 1, D = 64;
};

// One captured buffer's storage plus the views the runtime and the interpreter take.
struct HostBuffer {
  std::string name;
  dsl::DType dtype = dsl::DType::F32;
  std::vector<int64_t> shape;
  std::vector<unsigned char> bytes;
  Tensor tensor() { return Tensor::contiguous(bytes.data(), dtype, shape); }
  BufferView view() const {
    BufferView v;
    v.dtype = dtype;
    v.data = bytes.data();
    v.shape = shape;
    v.strides = contiguous_strides(shape);
    return v;
  }
};

inline uint16_t float_to_bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// Extent of a custom (non-standard) shape symbol for the gallery.
inline int64_t custom_extent(const std::string& symbol, const Sizes& s) {
  if (symbol == "L") return s.Sq + s.Skv - 1;  // relative_bias: one entry per q - kv (2 Skv - 1 when Sq = Skv)
  return 97;                                // e.g. offset_bias's N
}

inline int64_t extent_of(const dsl::Dim& d, const Sizes& s) {
  if (!d.is_symbol) return d.value;
  if (d.symbol == "B") return s.B;
  if (d.symbol == "H") return s.H;
  if (d.symbol == "Hkv") return s.Hkv;
  if (d.symbol == "Sq") return s.Sq;
  if (d.symbol == "Skv") return s.Skv;
  if (d.symbol == "D") return s.D;
  return custom_extent(d.symbol, s);
}

// Buffers for every declaration of `spec` with valid random contents.
inline std::vector<HostBuffer> make_buffers(const dsl::Spec& spec, const Sizes& s, std::mt19937_64& rng) {
  std::vector<HostBuffer> out;
  std::uniform_real_distribution<float> val(-1.0f, 1.0f);
  for (const dsl::BufferDecl& d : spec.buffers) {
    HostBuffer hb;
    hb.name = d.name;
    hb.dtype = d.dtype;
    int64_t n = 1;
    for (const dsl::Dim& dim : d.shape) {
      hb.shape.push_back(extent_of(dim, s));
      n *= hb.shape.back();
    }
    hb.bytes.resize(static_cast<size_t>(n) * dsl::dtype_size(d.dtype));
    // The largest index an integer buffer's values may be used as: the extent of the
    // dimension they index in the gallery (offset -> bias[N], dist -> sb[H, 256]).
    int64_t int_hi = 255;
    if (d.name == "offset") int_hi = custom_extent("N", s) - 1;
    for (int64_t i = 0; i < n; ++i) {
      unsigned char* p = hb.bytes.data() + i * dsl::dtype_size(d.dtype);
      switch (d.dtype) {
        case dsl::DType::F32: {
          float f = val(rng);
          std::memcpy(p, &f, 4);
          break;
        }
        case dsl::DType::BF16: {
          uint16_t b = float_to_bf16_bits(val(rng));
          std::memcpy(p, &b, 2);
          break;
        }
        case dsl::DType::F16: {
          // Small exact halves: k / 64 for k in [-64, 64].
          int k = std::uniform_int_distribution<int>(-64, 64)(rng);
          float f = k / 64.0f;
          uint32_t u;
          std::memcpy(&u, &f, 4);
          uint16_t h = f == 0 ? 0 : static_cast<uint16_t>(((u >> 16) & 0x8000u) | ((((u >> 23) & 0xffu) - 112) << 10) | ((u >> 13) & 0x3ffu));
          std::memcpy(p, &h, 2);
          break;
        }
        case dsl::DType::I32: {
          int32_t v = static_cast<int32_t>(std::uniform_int_distribution<int64_t>(0, int_hi)(rng));
          std::memcpy(p, &v, 4);
          break;
        }
        case dsl::DType::I64: {
          int64_t v = std::uniform_int_distribution<int64_t>(0, int_hi)(rng);
          std::memcpy(p, &v, 8);
          break;
        }
        case dsl::DType::U8: *p = static_cast<unsigned char>(std::uniform_int_distribution<int>(0, 255)(rng)); break;
        case dsl::DType::Bool: *p = static_cast<unsigned char>(std::uniform_int_distribution<int>(0, 1)(rng)); break;
        case dsl::DType::F8E4M3:
        case dsl::DType::F8E5M2: break;  // KV-cache types, never a buffer's
      }
    }
    if (d.name == "doc" && d.dtype == dsl::DType::I32) {
      // Sorted document ids: a few documents of random lengths.
      std::vector<int32_t> ids(static_cast<size_t>(n));
      int32_t id = 0;
      for (auto& x : ids) {
        if (std::uniform_int_distribution<int>(0, 9)(rng) == 0) ++id;
        x = id;
      }
      std::memcpy(hb.bytes.data(), ids.data(), ids.size() * 4);
    }
    out.push_back(std::move(hb));
  }
  return out;
}

// Parameter values: the spec's defaults, with window / prefix scaled to test sizes.
inline std::vector<std::pair<std::string, double>> gallery_params(const dsl::Spec& spec, const Sizes& s) {
  std::vector<std::pair<std::string, double>> out;
  for (const dsl::ParamDecl& p : spec.params) {
    if (p.is_const) continue;
    if (p.name == "window") out.push_back({p.name, static_cast<double>(std::max<int64_t>(1, s.Skv / 3))});
    else if (p.name == "prefix") out.push_back({p.name, static_cast<double>(std::max<int64_t>(1, s.Skv / 4))});
    else if (p.type == dsl::ValueType::Float) out.push_back({p.name, p.has_value ? p.float_value : 0.5});
    else if (p.type == dsl::ValueType::Bool) out.push_back({p.name, p.has_value && p.bool_value ? 1.0 : 0.0});
    else out.push_back({p.name, static_cast<double>(p.has_value ? p.int_value : 3)});
  }
  return out;
}

// The interpreter's environment for the same bindings (kv_head etc. are set per point).
inline EvalEnv eval_env(const dsl::CheckedSpec& cs, const Sizes& s, const std::vector<HostBuffer>& buffers,
                        const std::vector<std::pair<std::string, double>>& params) {
  EvalEnv env;
  std::map<std::string, std::string> values = {{"B", std::to_string(s.B)},     {"H", std::to_string(s.H)},
                                               {"Hkv", std::to_string(s.Hkv)}, {"Sq", std::to_string(s.Sq)},
                                               {"Skv", std::to_string(s.Skv)}, {"D", std::to_string(s.D)}};
  for (const auto& [name, v] : params) {
    const dsl::ParamDecl* p = cs.spec.find_param(name);
    values[name] = p && p->type == dsl::ValueType::Int ? std::to_string(static_cast<long long>(v)) : std::to_string(v);
    if (p && p->type == dsl::ValueType::Bool) values[name] = v != 0 ? "true" : "false";
  }
  std::vector<std::optional<std::vector<int64_t>>> shapes;
  for (const HostBuffer& b : buffers) shapes.push_back(b.shape);
  BoundValues bound = bind_values(cs, values, shapes, /*require_all=*/true);
  env.symbols = bound.symbols;
  env.params = bound.params;
  for (const HostBuffer& b : buffers) env.buffers.push_back(b.view());
  return env;
}

}  // namespace flexjit::test
