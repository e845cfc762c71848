// `flexjit eval SPEC --at b=0,h=1,q=5,kv=3,score=0.5`: evaluate the mods at one point with
// the reference interpreter (the oracle every back end is tested against).
#include <fmt/format.h>

#include <map>

#include "compiler/bindings.h"
#include "compiler/frontend.h"
#include "compiler/interpreter.h"
#include "tools/commands.h"
#include "tools/mod_inputs.h"
#include "tools/spec_options.h"

namespace flexjit::tools {

namespace {

struct EvalOptions {
  SpecOptions spec;
  std::string at;
  std::vector<std::string> sets, loads;
};

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

  ModInputs inputs = read_mod_inputs(spec, o.sets, o.loads);
  BoundValues bound = bind_values(cs, inputs.values, inputs.buffer_shapes, /*require_all=*/false);
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
  require_mod_inputs(ir, bound, inputs);
  env.buffers = inputs.buffer_views();

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
