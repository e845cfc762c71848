#include "compiler/codegen/decode_source.h"

#include <fmt/format.h>

#include "compiler/codegen/codegen_cuda_interval.h"

namespace flexjit {

VarDomains decode_var_domains(const dsl::CheckedSpec& spec) {
  VarDomains d = VarDomains::forward(spec);
  d.q = d.kv;
  return d;
}

RangeInfo analyze_decode_ranges(const SpecIR& ir) {
  std::vector<ir::Expr> roots;
  if (ir.score_mod) roots.push_back(ir.score_mod);
  if (ir.mask_mod) roots.push_back(ir.mask_mod);
  return analyze_ranges(roots, ir.checked, decode_var_domains(ir.checked));
}

bool decode_has_tile_list(const SpecIR& ir) { return static_cast<bool>(ir.mask_mod); }

KernelSource decode_kernel_source(const SpecIR& ir, const RangeInfo& ranges, const DecodeKernelOptions& options) {
  const DecodeConfig& c = options.config;
  KernelSource ks;
  // The forward config fields describe the tile shape for logs; the decode config is in key_text.
  ks.config = ForwardConfig{c.head_dim, c.block_m(), 64, 4};
  VariantOptions vo = options.variant;
  vo.tile_size = 64;  // kFlexDecodeBlockN
  ks.variant = generate_cuda_variant(ir, ranges, vo, "FlexVariant");
  const char* element = cuda_element_type(options.dtype);
  const char* kv_element = !c.kv_fp8 ? element : *c.kv_fp8 == dsl::DType::F8E5M2 ? "FlexFp8E5M2" : "FlexFp8E4M3";
  ks.name = fmt::format("{}_decode_{}_{}", ir.spec().name, dsl::dtype_name(options.dtype), c.str());
  ks.entries = {kDecodeEntry, kDecodeCombineEntry};
  std::string tiles;
  if (decode_has_tile_list(ir)) {
    ks.entries.push_back(kDecodeTilesEntry);
    const bool interval = mask_is_interval_classifiable(ir);
    tiles = (interval ? generate_cuda_interval_classifier(ir, "FlexVariant", "FlexMaskBox") : std::string()) +
            fmt::format("\nextern \"C\" __global__ void __launch_bounds__(kFlexDecodeTileListThreads)\n"
                        "{}(const FlexDecodeTileListParams p, const FlexVariant::Params vp) {{\n"
                        "  {};\n}}\n",
                        kDecodeTilesEntry,
                        interval ? "flex_decode_tiles_interval<FlexVariant, FlexMaskBox>(p, vp)" : "flex_decode_tiles_dense<FlexVariant>(p, vp)");
  }
  ks.source = fmt::format(
      "// flexjit decode kernels for spec `{}`: {} packed query rows x 64 KV rows per tile, {}, head dim {}, {}{}.\n"
      "#include \"flex_decode.cuh\"\n"
      "#include \"flex_ops.cuh\"\n"
      "{}\n"
      "{}\n"
      "using FlexDecodeT = FlexDecodeTraits</*kHeadDim=*/{}, /*kMTiles=*/{}, /*kStages=*/{}, {}, /*kAlternate=*/{}, /*KvElement=*/{}>;\n"
      "static_assert(FlexDecodeT::kSmemBytes == {}, \"the host's DecodeConfig::shared_bytes() drifted from FlexDecodeTraits\");\n\n"
      "extern \"C\" __global__ void __launch_bounds__(FlexDecodeT::kNThreads, 2)\n"
      "{}(const FlexDecodeParams p, const FlexVariant::Params vp) {{\n"
      "  flex_decode<FlexDecodeT, FlexVariant>(p, vp);\n"
      "}}\n\n"
      "extern \"C\" __global__ void __launch_bounds__(128)\n"
      "{}(const FlexDecodeParams p) {{\n"
      "  flex_decode_combine<{}, {}>(p);\n"
      "}}\n{}",
      ir.spec().name, c.block_m(), c.alternate ? "128-row K and V loads in turn" : fmt::format("{} stages", c.stages), c.head_dim, element,
      c.kv_fp8 ? fmt::format(", {} KV cache", dsl::dtype_name(*c.kv_fp8)) : "",
      tiles.empty() ? "" : "#include \"flex_decode_tiles.cuh\"\n", ks.variant.code, c.head_dim, c.m_tiles, c.stages, element,
      c.alternate ? "true" : "false", kv_element, c.shared_bytes(), kDecodeEntry, kDecodeCombineEntry, c.head_dim,
      element, tiles);
  ks.key_text = fmt::format("kind=decode\ndtype={}\nconfig={}\nint32={}\nchecked_loads={:x}\nunit_inner_stride={:x}\nerror_flags={}\nhoist={}\nfast_tanh={}\ntiles={}\n",
                            dsl::dtype_name(options.dtype), c.str(), vo.int32, vo.checked_loads, vo.unit_inner_stride, vo.error_flags, vo.hoist, vo.fast_tanh,
                            tiles.empty() ? 0 : 1);
  return ks;
}

}  // namespace flexjit
