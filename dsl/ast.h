// The syntax tree of a program, with source spans; sema annotates it in place.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dsl/source.h"
#include "dsl/token.h"

namespace flexjit::dsl {

enum class AstKind { IntLit, FloatLit, BoolLit, Name, Unary, Binary, Ternary, Call, Index, Error };

// Value types of the language. Error marks a node whose type could not be determined
// (an error was already reported), so later checks stay quiet about it.
enum class ValueType { Int, Float, Bool, Error };
const char* value_type_name(ValueType t);

// What a Name refers to, filled in by sema.
enum class NameKind { Unresolved, Variable, Let, Param, Symbol, Buffer };

struct AstNode {
  AstKind kind = AstKind::Error;
  Span span;
  int64_t int_value = 0;     // IntLit
  double float_value = 0;    // FloatLit (inf allowed)
  bool bool_value = false;   // BoolLit
  std::string name;          // Name; Call: the function; Index: the buffer
  Span name_span;            // Call / Index: span of the callee / buffer name
  Tok op = Tok::End;         // Unary / Binary operator
  Span op_span;
  std::vector<std::unique_ptr<AstNode>> args;  // operands, call arguments, or all indices of an [i][j] chain
  uint32_t depth = 1;        // height of this subtree, bounded by the parser so no pass can overflow the stack

  // Sema annotations.
  ValueType type = ValueType::Error;
  NameKind name_kind = NameKind::Unresolved;
  int ref = -1;  // Variable: VarId; Let: binding index; Param / Buffer: declaration index
};

struct LetBinding {
  std::string name;
  Span name_span;
  std::unique_ptr<AstNode> value;
};

struct Program {
  std::vector<LetBinding> lets;
  std::unique_ptr<AstNode> result;  // null if the program had no final expression
};

// S-expression dump for `flexjit dump --emit=ast` and tests.
std::string print_ast(const Program& p);
std::string print_ast(const AstNode& n);

}  // namespace flexjit::dsl
