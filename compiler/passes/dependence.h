// Dependence analysis: which index variables, buffers, parameters and shape symbols each IR
// node uses.
#pragma once
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "compiler/ir/ir.h"

namespace flexjit {

struct Dependence {
  uint32_t vars = 0;         // bit (1u << int(VarId)) per variable used
  std::vector<int> buffers;  // sorted buffer indices loaded (directly or nested)
  std::vector<int> symbols;  // sorted shape-symbol indices used
  bool uses_params = false;  // any runtime Param
  bool has_load = false;
  bool uses(dsl::VarId v) const { return vars & (1u << int(v)); }
  // "depends on b,h,q; loads rel_h; uses params". Buffer names by spec index when given,
  // else "buffer#i".
  std::string describe(const std::vector<std::string>& buffer_names = {}) const;
};

// Why: code generators hoist work out of the inner loop by what it depends on (a node
// without kv is computed once per row, one without q and kv once per head), the block-mask
// builder needs to know whether a mask reads buffers, and `flexjit dump` annotates the IR
// with it.
class DependenceInfo {
 public:
  explicit DependenceInfo(const std::vector<ir::Expr>& roots);
  // Throws std::out_of_range for a node that is not reachable from the roots.
  const Dependence& of(const ir::Expr& e) const;

 private:
  std::vector<ir::Expr> roots_;  // keeps the analysed nodes (the map's keys) alive
  std::unordered_map<const ir::Node*, Dependence> deps_;
};

// True when q and kv occur in e only inside `q - kv` subtrees (e is then a function of the diagonal q - kv and of
// neither position alone): a buffer gradient indexed so is a diagonal scatter, an additive term so a staged
// diagonal band of the Hopper backward (compiler/codegen/staged_terms.h).
bool only_through_difference(const ir::Expr& e);

}  // namespace flexjit
