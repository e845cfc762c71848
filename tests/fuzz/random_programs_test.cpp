// A bounded randomized test of the front end in ctest: random token soups, programs grown
// from the grammar, and mutations of the gallery programs. No input may crash, hang or
// throw anything but a positioned CompileError.
#include <catch2/catch.hpp>
#include <random>
#include <string>
#include <vector>

#include "fuzz/frontend_property.h"

namespace {

const std::vector<std::string> kTokens = {
    "score", "q", "kv", "b", "h", "kv_head", "window", "cap", "Skv", "Sq", "bias", "doc", "rel", "0", "1", "64", "-1", "1.5",
    "1e-3", ".5", "inf", "true", "false", "+", "-", "*", "/", "//", "%", "<<", ">>", "<", "<=", ">", ">=", "==", "!=", "&&",
    "||", "&", "|", "^", "~", "!", "not", "and", "or", "?", ":", ",", "(", ")", "[", "]", ";", "let", "x", "=", "#c\n",
    "tanh", "exp", "where", "clamp", "min", "max", "float", "int", "abs", "pow", "sigmoid", "@", "\"", "\xff", "\n", " "};

std::string random_soup(std::mt19937& rng) {
  std::uniform_int_distribution<size_t> n(0, 24), pick(0, kTokens.size() - 1);
  std::string s;
  for (size_t i = n(rng); i > 0; --i) s += kTokens[pick(rng)] + " ";
  return s;
}

// Grows a well-typed-looking expression from the grammar (it may still be ill-typed).
std::string grow(std::mt19937& rng, int depth) {
  std::uniform_int_distribution<int> d(0, 9);
  static const std::vector<std::string> leaves = {"q", "kv", "b", "h", "score", "window", "cap", "Skv", "3", "64", "0.5", "true"};
  static const std::vector<std::string> ops = {"+", "-", "*", "/", "//", "%", "<", "<=", "==", "!=", "&&", "||", "&", "|", "^", "<<", ">>"};
  int r = d(rng);
  if (depth <= 0 || r < 3) return leaves[std::uniform_int_distribution<size_t>(0, leaves.size() - 1)(rng)];
  if (r < 7) return "(" + grow(rng, depth - 1) + " " + ops[std::uniform_int_distribution<size_t>(0, ops.size() - 1)(rng)] + " " + grow(rng, depth - 1) + ")";
  if (r == 7) return "where(" + grow(rng, depth - 1) + ", " + grow(rng, depth - 1) + ", " + grow(rng, depth - 1) + ")";
  if (r == 8) return "bias[h, " + grow(rng, depth - 1) + "]";
  return "tanh(" + grow(rng, depth - 1) + ")";
}

std::string mutate(std::string s, std::mt19937& rng) {
  std::uniform_int_distribution<int> kind(0, 4);
  for (int m = std::uniform_int_distribution<int>(1, 4)(rng); m > 0; --m) {
    if (s.empty()) s = "q";
    std::uniform_int_distribution<size_t> at(0, s.size() - 1);
    switch (kind(rng)) {
      case 0: s.erase(at(rng), 1); break;
      case 1: s.insert(at(rng), kTokens[std::uniform_int_distribution<size_t>(0, kTokens.size() - 1)(rng)]); break;
      case 2: s[at(rng)] = static_cast<char>(std::uniform_int_distribution<int>(1, 255)(rng)); break;
      case 3: s = s.substr(0, at(rng)); break;
      case 4: s += s.substr(at(rng)); break;
    }
  }
  return s;
}

}  // namespace

TEST_CASE("10,000+ random and mutated programs never crash and every rejection is positioned", "[fuzz]") {
  const std::vector<std::string> seeds = {
      "q >= kv", "q >= kv && q - kv < window", "kv < window || q >= kv", "doc[q] == doc[kv]", "score + bias[h, q - kv + Skv - 1]",
      "cap * tanh(score / cap)", "score + rel[b, h, q, kv // 64] + rel[b][h][q][kv % 64]", "let d = q - kv;\nd >= 0 && d < window",
      "score + bias[h, doc[q]]", "where(q >= kv, score, -inf)"};
  std::mt19937 rng(12345);
  int accepted = 0, rejected = 0;
  for (int i = 0; i < 10500; ++i) {
    std::string score, mask;
    switch (i % 3) {
      case 0: (rng() & 1 ? score : mask) = random_soup(rng); break;
      case 1: (rng() & 1 ? score : mask) = grow(rng, 6); break;
      case 2: (rng() & 1 ? score : mask) = mutate(seeds[rng() % seeds.size()], rng); break;
    }
    bool ok = false;
    std::string violation = flexjit::fuzz::check_one(score, mask, &ok);
    if (!violation.empty()) {
      INFO("score_mod: " << score << "\nmask_mod: " << mask);
      FAIL(violation);
    }
    ++(ok ? accepted : rejected);
  }
  // Both outcomes must be exercised for the test to mean something.
  CHECK(accepted > 500);
  CHECK(rejected > 500);
}

TEST_CASE("pathological nesting is rejected with an error, not a stack overflow", "[fuzz]") {
  for (std::string deep : {std::string(100000, '(') + "q", std::string(100000, '-') + "q", "q" + std::string(0, ' ')}) {
    CHECK(flexjit::fuzz::check_one("", deep).empty());
  }
  std::string chain = "q";
  for (int i = 0; i < 100000; ++i) chain += " + q";
  CHECK(flexjit::fuzz::check_one("", chain + " >= kv").empty());
  std::string lets;
  for (int i = 0; i < 2000; ++i) lets += "let a" + std::to_string(i + 1) + " = a" + std::to_string(i) + " + a" + std::to_string(i) + ";\n";
  CHECK(flexjit::fuzz::check_one("", "let a0 = q;\n" + lets + "a2000 >= kv").empty());
}
