// A generator of random well-typed specs for differential testing: mods built from a typed
// grammar, buffers of random shapes and element types, runtime and const parameters, masks
// that empty whole rows, and the launch that goes with them (sizes, parameter values, layout,
// the seed of the input data). Every generated load is in range and no expression can reach a
// NaN, an integer overflow or a zero divisor, so any two back ends must agree within the
// rounding of their arithmetic:
//   - comparisons, floor / ceil / round, int() and integer conversions only see exact values
//     (integers, and dyadic fractions that fp32 holds exactly through +, - and small products),
//     so fused multiply-adds or a differently rounded exp cannot flip them;
//   - transcendental and divided values only flow, bounded, into the score, where a rounding
//     difference changes the output by about as much;
//   - `score` reaches the result only through continuous operations (and, in specs that are
//     differentiated, smooth ones), so the rounding of q.k is not amplified.
#pragma once
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "dsl/spec.h"

namespace flexjit::fuzz {

// One generated expression: `text` with each '$' replaced by the next child's text.
struct GenExpr {
  enum class Type { Int, Float, Bool };
  Type type = Type::Int;
  std::string text;
  std::vector<GenExpr> kids;
  // A shrink may not replace this node by a child (it keeps an index in range, or makes a
  // value exact); it may still simplify the children.
  bool keep = false;
  std::string render() const;
  size_t size() const;  // nodes
};

struct LaunchSizes {
  int64_t B = 1, H = 1, Hkv = 1, Sq = 1, Skv = 1;
  int64_t N = 1;  // the custom symbol some buffers use, bound by their shapes
};

// A generated case: a spec and one launch of it.
struct GenCase {
  uint64_t seed = 0;  // of the generator; also seeds the input data
  dsl::DType dtype = dsl::DType::F32;
  int head_dim = 16, head_dim_v = 0, gqa_group = 0;
  std::vector<std::string> buffers;                   // declarations, "b0: f32[H, Skv]"
  std::vector<bool> grads;                            // per buffer: requires a gradient
  std::vector<std::string> params;                    // declarations, "p0: int", "const c0: float = 0.5"
  std::vector<std::pair<std::string, double>> values; // runtime parameter values
  std::optional<GenExpr> score_mod, mask_mod;
  LaunchSizes sizes;
  float scale = 0;          // 0: 1/sqrt(D)
  bool bshd = false;        // q, k, v, o stored [B, S, H, D]
  bool backward = false;    // also check the gradients
  dsl::Spec spec() const;   // the spec the case describes
};

// What the generated specs must fit.
struct GenOptions {
  bool gpu = false;  // bf16 / f16 and the GPU kernels' head dims only
  int max_seqlen_q = 130, max_seqlen_kv = 200;
};

// Generates the case of `seed` (the same seed always gives the same case).
GenCase generate_case(uint64_t seed, const GenOptions& options);

}  // namespace flexjit::fuzz
