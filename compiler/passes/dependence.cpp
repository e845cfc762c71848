#include "compiler/passes/dependence.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

#include "compiler/ir/ir_mutator.h"

namespace flexjit {

using namespace ir;

namespace {

void merge_sorted(std::vector<int>& into, const std::vector<int>& from) {
  if (from.empty()) return;
  std::vector<int> out;
  out.reserve(into.size() + from.size());
  std::set_union(into.begin(), into.end(), from.begin(), from.end(), std::back_inserter(out));
  into = std::move(out);
}

void insert_sorted(std::vector<int>& into, int v) {
  auto it = std::lower_bound(into.begin(), into.end(), v);
  if (it == into.end() || *it != v) into.insert(it, v);
}

}  // namespace

std::string Dependence::describe(const std::vector<std::string>& buffer_names) const {
  std::vector<std::string> parts;
  std::string vs;
  for (int v = 0; v < dsl::kNumVars; ++v)
    if (vars & (1u << v)) vs += (vs.empty() ? "" : ",") + std::string(dsl::var_name(static_cast<dsl::VarId>(v)));
  parts.push_back(vs.empty() ? "depends on no index" : "depends on " + vs);
  if (!buffers.empty()) {
    std::string bs;
    for (int b : buffers) {
      std::string n = b >= 0 && static_cast<size_t>(b) < buffer_names.size() ? buffer_names[b] : fmt::format("buffer#{}", b);
      bs += (bs.empty() ? "" : ",") + n;
    }
    parts.push_back("loads " + bs);
  }
  if (uses_params) parts.push_back("uses params");
  std::string out;
  for (const std::string& p : parts) out += (out.empty() ? "" : "; ") + p;
  return out;
}

DependenceInfo::DependenceInfo(const std::vector<Expr>& roots) : roots_(roots) {
  for_each_node(roots_, [&](const Expr& e) {
    Dependence d;
    for (const Expr& c : children(e)) {
      const Dependence& cd = deps_.at(c.get());
      d.vars |= cd.vars;
      merge_sorted(d.buffers, cd.buffers);
      merge_sorted(d.symbols, cd.symbols);
      d.uses_params |= cd.uses_params;
      d.has_load |= cd.has_load;
    }
    switch (e.kind()) {
      case NodeKind::Var: d.vars |= 1u << static_cast<int>(e.as<Var>()->var); break;
      case NodeKind::Param: d.uses_params = true; break;
      case NodeKind::Symbol: insert_sorted(d.symbols, e.as<Symbol>()->index); break;
      case NodeKind::Load:
        d.has_load = true;
        insert_sorted(d.buffers, e.as<Load>()->buffer);
        break;
      default: break;
    }
    deps_.emplace(e.get(), std::move(d));
  });
}

const Dependence& DependenceInfo::of(const Expr& e) const {
  auto it = deps_.find(e.get());
  if (it == deps_.end()) throw std::out_of_range("DependenceInfo::of: the node is not part of the analysed expressions");
  return it->second;
}

bool only_through_difference(const ir::Expr& e) {
  using namespace ir;
  if (const Binary* b = e.as<Binary>(); b && b->op == BinaryOp::Sub && is_var(b->a, dsl::VarId::Q) && is_var(b->b, dsl::VarId::KV))
    return true;
  if (is_var(e, dsl::VarId::Q) || is_var(e, dsl::VarId::KV)) return false;
  for (const Expr& c : children(e))
    if (!only_through_difference(c)) return false;
  return true;
}

}  // namespace flexjit
