// The subcommands of the flexjit CLI; each registers itself on the app in its own file.
#pragma once
#include <CLI/CLI.hpp>
#include <functional>

namespace flexjit::tools {

// Each returns nothing; the subcommand's callback sets `action`, which main runs after
// parsing so that errors are reported with the right exit code.
using Action = std::function<int()>;
void add_check_command(CLI::App& app, Action& action);
void add_dump_command(CLI::App& app, Action& action);
void add_eval_command(CLI::App& app, Action& action);
void add_compile_command(CLI::App& app, Action& action);
void add_cache_command(CLI::App& app, Action& action);
void add_run_command(CLI::App& app, Action& action);
void add_bench_command(CLI::App& app, Action& action);
void add_bench_backward_command(CLI::App& app, Action& action);
void add_random_command(CLI::App& app, Action& action);
void add_devices_command(CLI::App& app, Action& action);
void add_viz_command(CLI::App& app, Action& action);

}  // namespace flexjit::tools
