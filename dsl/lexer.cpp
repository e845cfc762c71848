#include "dsl/lexer.h"

#include <fmt/format.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <string>

namespace flexjit::dsl {

const char* token_description(Tok t) {
  switch (t) {
#define FLEXJIT_TOK_DESC(name, text) \
  case Tok::name:                    \
    return text;
    FLEXJIT_TOKEN_KINDS(FLEXJIT_TOK_DESC)
#undef FLEXJIT_TOK_DESC
  }
  return "token";
}

namespace {

bool is_ident_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_ident_char(char c) { return is_ident_start(c) || is_digit(c); }

Tok keyword_or_ident(std::string_view s) {
  if (s == "let") return Tok::KwLet;
  if (s == "true") return Tok::KwTrue;
  if (s == "false") return Tok::KwFalse;
  if (s == "inf") return Tok::KwInf;
  if (s == "and") return Tok::KwAnd;
  if (s == "or") return Tok::KwOr;
  if (s == "not") return Tok::KwNot;
  if (s == "const") return Tok::KwConst;
  return Tok::Ident;
}

class Lexer {
 public:
  Lexer(const std::shared_ptr<const Source>& src, Diagnostics& diags) : src_(src), text_(src->text()), diags_(diags) {}

  std::vector<Token> run() {
    std::vector<Token> out;
    while (true) {
      skip_space_and_comments();
      if (pos_ >= text_.size()) {
        out.push_back(make(Tok::End, pos_, pos_));
        return out;
      }
      out.push_back(next());
    }
  }

 private:
  Token make(Tok k, size_t b, size_t e) {
    Token t;
    t.kind = k;
    t.span = Span{static_cast<uint32_t>(b), static_cast<uint32_t>(e)};
    t.text = std::string_view(text_).substr(b, e - b);
    return t;
  }

  void skip_space_and_comments() {
    while (pos_ < text_.size()) {
      char c = text_[pos_];
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v') {
        ++pos_;
      } else if (c == '#') {
        while (pos_ < text_.size() && text_[pos_] != '\n') ++pos_;
      } else {
        return;
      }
    }
  }

  Token number() {
    size_t b = pos_;
    bool is_float = false;
    while (pos_ < text_.size() && is_digit(text_[pos_])) ++pos_;
    if (pos_ < text_.size() && text_[pos_] == '.') {
      is_float = true;
      ++pos_;
      while (pos_ < text_.size() && is_digit(text_[pos_])) ++pos_;
    }
    if (pos_ < text_.size() && (text_[pos_] == 'e' || text_[pos_] == 'E')) {
      size_t save = pos_;
      ++pos_;
      if (pos_ < text_.size() && (text_[pos_] == '+' || text_[pos_] == '-')) ++pos_;
      if (pos_ < text_.size() && is_digit(text_[pos_])) {
        is_float = true;
        while (pos_ < text_.size() && is_digit(text_[pos_])) ++pos_;
      } else {
        pos_ = save;
        while (pos_ < text_.size() && is_ident_char(text_[pos_])) ++pos_;
        diags_.report(DiagCode::BadNumber, src_, Span{uint32_t(b), uint32_t(pos_)}, "malformed number: an exponent needs digits",
                      "expected digits after `e`", {"write e.g. `1e-3`"});
        return make(Tok::Error, b, pos_);
      }
    }
    if (pos_ < text_.size() && is_ident_start(text_[pos_])) {
      while (pos_ < text_.size() && is_ident_char(text_[pos_])) ++pos_;
      diags_.report(DiagCode::BadNumber, src_, Span{uint32_t(b), uint32_t(pos_)}, "malformed number: letters follow the digits",
                    "not a number", {"names cannot start with a digit; separate a number and a name with an operator"});
      return make(Tok::Error, b, pos_);
    }
    Token t = make(is_float ? Tok::Float : Tok::Int, b, pos_);
    std::string s(t.text);
    if (is_float) {
      errno = 0;
      double v = std::strtod(s.c_str(), nullptr);
      if (errno == ERANGE && std::isinf(v)) {
        diags_.report(DiagCode::NumberOutOfRange, src_, t.span, "float literal out of range", "too large for a float",
                      {"use `inf` for infinity"});
        t.kind = Tok::Error;
      }
      t.float_value = v;
    } else {
      errno = 0;
      unsigned long long v = std::strtoull(s.c_str(), nullptr, 10);
      if (errno == ERANGE || v > static_cast<unsigned long long>(INT64_MAX)) {
        diags_.report(DiagCode::NumberOutOfRange, src_, t.span, "integer literal out of range", "does not fit in a 64-bit int",
                      {"integers are 64-bit signed: at most 9223372036854775807"});
        t.kind = Tok::Error;
      }
      t.int_value = static_cast<int64_t>(v);
    }
    return t;
  }

  Token next() {
    size_t b = pos_;
    char c = text_[pos_];
    if (is_digit(c) || (c == '.' && pos_ + 1 < text_.size() && is_digit(text_[pos_ + 1]))) return number();
    if (is_ident_start(c)) {
      while (pos_ < text_.size() && is_ident_char(text_[pos_])) ++pos_;
      Token t = make(Tok::Ident, b, pos_);
      t.kind = keyword_or_ident(t.text);
      return t;
    }
    auto two = [&](char second) { return pos_ + 1 < text_.size() && text_[pos_ + 1] == second; };
    auto op = [&](Tok k, size_t len) {
      pos_ += len;
      return make(k, b, pos_);
    };
    switch (c) {
      case '+': return op(Tok::Plus, 1);
      case '-': return op(Tok::Minus, 1);
      case '*':
        if (two('*')) {
          pos_ += 2;
          diags_.report(DiagCode::UnexpectedCharacter, src_, Span{uint32_t(b), uint32_t(pos_)}, "`**` is not an operator",
                        "use pow(x, y)", {"powers are written pow(x, y)"});
          return make(Tok::Error, b, pos_);
        }
        return op(Tok::Star, 1);
      case '/': return two('/') ? op(Tok::SlashSlash, 2) : op(Tok::Slash, 1);
      case '%': return op(Tok::Percent, 1);
      case '<':
        if (two('<')) return op(Tok::Shl, 2);
        return two('=') ? op(Tok::Le, 2) : op(Tok::Lt, 1);
      case '>':
        if (two('>')) return op(Tok::Shr, 2);
        return two('=') ? op(Tok::Ge, 2) : op(Tok::Gt, 1);
      case '=': return two('=') ? op(Tok::EqEq, 2) : op(Tok::Assign, 1);
      case '!': return two('=') ? op(Tok::NotEq, 2) : op(Tok::Bang, 1);
      case '&': return two('&') ? op(Tok::AmpAmp, 2) : op(Tok::Amp, 1);
      case '|': return two('|') ? op(Tok::PipePipe, 2) : op(Tok::Pipe, 1);
      case '^': return op(Tok::Caret, 1);
      case '~': return op(Tok::Tilde, 1);
      case '?': return op(Tok::Question, 1);
      case ':': return op(Tok::Colon, 1);
      case ',': return op(Tok::Comma, 1);
      case '(': return op(Tok::LParen, 1);
      case ')': return op(Tok::RParen, 1);
      case '[': return op(Tok::LBracket, 1);
      case ']': return op(Tok::RBracket, 1);
      case ';': return op(Tok::Semicolon, 1);
      default: break;
    }
    // Consume one whole UTF-8 sequence so the caret covers the character.
    ++pos_;
    if (static_cast<unsigned char>(c) >= 0xC0)
      while (pos_ < text_.size() && (static_cast<unsigned char>(text_[pos_]) & 0xC0) == 0x80) ++pos_;
    std::string shown = (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f)
                            ? fmt::format("byte 0x{:02x}", static_cast<unsigned char>(c))
                            : fmt::format("`{}`", c);
    std::vector<std::string> notes;
    if (c == '"' || c == '\'') notes.push_back("the language has no strings");
    if (c == '@') notes.push_back("the language has no matrix products; score already holds scale * q.k");
    diags_.report(DiagCode::UnexpectedCharacter, src_, Span{uint32_t(b), uint32_t(pos_)},
                  fmt::format("unexpected character {}", shown), "not part of the language", std::move(notes));
    return make(Tok::Error, b, pos_);
  }

  std::shared_ptr<const Source> src_;
  const std::string& text_;
  Diagnostics& diags_;
  size_t pos_ = 0;
};

}  // namespace

std::vector<Token> lex(const std::shared_ptr<const Source>& src, Diagnostics& diags) { return Lexer(src, diags).run(); }

}  // namespace flexjit::dsl
