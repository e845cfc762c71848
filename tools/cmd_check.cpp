// `flexjit check SPEC`: parse and type-check a spec, reporting every error.
#include <fmt/format.h>

#include "compiler/frontend.h"
#include "tools/commands.h"
#include "tools/spec_options.h"

namespace flexjit::tools {

void add_check_command(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand("check", "Parse and check a spec; prints every error with its position");
  auto opts = std::make_shared<SpecOptions>();
  opts->add_to(cmd);
  cmd->callback([opts, &action] {
    action = [opts] {
      dsl::Spec spec = opts->load();
      SpecIR ir = build_spec_ir(spec);
      fmt::print("ok: {}{}{}\n", spec.name, ir.score_mod ? " (score_mod)" : "", ir.mask_mod ? " (mask_mod)" : "");
      return 0;
    };
  });
}

}  // namespace flexjit::tools
