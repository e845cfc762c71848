#include "dsl/decl.h"

#include <fmt/format.h>

#include <cmath>

#include "dsl/lexer.h"

namespace flexjit::dsl {

std::string BufferDecl::str() const {
  std::string dims;
  for (size_t i = 0; i < shape.size(); ++i) dims += (i ? ", " : "") + shape[i].str();
  return fmt::format("{}: {}[{}]", name, dtype_name(dtype), dims);
}

std::string ParamDecl::str() const {
  std::string s = fmt::format("{}{}: {}", is_const ? "const " : "", name, value_type_name(type));
  if (has_value) {
    if (type == ValueType::Int) s += fmt::format(" = {}", int_value);
    if (type == ValueType::Float) s += fmt::format(" = {}", float_value);
    if (type == ValueType::Bool) s += bool_value ? " = true" : " = false";
  }
  return s;
}

namespace {

// Shared cursor over the tokens of one declaration.
struct DeclCursor {
  std::shared_ptr<const Source> src;
  std::vector<Token> toks;
  size_t pos = 0;
  Diagnostics& diags;
  const char* usage;

  const Token& peek() const { return toks[std::min(pos, toks.size() - 1)]; }
  const Token& advance() {
    const Token& t = peek();
    if (pos + 1 < toks.size()) ++pos;
    return t;
  }
  bool fail(const Token& at, std::string message, std::string label) {
    if (at.kind != Tok::Error)
      diags.report(DiagCode::BadDeclaration, src, at.span, std::move(message), std::move(label), {usage});
    return false;
  }
  bool expect(Tok k, const char* what) {
    if (peek().kind == k) {
      advance();
      return true;
    }
    return fail(peek(), fmt::format("expected {} {}, found {}", token_description(k), what, token_description(peek().kind)),
                fmt::format("expected {}", token_description(k)));
  }
  bool check_name(const Token& t) {
    if (lookup_variable(t.text) || lookup_function(t.text) || t.text == "k0" || t.text == "j") {
      diags.report(DiagCode::ReservedName, src, t.span, fmt::format("`{}` is a built-in name and cannot be declared", t.text),
                   "built-in", {"choose another name"});
      return false;
    }
    return true;
  }
};

}  // namespace

std::optional<BufferDecl> parse_buffer_decl(const std::string& text, const std::string& source_name, Diagnostics& diags) {
  auto src = std::make_shared<Source>(source_name, text);
  size_t before = diags.list().size();
  DeclCursor c{src, lex(src, diags), 0, diags, "a buffer is declared as `name: dtype[dim, ...]`, e.g. `rel_h: bf16[B, H, Sq, 64]`"};
  if (diags.list().size() != before) return std::nullopt;
  BufferDecl d;
  if (c.peek().kind != Tok::Ident) return c.fail(c.peek(), "expected the buffer's name", "expected a name"), std::nullopt;
  const Token& name = c.advance();
  if (!c.check_name(name)) return std::nullopt;
  d.name = std::string(name.text);
  if (!c.expect(Tok::Colon, "after the buffer name")) return std::nullopt;
  const Token& dt = c.peek();
  auto dtype = dt.kind == Tok::Ident ? parse_dtype(dt.text) : std::nullopt;
  if (!dtype) {
    c.fail(dt, fmt::format("unknown element type `{}`", dt.text), "expected f32, f16, bf16, i32, i64, u8 or bool");
    return std::nullopt;
  }
  c.advance();
  d.dtype = *dtype;
  if (!c.expect(Tok::LBracket, "before the shape")) return std::nullopt;
  while (true) {
    const Token& t = c.peek();
    Dim dim;
    if (t.kind == Tok::Int) {
      if (t.int_value <= 0) return c.fail(t, "a dimension must be positive", "not positive"), std::nullopt;
      dim.value = t.int_value;
    } else if (t.kind == Tok::Ident) {
      if (lookup_variable(t.text) || lookup_function(t.text))
        return c.fail(t, fmt::format("`{}` is a built-in name, not a shape symbol", t.text), "not a symbol"), std::nullopt;
      dim.is_symbol = true;
      dim.symbol = std::string(t.text);
    } else {
      return c.fail(t, fmt::format("expected a dimension, found {}", token_description(t.kind)), "expected an integer or a symbol"),
             std::nullopt;
    }
    c.advance();
    d.shape.push_back(dim);
    if (c.peek().kind == Tok::Comma) {
      c.advance();
      continue;
    }
    if (!c.expect(Tok::RBracket, "to close the shape")) return std::nullopt;
    break;
  }
  if (c.peek().kind != Tok::End) return c.fail(c.peek(), "unexpected text after the declaration", "unexpected"), std::nullopt;
  return d;
}

std::optional<ParamDecl> parse_param_decl(const std::string& text, const std::string& source_name, Diagnostics& diags,
                                          bool force_const) {
  auto src = std::make_shared<Source>(source_name, text);
  size_t before = diags.list().size();
  DeclCursor c{src, lex(src, diags), 0, diags,
               "a parameter is declared as `name: int|float|bool`, or `const name: type = value`"};
  if (diags.list().size() != before) return std::nullopt;
  ParamDecl p;
  p.is_const = force_const;
  if (c.peek().kind == Tok::KwConst) {
    c.advance();
    p.is_const = true;
  }
  if (c.peek().kind != Tok::Ident) return c.fail(c.peek(), "expected the parameter's name", "expected a name"), std::nullopt;
  const Token& name = c.advance();
  if (!c.check_name(name)) return std::nullopt;
  p.name = std::string(name.text);
  if (!c.expect(Tok::Colon, "after the parameter name")) return std::nullopt;
  const Token& ty = c.peek();
  if (ty.text == "int") p.type = ValueType::Int;
  else if (ty.text == "float") p.type = ValueType::Float;
  else if (ty.text == "bool") p.type = ValueType::Bool;
  else return c.fail(ty, fmt::format("unknown parameter type `{}`", ty.text), "expected int, float or bool"), std::nullopt;
  c.advance();
  if (c.peek().kind == Tok::Assign) {
    c.advance();
    bool negative = false;
    if (c.peek().kind == Tok::Minus) {
      c.advance();
      negative = true;
    }
    const Token& v = c.peek();
    bool ok = false;
    if (p.type == ValueType::Int && v.kind == Tok::Int) {
      p.int_value = negative ? -v.int_value : v.int_value;
      ok = true;
    } else if (p.type == ValueType::Float && (v.kind == Tok::Int || v.kind == Tok::Float || v.kind == Tok::KwInf)) {
      double x = v.kind == Tok::Int ? double(v.int_value) : v.kind == Tok::KwInf ? INFINITY : v.float_value;
      p.float_value = negative ? -x : x;
      ok = true;
    } else if (p.type == ValueType::Bool && !negative && (v.kind == Tok::KwTrue || v.kind == Tok::KwFalse)) {
      p.bool_value = v.kind == Tok::KwTrue;
      ok = true;
    }
    if (!ok) {
      diags.report(DiagCode::BadConstValue, src, v.span,
                   fmt::format("`{}` is not a {} value", v.text, value_type_name(p.type)), "wrong value",
                   {fmt::format("give a {} literal, e.g. `{}`", value_type_name(p.type),
                                p.type == ValueType::Int ? "1024" : p.type == ValueType::Float ? "30.0" : "true")});
      return std::nullopt;
    }
    c.advance();
    p.has_value = true;
  }
  if (p.is_const && !p.has_value) {
    diags.report(DiagCode::BadConstValue, src, Span{0, static_cast<uint32_t>(text.size())},
                 fmt::format("constant parameter `{}` needs a value", p.name), "no value",
                 {fmt::format("write `const {}: {} = VALUE`", p.name, value_type_name(p.type))});
    return std::nullopt;
  }
  if (c.peek().kind != Tok::End) return c.fail(c.peek(), "unexpected text after the declaration", "unexpected"), std::nullopt;
  return p;
}

}  // namespace flexjit::dsl
