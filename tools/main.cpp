// The flexjit command-line tool: subcommand registration and the exit-code policy
// (0 success, 1 user error with diagnostics on stderr, 2 internal error).
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "dsl/compile_error.h"
#include "tools/commands.h"
#include "tools/spec_options.h"

#ifdef FLEXJIT_HAVE_CPU_BACKEND
#include "runtime/cpu/cpu_backend.h"
#endif

int main(int argc, char** argv) {
  using namespace flexjit::tools;
  CLI::App app{"flexjit: JIT-compiled attention with score_mod / mask_mod written as expressions"};
  app.require_subcommand(1);
  app.fallthrough();
  app.add_option("--diagnostics", diagnostics_format(), "How errors are printed: text or json")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();
  Action action;
  add_check_command(app, action);
  add_dump_command(app, action);
  add_eval_command(app, action);
  add_compile_command(app, action);
  add_cache_command(app, action);
  add_run_command(app, action);
  add_bench_command(app, action);
  add_bench_backward_command(app, action);
  add_random_command(app, action);
  add_devices_command(app, action);
  add_viz_command(app, action);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);
    return code == 0 ? 0 : 1;
  }
  try {
#ifdef FLEXJIT_HAVE_CPU_BACKEND
    flexjit::cpu::install();
#endif
    return action ? action() : 0;
  } catch (const flexjit::CompileError& e) {
    if (diagnostics_format() == "json") std::cerr << e.diagnostics().render_json() << "\n";
    else std::cerr << e.diagnostics().render_text();
    return 1;
  } catch (const flexjit::Error& e) {
    if (diagnostics_format() == "json") std::cerr << fmt::format("[{{\"severity\": \"error\", \"message\": {}}}]\n", nlohmann::json(e.what()).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
    else std::cerr << "error: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "internal error: " << e.what() << "\nThis is a bug in flexjit; please report it with the command line.\n";
    return 2;
  }
}
