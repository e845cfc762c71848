// The Hopper (sm_90a) forward main loop: wgmma on swizzled shared-memory tiles, two warpgroups.
#pragma once
#include "flex_forward.cuh"
#include "flex_staged_rows.cuh"
#include "flex_tma.cuh"
#include "flex_wgmma.cuh"

// Tile configuration (head dims up to 128; 192 and 256 keep the mma.sync loop of flex_forward.cuh):
//
//   kBlockM = 128 (the default): CTA = 2 warpgroups (8 warps, 256 threads); warpgroup w owns query rows
//   64w..64w+63 of the 128-row tile, so warp `warp` owns rows 16*warp..+15, exactly as the mma.sync loop's
//   8-warp configuration. kBlockM x kBlockN = 128 x 64 as on sm_80: block masks, the staging pass (SAM's kv // 64
//   per tile) and the host geometry are shared by both main loops.
//   kBlockM = 64: CTA = 1 warpgroup (4 warps, 128 threads), for data-dependent masks (compiler/codegen/
//   kernel_config.cpp says why). Three such CTAs share an SM at head dims 96 and 128 (more at 32 and 64), so one
//   CTA's prologue and epilogue run under the others' GEMMs, and a 64 x 64 block mask visits less of a document
//   mask's area than 128 x 64 (its ranked builder also shifts each query tile's KV tiles to its first kept column).
//   Shared memory: a Q region (the swizzled Q tile, at kBlockM = 128 later the O staging tile), then kKVStages
//   stages of {K, V} swizzled [64][D] tiles (K/V tile i + kLookahead is copied while tile i is consumed), or at
//   64 rows and head dims 96 and 128 a ring of three single K or V tiles (kTileRing), loaded by TMA (kTma) unless
//   the launch's strides have no tensor map.
//
// Per KV tile and warpgroup: S = Q K^T is D/16 wgmma m64n64k16 with both operands in shared memory (Q as a
// register operand measured 2% faster on full attention and 2% slower on causal, and at head dim 64, where
// S and P V are the same m64n64k16 shape, ptxas 13.0 gave the P fragments the live Q registers: wrong results);
// then score_mod / mask_mod / online softmax on the accumulators
// (the same code as the mma.sync loop: the wgmma accumulator layout per warp is the m16n8 C layout), and
// O += P V as 4 wgmma m64nDk16 with P packed in registers and V read MN-major. The P V of tile i runs on the
// tensor cores while the same warpgroup issues S of tile i + 1, and while the other warpgroup does its softmax.

// Widest swizzle whose row (kSwizzle / 2 elements) divides the head dim: 80 = 5 x 16 and 96 = 3 x 32 fit
// without padding.
template <int kHeadDim>
struct FlexSm90Swizzle {
  static constexpr int value = kHeadDim % 64 == 0 ? 128 : kHeadDim % 32 == 0 ? 64 : 32;
};

// The column GEMM (a variant with kColGemm, compiler/codegen/kernel_source.cpp): a score_mod summand
// buf[lead..., q, kv % 64] with bf16 elements (SAM's rel_w) is not added per element but by the tensor cores.
// With 64-column KV tiles, kv % 64 is the tile column j, so the term is C[q][j] for one [128 q][64] block C per
// CTA. S = Q K^T is accumulated on top of C (1 / scale) I: per 16 columns, one m64n16k16 wgmma with C's 16
// columns as A and a 16 x 16 diagonal matrix as B. The raw accumulator is then q.k + C / scale, and every later
// use multiplies it by scale. 1 / scale is written as kColGemmParts bf16 parts, one diagonal matrix and one wgmma
// each: one when 1 / scale is a bf16 value (scale 1/8 at head dim 64), else three (c0 + c1 + c2), so the product is
// exact to fp32. The host picks the count from the launch's scale (col_gemm_parts_for_scale): three cost SAM ViT-B
// 1.52 -> 1.69 ms, and a count decided in the kernel puts the wgmmas under a run-time condition (see the loop).
// Why: holding C in registers (a Col value per accumulator element) cost 32 registers at head dim 64, one CTA
// per SM instead of two, and two adds per element; the wgmmas add an eighth of the S GEMM's tensor work. The
// generator uses it up to head dim 64 only: where one CTA per SM remains, the extra wgmmas on each tile's S
// chain cost more than the adds (compiler/codegen/kernel_source.cpp has the figures).
// -inf in C (a masked element) would give 0 * -inf = NaN in every other column of its row, so the kernel
// replaces it by the lowest finite bf16, whose product with c0 >= 2 (scale <= 0.5, the host's rule) is -inf.
template <int kHeadDim_, class Element_, int kColGemmParts_ = 0, int kBlockM_ = 128, bool kTma_ = false, bool kStagedKvCols_ = false>
struct FlexForwardTraitsSm90 : FlexForwardTraits<kHeadDim_, kBlockM_, 64, kBlockM_ / 16, Element_> {
  using Base = FlexForwardTraits<kHeadDim_, kBlockM_, 64, kBlockM_ / 16, Element_>;
  static constexpr int kSwizzle = FlexSm90Swizzle<kHeadDim_>::value;
  using QTile = flex::SwizzledTile<kBlockM_, kHeadDim_, kSwizzle>;
  using KVTile = flex::SwizzledTile<64, kHeadDim_, kSwizzle>;
  static constexpr int kColGemmParts = kColGemmParts_;  // 0: no column GEMM
  static constexpr bool kColGemm = kColGemmParts > 0;
  using ColTile = flex::SwizzledTile<128, 64, 128>;  // the [128 q][64] block C (flex::staged_block_offset's layout)
  using DiagTile = flex::SwizzledTile<16, 16, 32>;   // one diagonal part of (1 / scale) I
  static constexpr int kDiagStride = 1024;          // bytes from one diagonal part to the next (aligned atoms)
  static constexpr int kColBytes = kColGemm ? ColTile::kBytes + kColGemmParts * kDiagStride : 0;
  // The column GEMM's point is two CTAs per SM (see above): without the bound ptxas took 132 registers. A
  // one-warpgroup CTA exists to share its SM.
  // One-warpgroup CTAs at head dims 96 and 128 keep K and V tiles in a ring of three single-tile slots (kTileRing,
  // see the mainloop) instead of {K, V} stages, so that three CTAs share an SM: 3 x (65 KB + the 1 KB the
  // hardware reserves per CTA) fits its 228 KB, and ptxas fits the loop in 168 registers without spills.
  static constexpr bool kTileRing = kBlockM_ == 64 && kHeadDim_ > 64;
  static constexpr int kMinBlocksPerSM = kTileRing ? 3 : kColGemm || kBlockM_ == 64 ? 2 : 1;
  static constexpr int kKVStages = kTileRing ? 0 : 4;  // {K, V} stages; kTileRing: 3 single-tile slots instead
  static constexpr int kLookahead = kTileRing ? 1 : 2;  // K/V tiles in flight beyond the one being consumed
  static constexpr int kOStageBytes = Base::kBlockM * Base::kSmemStride * 2;  // ForwardKernel::store_o_lse's layout
  // The O staging tile overlays Q at kBlockM = 128 and the first K/V stages at 64 (free once the last copy has
  // landed and the last P V retired), where the Q region's 1 KB of padding would cost the second CTA.
  static constexpr bool kOStageInKV = kBlockM_ == 64;
  static constexpr int kQRegionBytes =
      ((QTile::kBytes > kOStageBytes || kOStageInKV ? QTile::kBytes : kOStageBytes) + 1023) / 1024 * 1024;
  static constexpr int kStageBytes = 2 * KVTile::kBytes;  // K then V
  static constexpr int kOStageOffset = kOStageInKV ? kQRegionBytes + kColBytes : 0;  // from the aligned base
  // +1024: the dynamic shared memory base is rounded up to the 1024-byte alignment the swizzle needs.
  static constexpr int kKVBytes = kTileRing ? 3 * KVTile::kBytes : kKVStages * kStageBytes;
  // kTma (ring only): Q, K and V tiles are loaded by the TMA unit (one thread issues them) and complete on one
  // mbarrier per ring slot, after the K/V tiles. The launch passes the tensor maps (FlexForwardTmaMaps).
  static constexpr bool kTma = kTma_;
  static constexpr int kBarrierBytes = kTma ? 64 : 0;
  // kStagedKvCols (64 rows): the variant's per-column mask values (Variant::KvCol, at most 8 bytes) of two partial
  // tiles, the current one and the next, after the barriers.
  static constexpr bool kStagedKvCols = kStagedKvCols_;
  static constexpr int kKvColBytes = kStagedKvCols ? 2 * 64 * 8 : 0;
  static constexpr int kSmemBytes = kQRegionBytes + kColBytes + kKVBytes + kBarrierBytes + kKvColBytes + 1024;

  static_assert(kBlockM_ == 128 || kBlockM_ == 64, "FlexForwardTraitsSm90: one or two warpgroups of 64 query rows");
  static_assert(kBlockM_ == 128 || !kColGemm, "FlexForwardTraitsSm90: the column GEMM's block C has 128 rows");
  static_assert(!kTma || kTileRing, "FlexForwardTraitsSm90: TMA loads serve the ring of one-warpgroup CTAs");
  static_assert(!kStagedKvCols || kBlockM_ == 64, "FlexForwardTraitsSm90: staged mask columns serve the one-warpgroup loop");
  static_assert(kHeadDim_ <= 128, "FlexForwardTraitsSm90: head dims above 128 use the mma.sync loop (registers)");
  static_assert(kTileRing || kKVStages == kLookahead + 2,
                "FlexForwardTraitsSm90: a stage is refilled two tiles after its last reader's wait (see the mainloop)");
  static_assert(!kOStageInKV || kOStageBytes <= kKVBytes, "FlexForwardTraitsSm90: the O staging tile must fit the K/V stages");
  static_assert(kSmemBytes <= 232448, "FlexForwardTraitsSm90: shared memory exceeds the 227 KB an sm_90 block may opt into");
  static_assert(ColTile::kBytes % 1024 == 0 && DiagTile::kBytes <= kDiagStride, "FlexForwardTraitsSm90: column GEMM layout");
  static_assert(kColGemmParts == 0 || kColGemmParts == 1 || kColGemmParts == 3, "FlexForwardTraitsSm90: 1 or 3 parts of 1 / scale");
};

namespace flex {

// Whether a variant adds a bf16 column term by the tensor cores (kColGemm, with col_gemm_rows(vp, b, h, hkv)
// giving the term's rows).
template <class Variant, class = void>
struct HasColGemm {
  static constexpr bool value = false;
};
template <class Variant>
struct HasColGemm<Variant, decltype(void(Variant::kColGemm))> {
  static constexpr bool value = Variant::kColGemm;
};

// The kinds of KV tile the ring loop has a copy of its softmax and P V for (flex_forward_sm90, finish_tile).
constexpr int kTileInterior = 0, kTileMasked = 1, kTileBounds = 2;
template <int kKind>
struct TileKind {
  static constexpr int value = kKind;
};

// bf16 -inf (0xff80) in either half of a pair becomes the lowest finite bf16 (0xff7f).
__device__ __forceinline__ unsigned finite_bf16x2(unsigned w) {
  if ((w & 0xffffu) == 0xff80u) w = (w & 0xffff0000u) | 0xff7fu;
  if ((w >> 16) == 0xff80u) w = (w & 0xffffu) | 0xff7f0000u;
  return w;
}

// The diagonal parts of (1 / scale) I as DiagTiles at diag, diag + kDiagStride, ...: c0 = bf16(1 / scale), c1 and
// c2 (kParts = 3) the bf16 roundings of what is left. Threads 0 .. 32 kParts - 1 write
// one 16-byte chunk each (part t = tid / 32, row (tid % 32) / 2, chunk tid % 2).
template <class DiagTile, int kParts, int kDiagStride>
__device__ __forceinline__ void build_scale_diagonal(unsigned char* diag, float scale, int tid) {
  const float inv = 1.f / scale;
  unsigned short part[kParts];
  float rest = inv;
#pragma unroll
  for (int t = 0; t < kParts; ++t) {
    const __nv_bfloat16 c = __float2bfloat16_rn(rest);
    part[t] = __bfloat16_as_ushort(c);
    rest -= __bfloat162float(c);
  }
  if (tid < 32 * kParts) {
    const int t = tid / 32, row = (tid % 32) / 2, chunk = tid % 2;
    const int k = row - 8 * chunk;  // the diagonal element's column inside this chunk (none unless 0 .. 7)
    unsigned short c = part[0];     // part[t] and w[k / 2] by selects: no local-memory arrays indexed at run time
#pragma unroll
    for (int u = 1; u < kParts; ++u) c = t == u ? part[u] : c;
    const unsigned word = (unsigned)c << (16 * (k & 1));
    auto w = [&](int i) { return k >= 0 && k < 8 && k / 2 == i ? word : 0u; };
    *reinterpret_cast<uint4*>(diag + t * kDiagStride + DiagTile::chunk_offset(row, chunk)) = make_uint4(w(0), w(1), w(2), w(3));
  }
}

}  // namespace flex

// One CTA computes O and LSE for kBlockM query rows of one (b, h): the same contract, grid and block mask as
// flex_forward (flex_forward.cuh), block = Traits::kNThreads, dynamic shared memory = Traits::kSmemBytes.
// Traits::kTma: `tma` points at the launch's tensor maps (a __grid_constant__ parameter); else unused.
template <class Traits, class Variant, bool kVarlen = false, bool kRankTiles = false>
__device__ __forceinline__ void flex_forward_sm90(const FlexForwardParams& p, const typename Variant::Params& vp,
                                                  const FlexForwardTmaMaps* tma = nullptr) {
  using K = flex::ForwardKernel<Traits, Variant>;
  using Element = typename Traits::Element;
  using QTile = typename Traits::QTile;
  using KVTile = typename Traits::KVTile;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kNThreads = Traits::kNThreads;
  constexpr int kNTiles = Traits::kNTiles;
  constexpr int kDTiles = Traits::kDTiles;
  constexpr int kD16 = kHeadDim / 16;
  constexpr int kRowsPerThread = Traits::kRowsPerThread;
  constexpr int kColsPerThread = Traits::kColsPerThread;
  constexpr int kKVStages = Traits::kKVStages;
  constexpr int kLookahead = Traits::kLookahead;
  static_assert(Traits::kMTiles == 1 && kNTiles * 8 == 64, "flex_forward_sm90: one m16 row block per warp, 64-column S tiles");
  constexpr bool kColGemm = flex::HasColGemm<Variant>::value;
  using ColTile = typename Traits::ColTile;
  using DiagTile = typename Traits::DiagTile;

  extern __shared__ __align__(1024) unsigned char flex_smem_raw[];
  unsigned char* smem = flex_smem_raw + ((1024 - (flex::smem_addr(flex_smem_raw) & 1023)) & 1023);

  // ============================================ Prologue ============================================
  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  flex::ForwardTiles w;
  if (!flex::forward_tiles<kBlockM, kBlockN, Variant::kHasMaskMod, kVarlen, kRankTiles>(p, w)) return;
  const int b = w.b, h = w.h, hkv = w.hkv, m0 = w.m0;
  const int seqlen_q = w.seqlen_q, seqlen_kv = w.seqlen_kv;

  const Element* g_q = static_cast<const Element*>(p.q) + b * p.q_stride_b + h * p.q_stride_h + w.q_row0 * p.q_stride_s;
  const Element* g_k = static_cast<const Element*>(p.k) + b * p.k_stride_b + hkv * p.k_stride_h + w.kv_row0 * p.k_stride_s;
  const Element* g_v = static_cast<const Element*>(p.v) + b * p.v_stride_b + hkv * p.v_stride_h + w.kv_row0 * p.v_stride_s;

  const unsigned s_q = flex::smem_addr(smem);
  const unsigned s_col = s_q + Traits::kQRegionBytes;  // column GEMM: C, then the diagonal parts
  const unsigned s_diag = s_col + ColTile::kBytes;
  const unsigned s_kv = s_q + Traits::kQRegionBytes + Traits::kColBytes;
  auto k_stage = [&](int t) { return s_kv + (unsigned)((t % (kKVStages > 0 ? kKVStages : 1)) * Traits::kStageBytes); };
  constexpr bool kTileRing = Traits::kTileRing;
  constexpr bool kTma = Traits::kTma;
  static_assert(!kTma || !kVarlen, "flex_forward_sm90: the tensor maps describe dense [B, H, S, D] tensors");
  // kTileRing: the K and V tiles of iteration it take slots 2 it % 3 and (2 it + 1) % 3 of a three-slot ring;
  // ring_k is the slot of K of the current iteration.
  auto ring_slot = [&](int slot) { return s_kv + (unsigned)(slot * KVTile::kBytes); };
  int ring_k = 0;
  // kTma: slot s's mbarrier completes once per fill (Q lands with the first K, on slot 0's); bit s of ring_phase is
  // the parity of its next phase.
  const unsigned s_bars = s_kv + Traits::kKVBytes;
  auto ring_bar = [&](int slot) { return s_bars + 8u * (unsigned)slot; };
  unsigned ring_phase = 0;
  auto ring_wait = [&](int slot) {
    flex::mbarrier_wait(ring_bar(slot), (ring_phase >> slot) & 1u);
    ring_phase ^= 1u << slot;
  };
  auto tma_kv = [&](const FlexTensorMap* map, int slot, int row0) {
    flex::mbarrier_arrive_expect_tx(ring_bar(slot), KVTile::kBytes);
    flex::tma_load_tile<KVTile>(ring_slot(slot), map, ring_bar(slot), row0, hkv, b);
  };

  const int n_masked = w.n_partial;
  const int n_tiles = w.count();
  // Data-dependent masks (kRankTiles): the KV tile indices come from the lists one iteration before they are
  // needed, so no copy and no hoist waits on a global load (the first from the ranked order itself). idx[u] is
  // the tile of iteration it + u, clamped to the last one. Other kernels read w.at() where they use it.
  // H100, documents: D128 0.226 -> 0.221 ms, D64 0.139 -> 0.136; not at D32, where its 18 registers cost the
  // fourth CTA per SM (0.102 -> 0.112).
  constexpr bool kIndexRing = kRankTiles && kHeadDim >= 64 && kHeadDim != 96;
  auto tile_of = [&](int t) { return w.at(min(t, n_tiles - 1)); };
  int idx[3] = {0, 0, 0};
  if (kIndexRing && n_tiles > 0) idx[0] = w.first(), idx[1] = tile_of(1), idx[2] = tile_of(2);
  auto kv_tile = [&](int it, int u) { return kIndexRing ? idx[u] : w.at(it + u); };
  // A ranked mask's tiles may start off the multiples of kBlockN (ForwardTiles::kv_shift).
  const int kv_shift = kRankTiles ? w.kv_shift : 0;
  auto kv_row = [&](int it, int u) { return kv_tile(it, u) * kBlockN + kv_shift; };
  auto load_k = [&](unsigned dst, int row0) {
    flex::load_swizzled_rows<KVTile, kBlockN, kNThreads>(dst, g_k, p.k_stride_s, row0, seqlen_kv, tid);
  };
  auto load_v = [&](unsigned dst, int row0) {
    flex::load_swizzled_rows<KVTile, kBlockN, kNThreads>(dst, g_v, p.v_stride_s, row0, seqlen_kv, tid);
  };
  auto load_kv = [&](int it, int u) {
    const int row0 = kv_row(it, u);
    load_k(k_stage(it + u), row0);
    load_v(k_stage(it + u) + KVTile::kBytes, row0);
  };

  // Copy groups: {Q, KV 0}, then one group per K/V tile, kLookahead tiles ahead (empty groups keep the count).
  // kTileRing: {Q, K 0}, {V 0}, then one group per K tile and one per V tile. kTma: thread 0 issues the same
  // tiles to the TMA unit (none when the query tile visits no KV tile: nothing may land after the CTA exits).
  if constexpr (kTma) {
    if (tid == 0) {
#pragma unroll
      for (int slot = 0; slot < 3; ++slot) flex::mbarrier_init(ring_bar(slot), 1);
      flex::fence_mbarrier_init();
    }
    __syncthreads();
    if (tid == 0 && n_tiles > 0) {
      flex::mbarrier_arrive_expect_tx(ring_bar(0), QTile::kBytes + KVTile::kBytes);
      flex::tma_load_tile<QTile>(s_q, &tma->q, ring_bar(0), m0, h, b);
      flex::tma_load_tile<KVTile>(ring_slot(0), &tma->k, ring_bar(0), kv_row(0, 0), hkv, b);
      tma_kv(&tma->v, 1, kv_row(0, 0));
    }
  } else {
    flex::load_swizzled_rows<QTile, kBlockM, kNThreads>(s_q, g_q, p.q_stride_s, m0, seqlen_q, tid);
  }
  if constexpr (kColGemm) {
    flex::load_staged_block<kBlockM, kNThreads>(smem + Traits::kQRegionBytes, s_col, Variant::col_gemm_rows(vp, b, h, hkv), m0, seqlen_q,
                                                tid);
    flex::build_scale_diagonal<DiagTile, Traits::kColGemmParts, Traits::kDiagStride>(
        smem + Traits::kQRegionBytes + ColTile::kBytes, p.scale, tid);
  }
  if constexpr (kTileRing && !kTma) {
    if (n_tiles > 0) load_k(ring_slot(0), kv_row(0, 0));
    flex::cp_async_commit();
    if (n_tiles > 0) load_v(ring_slot(1), kv_row(0, 0));
    flex::cp_async_commit();
  } else if constexpr (!kTileRing) {
#pragma unroll
    for (int t = 0; t < kLookahead; ++t) {
      if (t < n_tiles) load_kv(0, t);
      flex::cp_async_commit();
    }
  }

  // Staged mask columns (a variant with kStagedKvCols): the KvCol values of partial tile t sit in slot t % 2, one per
  // column, written by threads 0 .. 63 (thread j: column j). Tile 0's here, tile it + 1's during iteration it (loaded
  // at its top, stored after its S wait, so the load's latency hides under the S GEMM); each iteration's first
  // barrier publishes them and retires the readers of the slot. H100, documents D128: the per-element doc[kv]
  // loads took 16 global loads and their 64-bit addresses per thread and partial tile.
  constexpr bool kStageCols = flex::StagedKvCols<Variant>::value;
  static_assert(kStageCols == Traits::kStagedKvCols, "flex_forward_sm90: the traits' staged-column region must match the variant");
  using KvCol = typename K::KvCol;
  static_assert(!kStageCols || sizeof(KvCol) <= 8, "flex_forward_sm90: a KvCol slot holds 8 bytes");
  KvCol* const kv_cols =
      reinterpret_cast<KvCol*>(smem + Traits::kQRegionBytes + Traits::kColBytes + Traits::kKVBytes + Traits::kBarrierBytes);
  auto col_staged = [&](int t, int col_k0) { return kStageCols && tid < kBlockN && t < n_masked && col_k0 + tid < seqlen_kv; };
  if constexpr (kStageCols) {
    if (n_tiles > 0 && col_staged(0, kv_row(0, 0))) {
      KvCol c;
      Variant::kv_col(vp, c, b, h, hkv, kv_row(0, 0), tid);
      kv_cols[tid] = c;
    }
  }

  // Hoisted variant state, while the copies fly.
  typename Variant::Row row_st[kRowsPerThread];
  typename Variant::Col col_st[kRowsPerThread][kColsPerThread];
  // Per-tile state without a branch (hoist_tile_clamped) at head dims 96 and up, which run one CTA per SM anyway:
  // SAM at D128 1.69 -> 1.53 ms, rel_h alone 1.48 -> 1.39 (H100, same run). At D64 the clamped form needs 141
  // registers for rel_h alone and loses the second CTA per SM (1.25 -> 1.71 ms); SAM D64 (capped at 128) is unchanged.
  constexpr bool kClampedHoist = kHeadDim >= 96;
  K::template hoist_rows<kClampedHoist>(vp, row_st, col_st, b, h, hkv, m0, warp, lane, seqlen_q, seqlen_kv);

  float acc_o[1][kDTiles][4];
#pragma unroll
  for (int dt = 0; dt < kDTiles; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc_o[0][dt][e] = 0.f;
  float(&o_flat)[kHeadDim / 2] = reinterpret_cast<float(&)[kHeadDim / 2]>(acc_o);
  float row_max[kRowsPerThread];
  float row_sum[kRowsPerThread];
#pragma unroll
  for (int r = 0; r < kRowsPerThread; ++r) {
    row_max[r] = K::initial_row_max();
    row_sum[r] = 0.f;
  }
  const float mult = K::exp2_mult(p.scale);
  const bool q_tail = m0 + kBlockM > seqlen_q;

  const int wg_row0 = (warp / 4) * 64;  // the warpgroup's first Q row: the A rows of its S wgmma

  // Per-tile variant state is computed two tiles ahead: its loads (SAM's rel_h[b, h, q, kv // 64]) then have two
  // iterations to land instead of stalling the softmax of a short wgmma iteration (one tile ahead: SAM D64 1.51 ms,
  // D128 1.74; two: 1.48, 1.68).
  typename Variant::Tile tile_next[kRowsPerThread], tile_next2[kRowsPerThread];
  if (n_tiles > 0) K::hoist_tile(vp, row_st, tile_next, b, h, hkv, m0, kv_row(0, 0), warp, lane, seqlen_q, seqlen_kv);
  if (n_tiles > 1) K::hoist_tile(vp, row_st, tile_next2, b, h, hkv, m0, kv_row(0, 1), warp, lane, seqlen_q, seqlen_kv);

  if constexpr (kColGemm) {
    // C has landed with Q (the oldest copy group); each thread rewrites the chunks it copied, -inf made finite
    // (see the traits). The first iteration's proxy fence and barrier publish them to the wgmmas.
    flex::cp_async_wait<kLookahead - 1>();
    for (int i = tid; i < kBlockM * 8; i += kNThreads) {
      uint4* chunk = reinterpret_cast<uint4*>(smem + Traits::kQRegionBytes + flex::staged_block_offset(i / 8, i % 8));
      uint4 v = *chunk;
      v.x = flex::finite_bf16x2(v.x), v.y = flex::finite_bf16x2(v.y), v.z = flex::finite_bf16x2(v.z), v.w = flex::finite_bf16x2(v.w);
      *chunk = v;
    }
  }

  // ============================================ Mainloop ============================================
  // A stage is refilled at the barrier two iterations after its tile was consumed: every thread passing the
  // barrier of iteration it has finished iteration it - 1, whose wgmma_wait<0> retired the P V of tile it - 2.
  // kTileRing: two barriers per iteration. At the first, every warp has retired the P V of tile it - 1, so K of
  // tile it + 1 takes the slot of V of tile it - 1; at the second, every warp has retired S of tile it, so V of
  // tile it + 1 takes the slot of K of tile it. Each copy gets one iteration to land, and the S GEMM waits for
  // the previous P V within the CTA (the other CTAs on the SM keep the tensor cores busy meanwhile).
  for (int it = 0; it < n_tiles; ++it) {
    const int k0 = kv_row(it, 0);
    const int idx_after = kIndexRing ? tile_of(it + 3) : 0;  // idx[2] of the next iteration
    KvCol col_next;
    bool stage_next = false;
    if constexpr (kStageCols) {
      const int next_k0 = kv_row(it, 1);
      stage_next = col_staged(it + 1, next_k0);
      if (stage_next) Variant::kv_col(vp, col_next, b, h, hkv, next_k0, tid);
    }
    typename Variant::Tile tile_st[kRowsPerThread];
#pragma unroll
    for (int r = 0; r < kRowsPerThread; ++r) tile_st[r] = tile_next[r], tile_next[r] = tile_next2[r];
    if constexpr (kClampedHoist)
      K::hoist_tile_clamped(vp, row_st, tile_next2, b, h, hkv, m0, (kIndexRing ? idx[2] : tile_of(it + 2)) * kBlockN + kv_shift, warp, lane, seqlen_q);
    else if (it + 2 < n_tiles)
      K::hoist_tile(vp, row_st, tile_next2, b, h, hkv, m0, kv_row(it, 2), warp, lane, seqlen_q, seqlen_kv);

    if constexpr (kTma) {
      flex::wgmma_wait<0>();  // P V of tile it - 1
      flex::fence_operands(o_flat);
      ring_wait(ring_k);  // K of tile it has landed
      __syncthreads();
      if (tid == 0 && it + 1 < n_tiles) tma_kv(&tma->k, ring_k == 0 ? 2 : ring_k - 1, kv_row(it, 1));
    } else if constexpr (kTileRing) {
      flex::wgmma_wait<0>();  // P V of tile it - 1
      flex::fence_operands(o_flat);
      flex::cp_async_wait<1>();  // K of tile it has landed (V of tile it may still fly)
      flex::fence_proxy_async();
      __syncthreads();
      if (it + 1 < n_tiles) load_k(ring_slot(ring_k == 0 ? 2 : ring_k - 1), kv_row(it, 1));
      flex::cp_async_commit();
    } else {
      flex::cp_async_wait<kLookahead - 1>();  // tile it has landed (tile it + 1 may still fly)
      flex::fence_proxy_async();              // cp.async wrote through the generic proxy; wgmma reads through the async one
      __syncthreads();
      if (it + kLookahead < n_tiles) load_kv(it, kLookahead);
      flex::cp_async_commit();
    }

    const unsigned sk = kTileRing ? ring_slot(ring_k) : k_stage(it);
    const unsigned sv = kTileRing ? ring_slot(ring_k == 2 ? 0 : ring_k + 1) : sk + KVTile::kBytes;

    // S = Q @ K^T   (per warpgroup: [64 x kBlockN], fp32)
    float acc_s[1][kNTiles][4];
    float(&s_flat)[kNTiles * 4] = reinterpret_cast<float(&)[kNTiles * 4]>(acc_s);
    flex::wgmma_fence();
    if constexpr (kColGemm) {
      // C (1 / scale) I first: columns 16 jj .. 16 jj + 15 of S get C's same columns, once per diagonal part; Q K^T
      // then accumulates onto them. ptxas serialises every wgmma of the kernel when one sits under a run-time
      // condition (C7520: hence the compile-time part count) or when these follow Q K^T (C7511).
#pragma unroll
      for (int jj = 0; jj < kBlockN / 16; ++jj)
#pragma unroll
        for (int t = 0; t < Traits::kColGemmParts; ++t)
          flex::Wgmma<16>::template ss<__nv_bfloat16, /*kTransA=*/0, /*kTransB=*/0>(
              reinterpret_cast<float(&)[8]>(s_flat[8 * jj]), flex::desc_k_major<ColTile>(s_col, wg_row0, 16 * jj),
              flex::desc_k_major<DiagTile>(s_diag + t * Traits::kDiagStride, 0, 0), t > 0 ? 1 : 0);
    }
    // Descriptors of the k-steps from one per operand (desc_advance): rebuilding each cost about 14 instructions
    // per wgmma.
    const unsigned long long desc_q = flex::desc_k_major<QTile>(s_q, wg_row0, 0), desc_k = flex::desc_k_major<KVTile>(sk, 0, 0);
#pragma unroll
    for (int kk = 0; kk < kD16; ++kk)
      flex::Wgmma<kBlockN>::template ss<Element, /*kTransA=*/0, /*kTransB=*/0>(
          s_flat, flex::desc_advance(desc_q, flex::k_major_offset<QTile>(kk * 16)),
          flex::desc_advance(desc_k, flex::k_major_offset<KVTile>(kk * 16)), (kColGemm || kk > 0) ? 1 : 0);
    flex::wgmma_commit();
    flex::wgmma_wait<0>();  // S of this tile and P V of the previous one
    flex::fence_operands(s_flat);
    flex::fence_operands(o_flat);
    if constexpr (kStageCols) {
      if (stage_next) kv_cols[((it + 1) & 1) * kBlockN + tid] = col_next;
    }
    if constexpr (kTma) {
      ring_wait(ring_k == 2 ? 0 : ring_k + 1);  // V of tile it has landed
      __syncthreads();
      if (tid == 0 && it + 1 < n_tiles) tma_kv(&tma->v, ring_k, kv_row(it, 1));
      ring_k = ring_k == 0 ? 2 : ring_k - 1;
    } else if constexpr (kTileRing) {
      flex::cp_async_wait<1>();  // V of tile it has landed (K of tile it + 1 may still fly)
      flex::fence_proxy_async();
      __syncthreads();
      if (it + 1 < n_tiles) load_v(ring_slot(ring_k), kv_row(it, 1));
      flex::cp_async_commit();
      ring_k = ring_k == 0 ? 2 : ring_k - 1;
    }

    // The rest of the iteration. In the ring loop (64 rows, head dims 96 and 128) one copy per kind of tile
    // (kTileInterior: no mask_mod, kTileMasked: mask_mod, kTileBounds: the tile crosses Sq or Skv): with one copy
    // ptxas kept S and P V's A fragments in the same registers and, to merge with the masked path's results, moved
    // all 32 S values of a thread on every tile the mask left alone (H100 SASS, documents D128). Elsewhere one copy:
    // the copies made the 128-row loop and the 64-row loop at head dims 32 and 64 no faster.
    auto finish_tile = [&](auto kind) {
      constexpr int kKind = decltype(kind)::value;
      // S = mask(score_mod(scale * S)); -inf outside [0, Sq) x [0, Skv)
      if constexpr (kKind == flex::kTileBounds)
        K::mods(acc_s, it < n_masked, true, vp, row_st, col_st, tile_st, b, h, hkv, m0, warp, lane, k0, seqlen_q, seqlen_kv, p.scale,
                kv_cols + (it & 1) * kBlockN);
      else if constexpr (kKind == flex::kTileMasked)
        K::template apply_mods</*kPartial=*/true, /*kCheckBounds=*/false>(acc_s, vp, row_st, col_st, tile_st, b, h, hkv, m0, warp, lane, k0,
                                                                        seqlen_q, seqlen_kv, p.scale, kv_cols + (it & 1) * kBlockN);
      else if constexpr (Variant::kHasScoreMod)
        K::template apply_mods</*kPartial=*/false, /*kCheckBounds=*/false>(acc_s, vp, row_st, col_st, tile_st, b, h, hkv, m0, warp, lane, k0,
                                                                         seqlen_q, seqlen_kv, p.scale);

      float alpha[kRowsPerThread];
      float max_scaled[kRowsPerThread];
      const bool rescale = K::softmax_rescale(acc_s, row_max, row_sum, mult, max_scaled, alpha);
      if (__any_sync(0xffffffffu, rescale)) {
#pragma unroll
        for (int dt = 0; dt < kDTiles; ++dt)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc_o[0][dt][e] *= alpha[e / 2];
      }

      // O += P @ V: P packed into the A fragments of 4 k-steps of 16 KV rows; left running on the tensor cores.
      unsigned pa[kBlockN / 16][4];
      // One exponential in four on the FMA pipe (exp_pack's kFmaShare) relieves MUFU in the 128-row loop at D128; the
      // 64-row loop is bound by instruction issue instead, where the polynomial's extra instructions cost 2% (documents).
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) K::template exp_pack<kHeadDim == 128 && kBlockM == 128>(acc_s, 0, kk, mult, max_scaled, row_sum, pa[kk]);
      flex::wgmma_fence();
      const unsigned long long desc_v = flex::desc_mn_major<KVTile>(sv, 0, 0);
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk)
        flex::Wgmma<kHeadDim>::template rs<Element, /*kTransB=*/1>(o_flat, pa[kk],
                                                                    flex::desc_advance(desc_v, flex::mn_major_offset<KVTile>(kk * 16, 0)), 1);
      flex::wgmma_commit();
    };
    if constexpr (!kTileRing) {
      // The same steps written out, not through finish_tile: the lambda renumbers the PTX's registers, and ptxas then
      // allocated the 128-row loop differently (causal 0.7% slower on the H100, six interleaved rounds).
      K::mods(acc_s, it < n_masked, q_tail || k0 + kBlockN > seqlen_kv, vp, row_st, col_st, tile_st, b, h, hkv, m0, warp, lane, k0,
              seqlen_q, seqlen_kv, p.scale);
      float alpha[kRowsPerThread];
      float max_scaled[kRowsPerThread];
      const bool rescale = K::softmax_rescale(acc_s, row_max, row_sum, mult, max_scaled, alpha);
      if (__any_sync(0xffffffffu, rescale)) {
#pragma unroll
        for (int dt = 0; dt < kDTiles; ++dt)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc_o[0][dt][e] *= alpha[e / 2];
      }
      unsigned pa[kBlockN / 16][4];
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) K::template exp_pack<kHeadDim == 128 && kBlockM == 128>(acc_s, 0, kk, mult, max_scaled, row_sum, pa[kk]);
      flex::wgmma_fence();
      const unsigned long long desc_v = flex::desc_mn_major<KVTile>(sv, 0, 0);
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk)
        flex::Wgmma<kHeadDim>::template rs<Element, /*kTransB=*/1>(o_flat, pa[kk],
                                                                    flex::desc_advance(desc_v, flex::mn_major_offset<KVTile>(kk * 16, 0)), 1);
      flex::wgmma_commit();
    } else if (q_tail || k0 + kBlockN > seqlen_kv) {
      finish_tile(flex::TileKind<flex::kTileBounds>{});
    } else if (Variant::kHasMaskMod && it < n_masked) {
      finish_tile(flex::TileKind<flex::kTileMasked>{});
    } else {
      finish_tile(flex::TileKind<flex::kTileInterior>{});
    }
    if constexpr (kIndexRing) idx[0] = idx[1], idx[1] = idx[2], idx[2] = idx_after;
  }
  flex::wgmma_wait<0>();
  flex::fence_operands(o_flat);

  // ============================================ Epilogue ============================================
  float lse[kRowsPerThread];
  K::normalize(acc_o, row_max, row_sum, K::score_unit(p.scale), lse);
  // O is staged (in the Q region at 128 rows, over the K/V stages at 64) once every copy has landed and every
  // warpgroup's last wgmma has read its operands.
  flex::cp_async_wait<0>();
  __syncthreads();
  // The 64-row loop's CTAs are short, so its epilogue counts: fixed store offsets (store_o_lse says why only here).
  K::template store_o_lse</*kFixedOffsets=*/kBlockM == 64>(p, smem + Traits::kOStageOffset, acc_o, lse, b, h, m0, seqlen_q,
                                                            kVarlen ? p.cu_seqlens_q[b] : 0, tid, warp, lane);
}
