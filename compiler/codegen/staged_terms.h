// Additive terms of a score_mod that the Hopper KV-major backward kernel reads per query tile from shared memory
// instead of per element from global memory, and whose gradients it reduces itself: SAM's decomposed
// relative-position bias, score + rel_h[b, h, q, kv // 64] + rel_w[b, h, q, kv % 64].
//
// Why: in the KV-major kernel a thread's KV rows are fixed and its query columns change every tile, so each
// such load is a gather with 64-bit index arithmetic per element (SAM's backward cost 2.6 ms over plain
// attention at ViT-B size), and rel_w's gradient, summed over every KV tile of a row, had to go to a second,
// query-major pass. A query tile's rel_w[q0 .. q0 + 63][0 .. 63] is a contiguous 8 KB block and its rel_h
// values are two per row: both are copied asynchronously next to Q and dO, and the gradients leave the CTA as
// one block of vector atomics (rel_w) and one plain sum per row (rel_h, owned by one warpgroup).
//
// A learnable relative bias `bias[h, q - kv + Skv - 1]` is a third kind, Diag: a (query tile, KV block) pair
// touches only the 191 entries of its diagonals, which the warp-specialised kernel's producer warp copies into the
// tile's ring slot next to lse2 and delta, so each element reads shared memory at a constant offset from one base
// instead of computing its index and gathering from global memory (18 loads per thread and tile after CSE). Its
// gradient stays the generic diagonal scatter.
#pragma once
#include <optional>
#include <vector>

#include "compiler/codegen/codegen_cuda.h"
#include "compiler/passes/autodiff.h"

namespace flexjit {

// The tile width the kernel stages for (a warpgroup's KV rows in flex_backward_sm90.cuh): kv % 64 is the row
// inside the warpgroup, kv // 64 is constant over it.
inline constexpr int kStagedTermTile = 64;

enum class StagedKind {
  Col,   // buf[lead..., q, kv % 64]: one [64 q][64] block per query tile
  Tile,  // buf[lead..., q, kv // 64]: one value per query row and warpgroup
  Diag,  // buf[lead..., f(q - kv)]: one band of 191 values per (query tile, KV block)
};
const char* staged_kind_name(StagedKind k);

struct StagedTerm {
  StagedKind kind;
  int buffer;           // spec buffer index
  ir::Expr load;        // the Load node (a summand of the score_mod)
  int scatter = -1;     // index into ScoreModGradient::scatters of its gradient, -1 when none is required
                        // (Diag: always -1, its gradient is the generic diagonal scatter's)
};

struct StagedTerms {
  std::vector<StagedTerm> terms;  // at most one of each kind; empty: nothing staged
  ir::Expr residual;              // the score_mod without the terms (null: the score itself, no score_mod left)
  const StagedTerm* find(StagedKind k) const;
  // Whether scatter `i` of the gradient is one of the terms' (the kernel reduces it, not the scatter code).
  bool covers_scatter(int i) const;
  // Whether the Hopper backward spreads each CTA's KV rows over eight kv // 64 blocks (flex_backward_staged.cuh):
  // a Col term with a gradient, and no scatter of the gradient's `num_scatters` but the terms'.
  bool spreads_rows(size_t num_scatters) const;
};

// The terms of grad.score_mod the kernel can stage under `options` (its checked-load bits). A summand qualifies
// when it is `+ buf[lead..., q, kv % 64]` or `+ buf[lead..., q, kv // 64]` with a 2-byte float buffer (bf16,
// f16), lead indices that use neither q nor kv nor the score, a load emitted unchecked (indices proven in
// range, or proven by a launch-time obligation that held), no other load of the buffer (the same load in
// mask_mod is fine: the mask keeps its own read),
// and, when the buffer requires a gradient, its single scatter is that load with coefficient 1. With `diagonal`, a
// summand `+ buf[lead..., f(q - kv)]` of any float buffer (q and kv only through q - kv, the same lead-index and
// single-load rules) qualifies as Diag, unless a Col or Tile term is found too (the kernels stage one or the
// other). Anything else stays in the residual and goes through the generic code.
StagedTerms find_staged_terms(const ScoreModGradient& grad, const RangeInfo& ranges, const VariantOptions& options, bool diagonal = false);

}  // namespace flexjit
