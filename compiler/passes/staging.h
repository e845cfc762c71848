// Splits score_mod / mask_mod into stages by how often a value changes inside a
// flash-attention kernel, so that work constant across a row, a KV tile or a tile column
// is computed once (the SAM `rel_h[b, h, q, kv // 64]` load) instead of per score element.
#pragma once
#include <functional>
#include <unordered_map>
#include <vector>

#include "compiler/ir/ir.h"

namespace flexjit {

// Row: depends on (b, h, kv_head, q) at most. Col: also on the column j inside a KV tile,
// and so is shared by every tile. Tile: also on the tile start k0. Element: everything else.
enum class Stage { Row = 0, Col = 1, Tile = 2, Element = 3 };
const char* stage_name(Stage s);

struct HoistedValue {
  ir::Expr expr;  // in terms of b, h, kv_head, q, k0, j and earlier hoisted values
  Stage stage;
  int slot;       // position among the values of its stage
};

struct StagingOptions {
  int tile_size = 64;          // kBlockN of the kernel; tiles start at multiples of it
  int max_col_values = 2;      // Col values cost rows x columns registers per thread each
  bool hoist = true;           // false: only the tile rewrite, nothing hoisted (for testing)
  // Whether a node of the input DAG can raise an error flag when evaluated (a checked load,
  // a runtime divisor). Such work is hoisted only where it is evaluated unconditionally:
  // hoisting it out of `c && x` or a select's branch would report errors the program guards
  // against. Null: nothing can flag.
  std::function<bool(const ir::Expr&)> may_flag;
};

struct StagedMods {
  ir::Expr score_mod;  // after the rewrite kv = k0 + j (null if absent)
  ir::Expr mask_mod;
  std::vector<HoistedValue> values;                   // dependency order: operands before users
  std::unordered_map<const ir::Node*, int> value_of;  // hoisted node -> index in values
  // Every node of the rewritten DAG -> the node of the input DAG it replaces, so analyses
  // run on the input (ranges, load checks) apply to the rewritten code.
  std::unordered_map<const ir::Node*, ir::Expr> origin;
  int tile_size = 64;

  Stage stage_of(const ir::Expr& e) const;  // from the variables it uses
  const HoistedValue* hoisted(const ir::Expr& e) const;
  int count(Stage s) const;
};

// Rewrites kv as k0 + j (with kv // c -> k0 // c when the tile size divides c, and
// kv % c -> j % c when c divides the tile size: exact because tiles are aligned), then
// picks the hoisted values: maximal Row/Col/Tile subexpressions used by a later stage that
// contain a load or a costly operation.
StagedMods stage_mods(const ir::Expr& score_mod, const ir::Expr& mask_mod, const StagingOptions& options);

}  // namespace flexjit
