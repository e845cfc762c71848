// The backward policy (kernels_templates/flex_backward_policy.cuh) over every head dim, both main kernels and every
// feature set a module can have: its tiles must fit the kernels' warp layouts and shared memory, and its dQ choices
// the kernels' static_asserts, before NVRTC ever compiles a module that meets them.
#include <catch2/catch.hpp>

#include <set>

#include "compiler/codegen/backward_source.h"
#include "dsl/spec.h"
#include "kernels_templates/flex_backward_params.cuh"
#include "kernels_templates/flex_backward_policy.cuh"

namespace {

// Staged terms exist only in the wgmma kernel's atomic (not query-major) modules; spread rows and gradients need a
// staged term, and the kv // 64 term's gradient needs that term.
std::vector<FlexBackwardFeatures> all_features(int kind) {
  std::vector<FlexBackwardFeatures> out;
  for (int bits = 0; bits < 1024; ++bits) {
    FlexBackwardFeatures f{};
    f.query_major = bits & 1;
    f.deterministic = bits & 2;
    f.bf16 = bits & 4;
    f.d_score_is_one = bits & 8;
    f.diagonal_scatter = bits & 16;
    f.staged_col = bits & 32;
    f.staged_tile = bits & 64;
    f.staged_grad = bits & 128;
    f.tile_term_grad = bits & 256;
    f.spread_rows = bits & 512;
    const bool staged = f.staged_col || f.staged_tile;
    if (staged && (kind != kFlexBackwardWgmma || f.query_major)) continue;
    if ((f.staged_grad || f.spread_rows) && !staged) continue;
    if (f.tile_term_grad && !(f.staged_tile && f.staged_grad)) continue;
    out.push_back(f);
  }
  return out;
}

}  // namespace

TEST_CASE("the backward kernel kind: wgmma on sm_90a, above head dim 128 only where the split form applies", "[codegen][policy]") {
  for (int d : flexjit::dsl::supported_head_dims()) {
    CHECK(flex_backward_kind(false, d) == kFlexBackwardMmaSync);
    CHECK(flex_backward_kind(true, d) == kFlexBackwardWgmma);
    CHECK(flex_backward_kind(true, d, /*split_ok=*/false) == (d <= 128 ? kFlexBackwardWgmma : kFlexBackwardMmaSync));
  }
}

TEST_CASE("the backward policy fits the kernels' warp layouts and shared memory at every head dim", "[codegen][policy]") {
  constexpr int kSm90MaxDynamicShared = 227 * 1024;
  for (int d : flexjit::dsl::supported_head_dims()) {
    for (bool hopper : {false, true}) {
      const int kind = flex_backward_kind(hopper, d);
      for (FlexBackwardFeatures f : all_features(kind)) {
        // Above head dim 128 the wgmma kind is the head-dim split form: TMA operands, warp-specialised (dQ in it or by
        // the query-major pass), no staged terms (none are found there); without tensor maps those head dims take
        // mma.sync (flex_backward_kind's split_ok).
        const bool split = kind == kFlexBackwardWgmma && d > 128;
        if (split && (f.staged_col || f.staged_tile)) continue;
        f.tma_operands = split;
        INFO("head dim " << d << ", kind " << kind << ", query-major " << f.query_major << ", deterministic " << f.deterministic
                         << ", bf16 " << f.bf16 << ", staged col / tile / grad / spread " << f.staged_col << f.staged_tile << f.staged_grad
                         << f.spread_rows);
        const FlexBackwardPolicy p = flex_backward_policy(kind, d, f);
        // FlexBackwardTraits: warps tile the KV rows in 16-row groups and dQ's query rows evenly.
        CHECK(p.warps * 32 == 256);
        CHECK(p.warps % (p.block_n / 16) == 0);
        CHECK(p.warps % (p.block_m / 16) == 0);
        CHECK((p.stages == 1 || p.stages == 2));
        CHECK(p.qmajor_block_m == 16 * p.qmajor_warps);
        CHECK(p.head_group >= 1);
        CHECK(p.smem_bytes <= kSm90MaxDynamicShared);
        if (kind == kFlexBackwardWgmma) {
          // flex_bwd_sm90::Smem: 64 x 128 tiles (64 x 64 above 128, the warp-specialised split form), 1024-byte
          // aligned tiles, at least two swizzle regions per row; the stages the kernel's Smem takes.
          CHECK(p.block_m == 64);
          CHECK(p.block_n == (split ? 64 : 128));
          CHECK(p.stages == flex_backward_stages(p, p.dq_bulk, f.deterministic));
          if (split) {
            CHECK(p.producer);
            CHECK(d / 2 % (p.swizzle_bytes / 2) == 0);  // the dK / dV split on a swizzle region boundary
          }
          CHECK(d * 2 / p.swizzle_bytes >= 2);
          CHECK(p.block_m * d * 2 % 1024 == 0);
          CHECK((!p.dq_bulk || !f.query_major));
          CHECK((!p.grad_gemm || (f.spread_rows && f.bf16 && f.d_score_is_one)));
          CHECK((!p.two_ds || (p.producer && !split && !f.split_scatter)));
        } else {
          CHECK_FALSE(p.two_ds);
          CHECK_FALSE(p.dq_bulk);
          CHECK_FALSE(p.grad_gemm);
          CHECK_FALSE(p.producer);
        }
        // The host's geometry is the policy's (its stages are those of a module without bulk dQ rows).
        flexjit::BackwardConfig c = flexjit::backward_config(d, hopper ? "sm_90a" : "sm_80");
        CHECK(c.block_m == p.block_m);
        CHECK(c.block_n == p.block_n);
        CHECK(c.stages == flex_backward_stages(p, false, false));
        CHECK(c.hopper == (kind == kFlexBackwardWgmma));
      }
    }
  }
}

TEST_CASE("the backward policy's dQ choices: bulk rows from head dim 96, fixed-point bulk rows when deterministic", "[codegen][policy]") {
  FlexBackwardFeatures plain{};
  plain.bf16 = true;
  plain.d_score_is_one = true;
  CHECK(flex_backward_policy(kFlexBackwardWgmma, 128, plain).dq_bulk);
  CHECK(flex_backward_policy(kFlexBackwardWgmma, 96, plain).dq_bulk);
  CHECK_FALSE(flex_backward_policy(kFlexBackwardWgmma, 64, plain).dq_bulk);
  FlexBackwardFeatures bias = plain;
  bias.diagonal_scatter = true;
  // A diagonal scatter keeps the float4 atomics in the 256-thread kernel (no tensor maps) and takes the rows in the
  // warp-specialised one.
  CHECK_FALSE(flex_backward_policy(kFlexBackwardWgmma, 128, bias).dq_bulk);
  FlexBackwardFeatures bias_ws = bias;
  bias_ws.tma_operands = true;
  CHECK(flex_backward_policy(kFlexBackwardWgmma, 128, bias_ws).producer);
  CHECK(flex_backward_policy(kFlexBackwardWgmma, 128, bias_ws).dq_bulk);
  // Deterministic: fixed-point rows at every head dim, with a diagonal scatter too, and they keep dQ KV-major.
  FlexBackwardFeatures det = plain;
  det.deterministic = true;
  for (int d : {32, 64, 80, 96, 128}) {
    INFO("head dim " << d);
    CHECK(flex_backward_policy(kFlexBackwardWgmma, d, det).dq_bulk);
    CHECK_FALSE(flex_backward_prefers_query_major(kFlexBackwardWgmma, d, det, false));
  }
  FlexBackwardFeatures det_bias = bias;
  det_bias.deterministic = true;
  CHECK(flex_backward_policy(kFlexBackwardWgmma, 128, det_bias).dq_bulk);
  // Unpadded rows: fp32 ones are 512 bytes at D128, fixed-point ones 1024: the host's count follows.
  CHECK(flex_backward_policy(kFlexBackwardWgmma, 128, det).smem_bytes - flex_backward_policy(kFlexBackwardWgmma, 128, plain).smem_bytes ==
        64 * (1024 - 512));
  CHECK_FALSE(flex_backward_prefers_query_major(kFlexBackwardMmaSync, 128, det, false));
  CHECK_FALSE(flex_backward_prefers_query_major(kFlexBackwardWgmma, 128, plain, false));
  // SAM at D64 keeps its fixed-point rows next to the staged tiles; at D128 they do not fit, and the query-major pass
  // takes dQ.
  FlexBackwardFeatures sam = det;
  sam.staged_col = sam.staged_tile = sam.staged_grad = sam.tile_term_grad = sam.spread_rows = true;
  CHECK(flex_backward_policy(kFlexBackwardWgmma, 64, sam).dq_bulk);
  CHECK_FALSE(flex_backward_prefers_query_major(kFlexBackwardWgmma, 64, sam, true));
  CHECK_FALSE(flex_backward_policy(kFlexBackwardWgmma, 128, sam).dq_bulk);
  CHECK(flex_backward_prefers_query_major(kFlexBackwardWgmma, 128, sam, true));
  sam.deterministic = false;
  CHECK(flex_backward_policy(kFlexBackwardWgmma, 64, sam).grad_gemm);
  sam.bf16 = false;
  CHECK_FALSE(flex_backward_policy(kFlexBackwardWgmma, 64, sam).grad_gemm);
}

TEST_CASE("the backward policy's split form (head dims 192, 256): stages and dQ rows in 227 KB", "[codegen][policy]") {
  FlexBackwardFeatures plain{};
  plain.bf16 = plain.d_score_is_one = plain.tma_operands = true;
  FlexBackwardFeatures det = plain;
  det.deterministic = true;
  struct Expect {
    int head_dim;
    bool deterministic, dq_bulk;
    int stages;
  };
  // fp32 rows fit beside two stages at D192 (48 KB); fixed-point rows take one stage at D192 (96 KB) and do not fit at
  // D256 (128 KB), where fixed-point atomics remain; D256 keeps fp32 atomics: its fp32 rows would cost a Q / dO
  // stage, which measured slower (docs/notes/BACKWARD_SM90.md).
  for (const Expect& e : {Expect{192, false, true, 2}, Expect{192, true, true, 1}, Expect{256, true, false, 2}, Expect{256, false, false, 2}}) {
    INFO("head dim " << e.head_dim << ", deterministic " << e.deterministic);
    const FlexBackwardPolicy p = flex_backward_policy(kFlexBackwardWgmma, e.head_dim, e.deterministic ? det : plain);
    CHECK(p.dq_bulk == e.dq_bulk);
    CHECK(p.stages == e.stages);
    CHECK(p.smem_bytes <= 227 * 1024);
  }
  // Without bulk rows both head dims keep two stages: K, V, Q and dO x 2, P^T, dS^T and 5 KB.
  CHECK(flex_backward_stages(flex_backward_policy(kFlexBackwardWgmma, 256, plain), false, false) == 2);
  CHECK(flex_backward_stages(flex_backward_policy(kFlexBackwardMmaSync, 256, plain), false, false) == 1);
  // Deterministic dQ: the query-major pass takes it at both (at D192 instead of fixed-point rows with one stage, at
  // D256 instead of fixed-point atomics per element), and the split form, still warp-specialised, skips it.
  CHECK(flex_backward_prefers_query_major(kFlexBackwardWgmma, 192, det, false));
  CHECK(flex_backward_prefers_query_major(kFlexBackwardWgmma, 256, det, false));
  CHECK_FALSE(flex_backward_prefers_query_major(kFlexBackwardWgmma, 256, plain, false));
  FlexBackwardFeatures det_qm = det;
  det_qm.query_major = true;
  const FlexBackwardPolicy qm = flex_backward_policy(kFlexBackwardWgmma, 256, det_qm);
  CHECK(qm.producer);
  CHECK_FALSE(qm.dq_bulk);
  CHECK(qm.stages == 2);
}

TEST_CASE("the backward policy's warp specialisation: Hopper modules without staged terms whose operands have tensor maps",
          "[codegen][policy]") {
  FlexBackwardFeatures plain{};
  plain.bf16 = true;
  plain.d_score_is_one = true;
  plain.tma_operands = true;
  for (int d : {32, 64, 80, 96, 128}) {
    INFO("head dim " << d);
    for (bool det : {false, true}) {
      FlexBackwardFeatures f = plain;
      f.deterministic = det;
      const FlexBackwardPolicy p = flex_backward_policy(kFlexBackwardWgmma, d, f);
      CHECK(p.producer);
      // The mbarriers live in the tile-class cache: warp specialisation costs no shared memory but its second dS^T
      // tile's, so the deterministic rows keep fitting at D128.
      f.tma_operands = false;
      CHECK(flex_backward_policy(kFlexBackwardWgmma, d, f).smem_bytes + (p.two_ds ? p.block_n * p.block_m * 2 : 0) == p.smem_bytes);
      CHECK(p.dq_bulk == (det || d >= 96));
    }
  }
  FlexBackwardFeatures f = plain;
  f.tma_operands = false;
  CHECK_FALSE(flex_backward_policy(kFlexBackwardWgmma, 128, f).producer);
  f = plain;
  f.diagonal_scatter = true;  // a learnable bias: its reductions meet at the consumers' named barrier
  CHECK(flex_backward_policy(kFlexBackwardWgmma, 128, f).producer);
  // Staged terms: warp-specialised without gradients, or with gradients by selector GEMMs (spread rows, bf16, both
  // terms learnable); the planes and slabs of the other staged gradients need the 256-thread form's barriers.
  f = plain;
  f.staged_col = f.staged_tile = true;
  CHECK(flex_backward_policy(kFlexBackwardWgmma, 64, f).producer);
  f.staged_grad = f.spread_rows = f.tile_term_grad = true;
  CHECK(flex_backward_policy(kFlexBackwardWgmma, 64, f).grad_gemm);
  CHECK(flex_backward_policy(kFlexBackwardWgmma, 64, f).producer);
  f.deterministic = true;  // deterministic too
  CHECK(flex_backward_policy(kFlexBackwardWgmma, 64, f).producer);
  f.deterministic = false;
  f.tile_term_grad = false;  // rel_w's gradient alone: the slabs
  CHECK_FALSE(flex_backward_policy(kFlexBackwardWgmma, 64, f).producer);
  f.tile_term_grad = true;
  f.bf16 = false;  // fp16: the slabs' fp32 sums
  CHECK_FALSE(flex_backward_policy(kFlexBackwardWgmma, 64, f).producer);
  f = plain;
  f.staged_col = f.staged_tile = f.staged_grad = true;  // rel_h's gradient without spread rows: the planes
  f.tile_term_grad = true;
  CHECK_FALSE(flex_backward_policy(kFlexBackwardWgmma, 64, f).producer);
  f = plain;
  f.query_major = true;
  CHECK_FALSE(flex_backward_policy(kFlexBackwardWgmma, 128, f).producer);
  CHECK_FALSE(flex_backward_policy(kFlexBackwardMmaSync, 128, plain).producer);
  CHECK_FALSE(flex_backward_policy(kFlexBackwardMmaSync, 256, plain).producer);
}

TEST_CASE("two dS^T tiles in the warp-specialised kernel where they fit, the blocks and dQ rows first, never with a split scatter",
          "[codegen][policy]") {
  FlexBackwardFeatures plain{};
  plain.bf16 = plain.d_score_is_one = plain.tma_operands = true;
  for (int d : {32, 64, 80, 96, 128}) {
    INFO("head dim " << d);
    const FlexBackwardPolicy p = flex_backward_policy(kFlexBackwardWgmma, d, plain);
    CHECK(p.two_ds);
    CHECK(p.smem_bytes <= kSm90MaxDynamicShared);
    FlexBackwardFeatures bias = plain;
    bias.split_scatter = bias.diagonal_scatter = true;
    CHECK_FALSE(flex_backward_policy(kFlexBackwardWgmma, d, bias).two_ds);
  }
  // The fixed-point dQ rows at D128 leave no room; the 256-thread form and the split form keep one tile.
  FlexBackwardFeatures det = plain;
  det.deterministic = true;
  const FlexBackwardPolicy d128 = flex_backward_policy(kFlexBackwardWgmma, 128, det);
  CHECK((d128.dq_bulk && !d128.two_ds));
  FlexBackwardFeatures no_maps = plain;
  no_maps.tma_operands = false;
  CHECK_FALSE(flex_backward_policy(kFlexBackwardWgmma, 128, no_maps).two_ds);
  CHECK_FALSE(flex_backward_policy(kFlexBackwardWgmma, 256, plain).two_ds);
  CHECK_FALSE(flex_backward_policy(kFlexBackwardMmaSync, 128, plain).two_ds);
  // SAM's deterministic blocks keep their place at every head dim they fit.
  FlexBackwardFeatures sam = det;
  sam.staged_col = sam.staged_tile = sam.staged_grad = sam.tile_term_grad = sam.spread_rows = true;
  for (int d : {32, 64, 80}) {
    const FlexBackwardPolicy p = flex_backward_policy(kFlexBackwardWgmma, d, sam);
    CHECK(flex_backward_staged_blocks(p, sam, p.dq_bulk, p.grad_gemm));
  }
}

TEST_CASE("deterministic staged gradients leave as blocks where the blocks fit", "[codegen][policy]") {
  FlexBackwardFeatures sam{};
  sam.bf16 = sam.d_score_is_one = sam.tma_operands = sam.deterministic = true;
  sam.staged_col = sam.staged_tile = sam.staged_grad = sam.tile_term_grad = sam.spread_rows = true;
  for (int d : {32, 64, 80}) {
    INFO("head dim " << d);
    const FlexBackwardPolicy p = flex_backward_policy(kFlexBackwardWgmma, d, sam);
    REQUIRE((p.producer && p.grad_gemm && p.dq_bulk));
    CHECK(flex_backward_staged_blocks(p, sam, p.dq_bulk, p.grad_gemm));
    CHECK(p.smem_bytes == flex_backward_smem_bytes_without_blocks(p, sam, p.dq_bulk, p.grad_gemm) + kFlexBackwardStagedBlockBytes);
    CHECK(p.smem_bytes <= kSm90MaxDynamicShared);
  }
  // At head dim 96 they do not fit beside the fixed-point dQ rows, which stay (and keep dQ KV-major).
  const FlexBackwardPolicy d96 = flex_backward_policy(kFlexBackwardWgmma, 96, sam);
  CHECK(d96.dq_bulk);
  CHECK_FALSE(flex_backward_staged_blocks(d96, sam, d96.dq_bulk, d96.grad_gemm));
  CHECK_FALSE(flex_backward_prefers_query_major(kFlexBackwardWgmma, 96, sam, true));
  // Float atomics add vectors instead; without tensor maps the 256-thread form keeps the per-element atomics.
  FlexBackwardFeatures fp32 = sam;
  fp32.deterministic = false;
  const FlexBackwardPolicy nd = flex_backward_policy(kFlexBackwardWgmma, 64, fp32);
  CHECK_FALSE(flex_backward_staged_blocks(nd, fp32, nd.dq_bulk, nd.grad_gemm));
  FlexBackwardFeatures no_maps = sam;
  no_maps.tma_operands = false;
  const FlexBackwardPolicy nm = flex_backward_policy(kFlexBackwardWgmma, 64, no_maps);
  CHECK_FALSE(flex_backward_staged_blocks(nm, no_maps, nm.dq_bulk, nm.grad_gemm));
}

TEST_CASE("the blocked accumulator layout is a permutation with one contiguous run per query tile and slice", "[codegen][policy]") {
  for (long long rows : {1, 13, 64, 77, 128, 290}) {
    for (long long cols : {8, 16, 64, 80}) {
      for (int w : {8, 16}) {
        if (cols % w != 0) continue;
        INFO("rows " << rows << ", cols " << cols << ", slices of " << w);
        const long long base = 3 * rows * cols;  // a lead index's matrix
        std::set<long long> seen;
        for (long long r = 0; r < rows; ++r)
          for (int c = 0; c < cols; ++c) seen.insert(flex_bwd::blocked_index(rows, cols, w, base, r, c));
        CHECK(seen.size() == static_cast<size_t>(rows * cols));
        CHECK(*seen.begin() == base);
        CHECK(*seen.rbegin() == base + rows * cols - 1);
        // What one bulk reduction covers: query tile m0's first v rows of slice s, row-major.
        for (long long m0 = 0; m0 < rows; m0 += 64)
          for (int s = 0; s < cols / w; ++s) {
            const long long start = flex_bwd::blocked_index(rows, cols, w, base, m0, s * w);
            const long long v = rows - m0 < 64 ? rows - m0 : 64;
            bool run = true;
            for (long long i = 0; i < v; ++i)
              for (int k = 0; k < w; ++k) run = run && flex_bwd::blocked_index(rows, cols, w, base, m0 + i, s * w + k) == start + i * w + k;
            CHECK(run);
          }
      }
    }
  }
}
