#include "compiler/codegen/backward_source.h"

#include <fmt/format.h>

#include "dsl/error.h"
#include "dsl/spec.h"

namespace flexjit {

std::string BackwardConfig::str() const {
  std::string staged;
  if (staged_col || staged_tile)
    staged = fmt::format("_st{}{}{}{}{}", staged_col ? "c" : "", staged_tile ? "t" : "", staged_grad ? "g" : "", spread_rows ? "s" : "",
                         grad_gemm ? "m" : "");
  return fmt::format("d{}_m{}_n{}_w{}_s{}{}{}{}", head_dim, block_m, block_n, warps, stages, hopper ? "_sm90" : "", staged, dq_bulk ? "_qb" : "");
}

int BackwardConfig::shared_bytes() const {
  if (hopper) {
    // flex_bwd_sm90::Smem: dense swizzled K, V [block_n][D] and Q, dO [block_m][D] per stage, dS^T [block_n][block_m],
    // lse2 / delta, the reduction slots, the diagonal scatter's planes [warps][4][block_m + 16] floats, the cached
    // tile classes, and 1 KB to align the base.
    int bytes = 2 * block_n * head_dim * 2 + 2 * stages * block_m * head_dim * 2 + block_n * block_m * 2;
    bytes += 2 * stages * block_m * 4 + warps * block_m * 8 + warps * 4 * (block_m + 16) * 4 + 2048;
    if (staged_col) bytes += stages * block_m * 64 * 2;
    if (staged_tile) bytes += stages * block_m * (spread_rows ? 8 : 2) * 2;
    // Selectors: two spare swizzle regions of K ([block_n][swizzle bytes]) where both warpgroups take as many dQ
    // columns (head dims 32, 64, 128), else two [128][16] tiles and 1 KB to align them. The swizzle and the dQ split
    // are flex_bwd_sm90::Smem's (kSwizzle, kDqN0: half of D rounded up to whole swizzle regions).
    const int swizzle_bytes = head_dim == 128 ? 128 : (head_dim == 64 || head_dim == 96) ? 64 : 32;
    const int region_cols = swizzle_bytes / 2;
    const bool selectors_in_k = 2 * ((head_dim / 2 + region_cols - 1) / region_cols * region_cols) == head_dim;
    if (staged_grad && grad_gemm) bytes += selectors_in_k ? 2 * block_n * swizzle_bytes : 2 * block_n * 16 * 2 + 1024;
    else if (staged_grad) bytes += spread_rows ? 8 * block_m * 20 * 4 + 8 * (block_m + 4) * 4 : 2 * block_m * 68 * 4;
    if (dq_bulk) bytes += block_m * (head_dim + 8) * 4;
    return bytes + 1024;
  }
  const int stride = head_dim + 8;
  int bytes = 2 * block_n * stride * 2;        // K, V
  bytes += 2 * stages * block_m * stride * 2;  // Q, dO
  bytes += block_n * (block_m + 8) * 2;        // dS^T
  bytes += 2 * stages * block_m * 4;           // lse2, delta
  bytes += warps * block_m * 8;                // reductions
  bytes += 2048;                               // cached tile classes (FlexBackwardTraits::kMaxSched)
  return bytes;
}

int BackwardConfig::main_grid_x(int64_t seqlen_kv) const {
  if (spread_rows) return static_cast<int>((seqlen_kv + 511) / 512 * 4);
  return static_cast<int>((seqlen_kv + block_n - 1) / block_n);
}

BackwardConfig backward_config(int head_dim, const std::string& arch) {
  if (is_hopper_arch(arch) && head_dim <= 128 && head_dim % 16 == 0) {
    BackwardConfig c = backward_config(head_dim);
    c.hopper = true;
    return c;
  }
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

QueryMajorConfig query_major_config(int head_dim) {
  backward_config(head_dim);  // the same head dims (throws for others)
  QueryMajorConfig c;
  c.head_dim = head_dim;
  c.stages = head_dim > 128 ? 1 : 2;
  return c;
}

StagedTerms backward_staged_terms(const ScoreModGradient& grad, const RangeInfo& ranges, const BackwardKernelOptions& options) {
  if (options.query_major || !backward_config(options.head_dim, options.arch).hopper) return {};
  return find_staged_terms(grad, ranges, options.variant);
}

bool auto_picks_query_major(const ScoreModGradient& grad, const RangeInfo& ranges, const BackwardKernelOptions& options) {
  BackwardKernelOptions atomic = options;
  atomic.query_major = false;
  const StagedTerms staged = backward_staged_terms(grad, ranges, atomic);
  // Deterministic: the staged gradients would be 64-bit fixed-point atomics per element of each [64 q][64]
  // block, slower than the query-major pass that owns those rows (SAM ViT-B on an H100: 16.8 against 9.0 ms).
  if (options.deterministic)
    for (const StagedTerm& t : staged.terms)
      if (t.scatter >= 0) return true;
  // Deterministic, nothing staged, the Hopper kernel: the pass computes dq without atomics, where the KV-major kernel
  // adds it by 64-bit fixed-point atomics per element, which cost more than the pass's extra GEMMs at every head dim
  // and mod measured (docs/BACKWARD.md, dQ strategy).
  if (options.deterministic && staged.terms.empty() && backward_config(options.head_dim, options.arch).hopper) return true;
  return needs_query_major_pass(grad, staged);
}

BackwardKernelSource backward_kernel_source(const SpecIR& ir, const ScoreModGradient& grad, const RangeInfo& ranges,
                                            const BackwardKernelOptions& options) {
  BackwardKernelSource out;
  out.config = backward_config(options.head_dim, options.arch);
  const bool qm = options.query_major;
  const StagedTerms staged = backward_staged_terms(grad, ranges, options);
  out.config.staged_col = staged.find(StagedKind::Col) != nullptr;
  out.config.staged_tile = staged.find(StagedKind::Tile) != nullptr;
  for (const StagedTerm& t : staged.terms) out.config.staged_grad = out.config.staged_grad || t.scatter >= 0;
  out.config.spread_rows = staged.spreads_rows(grad.scatters.size());
  // Selector GEMMs sum the bf16 dS^T tile that dQ reads, which is the terms' gradient only when d_score is 1; in
  // fp16 small dS would lose bits the slab sums (fp32) keep. One GEMM per warpgroup: with rel_w's gradient alone
  // warpgroup 0 did all of it and the slabs (all eight warps, during the dQ GEMM) were faster (H100, B8 H12 D64:
  // 4.27 against 4.92 ms); SAM with both gradients 4.79-4.86 -> 4.59-4.64, D32 3.89-3.94 -> 3.81, D80 7.48-7.53 ->
  // 7.03-7.06.
  const StagedTerm* tile_term = staged.find(StagedKind::Tile);
  out.config.grad_gemm = out.config.spread_rows && tile_term && tile_term->scatter >= 0 && options.dtype == dsl::DType::BF16 &&
                         is_float_const(grad.d_score, 1.f);
  // Bulk dQ reductions pay from head dim 96 (one bulk operation per query row of D * 4 bytes). H100, backward ms,
  // atomics -> bulk: D128 causal 2.16 -> 1.97, full 3.90 -> 3.55; D96 causal 1.868 -> 1.846; D64 causal 1.41 ->
  // 1.52, plain 3.69 -> 3.97; D32 causal 1.03 -> 1.35 (B4 H16 S4096, B8 H12 at D64 plain).
  constexpr int kDqBulkMinHeadDim = 96;
  constexpr int kSm90MaxDynamicShared = 227 * 1024;  // opt-in limit per block; fp16 SAM at head dim 128 (fp32 slabs) leaves no room
  // Not with a diagonal scatter (the learnable bias[h, q - kv + S - 1]), whose split reduction runs its
  // cross-warp sums while dQ runs: there the float4 atomics win. H100, B4 H16 S4096 D128, backward ms, bulk rows ->
  // float4 atomics: bias 2.56 / 2.58 / 2.56 -> 2.47 / 2.45 / 2.48; causal 1.94 / 1.94 / 1.95 -> 2.04 / 2.02 / 2.01 and
  // the learnable slope 2.23 -> 2.33 keep the rows.
  bool diagonal_scatter = false;
  for (const GradScatter& s : grad.scatters) diagonal_scatter = diagonal_scatter || classify_scatter(s) == ScatterClass::Diagonal;
  if (out.config.hopper && !qm && !options.deterministic && options.head_dim >= kDqBulkMinHeadDim && !diagonal_scatter) {
    BackwardConfig bulk = out.config;
    bulk.dq_bulk = true;
    out.config.dq_bulk = bulk.shared_bytes() <= kSm90MaxDynamicShared;
  }
  GradVariantOptions kv_major;
  kv_major.query_major_pass = qm;
  kv_major.staged = &staged;
  out.grad = generate_cuda_grad_variant(ir, grad, ranges, options.variant, "FlexGradVariant", kv_major);
  std::string variants = out.grad.code;
  if (qm) {
    out.qconfig = query_major_config(options.head_dim);
    GradVariantOptions q_major = kv_major;
    q_major.hoisted = true;
    q_major.staged = nullptr;
    variants += "\n" + generate_cuda_grad_variant(ir, grad, ranges, options.variant, "FlexGradVariantQ", q_major).code;
  }
  const char* element = cuda_element_type(options.dtype);
  const char* det = options.deterministic ? "true" : "false";
  KernelSource& ks = out.module;
  ks.config = forward_config(options.head_dim);
  ks.variant.layout = out.grad.layout;
  ks.variant.loads = out.grad.loads;
  ks.variant.code = out.grad.code;
  ks.name = fmt::format("{}_bwd_{}_{}{}{}", ir.spec().name, dsl::dtype_name(options.dtype), out.config.str(), options.deterministic ? "_det" : "",
                        qm ? "_qdq" : "");
  // dq: the query-major pass (no accumulator), or the KV-major kernel's atomics and the conversion kernel.
  ks.entries = {kBwdPreprocessEntry, kBwdMainEntry, qm ? kBwdQMajorEntry : kBwdDqEntry, kBwdConvertEntry, kBwdTileStateEntry};
  const std::string dq_kernel =
      qm ? fmt::format("using FlexBwdQTraits = FlexBackwardQTraits</*kHeadDim=*/{d}, {el}>;\n\n"
                       "extern \"C\" __global__ void __launch_bounds__(FlexBwdQTraits::kNThreads, 1)\n"
                       "{name}(const FlexBackwardParams p, const FlexBlockMask m, const FlexGradVariantQ::Params vp) {{\n"
                       "  flex_backward_qmajor<FlexBwdQTraits, FlexGradVariantQ, {det}>(p, m, vp);\n}}\n\n",
                       fmt::arg("d", options.head_dim), fmt::arg("el", element), fmt::arg("name", kBwdQMajorEntry), fmt::arg("det", det))
         : fmt::format("extern \"C\" __global__ void __launch_bounds__(256)\n"
                       "{name}(const FlexBackwardParams p) {{\n"
                       "  flex_backward_dq<{el}, {d}, {det}>(p);\n}}\n\n",
                       fmt::arg("d", options.head_dim), fmt::arg("el", element), fmt::arg("name", kBwdDqEntry), fmt::arg("det", det));
  ks.source = fmt::format(
      "// flexjit backward kernels for spec `{spec}`: head dim {d}, {el}{detc}{qmc}.\n"
      "#include \"{header}\"\n"
      "{hopper_header}"
      "#include \"flex_ops.cuh\"\n\n"
      "{variants}\n"
      "using FlexBwdTraits = FlexBackwardTraits</*kHeadDim=*/{d}, {el}>;\n"
      "{smem_check}\n"
      "extern \"C\" __global__ void __launch_bounds__(256)\n"
      "{pre}(const FlexBackwardParams p) {{\n"
      "  flex_backward_preprocess<{el}, {d}, {det}>(p);\n}}\n\n"
      "extern \"C\" __global__ void __launch_bounds__(FlexBwdTraits::kNThreads, 1)\n"
      "{main}(const FlexBackwardParams p, const FlexGradVariant::Params vp) {{\n"
      "  {main_fn}<FlexBwdTraits, FlexGradVariant, {det}, /*kDq=*/{kdq}{bulk}>(p, vp);\n}}\n\n"
      "{dq_kernel}"
      "extern \"C\" __global__ void __launch_bounds__(256)\n"
      "{conv}(const FlexConvertParams c) {{\n"
      "  flex_backward_convert(c);\n}}\n\n"
      "extern \"C\" __global__ void __launch_bounds__(128)\n"
      "{ts}(const FlexTileStateParams t) {{\n"
      "  flex_backward_tile_state(t);\n}}\n",
      fmt::arg("spec", ir.spec().name), fmt::arg("d", options.head_dim), fmt::arg("el", element),
      fmt::arg("detc", options.deterministic ? ", deterministic" : ""), fmt::arg("qmc", qm ? ", query-major dq" : ""),
      fmt::arg("header", qm ? "flex_backward_qmajor.cuh" : "flex_backward.cuh"), fmt::arg("variants", variants), fmt::arg("det", det),
      fmt::arg("kdq", qm ? "false" : "true"), fmt::arg("pre", kBwdPreprocessEntry), fmt::arg("main", kBwdMainEntry),
      fmt::arg("dq_kernel", dq_kernel), fmt::arg("conv", kBwdConvertEntry), fmt::arg("ts", kBwdTileStateEntry),
      fmt::arg("hopper_header", out.config.hopper ? "#include \"flex_backward_sm90.cuh\"\n" : ""),
      fmt::arg("main_fn", out.config.hopper ? "flex_backward_main_sm90" : "flex_backward_main"),
      fmt::arg("bulk", out.config.hopper ? fmt::format(", /*kDqBulk=*/{}, /*kGradGemm=*/{}", out.config.dq_bulk, out.config.grad_gemm) : std::string()),
      fmt::arg("smem_check", out.config.hopper ? fmt::format("static_assert(flex_bwd_sm90::Smem<FlexBwdTraits, FlexGradVariant, {}, {}>::kAllocBytes == {}, "
                                                              "\"host and template disagree on the backward's shared memory\");\n",
                                                              out.config.dq_bulk, out.config.grad_gemm, out.config.shared_bytes()) +
                                                      (out.config.spread_rows
                                                           ? "static_assert(flex_bwd_staged::kSpreadRange == 512 && flex_bwd_staged::kSpreadCtas == 4, "
                                                             "\"host (BackwardConfig::main_grid_x) and template disagree on the spread rows' grid\");\n"
                                                           : "")
                                               : std::string()));
  const VariantOptions& vo = options.variant;
  ks.key_text = fmt::format(
      "kind=backward\ndtype={}\nconfig={}\ndeterministic={}\ndq={}\nint32={}\nchecked_loads={:x}\nerror_flags={}\nfast_tanh={}\n",
      dsl::dtype_name(options.dtype), out.config.str(), options.deterministic, qm ? "query_major" : "atomic", vo.int32, vo.checked_loads,
      vo.error_flags, vo.fast_tanh);
  return out;
}

}  // namespace flexjit
