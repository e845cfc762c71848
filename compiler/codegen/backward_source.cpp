#include "compiler/codegen/backward_source.h"

#include <fmt/format.h>

#include "dsl/error.h"
#include "dsl/spec.h"

namespace flexjit {

std::string BackwardConfig::str() const { return fmt::format("d{}_m{}_n{}_w{}_s{}", head_dim, block_m, block_n, warps, stages); }

int BackwardConfig::shared_bytes() const {
  const int stride = head_dim + 8;
  int bytes = 2 * block_n * stride * 2;        // K, V
  bytes += 2 * stages * block_m * stride * 2;  // Q, dO
  bytes += block_n * (block_m + 8) * 2;        // dS^T
  bytes += 2 * stages * block_m * 4;           // lse2, delta
  bytes += warps * block_m * 8;                // reductions
  bytes += (block_m + block_n) * 8;            // diagonal slots
  bytes += 2048;                               // cached tile classes (FlexBackwardTraits::kMaxSched)
  return bytes;
}

BackwardConfig backward_config(int head_dim) {
  switch (head_dim) {
    case 32:
    case 64:
    case 80:
    case 96:
    case 128: return {head_dim, 64, 128, 8, 2};
    case 192:
    case 256: return {head_dim, 64, 64, 8, 1};
    default: break;
  }
  throw Error(fmt::format("head dim {} is not supported by the GPU backward kernel; supported: {}", head_dim,
                          fmt::join(dsl::supported_head_dims(), ", ")));
}

BackwardKernelSource backward_kernel_source(const SpecIR& ir, const ScoreModGradient& grad, const RangeInfo& ranges,
                                            const BackwardKernelOptions& options) {
  BackwardKernelSource out;
  out.config = backward_config(options.head_dim);
  out.grad = generate_cuda_grad_variant(ir, grad, ranges, options.variant, "FlexGradVariant");
  const char* element = cuda_element_type(options.dtype);
  const char* det = options.deterministic ? "true" : "false";
  KernelSource& ks = out.module;
  ks.config = forward_config(options.head_dim);
  ks.variant.layout = out.grad.layout;
  ks.variant.loads = out.grad.loads;
  ks.variant.code = out.grad.code;
  ks.name = fmt::format("{}_bwd_{}_{}{}", ir.spec().name, dsl::dtype_name(options.dtype), out.config.str(), options.deterministic ? "_det" : "");
  ks.entries = {kBwdPreprocessEntry, kBwdMainEntry, kBwdDqEntry, kBwdConvertEntry, kBwdTileStateEntry};
  ks.source = fmt::format(
      "// flexjit backward kernels for spec `{spec}`: head dim {d}, {el}{detc}.\n"
      "#include \"flex_backward.cuh\"\n"
      "#include \"flex_ops.cuh\"\n\n"
      "{variant}\n"
      "using FlexBwdTraits = FlexBackwardTraits</*kHeadDim=*/{d}, {el}>;\n\n"
      "extern \"C\" __global__ void __launch_bounds__(256)\n"
      "{pre}(const FlexBackwardParams p) {{\n"
      "  flex_backward_preprocess<{el}, {d}, {det}>(p);\n}}\n\n"
      "extern \"C\" __global__ void __launch_bounds__(FlexBwdTraits::kNThreads, 1)\n"
      "{main}(const FlexBackwardParams p, const FlexGradVariant::Params vp) {{\n"
      "  flex_backward_main<FlexBwdTraits, FlexGradVariant, {det}>(p, vp);\n}}\n\n"
      "extern \"C\" __global__ void __launch_bounds__(256)\n"
      "{dq}(const FlexBackwardParams p) {{\n"
      "  flex_backward_dq<{el}, {d}, {det}>(p);\n}}\n\n"
      "extern \"C\" __global__ void __launch_bounds__(256)\n"
      "{conv}(const FlexConvertParams c) {{\n"
      "  flex_backward_convert(c);\n}}\n\n"
      "extern \"C\" __global__ void __launch_bounds__(128)\n"
      "{ts}(const FlexTileStateParams t) {{\n"
      "  flex_backward_tile_state(t);\n}}\n",
      fmt::arg("spec", ir.spec().name), fmt::arg("d", options.head_dim), fmt::arg("el", element),
      fmt::arg("detc", options.deterministic ? ", deterministic" : ""), fmt::arg("variant", out.grad.code), fmt::arg("det", det),
      fmt::arg("pre", kBwdPreprocessEntry), fmt::arg("main", kBwdMainEntry), fmt::arg("dq", kBwdDqEntry), fmt::arg("conv", kBwdConvertEntry),
      fmt::arg("ts", kBwdTileStateEntry));
  const VariantOptions& vo = options.variant;
  ks.key_text = fmt::format("kind=backward\ndtype={}\nconfig={}\ndeterministic={}\nint32={}\nchecked_loads={:x}\nerror_flags={}\nfast_tanh={}\n",
                            dsl::dtype_name(options.dtype), out.config.str(), options.deterministic, vo.int32, vo.checked_loads,
                            vo.error_flags, vo.fast_tanh);
  return out;
}

}  // namespace flexjit
