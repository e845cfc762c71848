#include "compiler/passes/staging.h"

#include <algorithm>
#include <functional>
#include <unordered_set>

#include "compiler/ir/ir_mutator.h"

namespace flexjit {

using namespace ir;

const char* stage_name(Stage s) {
  switch (s) {
    case Stage::Row: return "row";
    case Stage::Col: return "col";
    case Stage::Tile: return "tile";
    case Stage::Element: return "element";
  }
  return "?";
}

namespace {

bool is_positive_int(const Expr& e, int64_t* value) {
  const IntImm* i = e.as<IntImm>();
  if (!i || i->value <= 0) return false;
  *value = i->value;
  return true;
}

// kv -> k0 + j, exploiting tile alignment for // and %; records each new node's origin.
class TileRewrite {
 public:
  TileRewrite(int tile, std::unordered_map<const Node*, Expr>& origin) : tile_(tile), origin_(origin) {}

  Expr run(const Expr& e) {
    if (!e) return e;
    auto it = memo_.find(e.get());
    if (it != memo_.end()) return it->second;
    Expr r = rewrite(e);
    memo_.emplace(e.get(), r);
    origin_.emplace(r.get(), e);
    return r;
  }

 private:
  Expr rewrite(const Expr& e) {
    if (const Var* v = e.as<Var>()) {
      if (v->var != VarId::KV) return e;
      Expr k0 = Var::make(VarId::TileStart), j = Var::make(VarId::TileCol);
      origin_.emplace(k0.get(), e);
      origin_.emplace(j.get(), e);
      return Binary::make(BinaryOp::Add, k0, j);
    }
    if (const Binary* b = e.as<Binary>()) {
      const Var* v = b->a.as<Var>();
      int64_t c = 0;
      if (v && v->var == VarId::KV && is_positive_int(b->b, &c)) {
        if (b->op == BinaryOp::FloorDiv && c % tile_ == 0) {
          Expr k0 = Var::make(VarId::TileStart);
          origin_.emplace(k0.get(), b->a);
          return Binary::make(BinaryOp::FloorDiv, k0, b->b);
        }
        if (b->op == BinaryOp::Mod && tile_ % c == 0) {
          Expr j = Var::make(VarId::TileCol);
          origin_.emplace(j.get(), b->a);
          return Binary::make(BinaryOp::Mod, j, b->b);
        }
      }
    }
    std::vector<Expr> kids = children(e);
    for (Expr& k : kids) k = run(k);
    return with_children(e, kids);
  }

  int tile_;
  std::unordered_map<const Node*, Expr>& origin_;
  std::unordered_map<const Node*, Expr> memo_;
};

uint32_t bit(VarId v) { return 1u << static_cast<int>(v); }

Stage stage_from_vars(uint32_t vars) {
  if (vars & (bit(VarId::Score) | bit(VarId::KV))) return Stage::Element;
  bool k0 = vars & bit(VarId::TileStart), j = vars & bit(VarId::TileCol);
  if (k0 && j) return Stage::Element;
  if (k0) return Stage::Tile;
  if (j) return Stage::Col;
  return Stage::Row;
}

// Whether computing a node once instead of per element is worth a register: loads and
// transcendental or division-like operations are; cheap integer arithmetic is not.
bool costly(const Expr& e) {
  switch (e.kind()) {
    case NodeKind::Load: return true;
    case NodeKind::Unary: return unary_op_is_float_math(e.as<Unary>()->op);
    case NodeKind::Binary: {
      BinaryOp op = e.as<Binary>()->op;
      return op == BinaryOp::Div || op == BinaryOp::Pow || op == BinaryOp::FloorDiv || op == BinaryOp::Mod;
    }
    default: return false;
  }
}

}  // namespace

Stage StagedMods::stage_of(const Expr& e) const {
  uint32_t vars = 0;
  for_each_node(e, [&](const Expr& n) {
    if (const Var* v = n.as<Var>()) vars |= bit(v->var);
  });
  return stage_from_vars(vars);
}

const HoistedValue* StagedMods::hoisted(const Expr& e) const {
  auto it = value_of.find(e.get());
  return it == value_of.end() ? nullptr : &values[it->second];
}

int StagedMods::count(Stage s) const {
  return static_cast<int>(std::count_if(values.begin(), values.end(), [&](const HoistedValue& v) { return v.stage == s; }));
}

StagedMods stage_mods(const Expr& score_mod, const Expr& mask_mod, const StagingOptions& options) {
  StagedMods out;
  out.tile_size = options.tile_size;
  TileRewrite rw(options.tile_size, out.origin);
  out.score_mod = rw.run(score_mod);
  out.mask_mod = rw.run(mask_mod);
  if (!options.hoist) return out;

  std::vector<Expr> roots;
  if (out.score_mod) roots.push_back(out.score_mod);
  if (out.mask_mod) roots.push_back(out.mask_mod);

  // Per node: the variables it uses and whether its subtree holds something costly.
  std::unordered_map<const Node*, uint32_t> vars;
  std::unordered_map<const Node*, bool> has_cost;
  for_each_node(roots, [&](const Expr& e) {
    uint32_t v = 0;
    bool c = costly(e);
    if (const Var* var = e.as<Var>()) v = bit(var->var);
    for (const Expr& k : children(e)) {
      v |= vars[k.get()];
      c |= has_cost[k.get()];
    }
    vars[e.get()] = v;
    has_cost[e.get()] = c;
  });

  // A node is hoisted when a user of a later stage (or a root) consumes it, it is not
  // Element, and it is costly. Col values are capped: each costs a register per element
  // position a thread owns.
  std::unordered_map<const Node*, Stage> consumer_stage;  // latest stage that uses the node
  auto note_use = [&](const Expr& child, Stage user) {
    auto it = consumer_stage.find(child.get());
    if (it == consumer_stage.end() || static_cast<int>(user) > static_cast<int>(it->second)) consumer_stage[child.get()] = user;
  };
  for (const Expr& r : roots) note_use(r, Stage::Element);
  for_each_node(roots, [&](const Expr& e) {
    Stage s = stage_from_vars(vars[e.get()]);
    for (const Expr& k : children(e)) note_use(k, s);
  });

  // Nodes every evaluation reaches: not only through the right operand of && / || or the
  // branches of a select.
  std::unordered_set<const Node*> unconditional;
  std::function<void(const Expr&)> mark = [&](const Expr& e) {
    if (!unconditional.insert(e.get()).second) return;
    const Binary* b = e.as<Binary>();
    if (b && (b->op == BinaryOp::And || b->op == BinaryOp::Or)) return mark(b->a);
    if (const Select* s = e.as<Select>()) return mark(s->cond);
    for (const Expr& k : children(e)) mark(k);
  };
  for (const Expr& r : roots) mark(r);
  std::unordered_map<const Node*, bool> flags;
  for_each_node(roots, [&](const Expr& e) {
    auto o = out.origin.find(e.get());
    bool f = options.may_flag && o != out.origin.end() && options.may_flag(o->second);
    for (const Expr& k : children(e)) f = f || flags[k.get()];
    flags[e.get()] = f;
  });

  int slots[4] = {0, 0, 0, 0};
  for_each_node(roots, [&](const Expr& e) {
    Stage s = stage_from_vars(vars[e.get()]);
    if (s == Stage::Element || children(e).empty() || !has_cost[e.get()]) return;
    auto it = consumer_stage.find(e.get());
    if (it == consumer_stage.end() || static_cast<int>(it->second) <= static_cast<int>(s)) return;
    if (s == Stage::Col && slots[1] >= options.max_col_values) return;
    if (flags[e.get()] && !unconditional.count(e.get())) return;
    out.value_of.emplace(e.get(), static_cast<int>(out.values.size()));
    out.values.push_back(HoistedValue{e, s, slots[static_cast<int>(s)]++});
  });
  return out;
}

}  // namespace flexjit
