// Staged additive terms of the Hopper KV-major backward (compiler/codegen/staged_terms.h): which summands of a
// score_mod qualify, what the generated variant then carries, and the automatic dQ strategy that follows.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "compiler/codegen/backward_source.h"
#include "compiler/codegen/kernel_source.h"
#include "compiler/codegen/staged_terms.h"
#include "compiler/frontend.h"
#include "compiler/ir/ir_printer.h"
#include "compiler/passes/autodiff.h"

using namespace flexjit;

namespace {

const char* kSam = "score + rel_h[b, h, q, kv // 64] + rel_w[b, h, q, kv % 64]";
const std::vector<std::string> kSamBufs = {"rel_h: bf16[B, H, Sq, 64]", "rel_w: bf16[B, H, Sq, 64]"};

struct Built {
  SpecIR ir;
  ScoreModGradient grad;
  RangeInfo ranges;
};

Built build(const std::string& score_mod, const std::vector<std::string>& buffers, const std::vector<std::string>& grads,
            const std::string& mask = "") {
  dsl::Spec spec;
  spec.name = "staged";
  spec.score_mod = score_mod;
  if (!mask.empty()) spec.mask_mod = mask;
  spec.head_dim = 64;
  dsl::Diagnostics diags;
  for (const std::string& b : buffers) REQUIRE(dsl::add_buffer(spec, b, "test", diags));
  for (dsl::BufferDecl& b : spec.buffers)
    for (const std::string& g : grads) b.requires_grad = b.requires_grad || b.name == g;
  Built out{build_spec_ir(spec), {}, {}};
  out.grad = differentiate_score_mod(out.ir);
  out.ranges = analyze_ranges(backward_roots(out.grad), out.ir.checked, VarDomains::forward(out.ir.checked));
  return out;
}

// "col:rel_w:1" per term (kind, buffer, scatter index), in the order found.
std::vector<std::string> describe(const Built& b, const StagedTerms& t) {
  std::vector<std::string> out;
  for (const StagedTerm& x : t.terms)
    out.push_back(std::string(staged_kind_name(x.kind)) + ":" + b.ir.spec().buffers.at(x.buffer).name + ":" + std::to_string(x.scatter));
  return out;
}

std::vector<std::string> staged(const std::string& score_mod, const std::vector<std::string>& buffers, const std::vector<std::string>& grads = {},
                                const std::string& mask = "") {
  Built b = build(score_mod, buffers, grads, mask);
  return describe(b, find_staged_terms(b.grad, b.ranges, VariantOptions{}));
}

using V = std::vector<std::string>;

}  // namespace

TEST_CASE("staged terms: SAM's rel_h and rel_w, with and without gradients", "[backward][codegen]") {
  Built b = build(kSam, kSamBufs, {"rel_h", "rel_w"});
  StagedTerms t = find_staged_terms(b.grad, b.ranges, VariantOptions{});
  CHECK(describe(b, t) == V{"tile:rel_h:0", "col:rel_w:1"});
  CHECK(!t.residual);  // only the score is left: no score_mod in the staged module
  CHECK(t.covers_scatter(0));
  CHECK(t.covers_scatter(1));
  CHECK(!needs_query_major_pass(b.grad, t));
  CHECK(needs_query_major_pass(b.grad));  // without staging, the query-major pass
  CHECK(staged(kSam, kSamBufs) == V{"tile:rel_h:-1", "col:rel_w:-1"});
  CHECK(staged(kSam, kSamBufs, {"rel_w"}) == V{"tile:rel_h:-1", "col:rel_w:0"});
  // fp16 buffers, a mask beside them, and lead indices of b / h only.
  CHECK(staged(kSam, {"rel_h: f16[B, H, Sq, 64]", "rel_w: f16[B, H, Sq, 64]"}, {}, "kv <= q") == V{"tile:rel_h:-1", "col:rel_w:-1"});
  CHECK(staged("score + r[h // 2, q, kv % 64]", {"r: bf16[H, Sq, 64]"}) == V{"col:r:-1"});
  CHECK(staged("score + r[q, kv % 64]", {"r: bf16[Sq, 64]"}) == V{"col:r:-1"});
}

TEST_CASE("staged terms: the residual keeps everything else", "[backward][codegen]") {
  Built b = build("score * 0.5 + rel_w[b, h, q, kv % 64] + slope[h] * (kv - q)", {"rel_w: bf16[B, H, Sq, 64]", "slope: f32[H]"},
                  {"rel_w", "slope"});
  StagedTerms t = find_staged_terms(b.grad, b.ranges, VariantOptions{});
  REQUIRE(describe(b, t) == V{"col:rel_w:0"});
  REQUIRE(t.residual);
  const std::string r = ir::print_inline(t.residual);
  CHECK(r.find("rel_w") == std::string::npos);
  CHECK(r.find("slope") != std::string::npos);
  CHECK(!t.covers_scatter(1));  // slope's scatter stays with the scatter code
}

TEST_CASE("staged terms: what does not qualify stays generic", "[backward][codegen]") {
  const std::vector<std::string> r64 = {"r: bf16[B, H, Sq, 64]"};
  CHECK(staged("score + r[b, h, q, kv % 32]", r64).empty());                         // not the warpgroup's 64 rows
  CHECK(staged("score + r[b, h, q, kv // 128]", r64).empty());
  CHECK(staged("score + r[b, h, q + 1, kv % 64]", {"r: bf16[B, H, L, 64]"}).empty());  // the row is not q
  CHECK(staged("score + r[b, h, kv % 64, q]", {"r: bf16[B, H, 64, Sq]"}).empty());     // transposed
  CHECK(staged("score + r[b, q % 4, q, kv % 64]", {"r: bf16[B, 4, Sq, 64]"}).empty()); // a lead index uses q
  CHECK(staged("score + r[b, h, q, kv % 64]", {"r: f32[B, H, Sq, 64]"}).empty());      // 4-byte elements
  CHECK(staged("score - r[b, h, q, kv % 64]", r64).empty());                          // not a summand
  CHECK(staged("score + 2.0 * r[b, h, q, kv % 64]", r64).empty());
  CHECK(staged("r[b, h, q, kv % 64]", r64).empty());                                  // nothing would be left
  // A second load of the buffer: not staged. The very same load in the mask is (mask_mod keeps its own read).
  CHECK(staged("score + r[b, h, q, kv % 64] + r[b, h, q, 0]", r64).empty());
  CHECK(staged("score + r[b, h, q, kv % 64]", r64, {}, "r[b, h, q, kv % 64] > 0.0") == V{"col:r:-1"});
  // kv // 64 past a last dim of 8 unless the launch proves Skv <= 512: checked loads are not staged.
  Built b = build("score + r[b, h, q, kv // 64]", {"r: bf16[B, H, Sq, 8]"}, {});
  CHECK(describe(b, find_staged_terms(b.grad, b.ranges, VariantOptions{})) == V{"tile:r:-1"});
  VariantOptions checked;
  checked.checked_loads = ~0ull;
  CHECK(find_staged_terms(b.grad, b.ranges, checked).terms.empty());
}

TEST_CASE("staged terms: only the Hopper kernel of an atomic module stages, and Auto follows", "[backward][codegen]") {
  Built b = build(kSam, kSamBufs, {"rel_h", "rel_w"});
  BackwardKernelOptions bo;
  bo.head_dim = 64;
  bo.arch = "sm_90a";
  CHECK(backward_staged_terms(b.grad, b.ranges, bo).terms.size() == 2);
  CHECK(!auto_picks_query_major(b.grad, b.ranges, bo));
  BackwardKernelSource src = backward_kernel_source(b.ir, b.grad, b.ranges, bo);
  CHECK(src.config.staged_col);
  CHECK(src.config.staged_tile);
  CHECK(src.config.staged_grad);
  CHECK(src.module.source.find("static constexpr bool kStagedCol = true;") != std::string::npos);
  CHECK(src.module.source.find("kScatterClass[2] = {6 /* row-tile, staged */, 6 /* row-col, staged */}") != std::string::npos);
  // Spread rows (rel_w has a gradient), the gradients by selector GEMMs (bf16, d_score 1, both terms learnable).
  CHECK(src.module.key_text.find("_stctgsm") != std::string::npos);
  CHECK(src.config.grad_gemm);
  // sm_80 (mma.sync kernel), head dim 192, or a query-major module: nothing staged, Auto takes the pass.
  BackwardKernelOptions a80 = bo;
  a80.arch = "sm_80";
  CHECK(backward_staged_terms(b.grad, b.ranges, a80).terms.empty());
  CHECK(auto_picks_query_major(b.grad, b.ranges, a80));
  // Fixed-point gradients: at head dim 64 the staged module's dQ goes out in fixed-point bulk rows, which beat the
  // query-major pass; at 128 those rows do not fit next to the staged tiles, and the pass takes dQ.
  BackwardKernelOptions det = bo;
  det.deterministic = true;
  CHECK(backward_staged_terms(b.grad, b.ranges, det).terms.size() == 2);
  CHECK(!auto_picks_query_major(b.grad, b.ranges, det));
  CHECK(backward_kernel_source(b.ir, b.grad, b.ranges, det).config.dq_bulk);
  BackwardKernelOptions det128 = det;
  det128.head_dim = 128;
  CHECK(auto_picks_query_major(b.grad, b.ranges, det128));
  Built nograd = build(kSam, kSamBufs, {});
  CHECK(!auto_picks_query_major(nograd.grad, nograd.ranges, det));
  // Deterministic with nothing staged: fixed-point bulk rows on the Hopper kernel; the KV-major kernel on sm_80 too.
  Built plain = build("score", {}, {});
  CHECK(!auto_picks_query_major(plain.grad, plain.ranges, bo));
  CHECK(!auto_picks_query_major(plain.grad, plain.ranges, det));
  BackwardKernelOptions det80 = det;
  det80.arch = "sm_80";
  CHECK(!auto_picks_query_major(plain.grad, plain.ranges, det80));
  BackwardKernelOptions d192 = bo;
  d192.head_dim = 192;
  CHECK(auto_picks_query_major(b.grad, b.ranges, d192));
  BackwardKernelOptions qm = bo;
  qm.query_major = true;
  CHECK(backward_staged_terms(b.grad, b.ranges, qm).terms.empty());
  BackwardKernelSource qsrc = backward_kernel_source(b.ir, b.grad, b.ranges, qm);
  CHECK(!qsrc.config.staged_col);
  CHECK(qsrc.module.source.find("static constexpr bool kStagedCol = false;") != std::string::npos);
  // The staged regions are in the host's shared-memory mirror (spread rows: [8] Tile values per query row, and the
  // selectors in two spare [128][32] regions of K (64-byte swizzle at head dim 64), or with the slabs eight [64][20]
  // slabs and [8][68] row sums); the warp-specialised atomic module has a second [128][64] dS^T tile (two_ds), the
  // query-major one's 256-thread kernel one.
  CHECK(src.config.two_ds);
  CHECK(!qsrc.config.two_ds);
  CHECK(src.config.shared_bytes() == qsrc.config.shared_bytes() + 2 * 64 * 64 * 2 + 2 * 64 * 8 * 2 + 2 * 128 * 64 + 128 * 64 * 2);
  // Head dims 80 and 96 (unequal dQ column counts) keep two [128][16] selector tiles of their own, 1 KB aligned.
  for (int d : {80, 96}) {
    BackwardKernelOptions od = bo, oq = qm;
    od.head_dim = oq.head_dim = d;
    const BackwardConfig c = backward_kernel_source(b.ir, b.grad, b.ranges, od).config;
    CHECK(c.shared_bytes() == backward_kernel_source(b.ir, b.grad, b.ranges, oq).config.shared_bytes() + 2 * 64 * 64 * 2 + 2 * 64 * 8 * 2 +
                                  2 * 128 * 16 * 2 + 1024 + (d == 96 ? 64 * 96 * 4 : 0) + (c.two_ds ? 128 * 64 * 2 : 0));
  }
  BackwardConfig slabs = src.config;
  slabs.grad_gemm = false;
  slabs.warp_specialized = slabs.two_ds = false;  // the slabs' module is the 256-thread form
  CHECK(slabs.shared_bytes() == qsrc.config.shared_bytes() + 2 * 64 * 64 * 2 + 2 * 64 * 8 * 2 + 8 * 64 * 20 * 4 + 8 * 68 * 4);
  Built w_only = build(kSam, kSamBufs, {"rel_w"});  // rel_w's gradient alone: spread rows through the slabs
  BackwardKernelSource wsrc = backward_kernel_source(w_only.ir, w_only.grad, w_only.ranges, bo);
  CHECK(wsrc.config.spread_rows);
  CHECK(!wsrc.config.grad_gemm);
  BackwardKernelOptions f16 = bo;  // fp16: the slabs' fp32 sums
  f16.dtype = dsl::DType::F16;
  CHECK(!backward_kernel_source(b.ir, b.grad, b.ranges, f16).config.grad_gemm);
  Built h_only = build(kSam, kSamBufs, {"rel_h"});
  BackwardKernelSource hsrc = backward_kernel_source(h_only.ir, h_only.grad, h_only.ranges, bo);
  CHECK(!hsrc.config.spread_rows);
  CHECK(hsrc.config.shared_bytes() == qsrc.config.shared_bytes() + 2 * 64 * 64 * 2 + 2 * 64 * 2 * 2 + 2 * 64 * 68 * 4);
}

TEST_CASE("staged terms: spread KV rows only for a Col gradient and no other scatter", "[backward][codegen]") {
  auto spreads = [](const std::string& score_mod, const std::vector<std::string>& buffers, const std::vector<std::string>& grads) {
    Built b = build(score_mod, buffers, grads);
    return find_staged_terms(b.grad, b.ranges, VariantOptions{}).spreads_rows(b.grad.scatters.size());
  };
  CHECK(spreads(kSam, kSamBufs, {"rel_h", "rel_w"}));
  CHECK(spreads(kSam, kSamBufs, {"rel_w"}));
  CHECK(spreads("score + rel_w[b, h, q, kv % 64]", {"rel_w: bf16[B, H, Sq, 64]"}, {"rel_w"}));
  CHECK(!spreads(kSam, kSamBufs, {"rel_h"}));  // rel_h's gradient has no cross-CTA sum to save
  CHECK(!spreads(kSam, kSamBufs, {}));
  // Another learnable buffer: its scatter code assumes contiguous KV rows.
  std::vector<std::string> bufs = kSamBufs;
  bufs.push_back("slope: f32[H]");
  CHECK(!spreads(std::string(kSam) + " + slope[h] * (kv - q)", bufs, {"rel_h", "rel_w", "slope"}));
  CHECK(spreads(std::string(kSam) + " + slope[h] * (kv - q)", bufs, {"rel_h", "rel_w"}));  // a slope without gradient

  Built b = build(kSam, kSamBufs, {"rel_w"});
  BackwardKernelOptions bo;
  bo.head_dim = 64;
  bo.arch = "sm_90a";
  BackwardKernelSource src = backward_kernel_source(b.ir, b.grad, b.ranges, bo);
  REQUIRE(src.config.spread_rows);
  CHECK(src.module.source.find("static constexpr bool kStagedSpread = true;") != std::string::npos);
  // Four CTAs per started 512 KV rows, against one per 128 contiguous rows.
  CHECK(src.config.main_grid_x(4096) == 32);
  CHECK(src.config.main_grid_x(4097) == 36);
  CHECK(src.config.main_grid_x(100) == 4);
  BackwardKernelSource plain = backward_kernel_source(b.ir, b.grad, b.ranges, BackwardKernelOptions{.head_dim = 64, .arch = "sm_80"});
  CHECK(!plain.config.spread_rows);
  CHECK(plain.module.source.find("static constexpr bool kStagedSpread = false;") != std::string::npos);
  CHECK(plain.config.main_grid_x(4097) == 33);
}

namespace {

std::vector<std::string> staged_diag(const std::string& score_mod, const std::vector<std::string>& buffers,
                                     const std::vector<std::string>& grads = {}, const std::string& mask = "") {
  Built b = build(score_mod, buffers, grads, mask);
  return describe(b, find_staged_terms(b.grad, b.ranges, VariantOptions{}, /*diagonal=*/true));
}

const char* kRelBias = "score + bias[h, q - kv + Skv - 1]";
const std::vector<std::string> kRelBiasBufs = {"bias: f32[H, 8191]"};

}  // namespace

TEST_CASE("staged terms: a learnable relative bias is a diagonal band", "[backward][codegen]") {
  // Only when asked (the warp-specialised kernel's band), any float type, its gradient left to the diagonal scatter.
  CHECK(staged(kRelBias, kRelBiasBufs, {"bias"}).empty());
  CHECK(staged_diag(kRelBias, kRelBiasBufs, {"bias"}) == V{"diag:bias:-1"});
  CHECK(staged_diag(kRelBias, {"bias: bf16[H, 8191]"}) == V{"diag:bias:-1"});
  CHECK(staged_diag("score + bias[b, h, q - kv + 4095]", {"bias: f16[B, H, 8191]"}) == V{"diag:bias:-1"});
  CHECK(staged_diag("score + bias[h, min(max(q - kv, -64), 64) + 64]", {"bias: f32[H, 129]"}) == V{"diag:bias:-1"});
  Built b = build(kRelBias, kRelBiasBufs, {"bias"}, "q >= kv");
  StagedTerms t = find_staged_terms(b.grad, b.ranges, VariantOptions{}, true);
  CHECK(!t.residual);
  CHECK(!t.covers_scatter(0));
  // Not a function of q - kv alone, another load of it, a lead index on a position, or beside a Col / Tile term.
  CHECK(staged_diag("score + bias[h, q + kv]", {"bias: f32[H, 8192]"}).empty());
  CHECK(staged_diag("score + bias[h, q]", {"bias: f32[H, 4096]"}).empty());
  CHECK(staged_diag("score + bias[h, q - kv + Skv - 1] + bias[h, 0]", kRelBiasBufs).empty());
  CHECK(staged_diag("score + bias[q % 4, q - kv + Skv - 1]", {"bias: f32[4, 8191]"}).empty());
  CHECK(staged_diag("score + t[b, q - kv + 4095]", {"t: i32[B, 8191]"}).empty());
  CHECK(staged_diag(std::string(kRelBias) + " + rel_w[b, h, q, kv % 64]", {"bias: f32[H, 8191]", "rel_w: bf16[B, H, Sq, 64]"}) ==
        V{"col:rel_w:-1"});
  // A load the launch cannot prove in range stays generic.
  VariantOptions checked;
  checked.checked_loads = ~0ull;
  CHECK(find_staged_terms(b.grad, b.ranges, checked, true).terms.empty());
}

TEST_CASE("staged terms: the band goes with the warp-specialised kernel where its bytes fit", "[backward][codegen]") {
  Built b = build(kRelBias, kRelBiasBufs, {"bias"}, "q >= kv");
  BackwardKernelOptions bo;
  bo.head_dim = 128;
  bo.arch = "sm_90a";
  BackwardKernelSource src = backward_kernel_source(b.ir, b.grad, b.ranges, bo);
  CHECK(src.config.staged_diag);
  CHECK(src.config.warp_specialized);
  CHECK(src.module.key_text.find("_std_qb_ws") != std::string::npos);
  CHECK(src.module.source.find("static constexpr bool kStagedDiag = true;") != std::string::npos);
  CHECK(src.module.source.find("float staged_diag(const Params& p, int b, int h, int hkv, int d)") != std::string::npos);
  CHECK(src.module.source.find("kScatterClass[1] = {3 /* diagonal */}") != std::string::npos);
  // Two 192-float bands beside the module without it (no tensor maps: the 256-thread kernel, nothing staged).
  BackwardKernelOptions no_tma = bo;
  no_tma.tma_operands = false;
  BackwardKernelSource plain = backward_kernel_source(b.ir, b.grad, b.ranges, no_tma);
  CHECK(!plain.config.staged_diag);
  CHECK(!plain.config.warp_specialized);
  CHECK(plain.module.source.find("static constexpr bool kStagedDiag = false;") != std::string::npos);
  BackwardConfig unstaged = src.config;
  unstaged.staged_diag = false;
  CHECK(src.config.shared_bytes() == unstaged.shared_bytes() + 2 * 192 * 4);
  // Deterministic at D128: the fixed-point rows fill shared memory, so no band; at D64 it fits.
  BackwardKernelOptions det = bo;
  det.deterministic = true;
  CHECK(backward_staged_terms(b.grad, b.ranges, det).terms.empty());
  CHECK(backward_kernel_source(b.ir, b.grad, b.ranges, det).config.dq_bulk);
  det.head_dim = 64;
  CHECK(backward_kernel_source(b.ir, b.grad, b.ranges, det).config.staged_diag);
  // sm_80 and query-major modules stage nothing.
  BackwardKernelOptions a80 = bo, qm = bo;
  a80.arch = "sm_80";
  qm.query_major = true;
  CHECK(backward_staged_terms(b.grad, b.ranges, a80).terms.empty());
  CHECK(backward_staged_terms(b.grad, b.ranges, qm).terms.empty());
}
