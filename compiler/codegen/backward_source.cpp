#include "compiler/codegen/backward_source.h"

#include "compiler/codegen/codegen_cuda_interval.h"

#include <algorithm>

#include <fmt/format.h>

#include "dsl/error.h"
#include "dsl/spec.h"

namespace flexjit {

std::string BackwardConfig::str() const {
  std::string staged;
  if (staged_col || staged_tile || staged_diag)
    staged = fmt::format("_st{}{}{}{}{}{}", staged_col ? "c" : "", staged_tile ? "t" : "", staged_diag ? "d" : "", staged_grad ? "g" : "",
                         spread_rows ? "s" : "", grad_gemm ? "m" : "");
  return fmt::format("d{}_m{}_n{}_w{}_s{}{}{}{}{}{}", head_dim, block_m, block_n, warps, stages, hopper ? "_sm90" : "", staged, dq_bulk ? "_qb" : "",
                     warp_specialized ? "_ws" : "", two_ds ? "_2ds" : "");
}

FlexBackwardFeatures BackwardConfig::features() const {
  FlexBackwardFeatures f{};
  f.staged_col = staged_col;
  f.staged_tile = staged_tile;
  f.staged_diag = staged_diag;
  f.staged_grad = staged_grad;
  f.spread_rows = spread_rows;
  f.deterministic = deterministic;
  return f;
}

FlexBackwardPolicy BackwardConfig::policy() const {
  FlexBackwardPolicy p = flex_backward_tiles(head_dim);
  p.kind = hopper ? kFlexBackwardWgmma : kFlexBackwardMmaSync;
  p.stages = stages;  // the module's policy's (backward_kernel_source)
  p.dq_bulk = dq_bulk;
  p.grad_gemm = grad_gemm;
  p.producer = warp_specialized;
  p.two_ds = two_ds;
  return p;
}

int BackwardConfig::shared_bytes() const { return flex_backward_smem_bytes(policy(), features(), dq_bulk, grad_gemm); }

bool BackwardConfig::staged_blocks() const { return flex_backward_staged_blocks(policy(), features(), dq_bulk, grad_gemm); }

int BackwardConfig::main_grid_x(int64_t seqlen_kv) const {
  if (spread_rows) return static_cast<int>((seqlen_kv + 511) / 512 * 4);
  return static_cast<int>((seqlen_kv + block_n - 1) / block_n);
}

BackwardConfig backward_config(int head_dim, const std::string& arch) {
  const auto& dims = dsl::supported_head_dims();
  if (std::find(dims.begin(), dims.end(), head_dim) == dims.end())
    throw Error(fmt::format("head dim {} is not supported by the GPU backward kernel; supported: {}", head_dim, fmt::join(dims, ", ")));
  const FlexBackwardPolicy p = flex_backward_tiles(head_dim);
  BackwardConfig c{head_dim, p.block_m, p.block_n, p.warps, p.stages};
  const int kind = flex_backward_kind(is_hopper_arch(arch), head_dim);
  c.hopper = kind == kFlexBackwardWgmma;
  c.stages = flex_backward_policy(kind, head_dim, FlexBackwardFeatures{}).stages;
  return c;
}

QueryMajorConfig query_major_config(int head_dim) {
  backward_config(head_dim);  // the same head dims (throws for others)
  const FlexBackwardPolicy p = flex_backward_tiles(head_dim);
  QueryMajorConfig c;
  c.head_dim = head_dim;
  c.block_m = p.qmajor_block_m;
  c.block_n = p.qmajor_block_n;
  c.warps = p.qmajor_warps;
  c.stages = p.qmajor_stages;
  return c;
}

namespace {

FlexBackwardFeatures backward_features(const ScoreModGradient& grad, const StagedTerms& staged, const BackwardKernelOptions& options);
int backward_kind(const BackwardKernelOptions& options);

}  // namespace

StagedTerms backward_staged_terms(const ScoreModGradient& grad, const RangeInfo& ranges, const BackwardKernelOptions& options) {
  // Head dims above 128 stage nothing: their Hopper kernel (the head-dim split form) has no staged terms.
  if (options.query_major || options.shard_positions || options.ragged || options.head_dim > 128 ||
      !backward_config(options.head_dim, options.arch).hopper)
    return {};
  StagedTerms with_diag = find_staged_terms(grad, ranges, options.variant, /*diagonal=*/true);
  if (!with_diag.find(StagedKind::Diag) ||
      flex_backward_stages_diag(backward_kind(options), options.head_dim, backward_features(grad, with_diag, options)))
    return with_diag;
  return find_staged_terms(grad, ranges, options.variant);
}

namespace {

// What the backward policy weighs of a module (kernels_templates/flex_backward_policy.cuh).
FlexBackwardFeatures backward_features(const ScoreModGradient& grad, const StagedTerms& staged, const BackwardKernelOptions& options) {
  FlexBackwardFeatures f{};
  f.query_major = options.query_major;
  f.deterministic = options.deterministic;
  f.bf16 = options.dtype == dsl::DType::BF16;
  f.d_score_is_one = is_float_const(grad.d_score, 1.f);
  for (const GradScatter& s : grad.scatters) f.diagonal_scatter = f.diagonal_scatter || classify_scatter(s) == ScatterClass::Diagonal;
  f.staged_col = staged.find(StagedKind::Col) != nullptr;
  const StagedTerm* tile_term = staged.find(StagedKind::Tile);
  f.staged_tile = tile_term != nullptr;
  f.staged_diag = staged.find(StagedKind::Diag) != nullptr;
  f.tile_term_grad = tile_term && tile_term->scatter >= 0;
  for (const StagedTerm& t : staged.terms) f.staged_grad = f.staged_grad || t.scatter >= 0;
  f.spread_rows = staged.spreads_rows(grad.scatters.size());
  f.tma_operands = options.tma_operands;
  if (grad.scatters.size() == 1) {
    const ScatterClass c = classify_scatter(grad.scatters[0]);
    f.split_scatter = c == ScatterClass::QOnly || c == ScatterClass::Diagonal;
  }
  return f;
}

// Head dims above 128 take wgmma only in the split form, which loads by TMA (flex_backward_kind).
int backward_kind(const BackwardKernelOptions& options) {
  return flex_backward_kind(is_hopper_arch(options.arch), options.head_dim, options.tma_operands);
}

}  // namespace

bool auto_picks_query_major(const ScoreModGradient& grad, const RangeInfo& ranges, const BackwardKernelOptions& options) {
  BackwardKernelOptions atomic = options;
  atomic.query_major = false;
  const StagedTerms staged = backward_staged_terms(grad, ranges, atomic);
  if (flex_backward_prefers_query_major(backward_kind(atomic), options.head_dim, backward_features(grad, staged, atomic), !staged.terms.empty()))
    return true;
  return needs_query_major_pass(grad, staged);
}

BackwardKernelSource backward_kernel_source(const SpecIR& ir, const ScoreModGradient& grad, const RangeInfo& ranges,
                                            const BackwardKernelOptions& options) {
  BackwardKernelSource out;
  out.config = backward_config(options.head_dim, options.arch);
  const bool qm = options.query_major;
  if (qm && options.shard_positions)
    throw Error("backward_kernel_source: a shard of a longer sequence has no query-major pass (pick the atomic dQ strategy)");
  const bool ragged = options.ragged;
  if (ragged && (qm || options.shard_positions))
    throw Error("backward_kernel_source: a ragged module has no query-major pass or shard offsets");
  const StagedTerms staged = backward_staged_terms(grad, ranges, options);
  const FlexBackwardFeatures features = backward_features(grad, staged, options);
  const int kind = backward_kind(options);
  const FlexBackwardPolicy policy = flex_backward_policy(kind, options.head_dim, features);
  out.config.hopper = kind == kFlexBackwardWgmma;
  out.config.stages = policy.stages;
  out.config.staged_col = features.staged_col;
  out.config.staged_tile = features.staged_tile;
  out.config.staged_diag = features.staged_diag;
  out.config.staged_grad = features.staged_grad;
  out.config.spread_rows = features.spread_rows;
  out.config.grad_gemm = policy.grad_gemm;
  out.config.dq_bulk = policy.dq_bulk;
  out.config.deterministic = options.deterministic;
  out.config.warp_specialized = policy.producer;
  out.config.two_ds = policy.two_ds;
  for (const StagedTerm& t : staged.terms) {
    if (t.scatter < 0) continue;
    if (t.kind == StagedKind::Col) out.staged_col_grad_buffer = t.buffer;
    if (t.kind == StagedKind::Tile) out.staged_tile_grad_buffer = t.buffer;
  }
  GradVariantOptions kv_major;
  kv_major.query_major_pass = qm;
  kv_major.staged = &staged;
  // A shard module wraps the generated struct so that its hooks see global positions; the wrapper's Params are the
  // layout's slots and the two offsets after them.
  const bool shard = options.shard_positions;
  out.grad = generate_cuda_grad_variant(ir, grad, ranges, options.variant, shard ? "FlexGradVariantLocal" : "FlexGradVariant", kv_major);
  std::string variants = out.grad.code;
  if (shard)
    variants += fmt::format(
        "\nusing FlexGradVariant = flex::ShardPositions<FlexGradVariantLocal>;\n"
        "static_assert(sizeof(FlexGradVariant::Params) == {}, \"host and template disagree on the shard variant's parameters\");\n",
        out.grad.layout.bytes() + 16);
  if (qm) {
    out.qconfig = query_major_config(options.head_dim);
    GradVariantOptions q_major = kv_major;
    q_major.hoisted = true;
    q_major.staged = nullptr;
    variants += "\n" + generate_cuda_grad_variant(ir, grad, ranges, options.variant, "FlexGradVariantQ", q_major).code;
  }
  const char* element = cuda_element_type(options.dtype);
  const char* det = options.deterministic ? "true" : "false";
  // A ragged module's kernels run on their sequence's view `s` of the launch's parameters (flex_bwd::ragged_sequence);
  // `report`: the CTA that reports a sequence outside the bounds.
  auto ragged_view = [&](const char* b, const char* first_q, const char* first_kv, const char* report) {
    if (!ragged) return std::string();
    return fmt::format("  FlexBackwardParams s;\n  if (!flex_bwd::ragged_sequence<{}, {}>(p, {}, s, {}, {}, {})) return;\n", det, options.head_dim, b,
                       first_q, first_kv, report);
  };
  std::string main_view;
  if (ragged && out.config.hopper)
    main_view = "  const flex_bwd_sm90::KvBlock<FlexBwdTraits::kBlockN, FlexBwdTraits::kPolicy.head_group, false> blk;\n" +
                ragged_view("blk.b", "-1", "blk.n0", "false");
  else if (ragged)
    main_view = ragged_view("blockIdx.z", "-1", "(int)blockIdx.x * FlexBwdTraits::kBlockN", "false");
  // The tile classes: from the forward's block-mask lists, or (ragged) by the mask's interval classifier.
  std::string ts_body = "const FlexTileStateParams t) {\n  flex_backward_tile_state(t);\n";
  if (ragged) {
    const bool box = mask_is_interval_classifiable(ir);
    if (box) variants += "\n" + generate_cuda_interval_classifier(ir, "FlexGradVariant", "FlexMaskBox");
    ts_body = fmt::format("const FlexRaggedTileStateParams t, const FlexGradVariant::Params vp) {{\n"
                          "  flex_backward_ragged_tile_state<FlexGradVariant, {}>(t, vp);\n",
                          box ? "FlexMaskBox" : "void");
  }
  KernelSource& ks = out.module;
  ks.config = forward_config(options.head_dim);
  ks.variant.layout = out.grad.layout;
  ks.variant.loads = out.grad.loads;
  ks.variant.code = out.grad.code;
  ks.name = fmt::format("{}_bwd_{}_{}{}{}{}{}", ir.spec().name, dsl::dtype_name(options.dtype), out.config.str(), options.deterministic ? "_det" : "",
                        qm ? "_qdq" : "", shard ? "_shard" : "", ragged ? "_ragged" : "");
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
                       "{view}"
                       "  flex_backward_dq<{el}, {d}, {det}, /*kBulkLayout=*/{bulk}>({pv});\n}}\n\n",
                       fmt::arg("d", options.head_dim), fmt::arg("el", element), fmt::arg("name", kBwdDqEntry), fmt::arg("det", det),
                       fmt::arg("bulk", out.config.hopper && out.config.dq_bulk),
                       fmt::arg("view", ragged_view("blockIdx.z", "blockIdx.x * 8", "-1", "false")), fmt::arg("pv", ragged ? "s" : "p"));
  ks.source = fmt::format(
      "// flexjit backward kernels for spec `{spec}`: head dim {d}, {el}{detc}{qmc}.\n"
      "#include \"{header}\"\n"
      "{hopper_header}"
      "{shard_header}"
      "{ragged_header}"
      "#include \"flex_ops.cuh\"\n\n"
      "{variants}\n"
      "using FlexBwdTraits = FlexBackwardTraits</*kHeadDim=*/{d}, {el}>;\n"
      "{smem_check}\n"
      "extern \"C\" __global__ void __launch_bounds__(256)\n"
      "{pre}(const FlexBackwardParams p) {{\n"
      "{pre_view}"
      "  flex_backward_preprocess<{el}, {d}, {det}>({pv});\n}}\n\n"
      "extern \"C\" __global__ void __launch_bounds__({main_threads}, 1)\n"
      "{main}(const FlexBackwardParams p, const FlexGradVariant::Params vp{tma_param}) {{\n"
      "{main_view}"
      "  {main_fn}<FlexBwdTraits, FlexGradVariant, {det}, /*kDq=*/{kdq}{bulk}>({pv}, vp{tma_arg});\n}}\n\n"
      "{dq_kernel}"
      "extern \"C\" __global__ void __launch_bounds__(256)\n"
      "{conv}(const FlexConvertParams c) {{\n"
      "  flex_backward_convert(c);\n}}\n\n"
      "extern \"C\" __global__ void __launch_bounds__(128)\n"
      "{ts}({ts_body}}}\n",
      fmt::arg("spec", ir.spec().name), fmt::arg("d", options.head_dim), fmt::arg("el", element),
      fmt::arg("detc", options.deterministic ? ", deterministic" : ""), fmt::arg("qmc", qm ? ", query-major dq" : ""),
      fmt::arg("header", qm ? "flex_backward_qmajor.cuh" : "flex_backward.cuh"), fmt::arg("variants", variants), fmt::arg("det", det),
      fmt::arg("kdq", qm ? "false" : "true"), fmt::arg("pre", kBwdPreprocessEntry), fmt::arg("main", kBwdMainEntry),
      fmt::arg("dq_kernel", dq_kernel), fmt::arg("conv", kBwdConvertEntry), fmt::arg("ts", kBwdTileStateEntry),
      fmt::arg("hopper_header", out.config.hopper ? "#include \"flex_backward_sm90.cuh\"\n" : ""),
      fmt::arg("shard_header", shard ? "#include \"flex_shard_positions.cuh\"\n" : ""),
      fmt::arg("ragged_header", ragged ? "#include \"flex_backward_ragged.cuh\"\n" : ""),
      fmt::arg("pre_view", ragged_view("blockIdx.z", "(int)blockIdx.x * 8", "-1", "blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0")),
      fmt::arg("main_view", main_view), fmt::arg("pv", ragged ? "s" : "p"), fmt::arg("ts_body", ts_body),
      fmt::arg("main_fn", out.config.hopper ? "flex_backward_main_sm90" : "flex_backward_main"),
      fmt::arg("bulk", out.config.hopper ? fmt::format(", /*kDqBulk=*/{}, /*kGradGemm=*/{}, /*kProducer=*/{}, /*kTwoDs=*/{}", out.config.dq_bulk,
                                                       out.config.grad_gemm, out.config.warp_specialized, out.config.two_ds)
                                         : std::string()),
      fmt::arg("main_threads", out.config.threads()),
      fmt::arg("tma_param", out.config.warp_specialized ? ", const __grid_constant__ FlexBackwardTmaMaps tma" : ""),
      fmt::arg("tma_arg", out.config.warp_specialized ? ", &tma" : ""),
      fmt::arg("smem_check", out.config.hopper ? fmt::format("static_assert(flex_bwd_sm90::Smem<FlexBwdTraits, FlexGradVariant, {}, {}, {}, {}, {}>::kAllocBytes == {}, "
                                                              "\"host and template disagree on the backward's shared memory\");\n",
                                                              out.config.dq_bulk, out.config.grad_gemm, out.config.dq_bulk && out.config.deterministic,
                                                              out.config.warp_specialized, out.config.two_ds, out.config.shared_bytes()) +
                                                      (out.config.spread_rows
                                                           ? "static_assert(flex_bwd_staged::kSpreadRange == 512 && flex_bwd_staged::kSpreadCtas == 4, "
                                                             "\"host (BackwardConfig::main_grid_x) and template disagree on the spread rows' grid\");\n"
                                                           : "")
                                               : std::string()));
  const VariantOptions& vo = options.variant;
  ks.key_text = fmt::format(
      "kind=backward\ndtype={}\nconfig={}\ndeterministic={}\ndq={}\nint32={}\nchecked_loads={:x}\nunit_inner_stride={:x}\nerror_flags={}\nfast_tanh={}\n{}{}",
      dsl::dtype_name(options.dtype), out.config.str(), options.deterministic, qm ? "query_major" : "atomic", vo.int32, vo.checked_loads,
      vo.unit_inner_stride,
      vo.error_flags, vo.fast_tanh, shard ? "shard_positions=1\n" : "", ragged ? "ragged=1\n" : "");
  return out;
}

}  // namespace flexjit
