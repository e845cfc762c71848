// Prints the AST as S-expressions, for `flexjit dump --emit=ast` and tests.
#include <fmt/format.h>

#include "dsl/ast.h"

namespace flexjit::dsl {

namespace {
void print(const AstNode& n, std::string& out) {
  switch (n.kind) {
    case AstKind::IntLit: out += std::to_string(n.int_value); return;
    case AstKind::FloatLit: out += fmt::format("{}", n.float_value); return;
    case AstKind::BoolLit: out += n.bool_value ? "true" : "false"; return;
    case AstKind::Name: out += n.name; return;
    case AstKind::Error: out += "<error>"; return;
    case AstKind::Unary: out += fmt::format("({} ", token_description(n.op)); break;
    case AstKind::Binary: out += fmt::format("({} ", token_description(n.op)); break;
    case AstKind::Ternary: out += "(?: "; break;
    case AstKind::Call: out += fmt::format("(call {} ", n.name); break;
    case AstKind::Index: out += fmt::format("(index {} ", n.name); break;
  }
  for (size_t i = 0; i < n.args.size(); ++i) {
    if (i) out += ' ';
    print(*n.args[i], out);
  }
  out += ')';
}
}  // namespace

std::string print_ast(const AstNode& n) {
  std::string out;
  print(n, out);
  // token descriptions carry backquotes for messages; the dump shows bare operators
  std::string clean;
  for (char c : out)
    if (c != '`') clean += c;
  return clean;
}

std::string print_ast(const Program& p) {
  std::string out;
  for (const LetBinding& lb : p.lets) out += fmt::format("(let {} {})\n", lb.name, lb.value ? print_ast(*lb.value) : "<error>");
  out += p.result ? print_ast(*p.result) : "<missing>";
  out += '\n';
  return out;
}

}  // namespace flexjit::dsl
