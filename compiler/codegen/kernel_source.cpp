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

namespace {

// The traits alias, the kernel entry and its body for the configuration: the warp-specialised kernel or the mma.sync
// one. The host's shared-memory figure is checked against the template's at compile time. mask_box: a ragged
// batch's mask classifier (the generated FlexMaskBox), with which the kernel skips the KV tiles the mask excludes.
std::string forward_entry(const ForwardConfig& c, const char* element, const char* entry, bool varlen, bool mask_box) {
  std::string traits, body, extra_param;
  const std::string ragged = varlen ? fmt::format(", /*kVarlen=*/true{}", mask_box ? ", FlexMaskBox" : "") : "";
  if (c.warp_specialized) {
    traits = fmt::format("using FlexTraits = FlexSm90Traits</*kHeadDim=*/{}, {}, FlexVariant>;\n", c.head_dim, element);
    body = fmt::format("  flex_forward_sm90<FlexTraits{}>(p, vp, tma);\n", ragged);
    // The tensor maps must stay in parameter space (the TMA unit reads them there): hence __grid_constant__.
    extra_param = ", const __grid_constant__ FlexForwardTmaMaps tma";
  } else {
    traits = fmt::format("using FlexTraits = FlexForwardTraits</*kHeadDim=*/{}, {}>;\n", c.head_dim, element);
    body = fmt::format("  flex_forward<FlexTraits, FlexVariant{}>(p, vp);\n", ragged);
  }
  traits += fmt::format("static_assert(FlexTraits::kSmemBytes == {}, \"host and template disagree on the forward's shared memory\");\n",
                        c.shared_bytes());
  return fmt::format("{}\nextern \"C\" __global__ void __launch_bounds__(FlexTraits::kNThreads, FlexTraits::kMinBlocksPerSM)\n"
                     "{}(const FlexForwardParams p, const FlexVariant::Params vp{}) {{\n{}}}\n",
                     traits, entry, extra_param, body);
}

// A forward module: the variant, the kernel entry and, for the dense kernel of a masked spec, the block-mask
// builder (one compile, one cache entry).
KernelSource forward_module(const SpecIR& ir, const RangeInfo& ranges, const ForwardKernelOptions& options, bool varlen) {
  KernelSource ks;
  VariantOptions vo = options.variant;
  vo.tile_size = 64;  // the hooks see 64-column parts of the kernel's KV tiles (flex_variant_base.cuh)
  vo.split_row_terms = true;
  ks.variant = generate_cuda_variant(ir, ranges, vo, "FlexVariant");
  ks.config = forward_config(options.head_dim, options.arch, options.tma_describable,
                             FlexVariantFeatures{ks.variant.has_score_mod, static_cast<bool>(ir.mask_mod), ks.variant.tile_aligned,
                                                 mask_is_data_dependent(ir), ks.variant.col_values > 0, ks.variant.fixed_max,
                                                 ks.variant.element_loads});
  const char* element = cuda_element_type(options.dtype);
  // Positions offset per launch (a shard of a longer sequence) or, for a ragged batch, per sequence (its queries at
  // the end of its KV: flex::TileScheduler).
  const bool shard = options.shard_positions;
  ks.name = fmt::format("{}_fwd{}_{}_{}{}{}", ir.spec().name, varlen ? "_varlen" : "", dsl::dtype_name(options.dtype), ks.config.str(),
                        shard ? "_shard" : "", varlen && options.fp8_kv ? fmt::format("_kv{}", dsl::dtype_name(*options.fp8_kv)) : "");
  ks.entries = {varlen ? kForwardVarlenEntry : kForwardEntry};
  // The mask's interval classifier (FlexMaskBox) when it reads no buffers: the block-mask builder's for dense
  // launches; a ragged batch has no block mask, so its kernel classifies its own KV tiles with it
  // (flex::TileScheduler), and masks that read buffers run mask_mod on every tile below a sequence's length there.
  const bool mask_box = mask_is_interval_classifiable(ir);
  const std::string classifier = mask_box ? generate_cuda_interval_classifier(ir, "FlexVariant", "FlexMaskBox") + "\n" : "";
  std::string block_mask;
  if (ir.mask_mod && !varlen) {
    ks.entries.push_back(kBlockMaskEntry);
    if (mask_box) {
      block_mask = fmt::format("\nextern \"C\" __global__ void __launch_bounds__(flex_blockmask::kThreads)\n"
                               "{}(const FlexBlockMaskBuildParams p, const FlexVariant::Params vp) {{\n"
                               "  flex_build_block_mask_interval<FlexVariant, FlexMaskBox>(p, vp);\n}}\n",
                               kBlockMaskEntry);
    } else {
      // Data-dependent masks (built by the dense path) give query tiles irregular amounts of work: the builder
      // ranks each row's query tiles by their tile counts and the scheduler takes them heaviest first
      // (flex::TileScheduler).
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
  const bool fp8_kv = varlen && options.fp8_kv.has_value();
  std::string widen;
  if (fp8_kv) {
    ks.entries.push_back(kWidenFp8Entry);
    widen = fmt::format("\n#include \"flex_fp8_widen.cuh\"\n"
                        "extern \"C\" __global__ void __launch_bounds__(256)\n"
                        "{}(const FlexFp8WidenParams p) {{\n  flex_widen_fp8<{}, {}>(p);\n}}\n",
                        kWidenFp8Entry, *options.fp8_kv == dsl::DType::F8E4M3 ? "FlexFp8E4M3" : "FlexFp8E5M2", element);
  }
  ks.source = fmt::format(
      "// flexjit {} kernel for spec `{}`: {} x {} tiles, {} warps, head dim {}, {}{}.\n"
      "{}"
      "#include \"{}\"\n"
      "#include \"flex_ops.cuh\"\n"
      "{}\n"
      "{}\n"
      "{}{}{}{}",
      varlen ? "ragged-prefill forward" : "forward", ir.spec().name, ks.config.block_m, ks.config.block_n, ks.config.warps,
      options.head_dim, element, ks.config.warp_specialized ? ", warp-specialised (sm_90a)" : "",
      !shard    ? ""
      : varlen ? "#define FLEX_SHARD_POSITIONS 1  // queries at the end of their sequence's KV: the mods see their KV positions\n"
               : "#define FLEX_SHARD_POSITIONS 1  // a shard of a longer sequence: the mods see global positions\n",
      ks.config.warp_specialized ? "flex_forward_kernel_sm90.cuh" : "flex_forward.cuh",
      !block_mask.empty() ? "#include \"flex_blockmask.cuh\"\n" : "", ks.variant.code,
      classifier, forward_entry(ks.config, element, ks.entries[0].c_str(), varlen, varlen && mask_box), block_mask, widen);
  ks.key_text = fmt::format("kind={}\ndtype={}\nconfig={}\nint32={}\nchecked_loads={:x}\nunit_inner_stride={:x}\nerror_flags={}\nhoist={}\nfast_tanh={}\n{}",
                            varlen ? "forward_varlen" : "forward", dsl::dtype_name(options.dtype), ks.config.str(), vo.int32,
                            vo.checked_loads, vo.unit_inner_stride, vo.error_flags, vo.hoist, vo.fast_tanh, shard ? "shard_positions=1\n" : "");
  if (fp8_kv) ks.key_text += fmt::format("fp8_kv={}\n", dsl::dtype_name(*options.fp8_kv));
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
  std::vector<ir::Expr> roots;
  if (ir.score_mod) roots.push_back(ir.score_mod);
  if (ir.mask_mod) roots.push_back(ir.mask_mod);
  RangeInfo ranges = analyze_ranges(roots, ir.checked, VarDomains::forward(ir.checked));
  return {forward_kernel_source(ir, ranges, fo)};
}

}  // namespace flexjit
