// `flexjit compile SPEC --arch sm_90a [--decode H,Hkv[,Sq] [--kv-dtype fp8]]`: fill the disk cache with the
// kernels a launch of the spec needs, without a GPU (to warm a server's cache at build time).
#include <fmt/format.h>

#include "compiler/codegen/decode_source.h"
#include "compiler/codegen/kernel_config.h"
#include "compiler/codegen/kernel_source.h"
#include "compiler/frontend.h"
#include "compiler/ir_report.h"
#include "runtime/kernel_compiler.h"
#include "tools/commands.h"
#include "tools/spec_options.h"

namespace flexjit::tools {

namespace {

struct CompileOptions {
  SpecOptions spec;
  std::vector<std::string> archs;
  std::vector<int> decode;  // H, Hkv[, Sq]: also the decode module a plan of these heads compiles
  std::string kv_dtype;     // with --decode: the plan's KV cache type (empty: the spec's dtype)
};

// The decode module Kernel::plan_decode compiles for these heads (the plain variant, checked mode).
KernelSource decode_module_source(const SpecIR& ir, const std::vector<int>& heads, const std::string& kv_dtype) {
  if (heads.size() < 2 || heads.size() > 3 || heads[0] < 1 || heads[1] < 1 || heads[0] % heads[1] != 0)
    throw Error(fmt::format("--decode expects H,Hkv[,Sq] with Hkv dividing H, got {}", fmt::join(heads, ",")));
  const int sq = heads.size() == 3 ? heads[2] : 1;
  if (sq < 1 || sq > 16) throw Error(fmt::format("--decode: Sq (query rows per sequence) must be in 1..16, got {}", sq));
  DecodeKernelOptions o;
  o.dtype = ir.spec().dtype;
  std::optional<dsl::DType> fp8;
  if (!kv_dtype.empty()) {
    std::optional<dsl::DType> t = dsl::parse_kv_cache_dtype(kv_dtype);
    if (!t || (dsl::dtype_size(*t) != 1 && *t != ir.spec().dtype))
      throw Error(fmt::format("--kv-dtype `{}` is not a KV cache type of a {} spec; use {}, fp8 (e4m3) or e5m2", kv_dtype,
                              dsl::dtype_name(ir.spec().dtype), dsl::dtype_name(ir.spec().dtype)));
    if (dsl::dtype_size(*t) == 1) fp8 = t;
  }
  o.config = decode_config(ir.spec().head_dim, heads[0] / heads[1] * sq, fp8);
  return decode_kernel_source(ir, analyze_decode_ranges(ir), o);
}

int run_compile(const CompileOptions& o) {
  dsl::Spec spec = o.spec.load();
  SpecIR ir = build_spec_ir(spec);
  for (const std::string& arch : o.archs) {
    std::vector<KernelSource> sources = kernels_for_launch(ir, spec.dtype, spec.head_dim, arch);
    if (!o.decode.empty()) sources.push_back(decode_module_source(ir, o.decode, o.kv_dtype));
    for (const KernelSource& ks : sources) {
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
  cmd->add_option("--decode", o->decode, "Also the decode module of plans with H query heads, Hkv KV heads and Sq query rows: H,Hkv[,Sq]")
      ->delimiter(',');
  cmd->add_option("--kv-dtype", o->kv_dtype, "With --decode: the plan's KV cache type, fp8 (= e4m3) or e5m2 (default: the spec's dtype)");
  cmd->callback([o, &action] { action = [o] { return run_compile(*o); }; });
}

}  // namespace flexjit::tools
