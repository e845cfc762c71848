#include "dsl/sema.h"

#include <fmt/format.h>

#include <algorithm>

#include "dsl/builtins.h"
#include "dsl/parser.h"

namespace flexjit::dsl {

const char* value_type_name(ValueType t) {
  switch (t) {
    case ValueType::Int: return "int";
    case ValueType::Float: return "float";
    case ValueType::Bool: return "bool";
    case ValueType::Error: return "<error>";
  }
  return "?";
}

const char* mod_kind_name(ModKind k) { return k == ModKind::Score ? "score_mod" : "mask_mod"; }

int CheckedSpec::symbol_index(const std::string& name) const {
  for (size_t i = 0; i < symbols.size(); ++i)
    if (symbols[i] == name) return static_cast<int>(i);
  return -1;
}

std::vector<std::string> collect_symbols(const Spec& spec) {
  std::vector<std::string> s = standard_symbols();
  for (const BufferDecl& b : spec.buffers)
    for (const Dim& d : b.shape)
      if (d.is_symbol && std::find(s.begin(), s.end(), d.symbol) == s.end()) s.push_back(d.symbol);
  return s;
}

namespace {

bool is_numeric(ValueType t) { return t == ValueType::Int || t == ValueType::Float; }
ValueType promote(ValueType a, ValueType b) { return (a == ValueType::Float || b == ValueType::Float) ? ValueType::Float : ValueType::Int; }
const char* kBoolNote = "bool never mixes with numbers implicitly: use float(c), int(c) or where(c, a, b)";

class Sema {
 public:
  Sema(ModKind kind, std::shared_ptr<const Source> src, const Spec& spec, const std::vector<std::string>& symbols,
       Diagnostics& diags)
      : kind_(kind), src_(std::move(src)), spec_(spec), symbols_(symbols), diags_(diags) {}

  void run(Program& p) {
    for (size_t i = 0; i < p.lets.size(); ++i) {
      LetBinding& lb = p.lets[i];
      if (!lb.value) continue;  // a malformed let, already reported
      uint32_t depth = check(*lb.value);
      if (shadows(lb.name)) {
        diags_.report(DiagCode::DuplicateLet, src_, lb.name_span, fmt::format("`let {}` rebinds a name already in scope", lb.name),
                      "already defined", {"choose a new name for each `let`"});
      }
      lets_.push_back({lb.name, lb.value->type, depth});
    }
    if (!p.result) return;
    check(*p.result);
    ValueType t = p.result->type;
    if (t == ValueType::Error) return;
    if (kind_ == ModKind::Mask && t != ValueType::Bool) {
      diags_.report(DiagCode::WrongResultType, src_, p.result->span, fmt::format("a mask_mod must give a bool, but this is {}", value_type_name(t)),
                    "not a bool", {"compare it, e.g. `... != 0`; true means attend"});
    } else if (kind_ == ModKind::Score && t == ValueType::Bool) {
      diags_.report(DiagCode::WrongResultType, src_, p.result->span, "a score_mod must give a number, but this is bool", "not a number",
                    {"masking belongs in mask_mod; or write where(c, score, -inf)"});
    }
  }

 private:
  struct LetInfo {
    std::string name;
    ValueType type;
    uint32_t depth;
  };
  bool too_deep_reported_ = false;

  bool shadows(const std::string& n) const {
    if (lookup_variable(n) || spec_.find_param(n) || spec_.find_buffer(n) || lookup_function(n)) return true;
    if (std::find(symbols_.begin(), symbols_.end(), n) != symbols_.end()) return true;
    for (const LetInfo& l : lets_)
      if (l.name == n) return true;
    return false;
  }

  std::vector<std::string> visible_names() const {
    std::vector<std::string> v = {"b", "h", "q", "kv", "kv_head", "batch", "head", "q_idx", "kv_idx"};
    if (kind_ == ModKind::Score) v.push_back("score");
    for (const LetInfo& l : lets_) v.push_back(l.name);
    for (const ParamDecl& p : spec_.params) v.push_back(p.name);
    for (const BufferDecl& b : spec_.buffers) v.push_back(b.name);
    for (const std::string& s : symbols_) v.push_back(s);
    v.push_back("true");
    v.push_back("false");
    v.push_back("inf");
    return v;
  }

  void mismatch(const AstNode& at, std::string message, std::string label, std::vector<std::string> notes = {}) {
    diags_.report(DiagCode::TypeMismatch, src_, at.span, std::move(message), std::move(label), std::move(notes));
  }

  // Requires a numeric operand; reports and returns false otherwise.
  bool need_number(const AstNode& operand, const char* context) {
    if (operand.type == ValueType::Error || is_numeric(operand.type)) return operand.type != ValueType::Error;
    mismatch(operand, fmt::format("{} needs a number, but this is {}", context, value_type_name(operand.type)), "bool here", {kBoolNote});
    return false;
  }
  bool need_bool(const AstNode& operand, const char* context) {
    if (operand.type == ValueType::Error || operand.type == ValueType::Bool) return operand.type != ValueType::Error;
    mismatch(operand, fmt::format("{} needs a bool, but this is {}", context, value_type_name(operand.type)),
             fmt::format("{} here", value_type_name(operand.type)), {"compare it, e.g. `x != 0`, or use where(...)"});
    return false;
  }
  bool need_int(const AstNode& operand, const char* context) {
    if (operand.type == ValueType::Error || operand.type == ValueType::Int) return operand.type != ValueType::Error;
    mismatch(operand, fmt::format("{} needs an int, but this is {}", context, value_type_name(operand.type)),
             fmt::format("{} here", value_type_name(operand.type)),
             {operand.type == ValueType::Float ? "convert with int(x), which truncates toward zero" : kBoolNote});
    return false;
  }

  // The value of an int expression built from literals and const parameters, if it has one.
  std::optional<int64_t> const_int(const AstNode& n) const {
    switch (n.kind) {
      case AstKind::IntLit: return n.int_value;
      case AstKind::Name:
        if (n.name_kind == NameKind::Param) {
          const ParamDecl& p = spec_.params[n.ref];
          if (p.is_const && p.type == ValueType::Int) return p.int_value;
        }
        return std::nullopt;
      case AstKind::Unary:
        if (n.op == Tok::Minus)
          if (auto v = const_int(*n.args[0])) return static_cast<int64_t>(0ull - static_cast<uint64_t>(*v));
        return std::nullopt;
      case AstKind::Binary: {
        auto a = const_int(*n.args[0]);
        auto b = const_int(*n.args[1]);
        if (!a || !b) return std::nullopt;
        uint64_t ua = static_cast<uint64_t>(*a), ub = static_cast<uint64_t>(*b);
        if (n.op == Tok::Plus) return static_cast<int64_t>(ua + ub);
        if (n.op == Tok::Minus) return static_cast<int64_t>(ua - ub);
        if (n.op == Tok::Star) return static_cast<int64_t>(ua * ub);
        return std::nullopt;
      }
      default: return std::nullopt;
    }
  }

  // Checks a subtree and returns its height with `let` references expanded; past
  // kMaxExpandedDepth the program is rejected, so lowering and every pass recurse safely.
  uint32_t check(AstNode& n) {
    uint32_t depth = 1;
    for (auto& a : n.args) depth = std::max(depth, 1 + check(*a));
    check_node(n);
    if (n.kind == AstKind::Name && n.name_kind == NameKind::Let) depth = lets_[n.ref].depth;
    if (depth > kMaxExpandedDepth && !too_deep_reported_) {
      diags_.report(DiagCode::TooDeep, src_, n.span,
                    fmt::format("expression more than {} levels deep once `let` bindings are expanded", kMaxExpandedDepth),
                    "depth limit reached here", {"simplify the program; the generated code would be unreasonably deep"});
      too_deep_reported_ = true;
      n.type = ValueType::Error;
    }
    return depth;
  }

  void check_node(AstNode& n) {
    switch (n.kind) {
      case AstKind::IntLit: n.type = ValueType::Int; return;
      case AstKind::FloatLit: n.type = ValueType::Float; return;
      case AstKind::BoolLit: n.type = ValueType::Bool; return;
      case AstKind::Error: n.type = ValueType::Error; return;
      case AstKind::Name: return check_name(n);
      case AstKind::Unary: return check_unary(n);
      case AstKind::Binary: return check_binary(n);
      case AstKind::Ternary: {
        n.type = ValueType::Error;
        bool ok = need_bool(*n.args[0], "the condition of `?:`");
        ValueType r = join(n, *n.args[1], *n.args[2], "the branches of `?:`");
        if (ok) n.type = r;
        return;
      }
      case AstKind::Call: return check_call(n);
      case AstKind::Index: return check_index(n);
    }
  }

  // The common type of two branches (where / ?:): numbers promote, bools stay bool.
  ValueType join(const AstNode& at, const AstNode& a, const AstNode& b, const char* what) {
    if (a.type == ValueType::Error || b.type == ValueType::Error) return ValueType::Error;
    if (is_numeric(a.type) && is_numeric(b.type)) return promote(a.type, b.type);
    if (a.type == ValueType::Bool && b.type == ValueType::Bool) return ValueType::Bool;
    mismatch(at, fmt::format("{} must both be numbers or both be bools, but they are {} and {}", what, value_type_name(a.type),
                             value_type_name(b.type)),
             "mixed types", {kBoolNote});
    return ValueType::Error;
  }

  void check_name(AstNode& n) {
    n.type = ValueType::Error;
    for (size_t i = lets_.size(); i-- > 0;) {
      if (lets_[i].name == n.name) {
        n.name_kind = NameKind::Let;
        n.ref = static_cast<int>(i);
        n.type = lets_[i].type;
        return;
      }
    }
    if (auto v = lookup_variable(n.name)) {
      if (*v == VarId::Score && kind_ == ModKind::Mask) {
        diags_.report(DiagCode::ScoreInMask, src_, n.span, "`score` is not available in a mask_mod", "only in score_mod",
                      {"a mask decides from positions (b, h, q, kv) alone; move score logic to score_mod"});
        return;
      }
      n.name_kind = NameKind::Variable;
      n.ref = static_cast<int>(*v);
      n.type = *v == VarId::Score ? ValueType::Float : ValueType::Int;
      return;
    }
    for (size_t i = 0; i < spec_.params.size(); ++i) {
      if (spec_.params[i].name == n.name) {
        n.name_kind = NameKind::Param;
        n.ref = static_cast<int>(i);
        n.type = spec_.params[i].type;
        return;
      }
    }
    for (size_t i = 0; i < spec_.buffers.size(); ++i) {
      if (spec_.buffers[i].name == n.name) {
        const BufferDecl& b = spec_.buffers[i];
        std::string idx;
        for (size_t k = 0; k < b.shape.size(); ++k) idx += k ? ", i" + std::to_string(k) : "i0";
        diags_.report(DiagCode::BufferWithoutIndex, src_, n.span, fmt::format("buffer `{}` is used without an index", n.name),
                      fmt::format("needs {} {}", b.shape.size(), b.shape.size() == 1 ? "index" : "indices"),
                      {fmt::format("`{}` is declared as {}; load one element with {}[{}]", n.name, b.str(), n.name, idx)});
        return;
      }
    }
    for (size_t i = 0; i < symbols_.size(); ++i) {
      if (symbols_[i] == n.name) {
        n.name_kind = NameKind::Symbol;
        n.ref = static_cast<int>(i);
        n.type = ValueType::Int;
        return;
      }
    }
    if (lookup_function(n.name)) {
      diags_.report(DiagCode::UnknownName, src_, n.span, fmt::format("`{}` is a function, not a value", n.name), "call it",
                    {fmt::format("write {}(...)", n.name)});
      return;
    }
    auto guess = closest_name(n.name, visible_names());
    std::vector<std::string> notes;
    if (!guess) notes.push_back("declare it as a parameter (`--param 'NAME: int'`) or a buffer (`--buffer 'NAME: f32[...]'`)");
    diags_.report(DiagCode::UnknownName, src_, n.span, fmt::format("unknown name `{}`", n.name),
                  guess ? fmt::format("did you mean `{}`?", *guess) : "not declared", std::move(notes));
  }

  void check_unary(AstNode& n) {
    n.type = ValueType::Error;
    const AstNode& a = *n.args[0];
    if (a.type == ValueType::Error) return;
    switch (n.op) {
      case Tok::Minus:
        if (need_number(a, "unary `-`")) n.type = a.type;
        return;
      case Tok::Bang:
      case Tok::KwNot:
        if (need_bool(a, n.op == Tok::Bang ? "`!`" : "`not`")) n.type = ValueType::Bool;
        return;
      case Tok::Tilde:
        if (a.type == ValueType::Bool || a.type == ValueType::Int) n.type = a.type;
        else mismatch(a, "`~` needs an int or a bool, but this is float", "float here", {"`~` is bitwise not on ints and logical not on bools"});
        return;
      default: return;
    }
  }

  void check_binary(AstNode& n) {
    n.type = ValueType::Error;
    const AstNode& a = *n.args[0];
    const AstNode& b = *n.args[1];
    if (a.type == ValueType::Error || b.type == ValueType::Error) return;
    std::string op = fmt::format("`{}`", std::string_view(src_->text()).substr(n.op_span.begin, n.op_span.end - n.op_span.begin));
    switch (n.op) {
      case Tok::Plus:
      case Tok::Minus:
      case Tok::Star:
        if (need_number(a, op.c_str()) & need_number(b, op.c_str())) n.type = promote(a.type, b.type);
        return;
      case Tok::Slash:
        if (need_number(a, op.c_str()) & need_number(b, op.c_str())) n.type = ValueType::Float;
        return;
      case Tok::SlashSlash:
      case Tok::Percent:
        if (need_number(a, op.c_str()) & need_number(b, op.c_str())) {
          n.type = promote(a.type, b.type);
          if (n.type == ValueType::Int) {
            auto d = const_int(b);
            if (d && *d == 0) {
              diags_.report(DiagCode::DivisionByZero, src_, b.span,
                            fmt::format("integer {} by zero", n.op == Tok::Percent ? "modulo" : "division"), "this is zero",
                            {"the divisor is a constant zero, so every evaluation would divide by zero"});
              n.type = ValueType::Error;
            }
          }
        }
        return;
      case Tok::Shl:
      case Tok::Shr:
        if (need_int(a, op.c_str()) & need_int(b, op.c_str())) n.type = ValueType::Int;
        return;
      case Tok::Amp:
      case Tok::Pipe:
      case Tok::Caret:
        if (a.type == ValueType::Bool && b.type == ValueType::Bool) n.type = ValueType::Bool;
        else if (a.type == ValueType::Int && b.type == ValueType::Int) n.type = ValueType::Int;
        else
          mismatch(n, fmt::format("{} needs two ints or two bools, but got {} and {}", op, value_type_name(a.type), value_type_name(b.type)),
                   "mixed operands", {a.type == ValueType::Float || b.type == ValueType::Float ? "bitwise operators do not apply to floats" : kBoolNote});
        return;
      case Tok::AmpAmp:
      case Tok::PipePipe:
      case Tok::KwAnd:
      case Tok::KwOr:
        if (need_bool(a, op.c_str()) & need_bool(b, op.c_str())) n.type = ValueType::Bool;
        return;
      case Tok::EqEq:
      case Tok::NotEq:
        if ((is_numeric(a.type) && is_numeric(b.type)) || (a.type == ValueType::Bool && b.type == ValueType::Bool))
          n.type = ValueType::Bool;
        else
          mismatch(n, fmt::format("{} compares a {} with a {}", op, value_type_name(a.type), value_type_name(b.type)), "mixed operands", {kBoolNote});
        return;
      case Tok::Lt:
      case Tok::Le:
      case Tok::Gt:
      case Tok::Ge:
        if (need_number(a, op.c_str()) & need_number(b, op.c_str())) n.type = ValueType::Bool;
        return;
      default: return;
    }
  }

  void check_call(AstNode& n) {
    n.type = ValueType::Error;
    auto f = lookup_function(n.name);
    if (!f) {
      if (lookup_variable(n.name) || spec_.find_param(n.name) || spec_.find_buffer(n.name)) {
        diags_.report(DiagCode::NotCallable, src_, n.name_span, fmt::format("`{}` is not a function", n.name), "not callable",
                      {spec_.find_buffer(n.name) ? fmt::format("index a buffer with brackets: {}[...]", n.name) : "only functions can be called"});
        return;
      }
      std::vector<std::string> names;
      for (const FuncInfo& fi : functions()) names.push_back(fi.name);
      auto guess = closest_name(n.name, names);
      diags_.report(DiagCode::UnknownFunction, src_, n.name_span, fmt::format("unknown function `{}`", n.name),
                    guess ? fmt::format("did you mean `{}`?", *guess) : "no such function",
                    {fmt::format("functions: {}", fmt::join(names, " "))});
      return;
    }
    if (static_cast<int>(n.args.size()) != f->arity) {
      diags_.report(DiagCode::WrongArity, src_, n.span,
                    fmt::format("`{}` takes {} argument{}, but {} {} given", n.name, f->arity, f->arity == 1 ? "" : "s", n.args.size(),
                                n.args.size() == 1 ? "was" : "were"),
                    fmt::format("expected {}", f->arity));
      return;
    }
    for (auto& a : n.args)
      if (a->type == ValueType::Error) return;
    const AstNode& x = *n.args[0];
    switch (f->func) {
      case Func::Abs:
      case Func::Sign:
      case Func::Floor:
      case Func::Ceil:
      case Func::Round:
        if (need_number(x, n.name.c_str())) n.type = x.type;
        return;
      case Func::Min:
      case Func::Max:
        if (need_number(x, n.name.c_str()) & need_number(*n.args[1], n.name.c_str())) n.type = promote(x.type, n.args[1]->type);
        return;
      case Func::Clamp:
        if (need_number(x, "clamp") & need_number(*n.args[1], "clamp") & need_number(*n.args[2], "clamp"))
          n.type = promote(promote(x.type, n.args[1]->type), n.args[2]->type);
        return;
      case Func::Pow:
        if (need_number(x, "pow") & need_number(*n.args[1], "pow")) n.type = ValueType::Float;
        return;
      case Func::Where:
        if (need_bool(x, "the condition of where")) n.type = join(n, *n.args[1], *n.args[2], "the branches of where");
        return;
      case Func::ToFloat: n.type = ValueType::Float; return;
      case Func::ToInt: n.type = ValueType::Int; return;
      default:
        if (need_number(x, n.name.c_str())) n.type = ValueType::Float;
        return;
    }
  }

  void check_index(AstNode& n) {
    n.type = ValueType::Error;
    const BufferDecl* buf = nullptr;
    for (size_t i = 0; i < spec_.buffers.size(); ++i)
      if (spec_.buffers[i].name == n.name) {
        buf = &spec_.buffers[i];
        n.name_kind = NameKind::Buffer;
        n.ref = static_cast<int>(i);
      }
    if (!buf) {
      bool known = lookup_variable(n.name) || spec_.find_param(n.name) ||
                   std::find(symbols_.begin(), symbols_.end(), n.name) != symbols_.end();
      for (const LetInfo& l : lets_) known |= l.name == n.name;
      if (known) {
        diags_.report(DiagCode::NotIndexable, src_, n.name_span, fmt::format("`{}` is not a buffer and cannot be indexed", n.name),
                      "not a buffer", {"only declared buffers can be indexed"});
      } else {
        std::vector<std::string> names;
        for (const BufferDecl& b : spec_.buffers) names.push_back(b.name);
        auto guess = closest_name(n.name, names);
        diags_.report(DiagCode::UnknownName, src_, n.name_span, fmt::format("unknown buffer `{}`", n.name),
                      guess ? fmt::format("did you mean `{}`?", *guess) : "not declared",
                      guess ? std::vector<std::string>{} : std::vector<std::string>{fmt::format("declare it, e.g. `--buffer '{}: f32[Sq]'`", n.name)});
      }
      return;
    }
    bool ok = true;
    for (auto& a : n.args) {
      if (a->type == ValueType::Error) {
        ok = false;
      } else if (a->type != ValueType::Int) {
        diags_.report(DiagCode::FloatIndex, src_, a->span, fmt::format("a buffer index must be an int, but this is {}", value_type_name(a->type)),
                      "not an int", {a->type == ValueType::Float ? "convert with int(x), which truncates toward zero" : kBoolNote});
        ok = false;
      }
    }
    if (n.args.size() != buf->shape.size()) {
      diags_.report(DiagCode::WrongIndexCount, src_, n.span,
                    fmt::format("`{}` has {} dimension{} but is indexed with {}", n.name, buf->shape.size(), buf->shape.size() == 1 ? "" : "s",
                                n.args.size()),
                    fmt::format("expected {} {}", buf->shape.size(), buf->shape.size() == 1 ? "index" : "indices"),
                    {fmt::format("`{}` is declared as {}", n.name, buf->str())});
      ok = false;
    }
    if (!ok) return;
    n.type = buf->dtype == DType::Bool ? ValueType::Bool : dtype_is_float(buf->dtype) ? ValueType::Float : ValueType::Int;
  }

  ModKind kind_;
  std::shared_ptr<const Source> src_;
  const Spec& spec_;
  const std::vector<std::string>& symbols_;
  Diagnostics& diags_;
  std::vector<LetInfo> lets_;
};

}  // namespace

CheckedProgram check_program(ModKind kind, const std::string& text, const Spec& spec, const std::vector<std::string>& symbols,
                             Diagnostics& diags) {
  CheckedProgram cp{kind, std::make_shared<Source>(mod_kind_name(kind), text), nullptr};
  cp.ast = std::make_shared<Program>(parse_program(cp.source, diags));
  Sema(kind, cp.source, spec, symbols, diags).run(*cp.ast);
  return cp;
}

std::optional<CheckedSpec> check_spec(const Spec& spec, Diagnostics& diags) {
  size_t before = diags.list().size();
  CheckedSpec cs;
  cs.spec = spec;
  cs.symbols = collect_symbols(spec);
  if (spec.score_mod) cs.score_mod = check_program(ModKind::Score, *spec.score_mod, cs.spec, cs.symbols, diags);
  if (spec.mask_mod) cs.mask_mod = check_program(ModKind::Mask, *spec.mask_mod, cs.spec, cs.symbols, diags);
  if (diags.list().size() != before) return std::nullopt;
  return cs;
}

}  // namespace flexjit::dsl
