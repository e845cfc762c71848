#include "compiler/ir/ir_printer.h"

#include <fmt/format.h>

#include <cmath>
#include <unordered_map>

#include "compiler/ir/ir_mutator.h"

namespace flexjit::ir {

std::string float_literal(float v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  std::string s = fmt::format("{}", v);
  if (s.find_first_of(".eE") == std::string::npos) s += ".0";
  return s;
}

namespace {

class Printer {
 public:
  Printer(const NodeAnnotator& annotate, bool inline_all) : annotate_(annotate), inline_all_(inline_all) {}

  std::string run(const Expr& root) {
    if (!root) return "<none>\n";
    if (!inline_all_) {
      std::unordered_map<const Node*, int> uses;
      for_each_node(root, [&](const Expr& e) {
        for (const Expr& c : children(e)) ++uses[c.get()];
      });
      for_each_node(root, [&](const Expr& e) {
        if (e.same_as(root) || children(e).empty()) return;
        std::string note = annotate_ ? annotate_(e) : "";
        if (uses[e.get()] > 1 || !note.empty() || e.kind() == NodeKind::Load) {
          std::string text = body(e);
          std::string name = fmt::format("%{}", names_.size());
          lines_ += fmt::format("{} = {}{}\n", name, text, note.empty() ? "" : "    # " + note);
          names_.emplace(e.get(), name);
        }
      });
      std::string note = annotate_ ? annotate_(root) : "";
      return lines_ + body(root) + (note.empty() ? "" : "    # " + note) + "\n";
    }
    return body(root);
  }

 private:
  std::string ref(const Expr& e) {
    auto it = names_.find(e.get());
    if (it != names_.end()) return it->second;
    std::string s = body(e);
    bool atomic = children(e).empty() || e.kind() == NodeKind::Load || e.kind() == NodeKind::Cast ||
                  (e.kind() == NodeKind::Unary && e.as<Unary>()->op != UnaryOp::Neg && e.as<Unary>()->op != UnaryOp::Not &&
                   e.as<Unary>()->op != UnaryOp::BitNot) ||
                  (e.kind() == NodeKind::Binary && (e.as<Binary>()->op == BinaryOp::Min || e.as<Binary>()->op == BinaryOp::Max ||
                                                    e.as<Binary>()->op == BinaryOp::Pow));
    return atomic ? s : "(" + s + ")";
  }

  std::string body(const Expr& e) {
    switch (e.kind()) {
      case NodeKind::IntImm: return std::to_string(e.as<IntImm>()->value);
      case NodeKind::FloatImm: return float_literal(e.as<FloatImm>()->value);
      case NodeKind::BoolImm: return e.as<BoolImm>()->value ? "true" : "false";
      case NodeKind::Var: return dsl::var_name(e.as<Var>()->var);
      case NodeKind::Param: return "$" + e.as<Param>()->name;
      case NodeKind::Symbol: return e.as<Symbol>()->name;
      case NodeKind::Unary: {
        const Unary* u = e.as<Unary>();
        if (u->op == UnaryOp::Neg || u->op == UnaryOp::Not || u->op == UnaryOp::BitNot) return unary_op_name(u->op) + ref(u->a);
        return fmt::format("{}({})", unary_op_name(u->op), body_or_ref(u->a));
      }
      case NodeKind::Binary: {
        const Binary* b = e.as<Binary>();
        if (b->op == BinaryOp::Min || b->op == BinaryOp::Max || b->op == BinaryOp::Pow)
          return fmt::format("{}({}, {})", binary_op_name(b->op), body_or_ref(b->a), body_or_ref(b->b));
        return fmt::format("{} {} {}", ref(b->a), binary_op_name(b->op), ref(b->b));
      }
      case NodeKind::Select: {
        const Select* s = e.as<Select>();
        return fmt::format("select({}, {}, {})", body_or_ref(s->cond), body_or_ref(s->t), body_or_ref(s->f));
      }
      case NodeKind::Cast: return fmt::format("{}({})", type_name(e.type()), body_or_ref(e.as<Cast>()->a));
      case NodeKind::Load: {
        const Load* l = e.as<Load>();
        std::string idx;
        for (size_t i = 0; i < l->indices.size(); ++i) idx += (i ? ", " : "") + body_or_ref(l->indices[i]);
        return fmt::format("{}[{}]", l->name, idx);
      }
    }
    return "?";
  }

  // Inside a call's parentheses no extra parentheses are needed.
  std::string body_or_ref(const Expr& e) {
    auto it = names_.find(e.get());
    return it != names_.end() ? it->second : body(e);
  }

  const NodeAnnotator& annotate_;
  bool inline_all_;
  std::unordered_map<const Node*, std::string> names_;
  std::string lines_;
};

}  // namespace

std::string print_ir(const Expr& e, const NodeAnnotator& annotate) { return Printer(annotate, false).run(e); }

std::string print_inline(const Expr& e) {
  static const NodeAnnotator none;
  return Printer(none, true).run(e);
}

}  // namespace flexjit::ir
