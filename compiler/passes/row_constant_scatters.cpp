#include "compiler/passes/row_constant_scatters.h"

#include <algorithm>

#include "compiler/passes/dependence.h"

namespace flexjit {

void drop_row_constant_scatters(ScoreModGradient& g) {
  std::vector<ir::Expr> roots;
  for (const GradScatter& s : g.scatters) {
    roots.push_back(s.coefficient);
    roots.insert(roots.end(), s.indices.begin(), s.indices.end());
  }
  if (roots.empty()) return;
  const DependenceInfo deps(roots);
  auto along_row = [&](const ir::Expr& e) {
    const Dependence& d = deps.of(e);
    return d.uses(dsl::VarId::KV) || d.uses(dsl::VarId::Score);
  };
  g.scatters.erase(std::remove_if(g.scatters.begin(), g.scatters.end(),
                                  [&](const GradScatter& s) {
                                    return !along_row(s.coefficient) && std::none_of(s.indices.begin(), s.indices.end(), along_row);
                                  }),
                   g.scatters.end());
}

}  // namespace flexjit
