#include "compiler/codegen/kernel_source.h"

#include <fmt/format.h>

#include "compiler/codegen/codegen_cuda_interval.h"
#include "compiler/codegen/staged_rows_source.h"
#include "compiler/codegen/staged_terms.h"
#include "compiler/ir/ir_printer.h"

namespace flexjit {

std::string canonical_ir_text(const SpecIR& ir) {
  std::string s;
  for (const dsl::BufferDecl& b : ir.spec().buffers) s += "buffer " + b.str() + "\n";
  for (const dsl::ParamDecl& p : ir.spec().params) s += "param " + p.str() + "\n";
  s += "symbols";
  for (const std::string& sym : ir.checked.symbols) s += " " + sym;
  s += "\nscore_mod:\n" + (ir.score_mod ? ir::print_ir(ir.score_mod) : std::string("none\n"));
  s += "mask_mod:\n" + (ir.mask_mod ? ir::print_ir(ir.mask_mod) : std::string("none\n"));
  return s;
}

namespace {

// The traits alias, the kernel entry and its body for the configuration: the Hopper main loop or the mma.sync
// one. For the Hopper loop the host's shared-memory figure is checked against the template's at compile time.
std::string forward_entry(const ForwardConfig& c, const char* element, const char* entry, const std::string& template_args) {
  std::string traits, body;
  if (c.hopper) {
    traits = fmt::format("using FlexTraits = FlexForwardTraitsSm90</*kHeadDim=*/{}, {}{}{}{}{}>;\n"
                         "static_assert(FlexTraits::kSmemBytes == {}, \"host and template disagree on the forward's shared memory\");\n",
                         c.head_dim, element, c.col_gemm_parts || c.block_m != 128 ? fmt::format(", /*kColGemmParts=*/{}", c.col_gemm_parts) : "",
                         c.block_m != 128 ? fmt::format(", /*kBlockM=*/{}", c.block_m) : "",
                         c.tma || c.staged_kv_cols ? fmt::format(", /*kTma=*/{}", c.tma) : "",
                         c.staged_kv_cols ? ", /*kStagedKvCols=*/true" : "", c.shared_bytes());
    body = fmt::format("  flex_forward_sm90<FlexTraits, FlexVariant{}>(p, vp{});\n", template_args, c.tma ? ", &tma" : "");
  } else {
    traits = fmt::format("using FlexTraits = FlexForwardTraits</*kHeadDim=*/{}, /*kBlockM=*/{}, /*kBlockN=*/{}, /*kNWarps=*/{}, {}>;\n",
                         c.head_dim, c.block_m, c.block_n, c.warps, element);
    body = fmt::format("  flex_forward<FlexTraits, FlexVariant{}>(p, vp);\n", template_args);
  }
  // The tensor maps must stay in parameter space (the TMA unit reads them there): hence __grid_constant__.
  return fmt::format("{}\nextern \"C\" __global__ void __launch_bounds__(FlexTraits::kNThreads, {})\n"
                     "{}(const FlexForwardParams p, const FlexVariant::Params vp{}) {{\n{}}}\n",
                     traits, c.hopper ? "FlexTraits::kMinBlocksPerSM" : "1", entry,
                     c.tma ? ", const __grid_constant__ FlexForwardTmaMaps tma" : "", body);
}

// A forward module: the variant, the kernel entry and, for the dense kernel of a masked spec, the block-mask
// builder (one compile, one cache entry).
KernelSource forward_module(const SpecIR& ir, const RangeInfo& ranges, const ForwardKernelOptions& options, bool varlen) {
  KernelSource ks;
  ks.config = forward_config(options.head_dim, options.arch, !varlen && mask_is_data_dependent(ir));
  ks.config.tma = options.tma && ks.config.hopper && ks.config.block_m == 64 && ks.config.head_dim > 64;
  VariantOptions vo = options.variant;
  vo.tile_size = ks.config.block_n;
  // Staged mask columns in the 64-row Hopper loop at head dims 96 and 128 (its K/V ring): documents D128 0.173 ->
  // 0.170 ms on the H100; at 32 and 64 no gain (D32 2-5% slower).
  vo.stage_kv_cols = ks.config.hopper && ks.config.block_m == 64 && ks.config.head_dim > 64;
  // The column GEMM (Hopper loop, dense kernel): the term leaves score_mod and the S GEMM adds it. Only up to head
  // dim 64, where the registers it frees give two CTAs per SM: at one CTA per SM its wgmmas lengthen each tile's
  // S chain more than the adds they replace (H100, SAM forward: D64 2.02 -> 1.62 ms, D32 1.75 -> 1.62, but D96
  // 1.55 -> 2.14 and D128 1.74 -> 2.30; docs/KERNEL_NOTES.md).
  ForwardColGemm col_gemm;
  if (options.col_gemm_parts && ks.config.hopper && ks.config.block_m == 128 && ks.config.head_dim <= 64 && !varlen && ks.config.block_n == kStagedTermTile)
    col_gemm = find_forward_col_gemm(ir, ranges, vo);
  ks.config.col_gemm_parts = col_gemm.term ? options.col_gemm_parts : 0;
  if (col_gemm.term) {
    SpecIR rest = ir;
    rest.score_mod = col_gemm.score_mod;
    ks.variant = generate_cuda_variant(rest, ranges, vo, "FlexVariant");
    const std::string close = "};\n";
    ks.variant.code.resize(ks.variant.code.size() - close.size());  // reopen the struct
    ks.variant.code += fmt::format(
        "  // Column GEMM (flex_forward_sm90.cuh): {} is left out of score_mod above; the S GEMM adds it.\n"
        "  static constexpr bool kColGemm = true;\n",
        ir::print_inline(col_gemm.term->load));
    ks.variant.code += staged_rows_function(ir, ranges, vo, *col_gemm.term, "col_gemm_rows") + close;
  } else {
    ks.variant = generate_cuda_variant(ir, ranges, vo, "FlexVariant");
  }
  ks.config.staged_kv_cols = ks.variant.kv_col_values > 0;
  const char* element = cuda_element_type(options.dtype);
  ks.name = fmt::format("{}_fwd{}_{}_{}", ir.spec().name, varlen ? "_varlen" : "", dsl::dtype_name(options.dtype), ks.config.str());
  ks.entries = {varlen ? kForwardVarlenEntry : kForwardEntry};
  std::string block_mask;
  std::string template_args = varlen ? ", /*kVarlen=*/true" : "";
  if (ir.mask_mod && !varlen) {
    ks.entries.push_back(kBlockMaskEntry);
    if (mask_is_interval_classifiable(ir)) {
      block_mask = generate_cuda_interval_classifier(ir, "FlexVariant", "FlexMaskBox") +
                   fmt::format("\nextern \"C\" __global__ void __launch_bounds__(flex_blockmask::kThreads)\n"
                               "{}(const FlexBlockMaskBuildParams p, const FlexVariant::Params vp) {{\n"
                               "  flex_build_block_mask_interval<FlexVariant, FlexMaskBox>(p, vp);\n}}\n",
                               kBlockMaskEntry);
    } else {
      // Data-dependent masks (built by the dense path) give query tiles irregular amounts of work: the builder
      // ranks each row's query tiles by their tile counts and the kernel takes them heaviest first
      // (flex::ranked_work).
      template_args = ", /*kVarlen=*/false, /*kRankTiles=*/true";
      ks.entries.push_back(kRankEntry);
      block_mask = fmt::format("\nextern \"C\" __global__ void __launch_bounds__(flex_blockmask::kThreads)\n"
                               "{}(const FlexBlockMaskBuildParams p, const FlexVariant::Params vp) {{\n"
                               "  flex_build_block_mask_dense<FlexVariant>(p, vp);\n}}\n"
                               "\nextern \"C\" __global__ void __launch_bounds__(flex_blockmask::kThreads)\n"
                               "{}(const FlexBlockMaskBuildParams p) {{\n"
                               "  flex_rank_q_tiles(p);\n}}\n",
                               kBlockMaskEntry, kRankEntry);
    }
  }
  ks.source = fmt::format(
      "// flexjit {} kernel for spec `{}`: {} x {} tiles, {} warps, head dim {}, {}{}.\n"
      "#include \"{}\"\n"
      "#include \"flex_ops.cuh\"\n"
      "{}\n"
      "{}\n"
      "{}{}",
      varlen ? "ragged-prefill forward" : "forward", ir.spec().name, ks.config.block_m, ks.config.block_n, ks.config.warps,
      options.head_dim, element, ks.config.hopper ? ", Hopper main loop" : "",
      ks.config.hopper ? "flex_forward_sm90.cuh" : "flex_forward.cuh", !block_mask.empty() ? "#include \"flex_blockmask.cuh\"\n" : "",
      ks.variant.code, forward_entry(ks.config, element, ks.entries[0].c_str(), template_args), block_mask);
  ks.key_text = fmt::format("kind={}\ndtype={}\nconfig={}\nint32={}\nchecked_loads={:x}\nerror_flags={}\nhoist={}\nfast_tanh={}\n",
                            varlen ? "forward_varlen" : "forward", dsl::dtype_name(options.dtype), ks.config.str(), vo.int32,
                            vo.checked_loads, vo.error_flags, vo.hoist, vo.fast_tanh);
  return ks;
}

}  // namespace

KernelSource forward_kernel_source(const SpecIR& ir, const RangeInfo& ranges, const ForwardKernelOptions& options) {
  return forward_module(ir, ranges, options, /*varlen=*/false);
}

KernelSource forward_varlen_kernel_source(const SpecIR& ir, const RangeInfo& ranges, const ForwardKernelOptions& options) {
  return forward_module(ir, ranges, options, /*varlen=*/true);
}

std::vector<KernelSource> kernels_for_launch(const SpecIR& ir, dsl::DType dtype, int head_dim, const std::string& arch) {
  ForwardKernelOptions fo;
  fo.dtype = dtype;
  fo.head_dim = head_dim;
  fo.arch = arch;
  fo.col_gemm_parts = col_gemm_parts_for_scale(default_softmax_scale(head_dim));  // what a launch with the default scale takes
  std::vector<ir::Expr> roots;
  if (ir.score_mod) roots.push_back(ir.score_mod);
  if (ir.mask_mod) roots.push_back(ir.mask_mod);
  RangeInfo ranges = analyze_ranges(roots, ir.checked, VarDomains::forward(ir.checked));
  return {forward_kernel_source(ir, ranges, fo)};
}

}  // namespace flexjit
