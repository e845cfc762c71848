#include "compiler/codegen/staged_terms.h"

#include <functional>
#include <optional>
#include <unordered_set>

#include "compiler/passes/dependence.h"

namespace flexjit {

using namespace ir;

namespace {

// `kv % 64` (Col) or `kv // 64` (Tile); nothing for any other index.
std::optional<StagedKind> last_index_kind(const Expr& e) {
  const Binary* b = e.as<Binary>();
  if (!b || !is_var(b->a, dsl::VarId::KV)) return std::nullopt;
  const IntImm* c = b->b.as<IntImm>();
  if (!c || c->value != kStagedTermTile) return std::nullopt;
  if (b->op == BinaryOp::Mod) return StagedKind::Col;
  if (b->op == BinaryOp::FloorDiv) return StagedKind::Tile;
  return std::nullopt;
}

// The summands of a chain of float additions.
void summands(const Expr& e, std::vector<Expr>& out) {
  const Binary* b = e.as<Binary>();
  if (b && b->op == BinaryOp::Add && e.type() == Type::Float) {
    summands(b->a, out);
    summands(b->b, out);
    return;
  }
  out.push_back(e);
}

// The summands not marked, added in their order (null when every one is marked).
Expr sum_of_unstaged(const std::vector<Expr>& parts, const std::vector<bool>& marked) {
  Expr rest;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (marked[i]) continue;
    rest = rest ? Binary::make(BinaryOp::Add, rest, parts[i]) : parts[i];
  }
  return rest;
}

// Distinct Load nodes of `buffer` reachable from the roots.
int loads_of(const std::vector<Expr>& roots, int buffer) {
  std::unordered_set<const Node*> seen;
  int n = 0;
  std::function<void(const Expr&)> walk = [&](const Expr& e) {
    if (!e || !seen.insert(e.get()).second) return;
    if (const Load* l = e.as<Load>(); l && l->buffer == buffer) ++n;
    for (const Expr& c : children(e)) walk(c);
  };
  for (const Expr& r : roots) walk(r);
  return n;
}

// Whether the variant emits the load without index checks (codegen_cuda.cpp's rule).
bool emitted_unchecked(const RangeInfo& ranges, const VariantOptions& options, const Expr& load) {
  for (size_t i = 0; i < ranges.loads.size(); ++i) {
    if (!ranges.loads[i].load.same_as(load)) continue;
    switch (ranges.loads[i].status) {
      case LoadCheck::Status::Proven: return true;
      case LoadCheck::Status::Unproven: return false;
      case LoadCheck::Status::Conditional: return i < 64 && !((options.checked_loads >> i) & 1);
    }
  }
  return false;
}

// Whether the lead indices of l (all but the last `tail`) name neither position, the score nor another buffer.
bool lead_indices_ok(const Load* l, size_t tail) {
  DependenceInfo deps(l->indices);
  for (size_t d = 0; d + tail < l->indices.size(); ++d) {
    const Dependence& dep = deps.of(l->indices[d]);
    if (dep.uses(dsl::VarId::Q) || dep.uses(dsl::VarId::KV) || dep.uses(dsl::VarId::Score) || dep.has_load) return false;
  }
  return true;
}

// A Diag term's last index: a function of q - kv that uses it (and no other load or the score).
bool diagonal_index(const Expr& e) {
  DependenceInfo deps({e});
  const Dependence& dep = deps.of(e);
  return dep.uses(dsl::VarId::Q) && !dep.uses(dsl::VarId::Score) && !dep.has_load && only_through_difference(e);
}

}  // namespace

const char* staged_kind_name(StagedKind k) {
  switch (k) {
    case StagedKind::Col: return "col";
    case StagedKind::Tile: return "tile";
    case StagedKind::Diag: return "diag";
  }
  return "?";
}

const StagedTerm* StagedTerms::find(StagedKind k) const {
  for (const StagedTerm& t : terms)
    if (t.kind == k) return &t;
  return nullptr;
}

bool StagedTerms::covers_scatter(int i) const {
  for (const StagedTerm& t : terms)
    if (t.scatter == i) return true;
  return false;
}

bool StagedTerms::spreads_rows(size_t num_scatters) const {
  const StagedTerm* col = find(StagedKind::Col);
  if (!col || col->scatter < 0) return false;
  for (size_t i = 0; i < num_scatters; ++i)
    if (!covers_scatter(static_cast<int>(i))) return false;
  return true;
}

StagedTerms find_staged_terms(const ScoreModGradient& grad, const RangeInfo& ranges, const VariantOptions& options, bool diagonal) {
  StagedTerms out;
  out.residual = grad.score_mod;
  if (!grad.score_mod) return out;
  std::vector<Expr> parts;
  summands(grad.score_mod, parts);
  std::vector<Expr> roots = {grad.score_mod};
  if (grad.mask_mod) roots.push_back(grad.mask_mod);

  std::vector<bool> staged(parts.size(), false);
  int diag_part = -1;
  for (size_t i = 0; i < parts.size(); ++i) {
    const Load* l = parts[i].as<Load>();
    if (!l || l->indices.empty()) continue;
    const bool single = loads_of(roots, l->buffer) == 1 && emitted_unchecked(ranges, options, parts[i]);
    if (diagonal && diag_part < 0 && (l->dtype == DType::F32 || l->dtype == DType::BF16 || l->dtype == DType::F16) && diagonal_index(l->indices.back()) && lead_indices_ok(l, 1) && single) {
      diag_part = static_cast<int>(i);
      continue;
    }
    if ((l->dtype != DType::BF16 && l->dtype != DType::F16) || l->indices.size() < 2) continue;
    const std::optional<StagedKind> kind = last_index_kind(l->indices.back());
    if (!kind || out.find(*kind) || !is_var(l->indices[l->indices.size() - 2], dsl::VarId::Q)) continue;
    if (!lead_indices_ok(l, 2) || !single) continue;
    StagedTerm t{*kind, l->buffer, parts[i], -1};
    bool grad_ok = true;
    for (size_t s = 0; s < grad.scatters.size(); ++s) {
      const GradScatter& g = grad.scatters[s];
      if (g.buffer != l->buffer) continue;
      bool same = g.indices.size() == l->indices.size() && is_float_const(g.coefficient, 1.f) && t.scatter < 0;
      for (size_t d = 0; same && d < g.indices.size(); ++d) same = g.indices[d].same_as(l->indices[d]);
      if (!same) grad_ok = false;
      t.scatter = static_cast<int>(s);
    }
    if (!grad_ok) continue;
    staged[i] = true;
    out.terms.push_back(t);
  }
  if (out.terms.empty() && diag_part >= 0) {  // a Col or Tile term takes the kernel form without the band
    staged[diag_part] = true;
    out.terms.push_back(StagedTerm{StagedKind::Diag, parts[diag_part].as<Load>()->buffer, parts[diag_part], -1});
  }
  if (out.terms.empty()) return out;

  const Expr rest = sum_of_unstaged(parts, staged);
  if (!rest) {  // no summand left (score_mod = rel_h + rel_w): keep the generic code
    out.terms.clear();
    out.residual = grad.score_mod;
    return out;
  }
  out.residual = is_var(rest, dsl::VarId::Score) ? Expr() : rest;
  return out;
}

}  // namespace flexjit
