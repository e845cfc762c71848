// One case per diagnostic code: the code, a fragment of the message and the caret column.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "dsl/sema.h"
#include "dsl/spec.h"

using namespace flexjit::dsl;

namespace {

struct Case {
  DiagCode code;
  const char* kind;  // "score", "mask", "buffer", "param", "json"
  std::string text;
  std::vector<std::string> buffers;
  const char* fragment;
  unsigned col;  // 0: not checked (no source line)
};

Diagnostics run(const Case& c) {
  Diagnostics d;
  Spec spec;
  for (const std::string& b : c.buffers) REQUIRE(add_buffer(spec, b, "--buffer", d));
  std::string k = c.kind;
  if (k == "score") spec.score_mod = c.text;
  if (k == "mask") spec.mask_mod = c.text;
  if (k == "buffer") {
    add_buffer(spec, c.text, "--buffer", d);
    return d;
  }
  if (k == "param") {
    add_param(spec, c.text, "--param", d);
    return d;
  }
  if (k == "json") {
    parse_spec_json(c.text, "spec.json", d);
    return d;
  }
  check_spec(spec, d);
  return d;
}

}  // namespace

TEST_CASE("every diagnostic code has a positioned error test", "[errors]") {
  std::string deep(150, '(');
  deep += "q >= kv" + std::string(150, ')');
  const std::vector<Case> cases = {
      {DiagCode::UnexpectedCharacter, "mask", "q >= kv @ 1", {}, "unexpected character `@`", 9},
      {DiagCode::BadNumber, "score", "score + 1e", {}, "exponent needs digits", 9},
      {DiagCode::NumberOutOfRange, "mask", "q < 99999999999999999999", {}, "integer literal out of range", 5},
      {DiagCode::ExpectedExpression, "mask", "q >= ", {}, "expected an expression", 5},
      {DiagCode::ExpectedToken, "mask", "(q >= kv", {}, "expected `)`", 9},
      {DiagCode::ChainedComparison, "mask", "0 <= kv < q", {}, "chained comparisons", 1},
      {DiagCode::TooDeep, "mask", deep, {}, "nested more than", 0},
      {DiagCode::TrailingInput, "mask", "q >= kv kv", {}, "after the end of the expression", 9},
      {DiagCode::MissingResult, "mask", "let a = q;", {}, "without a result", 5},
      {DiagCode::BadLet, "mask", "let = q; q >= kv", {}, "expected a name after `let`", 5},
      {DiagCode::UnknownName, "score", "score + rel_h[b, h, q, kvv // 64]", {"rel_h: bf16[B, H, Sq, 64]"}, "unknown name `kvv`", 24},
      {DiagCode::UnknownFunction, "score", "tanhh(score)", {}, "unknown function `tanhh`", 1},
      {DiagCode::WrongArity, "score", "max(score)", {}, "takes 2 arguments", 1},
      {DiagCode::TypeMismatch, "score", "score + (q >= kv)", {}, "needs a number", 9},
      {DiagCode::WrongIndexCount, "score", "score + bias[h]", {"bias: f32[H, Sq]"}, "indexed with 1", 9},
      {DiagCode::NotIndexable, "mask", "q[0] == 1", {}, "not a buffer", 1},
      {DiagCode::BufferWithoutIndex, "score", "score + bias", {"bias: f32[Sq]"}, "used without an index", 9},
      {DiagCode::WrongResultType, "mask", "q - kv", {}, "must give a bool", 1},
      {DiagCode::ScoreInMask, "mask", "score > 0", {}, "not available in a mask_mod", 1},
      {DiagCode::DuplicateLet, "mask", "let q = 1; q >= kv", {}, "rebinds", 5},
      {DiagCode::DivisionByZero, "mask", "q // (2 - 2) == kv", {}, "division by zero", 6},
      {DiagCode::NotCallable, "mask", "q(1) >= kv", {}, "is not a function", 1},
      {DiagCode::FloatIndex, "score", "score + bias[1.5]", {"bias: f32[Sq]"}, "must be an int", 14},
      {DiagCode::BadDeclaration, "buffer", "rel_h: bf17[B]", {}, "unknown element type `bf17`", 8},
      {DiagCode::DuplicateDeclaration, "buffer", "bias: f32[Sq]", {"bias: f32[H]"}, "declared twice", 1},
      {DiagCode::BadConstValue, "param", "const cap: float", {}, "needs a value", 1},
      {DiagCode::ReservedName, "buffer", "q: f32[Sq]", {}, "built-in name", 1},
      {DiagCode::BadSpec, "json", "{\"mask_mod\": ", {}, "not valid JSON", 0},
  };
  // The table covers every code in FLEXJIT_DIAGNOSTIC_CODES.
  std::vector<int> all = {
#define FLEXJIT_DIAG_NUMBER(name, number, what) number,
      FLEXJIT_DIAGNOSTIC_CODES(FLEXJIT_DIAG_NUMBER)
#undef FLEXJIT_DIAG_NUMBER
  };
  for (int code : all) {
    bool found = false;
    for (const Case& c : cases) found |= static_cast<int>(c.code) == code;
    INFO("diagnostic code E" << code << " has no test case");
    CHECK(found);
  }
  for (const Case& c : cases) {
    INFO(diag_code_string(c.code) << " on: " << c.text);
    Diagnostics d = run(c);
    REQUIRE(d.has_errors());
    const Diagnostic& first = d.list().front();
    INFO(d.render_text());
    CHECK(first.code == c.code);
    CHECK(first.message.find(c.fragment) != std::string::npos);
    if (c.col) {
      REQUIRE(first.source);
      CHECK(first.source->loc(first.span.begin).col == c.col);
    }
  }
}

TEST_CASE("diagnostics render a caret line and a did-you-mean label", "[errors]") {
  Diagnostics d;
  Spec spec;
  REQUIRE(add_buffer(spec, "rel_h: bf16[B, H, Sq, 64]", "--buffer", d));
  spec.score_mod = "score + rel_h[b, h, q, kvv // 64]";
  check_spec(spec, d);
  std::string text = d.render_text();
  CHECK(text ==
        "error[E0201]: unknown name `kvv`\n"
        " --> score_mod:1:24\n"
        "  |\n"
        "1 | score + rel_h[b, h, q, kvv // 64]\n"
        "  |                        ^^^ did you mean `kv`?\n");
  std::string json = d.render_json();
  CHECK(json.find("\"code\": \"E0201\"") != std::string::npos);
  CHECK(json.find("\"col\": 24") != std::string::npos);
  CHECK(json.find("\"line\": 1") != std::string::npos);
}

TEST_CASE("every error of a program is reported in one run", "[errors]") {
  Diagnostics d;
  Spec spec;
  spec.score_mod = "let a = foo;\nlet b = q +;\nscore + bar(a) + (q < kv < 3)";
  check_spec(spec, d);
  std::vector<DiagCode> codes;
  for (const Diagnostic& x : d.list()) codes.push_back(x.code);
  INFO(d.render_text());
  CHECK(std::count(codes.begin(), codes.end(), DiagCode::UnknownName) >= 1);
  CHECK(std::count(codes.begin(), codes.end(), DiagCode::ExpectedExpression) == 1);
  CHECK(std::count(codes.begin(), codes.end(), DiagCode::UnknownFunction) == 1);
  CHECK(std::count(codes.begin(), codes.end(), DiagCode::ChainedComparison) == 1);
  // Positions point at the right lines.
  for (const Diagnostic& x : d.list())
    if (x.code == DiagCode::UnknownFunction) CHECK(x.source->loc(x.span.begin).line == 3);
}
