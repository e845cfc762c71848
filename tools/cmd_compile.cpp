// `flexjit compile SPEC --arch sm_90a`: fill the disk cache with the kernels a launch of the
// spec needs, without a GPU (to warm a server's cache at build time).
#include <fmt/format.h>

#include "compiler/codegen/kernel_source.h"
#include "compiler/frontend.h"
#include "compiler/ir_report.h"
#include "runtime/kernel_compiler.h"
#include "compiler/codegen/kernel_source.h"
#include "tools/commands.h"
#include "tools/spec_options.h"

namespace flexjit::tools {

namespace {

struct CompileOptions {
  SpecOptions spec;
  std::vector<std::string> archs;
};

int run_compile(const CompileOptions& o) {
  dsl::Spec spec = o.spec.load();
  SpecIR ir = build_spec_ir(spec);
  for (const std::string& arch : o.archs) {
    for (const KernelSource& ks : kernels_for_launch(ir, spec.dtype, spec.head_dim, arch)) {
      runtime::CacheLookup r = runtime::compile_kernel(ks, canonical_ir_text(ir), arch);
      fmt::print("{} {} {}: {} ({:.2f} s)\n", arch, ks.name, fmt::join(ks.entries, ","), runtime::cache_source_name(r.source), r.seconds);
    }
  }
  return 0;
}

}  // namespace

void add_compile_command(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand("compile", "Compile every kernel a launch of the spec needs into the disk cache (no GPU needed)");
  auto o = std::make_shared<CompileOptions>();
  o->spec.add_to(cmd);
  cmd->add_option("--arch", o->archs, "Target architecture(s): sm_80, sm_86, sm_89, sm_90a, ... (repeatable)")->required();
  cmd->callback([o, &action] { action = [o] { return run_compile(*o); }; });
}

}  // namespace flexjit::tools
