// `flexjit eval SPEC --at b=0,h=1,q=5,kv=3,score=0.5`: evaluate the mods at one point with
// the reference interpreter (the oracle every back end is tested against).
#include <fmt/format.h>

#include <map>

#include "compiler/bindings.h"
#include "compiler/frontend.h"
#include "compiler/interpreter.h"
#include "compiler/ir/ir_mutator.h"
#include "runtime/npy.h"
#include "tools/commands.h"
#include "tools/spec_options.h"

namespace flexjit::tools {

namespace {

struct EvalOptions {
  SpecOptions spec;
  std::string at;
  std::vector<std::string> sets, loads;
};

std::pair<std::string, std::string> split_assignment(const std::string& s, const char* flag) {
  size_t eq = s.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == s.size())
    throw Error(fmt::format("{} expects NAME=VALUE, but got '{}'", flag, s));
  return {s.substr(0, eq), s.substr(eq + 1)};
}

int run_eval(const EvalOptions& o) {
  dsl::Spec spec = o.spec.load();
  SpecIR ir = build_spec_ir(spec);
  const dsl::CheckedSpec& cs = ir.checked;

  // --at b=0,h=1,q=5,kv=3[,score=0.5][,kv_head=0]
  std::map<std::string, std::string> point;
  size_t start = 0;
  while (start < o.at.size()) {
    size_t comma = o.at.find(',', start);
    std::string item = o.at.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    auto [k, v] = split_assignment(item, "--at");
    auto var = dsl::lookup_variable(k);
    if (!var) throw Error(fmt::format("--at: unknown variable `{}`; use b, h, q, kv, kv_head and score", k));
    point[dsl::var_name(*var)] = v;
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  EvalEnv env;
  for (const char* name : {"b", "h", "q", "kv"}) {
    auto it = point.find(name);
    if (it == point.end()) throw Error(fmt::format("--at needs a value for `{}` (e.g. --at b=0,h=1,q=5,kv=3)", name));
    char* end = nullptr;
    long long x = std::strtoll(it->second.c_str(), &end, 10);
    if (*end != '\0' || end == it->second.c_str()) throw Error(fmt::format("--at: `{}` must be an int, got '{}'", name, it->second));
    env.vars[static_cast<int>(*dsl::lookup_variable(name))] = x;
  }
  if (point.count("score")) {
    char* end = nullptr;
    env.score = std::strtof(point["score"].c_str(), &end);
    if (*end != '\0') throw Error(fmt::format("--at: score must be a number, got '{}'", point["score"]));
  } else if (ir.score_mod) {
    throw Error("this spec has a score_mod: give the score too, e.g. --at b=0,h=0,q=5,kv=3,score=0.5");
  }

  std::map<std::string, std::string> values;
  for (const std::string& s : o.sets) {
    auto [k, v] = split_assignment(s, "--set");
    values[k] = v;
  }
  std::vector<NpyArray> arrays(spec.buffers.size());
  std::vector<std::optional<std::vector<int64_t>>> shapes(spec.buffers.size());
  for (const std::string& l : o.loads) {
    auto [name, path] = split_assignment(l, "--load");
    int bi = -1;
    for (size_t i = 0; i < spec.buffers.size(); ++i)
      if (spec.buffers[i].name == name) bi = static_cast<int>(i);
    if (bi < 0) throw Error(fmt::format("--load names `{}`, which is not a declared buffer", name));
    arrays[bi] = read_npy(path);
    const dsl::BufferDecl& decl = spec.buffers[bi];
    if (arrays[bi].dtype != decl.dtype)
      throw Error(fmt::format("buffer `{}` is declared {} but '{}' holds {}", name, decl.str(), path, dsl::dtype_name(arrays[bi].dtype)));
    shapes[bi] = arrays[bi].shape;
  }
  BoundValues bound = bind_values(cs, values, shapes, /*require_all=*/false);
  env.symbols = bound.symbols;
  env.params = bound.params;
  // kv_head: given, or h / (H / Hkv) when both are known, else h.
  int64_t h = env.vars[static_cast<int>(dsl::VarId::H)];
  int64_t kvh = h;
  int hi = cs.symbol_index("H"), hkvi = cs.symbol_index("Hkv");
  if (bound.symbol_bound[hi] && bound.symbol_bound[hkvi] && bound.symbols[hkvi] > 0 && bound.symbols[hi] % bound.symbols[hkvi] == 0)
    kvh = h / (bound.symbols[hi] / bound.symbols[hkvi]);
  if (point.count("kv_head")) kvh = std::strtoll(point["kv_head"].c_str(), nullptr, 10);
  env.vars[static_cast<int>(dsl::VarId::KvHead)] = kvh;

  // Every symbol, parameter and buffer the mods use must have a value.
  std::vector<ir::Expr> roots;
  if (ir.score_mod) roots.push_back(ir.score_mod);
  if (ir.mask_mod) roots.push_back(ir.mask_mod);
  ir::for_each_node(roots, [&](const ir::Expr& e) {
    if (const ir::Symbol* s = e.as<ir::Symbol>())
      if (!bound.symbol_bound[s->index])
        throw Error(fmt::format("the spec uses shape symbol `{}`: give it with --set {}=N or load a buffer that has it", s->name, s->name));
    if (const ir::Param* p = e.as<ir::Param>())
      if (!values.count(p->name) && !spec.params[p->index].has_value)
        throw Error(fmt::format("the spec uses runtime parameter `{}`: give it with --set {}=VALUE", p->name, p->name));
    if (const ir::Load* l = e.as<ir::Load>())
      if (!shapes[l->buffer]) throw Error(fmt::format("the spec loads buffer `{}`: give its data with --load {}=FILE.npy", l->name, l->name));
  });
  env.buffers.resize(spec.buffers.size());
  for (size_t i = 0; i < spec.buffers.size(); ++i)
    if (shapes[i]) env.buffers[i] = BufferView{arrays[i].dtype, arrays[i].data.data(), arrays[i].shape, contiguous_strides(arrays[i].shape)};

  EvalFlags flags;
  if (ir.mask_mod) fmt::print("mask_mod: {}\n", evaluate(ir.mask_mod, env, &flags).str());
  if (ir.score_mod) fmt::print("score_mod: {}\n", evaluate(ir.score_mod, env, &flags).str());
  if (flags.index_out_of_range || flags.int_div_by_zero) {
    fmt::print(stderr, "error: {}\n", flags.first_error.empty() ? "a checked operation failed" : flags.first_error);
    return 1;
  }
  return 0;
}

}  // namespace

void add_eval_command(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand("eval", "Evaluate score_mod / mask_mod at one point with the reference interpreter");
  auto o = std::make_shared<EvalOptions>();
  o->spec.add_to(cmd);
  cmd->add_option("--at", o->at, "The point: b=0,h=1,q=5,kv=3[,score=0.5][,kv_head=0]")->required();
  cmd->add_option("--set", o->sets, "A runtime parameter or shape symbol: NAME=VALUE (repeatable)");
  cmd->add_option("--load", o->loads, "A captured buffer's data: NAME=FILE.npy (repeatable)");
  cmd->callback([o, &action] { action = [o] { return run_eval(*o); }; });
}

}  // namespace flexjit::tools
