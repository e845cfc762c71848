#include "compiler/codegen/kernel_source.h"

#include <fmt/format.h>

#include "compiler/codegen/codegen_cuda_interval.h"
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

KernelSource forward_kernel_source(const SpecIR& ir, const RangeInfo& ranges, const ForwardKernelOptions& options) {
  KernelSource ks;
  ks.config = forward_config(options.head_dim);
  VariantOptions vo = options.variant;
  vo.tile_size = ks.config.block_n;
  ks.variant = generate_cuda_variant(ir, ranges, vo, "FlexVariant");
  const char* element = cuda_element_type(options.dtype);
  ks.name = fmt::format("{}_fwd_{}_{}", ir.spec().name, dsl::dtype_name(options.dtype), ks.config.str());
  ks.entries = {kForwardEntry};
  std::string block_mask;
  // Data-dependent masks (built by the dense path) give query tiles irregular amounts of work: the kernel
  // then ranks its CTAs by the block mask's tile counts, heaviest first (flex::schedule_cta).
  bool rank_tiles = false;
  if (ir.mask_mod) {
    ks.entries.push_back(kBlockMaskEntry);
    if (mask_is_interval_classifiable(ir)) {
      block_mask = generate_cuda_interval_classifier(ir, "FlexVariant", "FlexMaskBox") +
                   fmt::format("\nextern \"C\" __global__ void __launch_bounds__(flex_blockmask::kThreads)\n"
                               "{}(const FlexBlockMaskBuildParams p, const FlexVariant::Params vp) {{\n"
                               "  flex_build_block_mask_interval<FlexVariant, FlexMaskBox>(p, vp);\n}}\n",
                               kBlockMaskEntry);
    } else {
      rank_tiles = true;
      block_mask = fmt::format("\nextern \"C\" __global__ void __launch_bounds__(flex_blockmask::kThreads)\n"
                               "{}(const FlexBlockMaskBuildParams p, const FlexVariant::Params vp) {{\n"
                               "  flex_build_block_mask_dense<FlexVariant>(p, vp);\n}}\n",
                               kBlockMaskEntry);
    }
  }
  ks.source = fmt::format(
      "// flexjit forward kernel for spec `{}`: {} x {} tiles, {} warps, head dim {}, {}.\n"
      "#include \"flex_forward.cuh\"\n"
      "#include \"flex_ops.cuh\"\n"
      "{}\n"
      "{}\n"
      "using FlexTraits = FlexForwardTraits</*kHeadDim=*/{}, /*kBlockM=*/{}, /*kBlockN=*/{}, /*kNWarps=*/{}, {}>;\n\n"
      "extern \"C\" __global__ void __launch_bounds__(FlexTraits::kNThreads, 1)\n"
      "{}(const FlexForwardParams p, const FlexVariant::Params vp) {{\n"
      "  flex_forward<FlexTraits, FlexVariant{}>(p, vp);\n"
      "}}\n{}",
      ir.spec().name, ks.config.block_m, ks.config.block_n, ks.config.warps, options.head_dim, element,
      ir.mask_mod ? "#include \"flex_blockmask.cuh\"\n" : "", ks.variant.code, options.head_dim, ks.config.block_m, ks.config.block_n,
      ks.config.warps, element, kForwardEntry, rank_tiles ? ", /*kVarlen=*/false, /*kRankTiles=*/true" : "", block_mask);
  ks.key_text = fmt::format("kind=forward\ndtype={}\nconfig={}\nint32={}\nchecked_loads={:x}\nerror_flags={}\nhoist={}\nfast_tanh={}\n",
                            dsl::dtype_name(options.dtype), ks.config.str(), vo.int32, vo.checked_loads, vo.error_flags, vo.hoist,
                            vo.fast_tanh);
  return ks;
}

KernelSource forward_varlen_kernel_source(const SpecIR& ir, const RangeInfo& ranges, const ForwardKernelOptions& options) {
  KernelSource ks = forward_kernel_source(ir, ranges, options);
  const char* element = cuda_element_type(options.dtype);
  ks.name = fmt::format("{}_fwd_varlen_{}_{}", ir.spec().name, dsl::dtype_name(options.dtype), ks.config.str());
  ks.entries = {kForwardVarlenEntry};
  ks.source = fmt::format(
      "// flexjit ragged-prefill forward kernel for spec `{}`: {} x {} tiles, {} warps, head dim {}, {}.\n"
      "#include \"flex_forward.cuh\"\n"
      "#include \"flex_ops.cuh\"\n"
      "{}\n"
      "using FlexTraits = FlexForwardTraits</*kHeadDim=*/{}, /*kBlockM=*/{}, /*kBlockN=*/{}, /*kNWarps=*/{}, {}>;\n\n"
      "extern \"C\" __global__ void __launch_bounds__(FlexTraits::kNThreads, 1)\n"
      "{}(const FlexForwardParams p, const FlexVariant::Params vp) {{\n"
      "  flex_forward<FlexTraits, FlexVariant, /*kVarlen=*/true>(p, vp);\n"
      "}}\n",
      ir.spec().name, ks.config.block_m, ks.config.block_n, ks.config.warps, options.head_dim, element, ks.variant.code,
      options.head_dim, ks.config.block_m, ks.config.block_n, ks.config.warps, element, kForwardVarlenEntry);
  ks.key_text = "kind=forward_varlen\n" + ks.key_text.substr(ks.key_text.find('\n') + 1);
  return ks;
}

std::vector<KernelSource> kernels_for_launch(const SpecIR& ir, dsl::DType dtype, int head_dim) {
  ForwardKernelOptions fo;
  fo.dtype = dtype;
  fo.head_dim = head_dim;
  std::vector<ir::Expr> roots;
  if (ir.score_mod) roots.push_back(ir.score_mod);
  if (ir.mask_mod) roots.push_back(ir.mask_mod);
  RangeInfo ranges = analyze_ranges(roots, ir.checked, VarDomains::forward(ir.checked));
  return {forward_kernel_source(ir, ranges, fo)};
}

}  // namespace flexjit
