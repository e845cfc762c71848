// Diagnostics: stable error codes, caret rendering and a JSON form, collected per compile.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "dsl/source.h"

namespace flexjit::dsl {

// Every diagnostic code, its number and what it means. Codes are stable: tools match on
// them, so a code is never renumbered or reused (docs/DIAGNOSTICS.md lists them).
#define FLEXJIT_DIAGNOSTIC_CODES(X)                                               \
  X(UnexpectedCharacter, 1, "a character that starts no token")                  \
  X(BadNumber, 2, "a malformed numeric literal")                                 \
  X(NumberOutOfRange, 3, "a literal too large for its type")                     \
  X(ExpectedExpression, 101, "an expression was expected")                       \
  X(ExpectedToken, 102, "a specific token was expected")                         \
  X(ChainedComparison, 103, "a < b < c is ambiguous and rejected")               \
  X(TooDeep, 104, "nesting deeper than the parser allows")                       \
  X(TrailingInput, 105, "input after the end of the expression")                 \
  X(MissingResult, 106, "a program with lets but no final expression")           \
  X(BadLet, 107, "a malformed let binding")                                      \
  X(UnknownName, 201, "a name that is not declared")                             \
  X(UnknownFunction, 202, "a call of a function that does not exist")            \
  X(WrongArity, 203, "a call with the wrong number of arguments")                \
  X(TypeMismatch, 204, "an operand of the wrong type")                           \
  X(WrongIndexCount, 205, "a buffer load with the wrong number of indices")      \
  X(NotIndexable, 206, "indexing something that is not a buffer")                \
  X(BufferWithoutIndex, 207, "a buffer used as a value without indices")         \
  X(WrongResultType, 208, "a program whose result has the wrong type")           \
  X(ScoreInMask, 209, "`score` used in a mask_mod")                              \
  X(DuplicateLet, 210, "a let that rebinds a name already in scope")             \
  X(DivisionByZero, 211, "integer division or modulo by a constant zero")        \
  X(NotCallable, 212, "a call of something that is not a function")            \
  X(FloatIndex, 213, "a buffer index that is not an integer")                    \
  X(BadDeclaration, 301, "a malformed buffer or parameter declaration")          \
  X(DuplicateDeclaration, 302, "two declarations of one name")                   \
  X(BadConstValue, 303, "a constant parameter without a valid value")            \
  X(ReservedName, 304, "a declaration that uses a built-in name")                \
  X(BadSpec, 401, "a malformed or inconsistent spec")

enum class DiagCode {
#define FLEXJIT_DIAG_ENUM(name, number, what) name = number,
  FLEXJIT_DIAGNOSTIC_CODES(FLEXJIT_DIAG_ENUM)
#undef FLEXJIT_DIAG_ENUM
};

// "E0201" for UnknownName.
std::string diag_code_string(DiagCode code);

struct Diagnostic {
  DiagCode code;
  std::string message;            // the headline: what is wrong
  std::shared_ptr<const Source> source;
  Span span;                      // what the caret underlines
  std::string label;              // text after the caret: a hint ("did you mean `kv`?")
  std::vector<std::string> notes; // further lines: how to fix
};

class Diagnostics {
 public:
  void report(Diagnostic d) { list_.push_back(std::move(d)); }
  void report(DiagCode code, std::shared_ptr<const Source> src, Span span, std::string message,
              std::string label = {}, std::vector<std::string> notes = {});
  bool has_errors() const { return !list_.empty(); }
  const std::vector<Diagnostic>& list() const { return list_; }
  void append(const Diagnostics& other);

  // Human form: error[E0201]: ..., --> name:line:col, the source line and a caret span.
  std::string render_text() const;
  // Machine form: a JSON array of objects {code, message, file, line, col, end_line, end_col,
  // label, notes, source_line}.
  std::string render_json() const;

 private:
  std::vector<Diagnostic> list_;
};

std::string render_text(const Diagnostic& d);


}  // namespace flexjit::dsl
