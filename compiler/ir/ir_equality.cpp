#include "compiler/ir/ir_equality.h"

#include <cstring>
#include <map>
#include <unordered_map>
#include <utility>

namespace flexjit::ir {

namespace {

uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// Compares the node-local payload (everything but the operands).
bool same_head(const Expr& a, const Expr& b) {
  if (a.kind() != b.kind() || a.type() != b.type()) return false;
  switch (a.kind()) {
    case NodeKind::IntImm: return a.as<IntImm>()->value == b.as<IntImm>()->value;
    case NodeKind::FloatImm: return float_bits(a.as<FloatImm>()->value) == float_bits(b.as<FloatImm>()->value);
    case NodeKind::BoolImm: return a.as<BoolImm>()->value == b.as<BoolImm>()->value;
    case NodeKind::Var: return a.as<Var>()->var == b.as<Var>()->var;
    case NodeKind::Param: return a.as<Param>()->index == b.as<Param>()->index;
    case NodeKind::Symbol: return a.as<Symbol>()->index == b.as<Symbol>()->index;
    case NodeKind::Unary: return a.as<Unary>()->op == b.as<Unary>()->op;
    case NodeKind::Binary: return a.as<Binary>()->op == b.as<Binary>()->op;
    case NodeKind::Load: return a.as<Load>()->buffer == b.as<Load>()->buffer && a.as<Load>()->indices.size() == b.as<Load>()->indices.size();
    case NodeKind::Select:
    case NodeKind::Cast: return true;
  }
  return false;
}

struct Comparer {
  std::map<std::pair<const Node*, const Node*>, bool> memo;
  bool eq(const Expr& a, const Expr& b) {
    if (a.same_as(b)) return true;
    if (!a || !b) return false;
    auto key = std::make_pair(a.get(), b.get());
    auto it = memo.find(key);
    if (it != memo.end()) return it->second;
    bool r = same_head(a, b);
    if (r) {
      std::vector<Expr> ka = children(a), kb = children(b);
      for (size_t i = 0; r && i < ka.size(); ++i) r = eq(ka[i], kb[i]);
    }
    memo.emplace(key, r);
    return r;
  }
};

size_t mix(size_t h, size_t v) { return h ^ (v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2)); }

struct Hasher {
  std::unordered_map<const Node*, size_t> memo;
  size_t hash(const Expr& e) {
    if (!e) return 0;
    auto it = memo.find(e.get());
    if (it != memo.end()) return it->second;
    size_t h = mix(static_cast<size_t>(e.kind()) * 131 + static_cast<size_t>(e.type()), 0);
    switch (e.kind()) {
      case NodeKind::IntImm: h = mix(h, static_cast<size_t>(e.as<IntImm>()->value)); break;
      case NodeKind::FloatImm: h = mix(h, float_bits(e.as<FloatImm>()->value)); break;
      case NodeKind::BoolImm: h = mix(h, e.as<BoolImm>()->value); break;
      case NodeKind::Var: h = mix(h, static_cast<size_t>(e.as<Var>()->var)); break;
      case NodeKind::Param: h = mix(h, static_cast<size_t>(e.as<Param>()->index)); break;
      case NodeKind::Symbol: h = mix(h, static_cast<size_t>(e.as<Symbol>()->index)); break;
      case NodeKind::Unary: h = mix(h, static_cast<size_t>(e.as<Unary>()->op)); break;
      case NodeKind::Binary: h = mix(h, static_cast<size_t>(e.as<Binary>()->op)); break;
      case NodeKind::Load: h = mix(h, static_cast<size_t>(e.as<Load>()->buffer)); break;
      default: break;
    }
    for (const Expr& c : children(e)) h = mix(h, hash(c));
    memo.emplace(e.get(), h);
    return h;
  }
};

}  // namespace

bool equal(const Expr& a, const Expr& b) { return Comparer().eq(a, b); }
size_t structural_hash(const Expr& e) { return Hasher().hash(e); }

}  // namespace flexjit::ir
