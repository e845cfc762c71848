// `flexjit dump SPEC --emit=ast|ir|cuda|ptx [--backward]`: show what a spec becomes at each stage.
#include <fmt/format.h>

#include "compiler/codegen/backward_source.h"
#include "compiler/codegen/codegen_cuda_grad.h"
#include "compiler/codegen/kernel_source.h"
#include "compiler/frontend.h"
#include "compiler/ir_report.h"
#include "compiler/ir/ir_printer.h"
#include "compiler/passes/autodiff.h"
#include "compiler/passes/pipeline.h"
#include "compiler/passes/row_constant_scatters.h"
#include "compiler/passes/range_analysis.h"
#include "dsl/ast.h"
#include "runtime/nvrtc.h"
#include "tools/commands.h"
#include "tools/spec_options.h"

namespace flexjit::tools {

namespace {

struct DumpOptions {
  SpecOptions spec;
  std::string emit = "cuda";
  std::string dump_after;
  std::string arch = "sm_90a";
  bool backward = false;
  std::string dq = "auto";
  bool deterministic = false;
  bool no_tma = false;
  bool shard = false;
  bool ragged = false;
  bool varlen = false;
};

// The backward module a launch of the spec compiles (with the gradients the spec marks), as the runtime builds it:
// dQ by the query-major pass when `dq` says so, or, for auto, when a scatter only that pass reduces (SAM's rel_h)
// is not staged by the Hopper kernel. A shard's or a ragged batch's module has no query-major pass (the runtime takes dQ
// by atomics).
KernelSource backward_module(const SpecIR& ir, const DumpOptions& o) {
  ScoreModGradient grad = differentiate_score_mod(ir);
  drop_row_constant_scatters(grad);
  RangeInfo ranges = analyze_ranges(backward_roots(grad), ir.checked, VarDomains::forward(ir.checked));
  BackwardKernelOptions bo;
  bo.dtype = ir.spec().dtype;
  bo.head_dim = ir.spec().head_dim;
  bo.deterministic = o.deterministic;
  bo.arch = o.arch;
  bo.tma_operands = !o.no_tma;
  bo.shard_positions = o.shard;
  bo.ragged = o.ragged;
  if (o.shard && o.ragged) throw Error("--shard and --ragged are different launches; give one");
  if ((o.shard || o.ragged) && o.dq == "qmajor")
    throw Error("--shard and --ragged go with --dq atomic or auto: their modules have no query-major pass");
  bo.query_major = !o.shard && !o.ragged && (o.dq == "qmajor" || (o.dq == "auto" && auto_picks_query_major(grad, ranges, bo)));
  return backward_kernel_source(ir, grad, ranges, bo).module;
}

int run_dump(const DumpOptions& o) {
  dsl::Spec spec = o.spec.load();
  if (o.emit == "ast") {
    dsl::Diagnostics diags;
    auto checked = dsl::check_spec(spec, diags);
    if (!checked) throw CompileError(std::move(diags));
    if (checked->score_mod) fmt::print("# score_mod\n{}", dsl::print_ast(*checked->score_mod->ast));
    if (checked->mask_mod) fmt::print("# mask_mod\n{}", dsl::print_ast(*checked->mask_mod->ast));
    return 0;
  }
  if (!o.dump_after.empty() && o.emit != "ir") throw Error("--dump-after goes with --emit=ir");
  if (o.backward && o.emit != "cuda" && o.emit != "ptx") throw Error("--backward goes with --emit=cuda or --emit=ptx");
  if (!o.dump_after.empty()) {
    const auto& names = pass_names();
    if (std::find(names.begin(), names.end(), o.dump_after) == names.end())
      throw Error(fmt::format("unknown pass '{}' for --dump-after; passes: {}", o.dump_after, fmt::join(names, ", ")));
  }
  bool dumped = false;
  SpecIR ir = build_spec_ir(spec, [&](const std::string& pass, const SpecIR& state) {
    if (pass != o.dump_after) return;
    fmt::print("# after pass `{}`\n{}", pass, ir_report(state, /*with_analyses=*/false));
    dumped = true;
  });
  if (o.emit == "ir") {
    if (!dumped) fmt::print("{}", ir_report(ir, /*with_analyses=*/true));
    return 0;
  }
  if (o.emit == "grad") {
    ScoreModGradient g = differentiate_score_mod(ir);
    fmt::print("# d score_mod / d score\n{}", ir::print_ir(g.d_score));
    for (const GradScatter& sc : g.scatters) {
      std::vector<std::string> idx;
      for (const ir::Expr& i : sc.indices) idx.push_back(ir::print_inline(i));
      fmt::print("# grad_{}[{}] += dS * coefficient\n{}", spec.buffers[sc.buffer].name, fmt::join(idx, ", "), ir::print_ir(sc.coefficient));
    }
    if (g.scatters.empty()) fmt::print("# no buffer requires a gradient (mark one with --grad NAME or \"grad\" in the spec)\n");
    return 0;
  }
  KernelSource ks;
  if (o.backward) {
    ks = backward_module(ir, o);
  } else {
    ForwardKernelOptions fo;
    fo.dtype = spec.dtype;
    fo.head_dim = spec.head_dim;
    fo.arch = o.arch;
    fo.tma_describable = !o.no_tma;
    fo.shard_positions = o.shard;
    ks = o.varlen ? forward_varlen_kernel_source(ir, analyze_ir_ranges(ir), fo) : forward_kernel_source(ir, analyze_ir_ranges(ir), fo);
  }
  if (o.emit == "cuda") {
    fmt::print("{}", ks.source);
    return 0;
  }
  runtime::NvrtcRequest req;
  req.source = ks.source;
  req.program_name = ks.name + ".cu";
  req.arch = o.arch;
  req.want_ptx = true;
  runtime::NvrtcOutput out = runtime::NvrtcCompiler().compile(req);
  fmt::print("{}", out.ptx);
  return 0;
}

}  // namespace

void add_dump_command(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand("dump", "Print a spec's AST, IR (with dependence and range facts), generated CUDA or PTX");
  auto o = std::make_shared<DumpOptions>();
  o->spec.add_to(cmd);
  cmd->add_option("--emit", o->emit, "What to print: ast, ir, grad (score_mod derivatives), cuda or ptx")->check(CLI::IsMember({"ast", "ir", "grad", "cuda", "ptx"}))->capture_default_str();
  cmd->add_option("--dump-after", o->dump_after, "With --emit=ir: print the IR right after this pass (lower, fold, simplify, cse)");
  cmd->add_option("--arch", o->arch, "With --emit=cuda or ptx: target architecture, e.g. sm_80, sm_90a (the Hopper main loop)")->capture_default_str();
  cmd->add_flag("--backward", o->backward, "With --emit=cuda or ptx: the backward module (gradients of the buffers marked with --grad)");
  cmd->add_option("--dq", o->dq, "With --backward: dQ strategy of the module, atomic, qmajor or auto (as a launch picks it)")
      ->check(CLI::IsMember({"auto", "atomic", "qmajor"}))
      ->capture_default_str();
  cmd->add_flag("--deterministic", o->deterministic, "With --backward: the deterministic (fixed-point) module");
  cmd->add_flag("--no-tma", o->no_tma,
                "With --emit=cuda or ptx: the module a launch compiles when TMA cannot describe its q, k, v (or d_o) strides "
                "(sm_90a: no tensor maps, and a backward that is not warp-specialised)");
  cmd->add_flag("--shard", o->shard,
                "With --emit=cuda or ptx: the module of a launch that is a shard of a longer sequence (q_offset / kv_offset: the "
                "mods see global positions)");
  cmd->add_flag("--varlen", o->varlen, "With --emit=cuda or ptx: the ragged-prefill forward module (Kernel::forward_varlen)");
  cmd->add_flag("--ragged", o->ragged,
                "With --backward: the module of a ragged batch's backward (Kernel::backward_varlen: each kernel on its sequence's rows)");
  cmd->callback([o, &action] { action = [o] { return run_dump(*o); }; });
}

}  // namespace flexjit::tools
