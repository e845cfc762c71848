// Symbolic integer range analysis: a bound for every Int node as an expression over shape
// symbols, proofs that buffer indices stay in range, and the launch-time conditions
// ("obligations") under which they do, or under which 32-bit arithmetic is exact.
#pragma once
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "compiler/ir/ir.h"
#include "dsl/sema.h"

namespace flexjit {

// An inclusive range [lo, hi]. A bound is an Int IR expression over Symbols, immediates and
// (in principle) runtime int Params, in a canonical linear form; a null Expr is unbounded.
// Bounds may be evaluated with the interpreter at launch: each is built so that evaluating it
// in 64-bit arithmetic cannot overflow for any symbol values in [1, 2^31 - 1].
struct Interval {
  ir::Expr lo, hi;
};

// The domains of the index variables, as intervals over symbols.
struct VarDomains {
  Interval b, h, kv_head, q, kv;
  Interval tile_start, tile_col;  // k0 and j of the tile rewrite: unbounded unless the caller sets them
  // Forward kernels: b in [0, B-1], h in [0, H-1], kv_head in [0, Hkv-1], q in [0, Sq-1],
  // kv in [0, Skv-1].
  static VarDomains forward(const dsl::CheckedSpec& spec);
  const Interval* of(dsl::VarId v) const;  // nullptr for score
};

struct LoadCheck {
  ir::Expr load;  // the Load node (pointer identity within the analysed DAG)
  enum class Status { Proven, Conditional, Unproven } status = Status::Unproven;
  // Bool expression over symbols (and params); when it evaluates true at launch, every index
  // is in [0, dim) and the load needs neither wrap nor clamp. Null unless Conditional.
  ir::Expr obligation;
  std::vector<Interval> index_ranges;
  bool may_be_negative = true;  // some index may be < 0 (so the checked path must emit the negative wrap)
};

struct RangeInfo {
  std::vector<ir::Expr> roots;                            // the analysed DAG (keeps the keys below alive)
  std::unordered_map<const ir::Node*, Interval> ranges;   // every Int node
  std::vector<LoadCheck> loads;                           // every Load, post-order (operands first), each once
  // Bool: when true at launch, every Int node with a bounded range that is not in wide_ints
  // fits in int32. Null = proven statically.
  ir::Expr int32_obligation;
  std::unordered_set<const ir::Node*> unbounded_ints;     // Int nodes with no finite range (must stay 64-bit)
  std::unordered_set<const ir::Node*> wide_ints;          // bounded, but provably not always within int32 (stay 64-bit)
  std::unordered_set<const ir::Node*> strict_int32;       // provably in [INT32_MIN + 1, INT32_MAX - 1] for every binding

  const LoadCheck* check_of(const ir::Expr& load) const;  // nullptr if not an analysed load
  std::string describe(const ir::Expr& e) const;          // e.g. "[0, (Skv - 1) // 64]"; "[-inf, +inf]" if unbounded
};

// Why: every buffer load must be range-checked unless it provably cannot go out of range,
// and int arithmetic may only be narrowed to 32 bits where it provably cannot overflow.
// Shapes are only known at launch, so the proofs are symbolic: what holds for every binding
// of the symbols is Proven; what depends on them becomes an obligation the launcher
// evaluates (with the interpreter) to pick the unchecked or 32-bit kernel variant.
// Symbols are assumed to lie in [1, 2^31 - 1] (the documented limit of a shape dimension).
RangeInfo analyze_ranges(const std::vector<ir::Expr>& roots, const dsl::CheckedSpec& spec, const VarDomains& domains);

}  // namespace flexjit
