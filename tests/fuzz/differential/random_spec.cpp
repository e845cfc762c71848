#include "fuzz/differential/random_spec.h"

#include <fmt/format.h>

#include <algorithm>

namespace flexjit::fuzz {

std::string GenExpr::render() const {
  std::string out;
  size_t kid = 0;
  for (char c : text) {
    if (c == '$' && kid < kids.size()) out += kids[kid++].render();
    else out += c;
  }
  return out;
}

size_t GenExpr::size() const {
  size_t n = 1;
  for (const GenExpr& k : kids) n += k.size();
  return n;
}

dsl::Spec GenCase::spec() const {
  dsl::Spec s;
  s.name = fmt::format("random_{}", seed);
  s.dtype = dtype;
  s.head_dim = head_dim;
  s.head_dim_v = head_dim_v;
  s.gqa_group = gqa_group;
  dsl::Diagnostics diags;
  for (size_t i = 0; i < buffers.size(); ++i) {
    dsl::add_buffer(s, buffers[i], "generated", diags);
    if (i < grads.size() && grads[i] && !s.buffers.empty()) s.buffers.back().requires_grad = true;
  }
  for (const std::string& p : params) dsl::add_param(s, p, "generated", diags);
  if (score_mod) s.score_mod = score_mod->render();
  if (mask_mod) s.mask_mod = mask_mod->render();
  return s;
}

namespace {

using Type = GenExpr::Type;

GenExpr leaf(Type t, std::string text) { return GenExpr{t, std::move(text), {}, false}; }
GenExpr node(Type t, std::string text, std::vector<GenExpr> kids, bool keep = false) { return GenExpr{t, std::move(text), std::move(kids), keep}; }

struct BufferInfo {
  std::string name;
  dsl::DType dtype;
  std::vector<std::string> dims;  // symbols or literals
};

class Generator {
 public:
  Generator(uint64_t seed, const GenOptions& o) : rng_(seed), opt_(o) { c_.seed = seed; }

  GenCase run() {
    c_.backward = chance(0.5);
    choose_types();
    choose_declarations();
    choose_sizes();
    // Kinks in `score` (max, min, abs) only where nothing is differentiated: at a tie the
    // derivative depends on the last bit of q.k.
    kinks_ = !c_.backward;
    const double r = uniform();
    const bool score = r < 0.75, mask = r > 0.3 || r < 0.05;
    if (score) {
      c_.score_mod = gen_score(3);
      // -inf only outermost: negation or abs above it would make it +inf.
      if (chance(0.1)) c_.score_mod = node(Type::Float, "where($, $, -inf)", {gen_bool(2), *c_.score_mod});
    }
    if (mask) c_.mask_mod = gen_mask();
    return c_;
  }

 private:
  bool chance(double p) { return std::uniform_real_distribution<double>(0, 1)(rng_) < p; }
  double uniform() { return std::uniform_real_distribution<double>(0, 1)(rng_); }
  int64_t range(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng_); }
  template <class T>
  const T& pick(const std::vector<T>& v) { return v[static_cast<size_t>(range(0, static_cast<int64_t>(v.size()) - 1))]; }

  void choose_types() {
    if (opt_.gpu) {
      c_.dtype = chance(0.5) ? dsl::DType::BF16 : dsl::DType::F16;
      c_.head_dim = static_cast<int>(pick(std::vector<int64_t>{32, 64, 64, 96, 128}));
    } else {
      const double r = uniform();
      c_.dtype = r < 0.5 ? dsl::DType::F32 : r < 0.75 ? dsl::DType::BF16 : dsl::DType::F16;
      c_.head_dim = static_cast<int>(pick(std::vector<int64_t>{8, 16, 16, 24, 32, 64}));
      if (chance(0.15)) c_.head_dim_v = static_cast<int>(pick(std::vector<int64_t>{8, 16, 32}));
    }
  }

  void choose_declarations() {
    static const std::vector<dsl::DType> dtypes = {dsl::DType::F32, dsl::DType::F16, dsl::DType::BF16, dsl::DType::I32,
                                                   dsl::DType::I64, dsl::DType::U8, dsl::DType::Bool};
    static const std::vector<std::string> dims = {"B", "H", "Hkv", "Sq", "Skv", "Sq", "Skv", "N", "1", "3", "5", "8"};
    const int64_t nbuf = range(0, 4);
    for (int64_t i = 0; i < nbuf; ++i) {
      BufferInfo b{fmt::format("t{}", i), pick(dtypes), {}};
      for (int64_t d = range(1, 3); d > 0; --d) b.dims.push_back(pick(dims));
      uses_n_ = uses_n_ || std::find(b.dims.begin(), b.dims.end(), "N") != b.dims.end();
      c_.buffers.push_back(fmt::format("{}: {}[{}]", b.name, dsl::dtype_name(b.dtype), fmt::join(b.dims, ", ")));
      const bool is_float = b.dtype == dsl::DType::F32 || b.dtype == dsl::DType::F16 || b.dtype == dsl::DType::BF16;
      c_.grads.push_back(c_.backward && is_float && chance(0.6));
      buffers_.push_back(std::move(b));
    }
    static const std::vector<std::string> types = {"int", "float", "bool"};
    for (int64_t i = range(0, 3); i > 0; --i) {
      const std::string name = fmt::format("p{}", params_.size()), type = pick(types);
      c_.params.push_back(fmt::format("{}: {}", name, type));
      double v = type == "int" ? double(range(-5, 20)) : type == "float" ? double(range(-16, 16)) / 8 : double(range(0, 1));
      c_.values.emplace_back(name, v);
      params_.emplace_back(name, type);
    }
    if (chance(0.3)) {
      const std::string name = "c0", type = pick(types);
      const std::string value = type == "int" ? std::to_string(range(-3, 12)) : type == "float" ? fmt::format("{}", double(range(-12, 12)) / 4)
                                                                                                   : (chance(0.5) ? "true" : "false");
      c_.params.push_back(fmt::format("const {}: {} = {}", name, type, value));
      params_.emplace_back(name, type);
    }
  }

  void choose_sizes() {
    LaunchSizes& s = c_.sizes;
    s.B = range(1, 2);
    s.Hkv = range(1, 2);
    s.H = s.Hkv * range(1, 3);
    if (chance(0.1)) c_.gqa_group = static_cast<int>(s.H / s.Hkv);
    static const std::vector<int64_t> special = {1, 2, 7, 63, 64, 65, 127, 128, 129};
    auto length = [&](int max) { return std::min<int64_t>(max, chance(0.4) ? pick(special) : range(1, max)); };
    s.Sq = length(opt_.max_seqlen_q);
    s.Skv = length(opt_.max_seqlen_kv);
    // The float64 reference costs B H Sq Skv interpreter calls: keep a case to a fraction of a second.
    while (s.B * s.H * s.Sq * s.Skv > 60000 && s.Sq > 1) s.Sq = (s.Sq + 1) / 2;
    s.N = range(1, 12);
    if (chance(0.2)) c_.scale = static_cast<float>(pick(std::vector<double>{0.5, 0.125, 0.3}));
    c_.bshd = chance(0.3);
  }

  // --- integers: bounded (|x| < 2^20), no division by zero, no overflow ---------------------

  std::string literal_int(int64_t lo, int64_t hi) {
    int64_t v = range(lo, hi);
    return v < 0 ? fmt::format("({})", v) : std::to_string(v);
  }

  std::vector<std::string> params_of(const std::string& type) const {
    std::vector<std::string> out;
    for (const auto& [n, t] : params_)
      if (t == type) out.push_back(n);
    return out;
  }

  std::vector<const BufferInfo*> buffers_of(Type t) const {
    std::vector<const BufferInfo*> out;
    for (const BufferInfo& b : buffers_) {
      const bool f = b.dtype == dsl::DType::F32 || b.dtype == dsl::DType::F16 || b.dtype == dsl::DType::BF16;
      const bool bo = b.dtype == dsl::DType::Bool;
      if ((t == Type::Float && f) || (t == Type::Bool && bo) || (t == Type::Int && !f && !bo)) out.push_back(&b);
    }
    return out;
  }

  // An index into a dimension of extent `dim` that is always in range (or wraps from the end);
  // `depth` bounds the loads nested in it.
  GenExpr index_for(const std::string& dim, int depth) {
    static const std::vector<std::pair<std::string, std::string>> natural = {{"B", "b"}, {"H", "h"}, {"Hkv", "kv_head"}, {"Sq", "q"}, {"Skv", "kv"}};
    for (const auto& [sym, var] : natural)
      if (dim == sym && chance(0.45)) return leaf(Type::Int, var);
    const bool literal = std::isdigit(static_cast<unsigned char>(dim[0]));
    switch (range(0, 3)) {
      case 0: return node(Type::Int, fmt::format("(($) % {})", dim), {gen_int(depth)}, true);
      case 1: return node(Type::Int, fmt::format("clamp($, 0, {} - 1)", dim), {gen_int(depth)}, true);
      case 2: return node(Type::Int, fmt::format("(-1 - (($) % {}))", dim), {gen_int(depth)}, true);
      default: return leaf(Type::Int, literal ? std::to_string(range(0, std::stoll(dim) - 1)) : "0");
    }
  }

  // A parameter of type `t` (when `param` and one is declared), else a load of a buffer of type
  // `t` (when one is declared): nullopt when there is neither.
  std::optional<GenExpr> declared(Type t, bool param, int depth) {
    static const char* const kTypeNames[] = {"int", "float", "bool"};
    if (param)
      if (auto p = params_of(kTypeNames[static_cast<int>(t)]); !p.empty()) return leaf(t, pick(p));
    if (auto b = buffers_of(t); !b.empty() && depth >= 0) return load(*pick(b), t, depth);
    return std::nullopt;
  }

  // A load whose indices hold at most `depth` - 1 levels of further loads.
  GenExpr load(const BufferInfo& b, Type t, int depth) {
    std::string text = b.name + "[";
    std::vector<GenExpr> kids;
    for (size_t d = 0; d < b.dims.size(); ++d) {
      text += d ? ", $" : "$";
      kids.push_back(index_for(b.dims[d], std::min(depth - 1, 1)));
    }
    return node(t, text + "]", std::move(kids), true);
  }

  GenExpr gen_int(int depth) {
    if (depth <= 0 || chance(0.3)) {
      std::vector<std::string> syms = {"B", "H", "Hkv", "Sq", "Skv"};
      if (uses_n_) syms.push_back("N");
      const int64_t k = range(0, 6);
      if (k <= 1) return leaf(Type::Int, pick(std::vector<std::string>{"b", "h", "kv_head", "q", "kv", "q", "kv"}));
      if (k == 2) return leaf(Type::Int, pick(syms));
      if (k <= 4)
        if (auto e = declared(Type::Int, k == 3, depth)) return *e;
      return leaf(Type::Int, literal_int(-9, 40));
    }
    auto sub = [&] { return gen_int(depth - 1); };
    switch (range(0, 15)) {
      case 0: return node(Type::Int, "($ + $)", {sub(), sub()});
      case 1: return node(Type::Int, "($ - $)", {sub(), sub()});
      case 2: return node(Type::Int, fmt::format("($ * {})", literal_int(-4, 8)), {sub()});
      case 3: return node(Type::Int, fmt::format("($ // {})", range(1, 9)), {sub()});
      case 4: return node(Type::Int, fmt::format("($ % {})", range(1, 9)), {sub()});
      case 5: return node(Type::Int, "($ // (abs($) + 1))", {sub(), sub()}, true);
      case 6: return node(Type::Int, "($ % (abs($) + 1))", {sub(), sub()}, true);
      case 7: return node(Type::Int, pick(std::vector<std::string>{"min($, $)", "max($, $)"}), {sub(), sub()});
      case 8: return node(Type::Int, pick(std::vector<std::string>{"abs($)", "(-$)", "sign($)"}), {sub()});
      case 9: return node(Type::Int, "where($, $, $)", {gen_bool(depth - 1), sub(), sub()});
      case 10: return node(Type::Int, "($ ? $ : $)", {gen_bool(depth - 1), sub(), sub()});
      case 11: return node(Type::Int, pick(std::vector<std::string>{"($ & $)", "($ | $)", "($ ^ $)"}), {sub(), sub()});
      case 12: return node(Type::Int, fmt::format("($ >> {})", range(0, 3)), {sub()});
      case 13: return node(Type::Int, fmt::format("(abs($) << {})", range(0, 3)), {sub()}, true);
      default: return node(Type::Int, "int($)", {gen_exact(depth - 1)});
    }
  }

  // --- exact floats: dyadic values fp32 holds exactly through every operation below --------
  // Leaves have at most 7 integer and 6 fraction bits (buffer data k/64, parameters k/8,
  // literals k/4, integers mod 97); three levels of sums and halvings stay within 24 bits.

  std::string literal_float() { return fmt::format("{:.2f}", double(range(-12, 12)) / 4); }

  GenExpr gen_exact(int depth) {
    if (depth <= 0 || chance(0.3)) {
      const int64_t k = range(0, 4);
      if (k == 0) return leaf(Type::Float, literal_float());
      if (k <= 2)
        if (auto e = declared(Type::Float, k == 1, depth)) return *e;
      return node(Type::Float, "float(($) % 97)", {gen_int(depth - 1)}, true);
    }
    auto sub = [&] { return gen_exact(depth - 1); };
    switch (range(0, 9)) {
      case 0: return node(Type::Float, "($ + $)", {sub(), sub()});
      case 1: return node(Type::Float, "($ - $)", {sub(), sub()});
      case 2: return node(Type::Float, fmt::format("($ * {})", pick(std::vector<std::string>{"0.5", "2.0", "-1.0"})), {sub()});
      case 3: return node(Type::Float, pick(std::vector<std::string>{"(-$)", "abs($)", "floor($)", "ceil($)", "round($)", "sign($)"}), {sub()});
      case 4: return node(Type::Float, pick(std::vector<std::string>{"min($, $)", "max($, $)"}), {sub(), sub()});
      case 5: return node(Type::Float, "where($, $, $)", {gen_bool(depth - 1), sub(), sub()});
      case 6: {
        double lo = double(range(-8, 0)) / 2, hi = lo + double(range(0, 8)) / 2;
        return node(Type::Float, fmt::format("clamp($, {:.1f}, {:.1f})", lo, hi), {sub()});
      }
      default: return node(Type::Float, "float(($) % 97)", {gen_int(depth - 1)}, true);
    }
  }

  // --- smooth floats: anything finite; only ever added, bounded, into the score ------------

  GenExpr gen_smooth(int depth) {
    if (depth <= 0 || chance(0.3)) return gen_exact(depth);
    auto sub = [&] { return gen_smooth(depth - 1); };
    switch (range(0, 12)) {
      case 0: return node(Type::Float, pick(std::vector<std::string>{"tanh($)", "sigmoid($)"}), {sub()});
      case 1: return node(Type::Float, pick(std::vector<std::string>{"sin(clamp($, -8.0, 8.0))", "cos(clamp($, -8.0, 8.0))"}), {sub()});
      case 2: return node(Type::Float, pick(std::vector<std::string>{"exp(clamp($, -4.0, 2.0))", "exp2(clamp($, -4.0, 2.0))"}), {sub()});
      case 3:
        return node(Type::Float, pick(std::vector<std::string>{"log1p(abs($))", "log(abs($) + 1.0)", "log2(abs($) + 0.5)", "sqrt(abs($) + 0.25)",
                                                                 "rsqrt(abs($) + 1.0)"}),
                    {sub()});
      case 4: return node(Type::Float, "($ / (abs($) + 1.0))", {sub(), sub()});
      case 5: return node(Type::Float, "($ + $)", {sub(), sub()});
      case 6: return node(Type::Float, "($ - $)", {sub(), sub()});
      case 7: return node(Type::Float, "($ * tanh($))", {sub(), sub()});
      case 8: return node(Type::Float, fmt::format("pow(abs($) + 0.5, {})", pick(std::vector<std::string>{"0.5", "2.0", "1.5"})), {sub()});
      case 9: return node(Type::Float, pick(std::vector<std::string>{"min($, $)", "max($, $)"}), {sub(), sub()});
      case 10: return node(Type::Float, "where($, $, $)", {gen_bool(depth - 1), sub(), sub()});
      default: return node(Type::Float, fmt::format("($ * {})", pick(std::vector<std::string>{"0.5", "-2.0", "0.1"})), {sub()});
    }
  }

  // A smooth value of magnitude at most 8, to be added to or multiplied into the score.
  GenExpr bounded_term(int depth) {
    switch (range(0, 3)) {
      case 0: return node(Type::Float, fmt::format("clamp($, -{0}, {0})", pick(std::vector<std::string>{"2.0", "4.0", "8.0"})), {gen_smooth(depth)}, true);
      case 1: return node(Type::Float, fmt::format("({} * tanh($))", pick(std::vector<std::string>{"0.5", "2.0", "4.0"})), {gen_smooth(depth)}, true);
      case 2: return node(Type::Float, "sigmoid($)", {gen_smooth(depth)}, true);
      default: return node(Type::Float, "(2.0 * sin(clamp($, -8.0, 8.0)))", {gen_smooth(depth)}, true);
    }
  }

  // score_mod: `score` through continuous operations (smooth ones when differentiated).
  GenExpr gen_score(int depth) {
    if (depth <= 0 || chance(0.15)) return leaf(Type::Float, "score");
    auto sub = [&] { return gen_score(depth - 1); };
    switch (range(0, kinks_ ? 11 : 8)) {
      case 0:
      case 1: return node(Type::Float, "($ + $)", {sub(), bounded_term(2)});
      case 2: return node(Type::Float, "($ - $)", {sub(), bounded_term(2)});
      case 3: return node(Type::Float, fmt::format("($ * {})", pick(std::vector<std::string>{"0.5", "2.0", "0.75", "1.25", "-1.0"})), {sub()});
      case 4: return node(Type::Float, "($ * (1.0 + $))", {sub(), bounded_term(1)});
      case 5: {
        const std::string cap = pick(std::vector<std::string>{"5.0", "10.0", "20.0"});
        return node(Type::Float, fmt::format("({0} * tanh($ / {0}))", cap), {sub()});
      }
      case 6:
      case 7: return node(Type::Float, "where($, $, $)", {gen_bool(2), sub(), sub()});
      case 8: return node(Type::Float, "(-$)", {sub()});
      case 9: return node(Type::Float, pick(std::vector<std::string>{"max($, $)", "min($, $)"}), {sub(), bounded_term(1)});
      default: return node(Type::Float, "abs($)", {sub()});
    }
  }

  // --- booleans: decided by exact values only ------------------------------------------------

  GenExpr compare(int depth) {
    static const std::vector<std::string> ops = {"<", "<=", ">", ">=", "==", "!="};
    const std::string op = pick(ops);
    if (chance(0.75)) return node(Type::Bool, "($ " + op + " $)", {gen_int(depth), gen_int(depth)});
    return node(Type::Bool, "($ " + op + " $)", {gen_exact(depth), gen_exact(depth)});
  }

  GenExpr gen_bool(int depth) {
    if (depth <= 0 || chance(0.3)) {
      const int64_t k = range(0, 5);
      if (k <= 1)
        if (auto e = declared(Type::Bool, k == 0, depth)) return *e;
      if (k <= 2) return leaf(Type::Bool, chance(0.5) ? "true" : "false");
      return compare(std::max(depth - 1, 0));
    }
    auto sub = [&] { return gen_bool(depth - 1); };
    switch (range(0, 9)) {
      case 0: return node(Type::Bool, pick(std::vector<std::string>{"($ && $)", "($ and $)", "($ & $)"}), {sub(), sub()});
      case 1: return node(Type::Bool, pick(std::vector<std::string>{"($ || $)", "($ or $)", "($ | $)"}), {sub(), sub()});
      case 2: return node(Type::Bool, pick(std::vector<std::string>{"(!$)", "(not $)"}), {sub()});
      case 3: return node(Type::Bool, pick(std::vector<std::string>{"($ ^ $)", "($ == $)", "($ != $)"}), {sub(), sub()});
      case 4: return node(Type::Bool, "where($, $, $)", {sub(), sub(), sub()});
      case 5: return node(Type::Bool, "($ ? $ : $)", {sub(), sub(), sub()});
      default: return compare(depth - 1);
    }
  }

  // mask_mod: a familiar block, combined with random conditions, sometimes emptying whole rows.
  GenExpr gen_mask() {
    std::vector<GenExpr> blocks;
    auto window = [&] {
      auto p = params_of("int");
      return p.empty() || chance(0.5) ? std::to_string(range(1, 40)) : pick(p);
    };
    switch (range(0, 5)) {
      case 0:
      case 4: blocks.push_back(leaf(Type::Bool, "(q >= kv)")); break;
      case 1: blocks.push_back(leaf(Type::Bool, fmt::format("(q >= kv && q - kv < {})", window()))); break;
      case 2: blocks.push_back(leaf(Type::Bool, fmt::format("(kv < {} || q >= kv)", window()))); break;
      case 3: blocks.push_back(leaf(Type::Bool, fmt::format("(q // {0} == kv // {0})", range(1, 70)))); break;
      default: break;
    }
    if (blocks.empty() || chance(0.5)) blocks.push_back(gen_bool(3));
    GenExpr m = blocks.size() == 1 ? blocks[0] : node(Type::Bool, chance(0.4) ? "($ && $)" : "($ || $)", {blocks[0], blocks[1]});
    if (chance(0.25)) {
      // Rows without a single key: every q below a bound, or every q of a residue class.
      GenExpr empties = chance(0.5) ? leaf(Type::Bool, fmt::format("(q >= {})", range(1, 40)))
                                    : leaf(Type::Bool, fmt::format("(q % {} != {})", range(2, 5), range(0, 1)));
      m = node(Type::Bool, "($ && $)", {m, empties});
    }
    return m;
  }

  std::mt19937_64 rng_;
  GenOptions opt_;
  GenCase c_;
  std::vector<BufferInfo> buffers_;
  std::vector<std::pair<std::string, std::string>> params_;  // name, type
  bool uses_n_ = false;
  bool kinks_ = false;
};

}  // namespace

GenCase generate_case(uint64_t seed, const GenOptions& options) { return Generator(seed, options).run(); }

}  // namespace flexjit::fuzz
