#include "dsl/parser.h"

#include <fmt/format.h>

#include <limits>

#include <algorithm>

#include "dsl/lexer.h"

namespace flexjit::dsl {

namespace {

using NodePtr = std::unique_ptr<AstNode>;

class Parser {
 public:
  Parser(const std::shared_ptr<const Source>& src, Diagnostics& diags)
      : src_(src), diags_(diags), toks_(lex(src, diags)) {}

  // program := ('let' IDENT '=' expr ';')* expr? EOF
  Program program() {
    Program p;
    while (!aborted_ && peek().kind == Tok::KwLet) p.lets.push_back(let_binding());
    if (aborted_) return p;
    if (peek().kind == Tok::End) {
      Span at = p.lets.empty() ? peek().span : p.lets.back().name_span;
      diags_.report(DiagCode::MissingResult, src_, at,
                    p.lets.empty() ? "empty program" : "the program ends after its lets without a result",
                    "expected an expression", {"a program is zero or more `let x = ...;` followed by one expression"});
      return p;
    }
    p.result = expr();
    if (!aborted_ && peek().kind != Tok::End) {
      const Token& t = peek();
      std::vector<std::string> notes;
      if (t.kind == Tok::Semicolon) notes.push_back("only `let` bindings end with `;`; the final expression has none");
      if (t.kind == Tok::Assign) notes.push_back("comparison is `==`");
      diags_.report(DiagCode::TrailingInput, src_, Span{t.span.begin, toks_[toks_.size() - 1].span.begin},
                    fmt::format("unexpected {} after the end of the expression", token_description(t.kind)),
                    "expected end of input", std::move(notes));
    }
    return p;
  }

 private:
  const Token& peek(size_t ahead = 0) const { return toks_[std::min(pos_ + ahead, toks_.size() - 1)]; }
  const Token& advance() {
    const Token& t = toks_[pos_];
    if (pos_ + 1 < toks_.size()) ++pos_;
    return t;
  }
  bool accept(Tok k) {
    if (peek().kind != k) return false;
    advance();
    return true;
  }
  uint32_t prev_end() const { return pos_ == 0 ? 0 : toks_[pos_ - 1].span.end; }

  NodePtr error_node(Span span) {
    auto n = std::make_unique<AstNode>();
    n->kind = AstKind::Error;
    n->span = span;
    return n;
  }

  // Reports that `what` was expected at the current token, without consuming it.
  void expect(Tok k, const char* context) {
    if (accept(k)) return;
    const Token& t = peek();
    if (t.kind == Tok::Error) return;  // the lexer already reported this spot
    std::vector<std::string> notes;
    if (t.kind == Tok::Assign) notes.push_back("comparison is `==`; `=` only appears in `let x = ...;`");
    diags_.report(DiagCode::ExpectedToken, src_, t.span,
                  fmt::format("expected {} {}, found {}", token_description(k), context, token_description(t.kind)),
                  fmt::format("expected {}", token_description(k)), std::move(notes));
  }

  // let_binding := 'let' IDENT '=' expr ';'
  LetBinding let_binding() {
    LetBinding lb;
    Span let_span = advance().span;
    if (peek().kind != Tok::Ident) {
      const Token& t = peek();
      diags_.report(DiagCode::BadLet, src_, t.kind == Tok::End ? let_span : t.span,
                    fmt::format("expected a name after `let`, found {}", token_description(t.kind)), "expected a name",
                    {"write `let name = expression;`"});
      skip_to_statement_end();
      return lb;
    }
    const Token& name = advance();
    lb.name = std::string(name.text);
    lb.name_span = name.span;
    if (!accept(Tok::Assign)) {
      const Token& t = peek();
      diags_.report(DiagCode::BadLet, src_, t.span, fmt::format("expected `=` after `let {}`", lb.name), "expected `=`",
                    {"write `let name = expression;`"});
      skip_to_statement_end();
      return lb;
    }
    lb.value = expr();
    if (aborted_) return lb;
    if (!accept(Tok::Semicolon)) {
      const Token& t = peek();
      diags_.report(DiagCode::ExpectedToken, src_, t.kind == Tok::End ? Span{prev_end(), prev_end()} : t.span,
                    fmt::format("expected `;` after the value of `let {}`", lb.name), "expected `;`",
                    {"each `let` binding ends with `;`"});
      skip_to_statement_end();
    }
    return lb;
  }

  void skip_to_statement_end() {
    while (peek().kind != Tok::End && peek().kind != Tok::KwLet && peek().kind != Tok::Semicolon) advance();
    accept(Tok::Semicolon);
  }

  // Guards recursion: past kMaxNestingDepth the parse is abandoned with one diagnostic.
  struct DepthGuard {
    Parser& p;
    explicit DepthGuard(Parser& parser) : p(parser) { ++p.depth_; }
    ~DepthGuard() { --p.depth_; }
  };
  bool too_deep() {
    if (aborted_) return true;
    if (depth_ <= kMaxNestingDepth) return false;
    diags_.report(DiagCode::TooDeep, src_, peek().span,
                  fmt::format("expression nested more than {} levels deep", kMaxNestingDepth), "nesting limit reached here",
                  {"split the expression with `let` bindings"});
    aborted_ = true;
    return true;
  }

  // expr := ternary
  NodePtr expr() { return ternary(); }

  // ternary := or_expr ('?' ternary ':' ternary)?      (right-associative)
  NodePtr ternary() {
    DepthGuard g(*this);
    if (too_deep()) return error_node(peek().span);
    NodePtr cond = or_expr();
    if (aborted_ || peek().kind != Tok::Question) return cond;
    advance();
    NodePtr a = ternary();
    if (aborted_) return a;
    expect(Tok::Colon, "in `c ? a : b`");
    NodePtr b = ternary();
    auto n = std::make_unique<AstNode>();
    n->kind = AstKind::Ternary;
    n->span = Span{cond->span.begin, b->span.end};
    n->depth = 1 + std::max({cond->depth, a->depth, b->depth});
    n->args.push_back(std::move(cond));
    n->args.push_back(std::move(a));
    n->args.push_back(std::move(b));
    return n;
  }

  NodePtr binary(Tok op, Span op_span, NodePtr l, NodePtr r) {
    auto n = std::make_unique<AstNode>();
    n->kind = AstKind::Binary;
    n->op = op;
    n->op_span = op_span;
    n->span = Span{l->span.begin, r->span.end};
    n->depth = 1 + std::max(l->depth, r->depth);
    n->args.push_back(std::move(l));
    n->args.push_back(std::move(r));
    if (n->depth > kMaxTreeDepth && !aborted_) {
      diags_.report(DiagCode::TooDeep, src_, n->op_span,
                    fmt::format("expression more than {} operators deep", kMaxTreeDepth), "depth limit reached here",
                    {"split the expression with `let` bindings"});
      aborted_ = true;
    }
    return n;
  }

  // A left-associative level: operand ((op) operand)*. `ops` lists the tokens of this level;
  // `next` parses the tighter level.
  template <class Next>
  NodePtr left_assoc(std::initializer_list<Tok> ops, Next next) {
    NodePtr l = (this->*next)();
    while (!aborted_) {
      Tok k = peek().kind;
      bool match = false;
      for (Tok o : ops) match |= (o == k);
      if (!match) break;
      Span op_span = advance().span;
      NodePtr r = (this->*next)();
      l = binary(k, op_span, std::move(l), std::move(r));
    }
    return l;
  }

  // or_expr := and_expr (('||' | 'or') and_expr)*
  NodePtr or_expr() { return left_assoc({Tok::PipePipe, Tok::KwOr}, &Parser::and_expr); }
  // and_expr := bit_or (('&&' | 'and') bit_or)*
  NodePtr and_expr() { return left_assoc({Tok::AmpAmp, Tok::KwAnd}, &Parser::bit_or); }
  // bit_or := bit_xor ('|' bit_xor)*
  NodePtr bit_or() { return left_assoc({Tok::Pipe}, &Parser::bit_xor); }
  // bit_xor := bit_and ('^' bit_and)*
  NodePtr bit_xor() { return left_assoc({Tok::Caret}, &Parser::bit_and); }
  // bit_and := equality ('&' equality)*
  NodePtr bit_and() { return left_assoc({Tok::Amp}, &Parser::equality); }

  // A non-associative comparison level: operand (op operand)?; a second operator of the
  // same level is a chained comparison, which is rejected (E0103) and parsed on.
  template <class Next>
  NodePtr comparison(std::initializer_list<Tok> ops, Next next) {
    auto is_op = [&](Tok k) {
      for (Tok o : ops)
        if (o == k) return true;
      return false;
    };
    NodePtr l = (this->*next)();
    if (aborted_ || !is_op(peek().kind)) return l;
    Tok k = peek().kind;
    Span op_span = advance().span;
    NodePtr r = (this->*next)();
    l = binary(k, op_span, std::move(l), std::move(r));
    bool reported = false;
    while (!aborted_ && is_op(peek().kind)) {
      Tok k2 = peek().kind;
      Span op2 = advance().span;
      NodePtr r2 = (this->*next)();
      if (!reported) {
        diags_.report(DiagCode::ChainedComparison, src_, Span{l->span.begin, r2->span.end},
                      "chained comparisons are not allowed", "this chains two comparisons",
                      {"write `a < b && b < c` (Python's meaning) or parenthesise one side"});
        reported = true;
      }
      l = binary(k2, op2, std::move(l), std::move(r2));
    }
    return l;
  }

  // equality := relational (('==' | '!=') relational)?
  NodePtr equality() { return comparison({Tok::EqEq, Tok::NotEq}, &Parser::relational); }
  // relational := shift (('<' | '<=' | '>' | '>=') shift)?
  NodePtr relational() { return comparison({Tok::Lt, Tok::Le, Tok::Gt, Tok::Ge}, &Parser::shift); }
  // shift := additive (('<<' | '>>') additive)*
  NodePtr shift() { return left_assoc({Tok::Shl, Tok::Shr}, &Parser::additive); }
  // additive := multiplicative (('+' | '-') multiplicative)*
  NodePtr additive() { return left_assoc({Tok::Plus, Tok::Minus}, &Parser::multiplicative); }
  // multiplicative := unary (('*' | '/' | '//' | '%') unary)*
  NodePtr multiplicative() { return left_assoc({Tok::Star, Tok::Slash, Tok::SlashSlash, Tok::Percent}, &Parser::unary); }

  // unary := ('-' | '!' | 'not' | '~') unary | postfix
  NodePtr unary() {
    Tok k = peek().kind;
    if (k != Tok::Minus && k != Tok::Bang && k != Tok::KwNot && k != Tok::Tilde) return postfix();
    DepthGuard g(*this);
    if (too_deep()) return error_node(peek().span);
    Span op_span = advance().span;
    NodePtr operand = unary();
    auto n = std::make_unique<AstNode>();
    n->kind = AstKind::Unary;
    n->op = k;
    n->op_span = op_span;
    n->span = Span{op_span.begin, operand->span.end};
    n->depth = 1 + operand->depth;
    n->args.push_back(std::move(operand));
    return n;
  }

  // Parses a comma-separated list up to `close`, for call arguments and indices.
  std::vector<NodePtr> list(Tok close, const char* context) {
    std::vector<NodePtr> items;
    if (accept(close)) return items;
    while (!aborted_) {
      items.push_back(expr());
      if (aborted_ || accept(close)) break;
      if (accept(Tok::Comma)) continue;
      expect(close, context);
      // Recover: skip to the closing token (or give up at a statement boundary).
      int nesting = 0;
      while (peek().kind != Tok::End && peek().kind != Tok::Semicolon && peek().kind != Tok::KwLet) {
        Tok t = peek().kind;
        if (t == Tok::LParen || t == Tok::LBracket) ++nesting;
        if ((t == Tok::RParen || t == Tok::RBracket) && nesting-- == 0) {
          if (t == close) advance();
          break;
        }
        advance();
      }
      break;
    }
    return items;
  }

  // postfix := primary ( '(' args ')' | '[' indices ']' )*
  NodePtr postfix() {
    NodePtr n = primary();
    while (!aborted_) {
      if (peek().kind == Tok::LParen) {
        Span open = peek().span;
        advance();
        DepthGuard g(*this);
        if (too_deep()) return n;
        std::vector<NodePtr> args = list(Tok::RParen, "to close the argument list");
        if (n->kind != AstKind::Name) {
          if (n->kind != AstKind::Error)
            diags_.report(DiagCode::NotCallable, src_, n->span, "only functions can be called", "this is not a function name",
                          {"functions are called by name, e.g. `exp(x)`"});
          n = error_node(Span{n->span.begin, prev_end()});
          continue;
        }
        auto call = std::make_unique<AstNode>();
        call->kind = AstKind::Call;
        call->name = n->name;
        call->name_span = n->span;
        call->span = Span{n->span.begin, prev_end()};
        call->args = std::move(args);
        for (const auto& a : call->args) call->depth = std::max(call->depth, a->depth + 1);
        (void)open;
        n = std::move(call);
      } else if (peek().kind == Tok::LBracket) {
        advance();
        DepthGuard g(*this);
        if (too_deep()) return n;
        std::vector<NodePtr> idx = list(Tok::RBracket, "to close the index list");
        if (n->kind == AstKind::Name) {
          auto load = std::make_unique<AstNode>();
          load->kind = AstKind::Index;
          load->name = n->name;
          load->name_span = n->span;
          load->span = Span{n->span.begin, prev_end()};
          load->args = std::move(idx);
          for (const auto& a : load->args) load->depth = std::max(load->depth, a->depth + 1);
          n = std::move(load);
        } else if (n->kind == AstKind::Index) {
          // buf[i][j] is buf[i, j]: the chain extends one load.
          for (NodePtr& i : idx) {
            n->depth = std::max(n->depth, i->depth + 1);
            n->args.push_back(std::move(i));
          }
          n->span.end = prev_end();
        } else {
          if (n->kind != AstKind::Error)
            diags_.report(DiagCode::NotIndexable, src_, n->span, "only buffers can be indexed", "this is not a buffer",
                          {"declare a buffer, e.g. `--buffer 'bias: f32[H, Sq]'`, and index it by name"});
          n = error_node(Span{n->span.begin, prev_end()});
        }
      } else {
        break;
      }
    }
    return n;
  }

  // primary := INT | FLOAT | 'true' | 'false' | 'inf' | IDENT | '(' expr ')'
  NodePtr primary() {
    const Token& t = peek();
    auto n = std::make_unique<AstNode>();
    n->span = t.span;
    switch (t.kind) {
      case Tok::Int:
        n->kind = AstKind::IntLit;
        n->int_value = t.int_value;
        advance();
        return n;
      case Tok::Float:
        n->kind = AstKind::FloatLit;
        n->float_value = t.float_value;
        advance();
        return n;
      case Tok::KwInf:
        n->kind = AstKind::FloatLit;
        n->float_value = std::numeric_limits<double>::infinity();
        advance();
        return n;
      case Tok::KwTrue:
      case Tok::KwFalse:
        n->kind = AstKind::BoolLit;
        n->bool_value = t.kind == Tok::KwTrue;
        advance();
        return n;
      case Tok::Ident:
        n->kind = AstKind::Name;
        n->name = std::string(t.text);
        advance();
        return n;
      case Tok::LParen: {
        advance();
        DepthGuard g(*this);
        if (too_deep()) return error_node(t.span);
        uint32_t begin = t.span.begin;
        NodePtr inner = expr();
        if (!aborted_) expect(Tok::RParen, "to close `(`");
        inner->span = Span{begin, prev_end()};
        return inner;
      }
      case Tok::Error:
        advance();  // already reported by the lexer
        n->kind = AstKind::Error;
        return n;
      default: {
        std::vector<std::string> notes;
        if (t.kind == Tok::KwLet) notes.push_back("`let` bindings come before the final expression and end with `;`");
        if (t.kind == Tok::Plus) notes.push_back("there is no unary `+`");
        diags_.report(DiagCode::ExpectedExpression, src_, t.kind == Tok::End ? Span{prev_end(), prev_end()} : t.span,
                      fmt::format("expected an expression, found {}", token_description(t.kind)), "expected an expression",
                      std::move(notes));
        // Consume the token unless it may close or separate something an outer rule expects.
        if (t.kind != Tok::End && t.kind != Tok::RParen && t.kind != Tok::RBracket && t.kind != Tok::Comma &&
            t.kind != Tok::Semicolon && t.kind != Tok::Colon && t.kind != Tok::KwLet)
          advance();
        n->kind = AstKind::Error;
        return n;
      }
    }
  }

  std::shared_ptr<const Source> src_;
  Diagnostics& diags_;
  std::vector<Token> toks_;
  size_t pos_ = 0;
  int depth_ = 0;
  bool aborted_ = false;
};

}  // namespace

Program parse_program(const std::shared_ptr<const Source>& src, Diagnostics& diags) { return Parser(src, diags).program(); }

}  // namespace flexjit::dsl
