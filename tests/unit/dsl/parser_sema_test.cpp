// Front end units: the lexer's literals, the parser's precedence and chains, sema's types,
// aliases, lets, comments, and spec parsing from JSON.
#include <catch2/catch.hpp>

#include "dsl/ast.h"
#include "dsl/lexer.h"
#include "dsl/parser.h"
#include "dsl/sema.h"
#include "dsl/spec.h"

using namespace flexjit::dsl;

namespace {
std::string parse(const std::string& text) {
  Diagnostics d;
  auto src = std::make_shared<Source>("t", text);
  Program p = parse_program(src, d);
  INFO(d.render_text());
  REQUIRE(!d.has_errors());
  return print_ast(p);
}

ValueType result_type(const std::string& text, ModKind kind = ModKind::Score, std::vector<std::string> buffers = {},
                      std::vector<std::string> params = {}) {
  Spec spec;
  Diagnostics d;
  for (auto& b : buffers) add_buffer(spec, b, "t", d);
  for (auto& p : params) add_param(spec, p, "t", d);
  CheckedProgram cp = check_program(kind, text, spec, collect_symbols(spec), d);
  INFO(d.render_text());
  REQUIRE(!d.has_errors());
  return cp.ast->result->type;
}
}  // namespace

TEST_CASE("lexer: literals, operators and comments", "[dsl]") {
  Diagnostics d;
  auto src = std::make_shared<Source>("t", "42 1.5 1e-3 .5 inf // ** # comment\n<< >= != && || q_idx");
  std::vector<Token> t = lex(src, d);
  CHECK(t[0].kind == Tok::Int);
  CHECK(t[0].int_value == 42);
  CHECK(t[1].float_value == 1.5);
  CHECK(t[2].float_value == Approx(1e-3));
  CHECK(t[3].float_value == 0.5);
  CHECK(t[4].kind == Tok::KwInf);
  CHECK(t[5].kind == Tok::SlashSlash);
  CHECK(t[6].kind == Tok::Error);  // `**` is reported with a pow() hint
  CHECK(t[7].kind == Tok::Shl);
  CHECK(t[8].kind == Tok::Ge);
  CHECK(t[9].kind == Tok::NotEq);
  CHECK(t[12].kind == Tok::Ident);
  CHECK(t.back().kind == Tok::End);
  REQUIRE(d.list().size() == 1);
  CHECK(d.list()[0].message.find("**") != std::string::npos);
}

TEST_CASE("parser: C precedence, as DSL.md's table says", "[dsl]") {
  CHECK(parse("q >= kv & q - kv <= 4") == "(& (>= q kv) (<= (- q kv) 4))\n");
  CHECK(parse("a || b && c") == "(|| a (&& b c))\n");
  CHECK(parse("a | b ^ c & d") == "(| a (^ b (& c d)))\n");
  CHECK(parse("1 << 2 + 3") == "(<< 1 (+ 2 3))\n");
  CHECK(parse("-q // 2 % 3") == "(% (// (- q) 2) 3)\n");
  CHECK(parse("c ? a : d ? e : f") == "(?: c a (?: d e f))\n");
  CHECK(parse("not a == b") == "(== (not a) b)\n");
  CHECK(parse("(q - kv) // 64") == "(// (- q kv) 64)\n");
}

TEST_CASE("parser: [i][j] chains are one load; calls; lets", "[dsl]") {
  CHECK(parse("rel_h[b][h][q][kv // 64]") == "(index rel_h b h q (// kv 64))\n");
  CHECK(parse("rel_h[b, h][q, kv]") == "(index rel_h b h q kv)\n");
  CHECK(parse("bias[offset[q]]") == "(index bias (index offset q))\n");
  CHECK(parse("clamp(x, 0, 1)") == "(call clamp x 0 1)\n");
  CHECK(parse("let d = q - kv; # distance\nd >= 0") == "(let d (- q kv))\n(>= d 0)\n");
}

TEST_CASE("sema: types, promotion and aliases", "[dsl]") {
  CHECK(result_type("score + 1") == ValueType::Float);
  CHECK(result_type("q - kv") == ValueType::Int);  // promoted to float when lowered
  CHECK(result_type("q / 2") == ValueType::Float);
  CHECK(result_type("q // 2") == ValueType::Int);
  CHECK(result_type("float(q >= kv)") == ValueType::Float);
  CHECK(result_type("int(score)") == ValueType::Int);
  CHECK(result_type("floor(score)") == ValueType::Float);
  CHECK(result_type("floor(q)") == ValueType::Int);
  CHECK(result_type("where(q >= kv, score, -inf)") == ValueType::Float);
  CHECK(result_type("q_idx >= kv_idx && batch == 0 && head >= 0 && kv_head >= 0", ModKind::Mask) == ValueType::Bool);
  CHECK(result_type("doc[q] == doc[kv]", ModKind::Mask, {"doc: i32[Sq]"}) == ValueType::Bool);
  CHECK(result_type("score + bias[h, q - kv + Skv - 1]", ModKind::Score, {"bias: f32[H, L]"}) == ValueType::Float);
  CHECK(result_type("q < window", ModKind::Mask, {}, {"window: int"}) == ValueType::Bool);
  CHECK(result_type("cap * tanh(score / cap)", ModKind::Score, {}, {"const cap: float = 30"}) == ValueType::Float);
  CHECK(result_type("m[q] || q >= kv", ModKind::Mask, {"m: bool[Sq]"}) == ValueType::Bool);
}

TEST_CASE("spec files: declarations, params, grads and errors", "[dsl]") {
  Diagnostics d;
  auto spec = parse_spec_json(R"({"name": "sam", "score_mod": "score + rel_h[b, h, q, kv // 64]",
      "buffers": {"rel_h": "bf16[B, H, Sq, 64]"}, "params": ["window: int = 64", "const cap: float = -1.5"],
      "grad": ["rel_h"], "dtype": "f16", "head_dim": 80})", "s.json", d);
  INFO(d.render_text());
  REQUIRE(spec);
  CHECK(spec->buffers[0].str() == "rel_h: bf16[B, H, Sq, 64]");
  CHECK(spec->buffers[0].requires_grad);
  CHECK(spec->params[0].has_value);
  CHECK(spec->params[0].int_value == 64);
  CHECK(spec->params[1].is_const);
  CHECK(spec->params[1].float_value == -1.5);
  CHECK(spec->dtype == DType::F16);
  CHECK(spec->head_dim == 80);
  // The JSON form round-trips.
  Diagnostics d2;
  auto again = parse_spec_json(spec_to_json(*spec), "again.json", d2);
  REQUIRE(again);
  CHECK(again->buffers[0].str() == spec->buffers[0].str());
  Diagnostics bad;
  CHECK(!parse_spec_json(R"({"mask_mod": "q >= kv", "hed_dim": 64})", "b.json", bad));
  CHECK(bad.render_text().find("did you mean \"head_dim\"") != std::string::npos);
  Diagnostics dim;
  CHECK(!parse_spec_json(R"({"mask_mod": "q >= kv", "head_dim": 77})", "c.json", dim));
}
