#include "compiler/codegen/codegen_cuda.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>

#include "compiler/codegen/codegen_cuda_interval.h"
#include "compiler/codegen/row_terms.h"
#include "compiler/codegen/score_scales.h"
#include "compiler/ir/ir_mutator.h"
#include "compiler/ir/ir_printer.h"
#include "compiler/passes/dependence.h"

namespace flexjit {

using namespace ir;

namespace {

std::string cuda_float(float v) {
  if (std::isnan(v)) return "__int_as_float(0x7fffffff)";
  if (std::isinf(v)) return v > 0 ? "__int_as_float(0x7f800000)" : "__int_as_float(0xff800000)";
  std::string s = float_literal(v);
  return s + "f";
}

class CudaEmitter {
 public:
  CudaEmitter(const SpecIR& ir, const RangeInfo& ranges, const StagedMods& staged, const VariantOptions& opt)
      : ir_(ir), ranges_(ranges), staged_(staged), opt_(opt) {
    for (size_t i = 0; i < ranges_.loads.size(); ++i) load_index_.emplace(ranges_.loads[i].load.get(), static_cast<int>(i));
  }

  // Starts a function body: earlier stages' hoisted values are visible through their state.
  void begin(Stage stage) {
    names_.clear();
    flags_memo_.clear();
    lines_.clear();
    stage_ = stage;
    for (const HoistedValue& v : staged_.values)
      if (static_cast<int>(v.stage) < static_cast<int>(stage)) names_[v.expr.get()] = fmt::format("{}.v{}", state_name(v.stage), index_of(v));
  }

  // Makes `name` the value of e in the current body (a staged value the function receives).
  void bind(const Expr& e, std::string name) { names_[e.get()] = std::move(name); }

  // Emits the statements computing e (if not yet in scope) and returns the name holding it.
  std::string emit(const Expr& e) {
    auto it = names_.find(e.get());
    if (it != names_.end()) return it->second;
    if (std::string leaf = leaf_text(e); !leaf.empty()) return leaf;
    if (std::string guarded = emit_guarded(e); !guarded.empty()) return guarded;
    std::vector<std::string> k;
    for (const Expr& c : children(e)) k.push_back(emit(c));
    std::string rhs = op_text(e, k);
    std::string name = fmt::format("t{}", counter_++);
    if (const Load* l = e.as<Load>()) lines_.push_back("// " + describe_load(e, l));
    lines_.push_back(fmt::format("const {} {} = {};", c_type(e), name, rhs));
    names_[e.get()] = name;
    return name;
  }

  // `&&`, `||` and selects evaluate only the operand they use, as the interpreter does, when
  // that operand holds work that can raise an error flag (a checked load, a runtime
  // divisor): `i < n && buf[i] > 0` then guards the load. Other operands are computed
  // eagerly (no divergence). Returns "" when e needs no guard.
  std::string emit_guarded(const Expr& e) {
    const Binary* b = e.as<Binary>();
    const Select* sel = e.as<Select>();
    bool logic = b && (b->op == BinaryOp::And || b->op == BinaryOp::Or);
    if (!logic && !sel) return "";
    if (logic ? !flags_errors(b->b) : !(flags_errors(sel->t) || flags_errors(sel->f))) return "";
    std::string name = fmt::format("t{}", counter_++);
    auto branch = [&](const Expr& value) {
      auto saved = names_;
      std::string v = emit(value);
      lines_.push_back(fmt::format("{} = {};", name, v));
      names_ = std::move(saved);  // temporaries of a branch are not visible after it
    };
    if (logic) {
      std::string a = emit(b->a);
      bool is_and = b->op == BinaryOp::And;
      lines_.push_back(fmt::format("bool {} = {};", name, is_and ? "false" : "true"));
      lines_.push_back(fmt::format("if ({}{}) {{", is_and ? "" : "!", a));
      branch(b->b);
      lines_.push_back("}");
    } else {
      std::string c = emit(sel->cond);
      lines_.push_back(fmt::format("{} {};", c_type(e), name));
      lines_.push_back(fmt::format("if ({}) {{", c));
      branch(sel->t);
      lines_.push_back("} else {");
      branch(sel->f);
      lines_.push_back("}");
    }
    names_[e.get()] = name;
    return name;
  }

  // Whether evaluating e (beyond what is already in scope) can set an error flag.
  bool flags_errors(const Expr& e) {
    if (names_.count(e.get())) return false;
    auto it = flags_memo_.find(e.get());
    if (it != flags_memo_.end()) return it->second;
    bool r = false;
    if (e.as<Load>()) {
      int idx = -1;
      r = emitted_checked(e, &idx) && opt_.error_flags;
    } else if (const Binary* b = e.as<Binary>()) {
      const IntImm* d = b->b.as<IntImm>();
      r = opt_.error_flags && e.type() == Type::Int && (b->op == BinaryOp::FloorDiv || b->op == BinaryOp::Mod) && !(d && d->value != 0);
    }
    for (const Expr& c : children(e)) r = r || flags_errors(c);
    flags_memo_[e.get()] = r;
    return r;
  }

  void line(std::string s) { lines_.push_back(std::move(s)); }
  std::string body(int indent) const {
    std::string out;
    int depth = 0;
    for (const std::string& l : lines_) {
      if (!l.empty() && l[0] == '}') --depth;
      out += std::string(indent + 2 * depth, ' ') + l + "\n";
      if (!l.empty() && l.back() == '{') ++depth;
    }
    return out;
  }

  std::string c_type(const Expr& e) const {
    switch (e.type()) {
      case Type::Bool: return "bool";
      case Type::Float: return "float";
      case Type::Int: return wide(e) ? "long long" : "int";
    }
    return "?";
  }

  static const char* state_name(Stage s) { return s == Stage::Row ? "row" : s == Stage::Col ? "col" : "tile"; }
  int index_of(const HoistedValue& v) const { return staged_.value_of.at(v.expr.get()); }

  std::vector<LoadSite> sites;

  // 64-bit when the int32 variant is off or the node's range is unbounded.
  bool wide(const Expr& e) const {
    if (e.type() != Type::Int) return false;
    if (!opt_.int32) return true;
    if (e.as<Var>()) return false;
    Expr o = origin(e);
    if (ranges_.unbounded_ints.count(o.get()) || ranges_.wide_ints.count(o.get())) return true;
    if (!ranges_.ranges.count(o.get())) return !e.as<IntImm>();
    return false;
  }

 private:
  Expr origin(const Expr& e) const {
    auto it = staged_.origin.find(e.get());
    return it == staged_.origin.end() ? e : it->second;
  }

  bool nonnegative(const Expr& e) const {
    auto it = ranges_.ranges.find(origin(e).get());
    if (it == ranges_.ranges.end() || !it->second.lo) return false;
    const IntImm* lo = it->second.lo.as<IntImm>();
    return lo && lo->value >= 0;
  }

  std::string leaf_text(const Expr& e) {
    switch (e.kind()) {
      case NodeKind::IntImm: {
        int64_t v = e.as<IntImm>()->value;
        if (v >= INT32_MIN && v <= INT32_MAX && !(opt_.int32 == false)) return v < 0 ? fmt::format("({})", v) : std::to_string(v);
        if (v == INT64_MIN) return "(-9223372036854775807ll - 1)";
        return v < 0 ? fmt::format("({}ll)", v) : fmt::format("{}ll", v);
      }
      case NodeKind::FloatImm: return cuda_float(e.as<FloatImm>()->value);
      case NodeKind::BoolImm: return e.as<BoolImm>()->value ? "true" : "false";
      case NodeKind::Var:
        switch (e.as<Var>()->var) {
          case VarId::B: return "b";
          case VarId::H: return "h";
          case VarId::KvHead: return "hkv";
          case VarId::Q: return "q";
          case VarId::TileStart: return "k0";
          case VarId::TileCol: return "j";
          case VarId::Score: return "score";
          case VarId::KV: return "(k0 + j)";
        }
        return "";
      case NodeKind::Param: {
        const Param* p = e.as<Param>();
        return fmt::format("p.param_{}", p->name);
      }
      case NodeKind::Symbol: {
        const Symbol* s = e.as<Symbol>();
        return wide(e) ? fmt::format("p.sym_{}", s->name) : fmt::format("((int)p.sym_{})", s->name);
      }
      default: return "";
    }
  }

  // A runtime int parameter compared with a 32-bit value: its copy saturated to int32 by the host, so the comparison
  // runs in 32 bits, as against a constant, instead of widening every score element's operand to 64. Exact where the
  // value provably never reaches INT32_MIN or INT32_MAX (RangeInfo::strict_int32: positions and their differences):
  // every comparison with the saturated copy then comes out as with the parameter. `text` is operand e's text;
  // `other` the other operand.
  std::string narrow_param(const Expr& e, const Expr& other, const std::string& text) const {
    const Param* p = e.as<Param>();
    if (!p || wide(other) || !opt_.int32 || !ranges_.strict_int32.count(origin(other).get())) return text;
    const dsl::ParamDecl& decl = ir_.spec().params.at(static_cast<size_t>(p->index));
    if (decl.is_const || decl.type != dsl::ValueType::Int) return text;
    return fmt::format("p.{}", int32_field(decl));
  }

  // The C type arithmetic on these operands runs in: 64-bit if any side (or the result) is.
  std::string int_comp_type(const Expr& e) const {
    bool w = wide(e);
    for (const Expr& c : children(e)) w |= wide(c);
    return w ? "long long" : "int";
  }

  std::string op_text(const Expr& e, const std::vector<std::string>& k) {
    switch (e.kind()) {
      case NodeKind::Unary: return unary_text(e.as<Unary>(), k[0]);
      case NodeKind::Binary: return binary_text(e, e.as<Binary>(), k[0], k[1]);
      case NodeKind::Select: return fmt::format("({} ? {} : {})", k[0], k[1], k[2]);
      case NodeKind::Cast: {
        Type from = e.as<Cast>()->a.type();
        if (e.type() == Type::Float) return from == Type::Bool ? fmt::format("({} ? 1.f : 0.f)", k[0]) : fmt::format("(float){}", k[0]);
        if (from == Type::Bool) return fmt::format("({} ? 1 : 0)", k[0]);
        return fmt::format("fj::float_to_int({})", k[0]);
      }
      case NodeKind::Load: return load_text(e, e.as<Load>(), k);
      default: return "/*?*/";
    }
  }

  std::string unary_text(const Unary* u, const std::string& a) {
    bool f = u->a.type() == Type::Float;
    switch (u->op) {
      case UnaryOp::Neg: return f ? fmt::format("(-{})", a) : fmt::format("fj::neg(({}){})", int_comp_type(u->a), a);
      case UnaryOp::Not: return fmt::format("(!{})", a);
      case UnaryOp::BitNot: return fmt::format("(~{})", a);
      case UnaryOp::Abs: return f ? fmt::format("fabsf({})", a) : fmt::format("fj::abs_(({}){})", int_comp_type(u->a), a);
      case UnaryOp::Sign: return f ? fmt::format("fj::sign({})", a) : fmt::format("fj::sign(({}){})", int_comp_type(u->a), a);
      case UnaryOp::Floor: return fmt::format("floorf({})", a);
      case UnaryOp::Ceil: return fmt::format("ceilf({})", a);
      case UnaryOp::Round: return fmt::format("rintf({})", a);
      case UnaryOp::Exp: return fmt::format("expf({})", a);
      case UnaryOp::Exp2: return fmt::format("exp2f({})", a);
      case UnaryOp::Log: return fmt::format("logf({})", a);
      case UnaryOp::Log2: return fmt::format("log2f({})", a);
      case UnaryOp::Log1p: return fmt::format("log1pf({})", a);
      case UnaryOp::Sqrt: return fmt::format("sqrtf({})", a);
      case UnaryOp::Rsqrt: return fmt::format("fj::rsqrt_({})", a);
      case UnaryOp::Tanh: return opt_.fast_tanh ? fmt::format("fj::tanh_fast({})", a) : fmt::format("tanhf({})", a);
      case UnaryOp::Sigmoid: return fmt::format("fj::sigmoid({})", a);
      case UnaryOp::Sin: return fmt::format("sinf({})", a);
      case UnaryOp::Cos: return fmt::format("cosf({})", a);
    }
    return "/*?*/";
  }

  std::string binary_text(const Expr& e, const Binary* b, const std::string& x, const std::string& y) {
    Type t = b->a.type();
    if (t == Type::Float) {
      switch (b->op) {
        case BinaryOp::Add: return fmt::format("({} + {})", x, y);
        case BinaryOp::Sub: return fmt::format("({} - {})", x, y);
        case BinaryOp::Mul: return fmt::format("({} * {})", x, y);
        case BinaryOp::Div:
          // Division by a constant becomes a multiplication by its reciprocal (at most one ulp
          // from IEEE division; exact for powers of two): IEEE division costs a dozen
          // instructions per score element and dominated soft-capping.
          if (const FloatImm* c = b->b.as<FloatImm>(); c && std::isfinite(c->value) && c->value != 0.f && std::isfinite(1.f / c->value))
            return fmt::format("({} * {})", x, cuda_float(1.f / c->value));
          // A runtime parameter's reciprocal is rounded once per launch by the host (docs/SEMANTICS.md).
          if (const Param* p = b->b.as<Param>())
            return fmt::format("({} * p.{})", x, reciprocal_field(ir_.spec().params.at(static_cast<size_t>(p->index))));
          return fmt::format("({} / {})", x, y);
        case BinaryOp::FloorDiv: return fmt::format("fj::floordiv({}, {})", x, y);
        case BinaryOp::Mod: return fmt::format("fj::mod({}, {})", x, y);
        case BinaryOp::Min: return fmt::format("fminf({}, {})", x, y);
        case BinaryOp::Max: return fmt::format("fmaxf({}, {})", x, y);
        case BinaryOp::Pow: return fmt::format("powf({}, {})", x, y);
        default: break;
      }
    }
    if (t == Type::Bool) {
      switch (b->op) {
        case BinaryOp::And: return fmt::format("({} && {})", x, y);
        case BinaryOp::Or: return fmt::format("({} || {})", x, y);
        case BinaryOp::Xor:
        case BinaryOp::NE: return fmt::format("({} != {})", x, y);
        case BinaryOp::EQ: return fmt::format("({} == {})", x, y);
        default: break;
      }
    }
    switch (b->op) {
      case BinaryOp::EQ: return fmt::format("({} == {})", narrow_param(b->a, b->b, x), narrow_param(b->b, b->a, y));
      case BinaryOp::NE: return fmt::format("({} != {})", narrow_param(b->a, b->b, x), narrow_param(b->b, b->a, y));
      case BinaryOp::LT: return fmt::format("({} < {})", narrow_param(b->a, b->b, x), narrow_param(b->b, b->a, y));
      case BinaryOp::LE: return fmt::format("({} <= {})", narrow_param(b->a, b->b, x), narrow_param(b->b, b->a, y));
      case BinaryOp::GT: return fmt::format("({} > {})", narrow_param(b->a, b->b, x), narrow_param(b->b, b->a, y));
      case BinaryOp::GE: return fmt::format("({} >= {})", narrow_param(b->a, b->b, x), narrow_param(b->b, b->a, y));
      default: break;
    }
    // Integer arithmetic.
    std::string ct = int_comp_type(e);
    bool narrow = ct == "int";
    auto cast = [&](const std::string& v) { return fmt::format("({}){}", ct, v); };
    const IntImm* divisor = b->b.as<IntImm>();
    switch (b->op) {
      case BinaryOp::Add: return narrow ? fmt::format("({} + {})", x, y) : fmt::format("fj::add({}, {})", cast(x), cast(y));
      case BinaryOp::Sub: return narrow ? fmt::format("({} - {})", x, y) : fmt::format("fj::sub({}, {})", cast(x), cast(y));
      case BinaryOp::Mul: return narrow ? fmt::format("({} * {})", x, y) : fmt::format("fj::mul({}, {})", cast(x), cast(y));
      case BinaryOp::FloorDiv:
      case BinaryOp::Mod: {
        bool div = b->op == BinaryOp::FloorDiv;
        // A positive constant divisor of a provably non-negative value is C's / and %,
        // which the compiler turns into shifts and masks.
        if (divisor && divisor->value > 0 && nonnegative(b->a)) return fmt::format("({} {} {})", cast(x), div ? "/" : "%", y);
        if (!(divisor && divisor->value != 0) && opt_.error_flags)
          lines_.push_back(fmt::format("if ({} == 0) atomicOr(p.error_flags, {}u);", y, kZeroDivisorFlag));
        // A runtime int parameter dividing a non-negative 32-bit value: a multiply by the multiplier the host computed
        // for the launch (flex_int_divisor.cuh) instead of a 64-bit division, which is a subroutine call per element.
        if (const Param* pd = b->b.as<Param>(); pd && !wide(b->a) && nonnegative(b->a)) {
          const dsl::ParamDecl& decl = ir_.spec().params.at(static_cast<size_t>(pd->index));
          if (!decl.is_const && decl.type == dsl::ValueType::Int)
            return fmt::format("fj::{}_by_param((int){}, {}, p.{})", div ? "floordiv" : "mod", x, y, divisor_field(decl));
        }
        return fmt::format("fj::{}<{}>({}, {})", div ? "floordiv" : "mod", ct, cast(x), cast(y));
      }
      case BinaryOp::Min: return fmt::format("min({}, {})", cast(x), cast(y));
      case BinaryOp::Max: return fmt::format("max({}, {})", cast(x), cast(y));
      case BinaryOp::BitAnd: return fmt::format("({} & {})", cast(x), cast(y));
      case BinaryOp::BitOr: return fmt::format("({} | {})", cast(x), cast(y));
      case BinaryOp::BitXor: return fmt::format("({} ^ {})", cast(x), cast(y));
      case BinaryOp::Shl: return fmt::format("fj::shl((long long){}, (long long){})", x, y);
      case BinaryOp::Shr: return fmt::format("fj::shr((long long){}, (long long){})", x, y);
      default: break;
    }
    return "/*?*/";
  }

  const LoadCheck* check_of(const Expr& e) const {
    Expr o = origin(e);
    auto it = load_index_.find(o.get());
    return it == load_index_.end() ? nullptr : &ranges_.loads[it->second];
  }

  bool emitted_checked(const Expr& e, int* index) const {
    Expr o = origin(e);
    auto it = load_index_.find(o.get());
    if (it == load_index_.end()) {
      *index = -1;
      return true;
    }
    *index = it->second;
    const LoadCheck& c = ranges_.loads[it->second];
    if (c.status == LoadCheck::Status::Proven) return false;
    if (c.status == LoadCheck::Status::Unproven) return true;
    return it->second < 64 && ((opt_.checked_loads >> it->second) & 1);
  }

  std::string describe_load(const Expr& e, const Load*) {
    Expr o = origin(e);
    int idx = -1;
    bool checked = emitted_checked(e, &idx);
    const LoadCheck* c = check_of(e);
    std::string why;
    if (!c) why = "checked: not analysed";
    else if (c->status == LoadCheck::Status::Proven) why = "unchecked: indices proven in range";
    else if (c->status == LoadCheck::Status::Conditional)
      why = checked ? fmt::format("checked: the launch's shapes break {}", print_inline(c->obligation))
                    : fmt::format("unchecked: indices proven in range because {} held at launch", print_inline(c->obligation));
    else why = "checked: indices not provably in range";
    Stage s = staged_.stage_of(e);
    return fmt::format("load {}; stage {}; {}", print_inline(o), stage_name(s), why);
  }

  std::string load_text(const Expr& e, const Load* l, const std::vector<std::string>& k) {
    const dsl::BufferDecl& decl = ir_.spec().buffers.at(l->buffer);
    std::string f = buffer_field(decl);
    int idx = -1;
    bool checked = emitted_checked(e, &idx);
    // Bits 0..29: bit 30 is the launches' length check (kFlexBadLengthsFlag), 31 the zero divisor's.
    unsigned bit = idx < 0 ? (1u << 29) : (1u << std::min(idx, 29));
    std::string off;
    for (size_t d = 0; d < k.size(); ++d) {
      std::string i = checked ? fmt::format("fj::checked_index((long long){}, p.{}_n{}, {}, {}u)", k[d], f, d,
                                            opt_.error_flags ? "p.error_flags" : "nullptr", bit)
                              : fmt::format("(long long){}", k[d]);
      const bool unit = d + 1 == k.size() && l->buffer < 64 && ((opt_.unit_inner_stride >> l->buffer) & 1);
      off += unit ? fmt::format("{}{}", d ? " + " : "", i) : fmt::format("{}{} * p.{}_s{}", d ? " + " : "", i, f, d);
    }
    if (idx >= 0 && sites.size() > static_cast<size_t>(idx)) {
      LoadSite& s = sites[idx];
      s.checked = checked;
      s.flag_bit = checked && opt_.error_flags ? bit : 0;
      const LoadCheck& c = ranges_.loads[idx];
      s.status = !checked ? (c.status == LoadCheck::Status::Proven ? "unchecked (proven)" : "unchecked (obligation held at launch)") : "checked";
    }
    std::string value;
    switch (decl.dtype) {
      case dsl::DType::F32: value = fmt::format("fj::load_f32(p.{}, {})", f, off); break;
      case dsl::DType::F16: value = fmt::format("fj::load_f16(p.{}, {})", f, off); break;
      case dsl::DType::BF16: value = fmt::format("fj::load_bf16(p.{}, {})", f, off); break;
      case dsl::DType::I32: value = fmt::format("fj::load_i32(p.{}, {})", f, off); break;
      case dsl::DType::I64: value = fmt::format("fj::load_i64(p.{}, {})", f, off); break;
      case dsl::DType::U8: value = fmt::format("fj::load_u8(p.{}, {})", f, off); break;
      case dsl::DType::Bool: value = fmt::format("fj::load_bool(p.{}, {})", f, off); break;
      case dsl::DType::F8E4M3:
      case dsl::DType::F8E5M2: throw std::logic_error("internal error: FP8 is a KV-cache type, never a buffer's");
    }
    if (e.type() == Type::Int && !wide(e)) value = "(int)" + value;
    return value;
  }

  const SpecIR& ir_;
  const RangeInfo& ranges_;
  const StagedMods& staged_;
  const VariantOptions& opt_;
  std::unordered_map<const Node*, int> load_index_;
  std::unordered_map<const Node*, std::string> names_;
  std::unordered_map<const Node*, bool> flags_memo_;
  std::vector<std::string> lines_;
  Stage stage_ = Stage::Row;
  int counter_ = 0;
};

// The user's program as // comments, one per source line (so newlines cannot end a comment).
std::string comment_block(const char* label, const std::string& text) {
  std::string out = fmt::format("// {}:\n", label);
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(start, end - start);
    for (char& c : line)
      if (c == '\r' || c == '\\') c = ' ';  // a trailing backslash would splice the next line
    out += "//   " + line + "\n";
    start = end + 1;
  }
  return out;
}

std::string params_struct(const ParamsLayout& layout) {
  std::string s = "  // Captured buffers, shape symbols and runtime parameters: one 8-byte slot per field,\n"
                  "  // filled by the host from the same ParamsLayout.\n  struct Params {\n";
  for (const ParamSlot& slot : layout.slots) {
    switch (slot.kind) {
      case SlotKind::ErrorFlags: s += "    unsigned int* error_flags;  // error word of the launch (clamped loads, zero divisors)\n"; break;
      case SlotKind::BufferData: s += fmt::format("    const void* {};\n", slot.field); break;
      case SlotKind::FloatParam:
      case SlotKind::FloatParamReciprocal: s += fmt::format("    float {};\n    unsigned int {}_pad;\n", slot.field, slot.field); break;
      case SlotKind::IntParamInt32: s += fmt::format("    int {};\n    unsigned int {}_pad;\n", slot.field, slot.field); break;
      default: s += fmt::format("    long long {};\n", slot.field); break;
    }
  }
  return s + "  };\n";
}

// Whether evaluating `e` (a node of the analysed DAG) can set an error flag in this variant.
bool may_flag(const SpecIR&, const RangeInfo& ranges, const VariantOptions& opt, const Expr& e) {
  if (!opt.error_flags) return false;
  if (const Binary* b = e.as<Binary>()) {
    const IntImm* d = b->b.as<IntImm>();
    return e.type() == Type::Int && (b->op == BinaryOp::FloorDiv || b->op == BinaryOp::Mod) && !(d && d->value != 0);
  }
  if (!e.as<Load>()) return false;
  for (size_t i = 0; i < ranges.loads.size(); ++i) {
    if (!ranges.loads[i].load.same_as(e)) continue;
    const LoadCheck& c = ranges.loads[i];
    if (c.status == LoadCheck::Status::Proven) return false;
    if (c.status == LoadCheck::Status::Unproven) return true;
    return i >= 64 || ((opt.checked_loads >> i) & 1);
  }
  return true;
}

// Whether the staged mods can be evaluated at any KV column, Skv and past it included, without reading memory or
// raising an error: no loads and no integer division by anything but a non-zero constant (flex_variant_base.cuh,
// kEvaluablePastSkv). A float result there may be anything; the kernels replace it.
bool mods_evaluable_past_skv(const StagedMods& staged) {
  bool ok = true;
  for (const Expr& root : {staged.score_mod, staged.mask_mod})
    if (root)
      for_each_node(root, [&](const Expr& n) {
        if (n.as<Load>()) ok = false;
        if (const Binary* b = n.as<Binary>(); b && n.type() == Type::Int && (b->op == BinaryOp::FloorDiv || b->op == BinaryOp::Mod)) {
          const IntImm* d = b->b.as<IntImm>();
          if (!d || d->value == 0) ok = false;
        }
      });
  return ok;
}

// mask_mod's subexpressions worth staging per KV column (VariantOptions::stage_kv_cols): the largest ones that use
// the column (both k0 and j after the tile rewrite) but neither the query row nor the score, hold a load, fit 32 bits
// and can raise no error flag (a staged value is computed for every column of a partial tile, which mask_mod's
// && / || / selects might not have read). At most kMaxKvColValues, the 8 bytes per column the kernels reserve.
constexpr int kMaxKvColValues = 2;

std::vector<Expr> kv_col_values(const StagedMods& staged, CudaEmitter& em) {
  std::vector<Expr> out;
  if (!staged.mask_mod) return out;
  const DependenceInfo deps({staged.mask_mod});
  std::unordered_set<const Node*> seen;
  std::function<void(const Expr&)> visit = [&](const Expr& e) {
    if (out.size() >= kMaxKvColValues || !seen.insert(e.get()).second) return;
    const Dependence& d = deps.of(e);
    const bool column_only = d.uses(VarId::TileStart) && d.uses(VarId::TileCol) && !d.uses(VarId::Q) && !d.uses(VarId::Score) &&
                             !d.uses(VarId::KV);
    if (column_only && d.has_load && !em.wide(e) && !em.flags_errors(e)) {
      out.push_back(e);
      return;
    }
    for (const Expr& k : children(e)) visit(k);
  };
  visit(staged.mask_mod);
  return out;
}

// A launch-constant factor as C: a literal, or a runtime parameter's field (its reciprocal's for a division by it).
std::string factor_text(const ScaleFactor& f) {
  if (!f.runtime()) return cuda_float(f.constant);
  return fmt::format("p.param_{}{}", f.param_name, f.reciprocal ? "_inv" : "");
}

// Whether the staged mods use the KV tile's start or column alone (k0 // c, j % c: the staging pass rewrote kv // c and
// kv % c): their values hold only for tiles at multiples of the staging tile. Everything else sees kv = k0 + j.
bool needs_aligned_tiles(const StagedMods& staged) {
  bool aligned = false;
  for (const Expr& root : {staged.score_mod, staged.mask_mod}) {
    if (!root) continue;
    for_each_node(root, [&](const Expr& n) {
      const Binary* b = n.as<Binary>();
      const Var* v = b ? b->a.as<Var>() : nullptr;
      if (v && ((b->op == BinaryOp::FloorDiv && v->var == VarId::TileStart) || (b->op == BinaryOp::Mod && v->var == VarId::TileCol)))
        aligned = true;
    });
  }
  return aligned;
}

}  // namespace

GeneratedVariant generate_cuda_variant(const SpecIR& ir, const RangeInfo& ranges, const VariantOptions& options,
                                       const std::string& struct_name) {
  GeneratedVariant out;
  StagingOptions so;
  so.tile_size = options.tile_size;
  so.hoist = options.hoist;
  so.may_flag = [&](const ir::Expr& original) { return may_flag(ir, ranges, options, original); };
  // The forward kernels take score_mod's row terms out of the per-element work (compiler/codegen/row_terms.h): the
  // staged score_mod is then the rest, and the identity when nothing else is left.
  const RowTerms terms = options.split_row_terms ? split_row_terms(ir.score_mod, [&](const Expr& e) { return !ranges.unbounded_ints.count(e.get()); })
                                                 : RowTerms{};
  const Expr score_root = !terms.split ? ir.score_mod : is_var(terms.rest, VarId::Score) ? Expr() : terms.rest;
  StagedMods staged = stage_mods(score_root, ir.mask_mod, so);
  staged.origin.insert(terms.origin.begin(), terms.origin.end());
  out.has_score_mod = static_cast<bool>(score_root) || static_cast<bool>(terms.col);
  out.layout = make_params_layout(ir);
  out.row_values = staged.count(Stage::Row);
  out.col_values = staged.count(Stage::Col);
  out.tile_values = staged.count(Stage::Tile);

  CudaEmitter em(ir, ranges, staged, options);
  for (const LoadCheck& c : ranges.loads) {
    const Load* l = c.load.as<Load>();
    em.sites.push_back(LoadSite{l ? l->name : "?", print_inline(c.load), "not emitted", false, 0});
  }

  std::string code = fmt::format("// Generated by flexjit from spec `{}`.\n", ir.spec().name);
  if (ir.spec().score_mod) code += comment_block("score_mod", *ir.spec().score_mod);
  if (ir.spec().mask_mod) code += comment_block("mask_mod", *ir.spec().mask_mod);
  // The base (kernels_templates/flex_variant_base.cuh) holds every hook's default; only what the spec changes follows.
  code += fmt::format("#include \"flex_variant_base.cuh\"\nstruct {0} : flex::VariantBase<{0}> {{\n", struct_name);
  code += params_struct(out.layout);
  if (out.has_score_mod) code += "  static constexpr bool kHasScoreMod = true;\n";
  if (ir.mask_mod) code += "  static constexpr bool kHasMaskMod = true;\n";
  if (mask_is_data_dependent(ir)) code += "  static constexpr bool kDataDependentMask = true;\n";
  out.tile_aligned = needs_aligned_tiles(staged);
  if (out.tile_aligned)
    code += "  // kv // c and kv % c became k0 // c and j % c: the hooks need KV tiles at multiples of kTileCols.\n"
            "  static constexpr bool kTileAligned = true;\n";
  if (options.tile_size != 64) code += fmt::format("  static constexpr int kTileCols = {};\n", options.tile_size);
  for (Stage s : {Stage::Row, Stage::Col, Stage::Tile}) {
    std::string fields;
    for (const HoistedValue& v : staged.values)
      if (v.stage == s) fields += fmt::format(" {} v{};", em.c_type(v.expr), staged.value_of.at(v.expr.get()));
    if (fields.empty()) continue;
    const char* what = s == Stage::Row ? "constant along a query row" : s == Stage::Col ? "per column j of a KV tile, the same in every tile" : "per query row and KV tile";
    code += fmt::format("  struct {} {{{} }};  // values {}\n", s == Stage::Row ? "Row" : s == Stage::Col ? "Col" : "Tile", fields, what);
  }
  if (out.col_values > 0) code += "  static constexpr bool kColumnState = true;\n";
  // Loads left in the per-element code (not hoisted into Row, Col or Tile state): their addresses and latencies take
  // registers the tile policy weighs.
  for (const Expr& root : {staged.score_mod, staged.mask_mod})
    if (root)
      for_each_node(root, [&](const Expr& n) { out.element_loads = out.element_loads || (n.as<Load>() && staged.stage_of(n) == Stage::Element); });
  if (out.element_loads) code += "  static constexpr bool kElementLoads = true;\n";
  if (mods_evaluable_past_skv(staged))
    code += "  // No loads and no division by a runtime value: the kernels may evaluate the mods past Skv and discard them.\n"
            "  static constexpr bool kEvaluablePastSkv = true;\n";
  const char* attrs = "  __device__ static __forceinline__";
  auto stage_fn = [&](Stage s, const std::string& signature) {
    if (staged.count(s) == 0) return;
    em.begin(s);
    for (const HoistedValue& v : staged.values)
      if (v.stage == s) em.line(fmt::format("{}.v{} = {};", CudaEmitter::state_name(s), staged.value_of.at(v.expr.get()), em.emit(v.expr)));
    code += fmt::format("{} void {} {{\n{}  }}\n", attrs, signature, em.body(4));
  };
  stage_fn(Stage::Row, "row(const Params& p, Row& row, int b, int h, int hkv, int q)");
  stage_fn(Stage::Col, "col(const Params& p, const Row& row, Col& col, int b, int h, int hkv, int q, int j)");
  stage_fn(Stage::Tile, "tile(const Params& p, const Row& row, Tile& tile, int b, int h, int hkv, int q, int k0)");
  const std::string element_args = "const Params& p, const Row& row, const Col& col, const Tile& tile, int b, int h, int hkv, int q, int k0, int j";
  if (terms.split) {
    code += "  // score_mod(score) = score_mod below + score_col_term(kv) + score_row_term(q): the forward kernels add the row\n"
            "  // terms to the LSE instead of every score of the row (the softmax does not change), the column terms once per\n"
            "  // column. a: the anchor row (within the thread's rows), kv = k0 + j with k0 = a.\n"
            "  static constexpr bool kRowTerms = true;\n";
    em.begin(Stage::Row);  // no hoisted state in scope: the term hooks see neither a row nor a column of the tile
    em.line(fmt::format("return {};", em.emit(terms.row)));
    code += fmt::format("{} float score_row_term(const Params& p, int b, int h, int hkv, int q, int k0) {{\n{}  }}\n", attrs, em.body(4));
    if (terms.col) {
      code += "  static constexpr bool kColTerms = true;\n";
      em.begin(Stage::Row);
      em.line(fmt::format("return {};", em.emit(terms.col)));
      code += fmt::format("{} float score_col_term(const Params& p, int b, int h, int hkv, int k0, int j) {{\n{}  }}\n", attrs, em.body(4));
    }
  }
  if (staged.score_mod) {
    em.begin(Stage::Element);
    em.line(fmt::format("return {};", em.emit(staged.score_mod)));
    code += fmt::format("{} float score_mod({}, float score) {{\n{}  }}\n", attrs, element_args, em.body(4));
    const ScoreScales scales = split_score_scales(staged.score_mod);
    const bool runtime = scales.in.runtime() || scales.out.runtime();
    // Column terms are added in score units after score_mod, which a split would leave in its core's units.
    if (scales.split && !terms.col && !(runtime && options.runtime_split == RuntimeSplit::Unsplit)) {
      em.begin(Stage::Element);
      em.line(fmt::format("return {};", em.emit(scales.core)));
      code += "  // score_mod(score) = score_out_scale * score_mod_core(score_in_scale * score), score_out_scale > 0: the forward\n"
              "  // kernels fold both scales into multiplies of their own (flex::ScoreFactors).\n";
      code += fmt::format("  static constexpr bool kSplitScore = true;\n"
                          "  __device__ static __forceinline__ float score_in_scale(const Params& p) {{ return {}; }}\n"
                          "  __device__ static __forceinline__ float score_out_scale(const Params& p) {{ return {}; }}\n",
                          factor_text(scales.in), factor_text(scales.out));
      code += fmt::format("{} float score_mod_core({}, float score) {{\n{}  }}\n", attrs, element_args, em.body(4));
      // A literal out scale decides here; a parameter's value decided at launch (VariantOptions::runtime_split).
      const bool fixed_max = scales.out.runtime() ? options.runtime_split == RuntimeSplit::FixedMax : scales.fixed_max_fits(scales.out.constant);
      out.fixed_max = fixed_max;
      if (fixed_max) {
        code += "  // Every value of score_mod_core lies at or below kScoreCoreMax, and exp2 of its whole range stays normal: the\n"
                "  // forward kernels subtract that fixed maximum in the softmax instead of each row's (flex::Softmax).\n";
        code += fmt::format("  static constexpr bool kFixedMax = true;\n  static constexpr float kScoreCoreMax = {};\n",
                            cuda_float(static_cast<float>(scales.core_hi)));
      }
    }
  }
  if (staged.mask_mod) {
    em.begin(Stage::Element);
    em.line(fmt::format("return {};", em.emit(staged.mask_mod)));
    code += fmt::format("{} bool mask_mod({}) {{\n{}  }}\n", attrs, element_args, em.body(4));
  }
  if (options.stage_kv_cols) {
    em.begin(Stage::Element);
    const std::vector<Expr> cols = kv_col_values(staged, em);
    if (!cols.empty()) {
      std::string fields;
      for (size_t i = 0; i < cols.size(); ++i) fields += fmt::format(" {} c{};", em.c_type(cols[i]), i);
      code += "  // mask_mod's values per KV column kv = k0 + j, the same for every query row: kernels that stage them compute\n"
              "  // them once per column of a partial tile (kv_col) into shared memory and call mask_mod_staged.\n";
      code += fmt::format("  static constexpr bool kStagedKvCols = true;\n  struct KvCol {{{} }};\n", fields);
      em.begin(Stage::Row);  // no hoisted state in scope: kv_col sees neither a row nor a column of the tile
      for (size_t i = 0; i < cols.size(); ++i) em.line(fmt::format("kc.c{} = {};", i, em.emit(cols[i])));
      code += fmt::format("{} void kv_col(const Params& p, KvCol& kc, int b, int h, int hkv, int k0, int j) {{\n{}  }}\n", attrs, em.body(4));
      em.begin(Stage::Element);
      for (size_t i = 0; i < cols.size(); ++i) em.bind(cols[i], fmt::format("kc.c{}", i));
      em.line(fmt::format("return {};", em.emit(staged.mask_mod)));
      code += fmt::format("{} bool mask_mod_staged(const Params& p, const Row& row, const Col& col, const Tile& tile, const KvCol& kc, int b, "
                          "int h, int hkv, int q, int k0, int j) {{\n{}  }}\n",
                          attrs, em.body(4));
      out.kv_col_values = static_cast<int>(cols.size());
    }
  }
  code += "};\n";
  out.code = code;
  out.loads = em.sites;
  return out;
}

EmittedExpressions emit_cuda_expressions(const SpecIR& ir, const RangeInfo& ranges, const VariantOptions& options,
                                         const std::vector<ir::Expr>& roots, int indent) {
  StagedMods unstaged;
  unstaged.tile_size = options.tile_size;
  CudaEmitter em(ir, ranges, unstaged, options);
  em.begin(Stage::Element);
  EmittedExpressions out;
  for (const Expr& r : roots) out.values.push_back(em.emit(r));
  out.body = em.body(indent);
  return out;
}

}  // namespace flexjit
