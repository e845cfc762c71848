#include "fuzz/differential/shrink.h"

#include <regex>
#include <string>
#include <vector>

namespace flexjit::fuzz {

namespace {

using Path = std::vector<size_t>;

GenExpr& at(GenExpr& root, const Path& path) {
  GenExpr* n = &root;
  for (size_t i : path) n = &n->kids[i];
  return *n;
}

void paths(const GenExpr& e, Path& prefix, std::vector<Path>& out) {
  out.push_back(prefix);
  for (size_t i = 0; i < e.kids.size(); ++i) {
    prefix.push_back(i);
    paths(e.kids[i], prefix, out);
    prefix.pop_back();
  }
}

// Simpler expressions of the same type that may replace `e`.
std::vector<GenExpr> replacements(const GenExpr& e) {
  std::vector<GenExpr> out;
  if (e.keep) return out;
  for (const GenExpr& k : e.kids)
    if (k.type == e.type) out.push_back(k);
  static const char* const kInt[] = {"0", "1"};
  static const char* const kFloat[] = {"0.0", "score"};
  static const char* const kBool[] = {"true", "false"};
  const char* const* leaves = e.type == GenExpr::Type::Int ? kInt : e.type == GenExpr::Type::Float ? kFloat : kBool;
  for (int i = 0; i < 2; ++i)
    if (e.text != leaves[i]) out.push_back(GenExpr{e.type, leaves[i], {}, false});
  return out;
}

bool mentions(const GenCase& c, const std::string& name) {
  const std::regex word("\\b" + name + "\\b");
  return (c.score_mod && std::regex_search(c.score_mod->render(), word)) || (c.mask_mod && std::regex_search(c.mask_mod->render(), word));
}

class Shrinker {
 public:
  Shrinker(GenCase c, const std::function<bool(const GenCase&)>& fails, int budget) : best_(std::move(c)), fails_(fails), budget_(budget) {}

  GenCase run() {
    bool progress = true;
    while (progress && budget_ > 0) {
      progress = programs();
      progress |= declarations();
      progress |= sizes();
      progress |= expressions();
    }
    return best_;
  }

 private:
  bool attempt(const GenCase& candidate) {
    if (budget_ <= 0) return false;
    --budget_;
    if (!fails_(candidate)) return false;
    best_ = candidate;
    return true;
  }

  template <class F>
  bool attempt_edit(F&& edit) {
    GenCase c = best_;
    if (!edit(c)) return false;
    return attempt(c);
  }

  bool sizes() {
    using Edit = std::function<bool(GenCase&)>;
    const std::vector<Edit> edits = {
        [](GenCase& c) { return c.sizes.B > 1 && (c.sizes.B = 1); },
        [](GenCase& c) { return c.gqa_group != 0 && ((c.gqa_group = 0), true); },
        [](GenCase& c) { return c.sizes.H > c.sizes.Hkv && !c.gqa_group && (c.sizes.H = c.sizes.Hkv); },
        [](GenCase& c) { return c.sizes.Hkv > 1 && !c.gqa_group && ((c.sizes.Hkv = 1), true); },
        [](GenCase& c) { return c.sizes.H > 1 && c.sizes.Hkv == 1 && !c.gqa_group && ((c.sizes.H = 1), true); },
        [](GenCase& c) { return c.sizes.Sq > 1 && ((c.sizes.Sq = 1), true); },
        [](GenCase& c) { return c.sizes.Sq > 1 && ((c.sizes.Sq /= 2), true); },
        [](GenCase& c) { return c.sizes.Sq > 1 && ((c.sizes.Sq -= 1), true); },
        [](GenCase& c) { return c.sizes.Skv > 1 && ((c.sizes.Skv = 1), true); },
        [](GenCase& c) { return c.sizes.Skv > 1 && ((c.sizes.Skv /= 2), true); },
        [](GenCase& c) { return c.sizes.Skv > 1 && ((c.sizes.Skv -= 1), true); },
        [](GenCase& c) { return c.sizes.N > 1 && ((c.sizes.N = 1), true); },
        [](GenCase& c) { return c.scale != 0 && ((c.scale = 0), true); },
        [](GenCase& c) { return c.bshd && !(c.bshd = false); },
        [](GenCase& c) { return c.backward && !(c.backward = false); },
        [](GenCase& c) { return c.head_dim_v != 0 && ((c.head_dim_v = 0), true); },
        [](GenCase& c) { return c.head_dim > 8 && ((c.head_dim = 8), true); },
        [](GenCase& c) { return c.dtype != dsl::DType::F32 && ((c.dtype = dsl::DType::F32), true); },
    };
    bool any = false;
    for (const Edit& e : edits) any |= attempt_edit(e);
    return any;
  }

  bool programs() {
    return attempt_edit([](GenCase& c) { return c.score_mod && (c.score_mod.reset(), true); }) ||
           attempt_edit([](GenCase& c) { return c.mask_mod && (c.mask_mod.reset(), true); });
  }

  bool expressions() {
    for (std::optional<GenExpr> GenCase::*root : {&GenCase::score_mod, &GenCase::mask_mod}) {
      if (!(best_.*root)) continue;
      std::vector<Path> all;
      Path prefix;
      paths(*(best_.*root), prefix, all);
      for (const Path& p : all) {
        for (const GenExpr& r : replacements(at(*(best_.*root), p))) {
          GenCase c = best_;
          at(*(c.*root), p) = r;
          if (attempt(c)) return true;
          if (budget_ <= 0) return false;
        }
      }
    }
    return false;
  }

  // Declarations the programs no longer mention (one removed per call).
  bool declarations() {
    for (size_t i = 0; i < best_.buffers.size(); ++i) {
      const std::string name = best_.buffers[i].substr(0, best_.buffers[i].find(':'));
      if (mentions(best_, name)) continue;
      GenCase c = best_;
      c.buffers.erase(c.buffers.begin() + static_cast<std::ptrdiff_t>(i));
      if (i < c.grads.size()) c.grads.erase(c.grads.begin() + static_cast<std::ptrdiff_t>(i));
      if (attempt(c)) return true;
    }
    for (size_t i = 0; i < best_.params.size(); ++i) {
      std::string decl = best_.params[i];
      if (decl.rfind("const ", 0) == 0) decl = decl.substr(6);
      const std::string name = decl.substr(0, decl.find(':'));
      if (mentions(best_, name)) continue;
      GenCase c = best_;
      c.params.erase(c.params.begin() + static_cast<std::ptrdiff_t>(i));
      for (size_t v = 0; v < c.values.size(); ++v)
        if (c.values[v].first == name) c.values.erase(c.values.begin() + static_cast<std::ptrdiff_t>(v));
      if (attempt(c)) return true;
    }
    return false;
  }

  GenCase best_;
  const std::function<bool(const GenCase&)>& fails_;
  int budget_;
};

}  // namespace

GenCase shrink_case(GenCase c, const std::function<bool(const GenCase&)>& fails, int budget) { return Shrinker(std::move(c), fails, budget).run(); }

}  // namespace flexjit::fuzz
