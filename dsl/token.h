// Tokens of the mask/score language.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

#include "dsl/source.h"

namespace flexjit::dsl {

#define FLEXJIT_TOKEN_KINDS(X)                                                              \
  X(End, "end of input") X(Int, "integer literal") X(Float, "float literal")               \
  X(Ident, "name") X(KwLet, "`let`") X(KwTrue, "`true`") X(KwFalse, "`false`")             \
  X(KwInf, "`inf`") X(KwAnd, "`and`") X(KwOr, "`or`") X(KwNot, "`not`") X(KwConst, "`const`") \
  X(Plus, "`+`") X(Minus, "`-`") X(Star, "`*`") X(Slash, "`/`") X(SlashSlash, "`//`")      \
  X(Percent, "`%`") X(Shl, "`<<`") X(Shr, "`>>`") X(Lt, "`<`") X(Le, "`<=`") X(Gt, "`>`")  \
  X(Ge, "`>=`") X(EqEq, "`==`") X(NotEq, "`!=`") X(AmpAmp, "`&&`") X(PipePipe, "`||`")     \
  X(Amp, "`&`") X(Pipe, "`|`") X(Caret, "`^`") X(Tilde, "`~`") X(Bang, "`!`")              \
  X(Question, "`?`") X(Colon, "`:`") X(Comma, "`,`") X(LParen, "`(`") X(RParen, "`)`")     \
  X(LBracket, "`[`") X(RBracket, "`]`") X(Semicolon, "`;`") X(Assign, "`=`")               \
  X(Error, "invalid token")

enum class Tok {
#define FLEXJIT_TOK_ENUM(name, text) name,
  FLEXJIT_TOKEN_KINDS(FLEXJIT_TOK_ENUM)
#undef FLEXJIT_TOK_ENUM
};

// How a token kind is named in messages ("`)`", "name").
const char* token_description(Tok t);

struct Token {
  Tok kind = Tok::End;
  Span span;
  std::string_view text;  // view into the Source's text
  int64_t int_value = 0;
  double float_value = 0;
};

}  // namespace flexjit::dsl
