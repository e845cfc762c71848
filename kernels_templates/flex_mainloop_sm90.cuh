// The Hopper (sm_90a) forward mainloop: a producer warp streams Q, K and V by TMA through mbarrier rings (load()),
// and consumer warpgroups run S = Q K^T and O += P V on wgmma with the mods and the online softmax between (mma()).
#pragma once
#include "flex_mods.cuh"
#include "flex_sm90_pipeline.cuh"
#include "flex_softmax.cuh"
#include "flex_tile_policy.cuh"
#include "flex_tile_scheduler.cuh"
#include "flex_wgmma.cuh"

// Compile-time geometry of one warp-specialised forward kernel, all of it read off the policy (flex_tile_policy.cuh).
template <int kHeadDim_, class Element_, class Variant_>
struct FlexSm90Traits {
  using Element = Element_;
  using Variant = Variant_;
  static constexpr FlexForwardPolicy kPolicy =
      flex_forward_policy_sm90(kHeadDim_, FlexVariantFeatures{Variant::kHasScoreMod, Variant::kHasMaskMod, Variant::kTileAligned, Variant::kDataDependentMask,
                                                     Variant::kColumnState, Variant::kFixedMax, Variant::kElementLoads});
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kTileD = kPolicy.tile_head_dim;
  static constexpr int kBlockM = kPolicy.block_m;
  static constexpr int kBlockN = kPolicy.block_n;
  static constexpr int kStages = kPolicy.stages;
  static constexpr int kNThreads = kPolicy.threads;
  static constexpr int kMinBlocksPerSM = kPolicy.min_blocks_per_sm;
  static constexpr int kConsumerWarpgroups = kPolicy.consumer_warpgroups;
  static constexpr int kConsumerThreads = 128 * kConsumerWarpgroups;
  static constexpr int kConsumerWarps = kConsumerThreads / 32;
  static constexpr int kNTiles = kBlockN / 8;  // n8 blocks of a warp's rows of S
  static constexpr int kDTiles = kTileD / 8;   // n8 blocks of a warp's rows of O
  using QTile = flex::SwizzledTile<kBlockM, kTileD, kPolicy.swizzle_bytes>;
  using KVTile = flex::SwizzledTile<kBlockN, kTileD, kPolicy.swizzle_bytes>;

  // Shared memory, from a 1024-byte aligned base (the swizzle's period): Q, the K ring, the V ring, then 256 bytes of
  // mbarriers: Q's, the K ring's full and empty ones, the V ring's, and the work queue (flex::WorkQueue).
  static constexpr int kQOffset = 0;
  static constexpr int kKOffset = kQOffset + QTile::kBytes;
  static constexpr int kVOffset = kKOffset + kStages * KVTile::kBytes;
  static constexpr int kBarOffset = kVOffset + kStages * KVTile::kBytes;
  static constexpr int kWorkQueueOffset = kBarOffset + 8 + 32 * kStages;
  static constexpr int kSmemBytes = kBarOffset + 256 + 1024;

  // Named barriers (0 is __syncthreads): the producer waits on kBarQueryEmpty until every consumer warpgroup has run
  // its last S GEMM of a work tile (Q may then be overwritten); consumer warpgroup w waits on kBarTurn + w for its
  // turn to issue GEMMs (ping-pong).
  static constexpr int kBarQueryEmpty = 1;
  static constexpr int kBarTurn = 2;

  static_assert(kSmemBytes == kPolicy.smem_bytes, "FlexSm90Traits: the policy's shared memory must match the layout");
  static_assert(kSmemBytes <= 232448, "FlexSm90Traits: shared memory exceeds the 227 KB an sm_90 block may opt into");
  static_assert(QTile::kBytes % 1024 == 0 && KVTile::kBytes % 1024 == 0, "FlexSm90Traits: tiles must keep the 1024-byte swizzle alignment");
  static_assert(kWorkQueueOffset + flex::WorkQueue::kBytes <= kBarOffset + 256,
                "FlexSm90Traits: the mbarriers and the work queue must fit their 256 bytes");
  static_assert(kBlockM == 64 * kConsumerWarpgroups, "FlexSm90Traits: each consumer warpgroup owns 64 query rows");
  static_assert(kBlockN % 16 == 0 && kBlockN <= 256, "FlexSm90Traits: KV tiles are whole 16-row P V k-steps and one wgmma wide");
  static_assert(!Variant::kTileAligned || kBlockN % Variant::kTileCols == 0,
                "FlexSm90Traits: a variant with per-tile state needs KV tiles at multiples of its tile columns");
  static_assert(kConsumerWarpgroups == 2 || !kPolicy.pingpong, "FlexSm90Traits: ping-pong alternates two consumer warpgroups");
  // The launch gives every thread the __launch_bounds__ cap (65536 / threads, rounded down to 8); setmaxnreg.inc
  // waits until the CTA's own pool has the registers, so a split over that total would hang the kernel.
  static_assert(kPolicy.producer_regs * 128 + kPolicy.consumer_regs * kConsumerThreads <= (65536 / kNThreads) / 8 * 8 * kNThreads,
                "FlexSm90Traits: the register split must fit the CTA's launch allocation");
  static_assert(kPolicy.producer_regs % 8 == 0 && kPolicy.consumer_regs % 8 == 0 && kPolicy.producer_regs >= 24 && kPolicy.consumer_regs <= 256,
                "FlexSm90Traits: setmaxnreg takes multiples of 8 in [24, 256]");
};

namespace flex {

template <class Traits, bool kVarlen>
struct MainloopSm90 {
  using Element = typename Traits::Element;
  using Variant = typename Traits::Variant;
  using VParams = typename Variant::Params;
  using QTile = typename Traits::QTile;
  using KVTile = typename Traits::KVTile;
  using Pipe = TmaPipeline<Traits::kStages>;
  using State = PipelineState<Traits::kStages>;
  using Mods = FragmentMods<Variant, 1, Traits::kNTiles>;
  using SoftmaxT = Softmax<Variant, Element, 1, Traits::kNTiles>;
  static constexpr int kBlockN = Traits::kBlockN;
  static constexpr int kNTiles = Traits::kNTiles;
  static constexpr int kDTiles = Traits::kDTiles;
  static constexpr int kQSteps = Traits::kTileD / 16;  // k-steps of S = Q K^T
  static constexpr int kPSteps = kBlockN / 16;         // k-steps of O += P V
  static constexpr bool kPingpong = Traits::kPolicy.pingpong;
  static constexpr int kQueryEmptyThreads = Traits::kConsumerThreads + 32;  // the consumers and the producer warp
  static constexpr bool kFmaShare = Traits::kPolicy.exp_on_fma;

  unsigned base;  // the aligned shared-memory base
  Pipe k_pipe, v_pipe;

  __device__ __forceinline__ explicit MainloopSm90(unsigned smem_base) : base(smem_base) {
    k_pipe.bars = base + Traits::kBarOffset + 8;
    v_pipe.bars = k_pipe.bars + 16 * Traits::kStages;
  }
  __device__ __forceinline__ unsigned q_full() const { return base + Traits::kBarOffset; }
  __device__ __forceinline__ unsigned q_smem() const { return base + Traits::kQOffset; }
  __device__ __forceinline__ unsigned k_smem(int stage) const { return base + Traits::kKOffset + (unsigned)(stage * KVTile::kBytes); }
  __device__ __forceinline__ unsigned v_smem(int stage) const { return base + Traits::kVOffset + (unsigned)(stage * KVTile::kBytes); }

  // One thread, then fence_mbarrier_init and a CTA barrier.
  __device__ __forceinline__ void init_barriers() const {
    mbarrier_init(q_full(), 1);
    k_pipe.init(Traits::kConsumerWarps);
    v_pipe.init(Traits::kConsumerWarps);
  }

  // ============================================ Producer ============================================
  // The producer warp's part of one work tile (every lane calls it; `leader` issues the copies). Order: K of the
  // first KV tile (its ring slot may free before Q's buffer does), Q once the consumers are done with the previous
  // work tile's, then K of tile t with V of tile t - 1, as the consumers use them (S of the next tile is issued
  // before P V of the current one), and V of the last tile.
  __device__ __forceinline__ void load(const FlexForwardTmaMaps& tma, const ForwardTiles& w, State& k_st, State& v_st, bool leader) const {
    const int n = w.count();
    if (n == 0) return;
    // Ragged batches address rows of the packed [total, H, D] tensors (the maps' batch dimension is 1).
    const int batch = kVarlen ? 0 : w.b;
    auto kv_row = [&](int t) { return (int)w.kv_row0 + w.at(t) * kBlockN; };
    auto load_kv = [&](const FlexTensorMap* map, const Pipe& pipe, State& st, unsigned smem, int row) {
      if (leader) tma_load_tile<KVTile>(smem, map, pipe.producer_acquire(st, KVTile::kBytes), row, w.hkv, batch);
      st.advance();
    };
    int row = kv_row(0);
    load_kv(&tma.k, k_pipe, k_st, k_smem(k_st.index), row);
    __syncwarp();  // the leader rejoins the warp: a named barrier counts whole warps
    named_barrier_sync(Traits::kBarQueryEmpty, kQueryEmptyThreads);
    if (leader) {
      mbarrier_arrive_expect_tx(q_full(), QTile::kBytes);
      tma_load_tile<QTile>(q_smem(), &tma.q, q_full(), (int)w.q_row0 + w.m0, w.h, batch);
    }
    for (int t = 1; t < n; ++t) {
      const int next = kv_row(t);
      load_kv(&tma.k, k_pipe, k_st, k_smem(k_st.index), next);
      load_kv(&tma.v, v_pipe, v_st, v_smem(v_st.index), row);
      row = next;
    }
    load_kv(&tma.v, v_pipe, v_st, v_smem(v_st.index), row);
  }

  // ============================================ Consumers ============================================
  // Before the first work tile: Q's buffer counts as free, and consumer warpgroup 0 has the first turn.
  __device__ __forceinline__ void consumer_init(int wg) const {
    named_barrier_arrive(Traits::kBarQueryEmpty, kQueryEmptyThreads);
    if (kPingpong && wg == 0) named_barrier_arrive(Traits::kBarTurn, 2 * 128);
  }
  // Ping-pong: wait for this warpgroup's turn to issue GEMMs; hand the turn to the other one.
  __device__ __forceinline__ void turn_wait(int wg) const {
    if constexpr (kPingpong) named_barrier_sync(Traits::kBarTurn + wg, 2 * 128);
  }
  __device__ __forceinline__ void turn_pass(int wg) const {
    if constexpr (kPingpong) named_barrier_arrive(Traits::kBarTurn + (wg ^ 1), 2 * 128);
  }

  // S = Q @ K^T  (this warpgroup's 64 rows x kBlockN, fp32), issued and committed, not waited for.
  __device__ __forceinline__ void issue_qk(float (&s)[1][kNTiles][4], int wg, unsigned k_tile) const {
    float(&s_flat)[kNTiles * 4] = reinterpret_cast<float(&)[kNTiles * 4]>(s);
    // Descriptors of the k-steps from one per operand (desc_advance): rebuilding each costs about 14 instructions.
    const unsigned long long desc_q = desc_k_major<QTile>(q_smem(), wg * 64, 0), desc_k = desc_k_major<KVTile>(k_tile, 0, 0);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kQSteps; ++kk)
      Wgmma<kBlockN>::template ss<Element, /*kTransA=*/0, /*kTransB=*/0>(s_flat, desc_advance(desc_q, k_major_offset<QTile>(kk * 16)),
                                                                        desc_advance(desc_k, k_major_offset<KVTile>(kk * 16)), kk > 0 ? 1 : 0);
    wgmma_commit();
  }

  // O += P @ V with P in registers (A fragments of kPSteps k-steps) and V read MN-major; issued and committed.
  __device__ __forceinline__ void issue_pv(float (&o)[1][kDTiles][4], const unsigned (&pa)[kPSteps][4], unsigned v_tile) const {
    float(&o_flat)[kDTiles * 4] = reinterpret_cast<float(&)[kDTiles * 4]>(o);
    const unsigned long long desc_v = desc_mn_major<KVTile>(v_tile, 0, 0);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kPSteps; ++kk)
      Wgmma<Traits::kTileD>::template rs<Element, /*kTransB=*/1>(o_flat, pa[kk], desc_advance(desc_v, mn_major_offset<KVTile>(kk * 16, 0)), 1);
    wgmma_commit();
  }

  // Waits for every GEMM this warpgroup issued (P V), whose accumulators O then become readable.
  __device__ __forceinline__ static void wait_pv(float (&o)[1][kDTiles][4]) {
    wgmma_wait<0>();
    fence_operands(reinterpret_cast<float(&)[kDTiles * 4]>(o));
  }

  // One consumer warpgroup's 64 rows of a work tile with at least one KV tile: accumulates O (zeroed by the caller)
  // and the softmax state. wg: the consumer warpgroup; warp: the consumer warp (0 .. kConsumerWarps - 1).
  // Per KV tile t after the first (intra-warpgroup overlap): issue S(t) and then P V(t - 1), hand the turn on, wait for
  // S(t) and run the mods and the softmax of tile t while P V(t - 1) runs on the tensor cores (and the other
  // warpgroup's GEMMs after it), then wait for P V(t - 1) before O is rescaled and P(t) packed over P(t - 1).
  __device__ __forceinline__ void mma(const VParams& vp, const ForwardTiles& w, const ScoreFactors& f,
                                      State& k_st, State& v_st, unsigned& q_phase, float (&o)[1][kDTiles][4], SoftmaxT& softmax, int wg,
                                      int warp, int lane) const {
    const int n = w.count();
    Mods mods;
    mods.hoist_rows(vp, w.b, w.h, w.hkv, w.m0 + warp * 16, lane, w.seqlen_q, w.seqlen_kv, w.q_pos0, w.kv_pos0);
    if constexpr (Variant::kRowTerms) mods.row_terms(vp, w.b, w.h, w.hkv, softmax.lse_shift);
    auto mods_and_softmax = [&](float(&s)[1][kNTiles][4], int t, int k0, float(&alpha)[2]) {
      mods.run(s, t < w.n_partial, k0 + kBlockN > w.seqlen_kv, vp, w.b, w.h, w.hkv, k0, lane, w.seqlen_kv, f.score_scale);
      const bool jumped = softmax.update_max(s, alpha);
#pragma unroll
      for (int kk = 0; kk < kPSteps; ++kk) softmax.template exp_kstep<kFmaShare>(s, 0, kk);
      return jumped;
    };
    auto pack = [&](const float(&s)[1][kNTiles][4], unsigned(&pa)[kPSteps][4]) {
#pragma unroll
      for (int kk = 0; kk < kPSteps; ++kk) SoftmaxT::pack_kstep(s, 0, kk, pa[kk]);
    };

    float s[1][kNTiles][4];
    unsigned pa[kPSteps][4];
    float alpha[2];
    mbarrier_wait(q_full(), q_phase);
    q_phase ^= 1u;

    // The first KV tile: S, its softmax and P; nothing to overlap with yet.
    int k0 = w.at(0) * kBlockN;
    mods.hoist_tile(vp, w.b, w.h, w.hkv, k0, w.seqlen_kv);
    k_pipe.consumer_wait(k_st);
    issue_qk(s, wg, k_smem(k_st.index));
    wgmma_wait<0>();
    fence_operands(reinterpret_cast<float(&)[kNTiles * 4]>(s));
    k_pipe.consumer_release(k_st, lane);
    mods_and_softmax(s, 0, k0, alpha);
    pack(s, pa);

    for (int t = 1; t < n; ++t) {
      k0 = w.at(t) * kBlockN;
      mods.hoist_tile(vp, w.b, w.h, w.hkv, k0, w.seqlen_kv);  // its loads fly under the GEMMs
      k_pipe.consumer_wait(k_st);
      turn_wait(wg);
      issue_qk(s, wg, k_smem(k_st.index));
      v_pipe.consumer_wait(v_st);
      issue_pv(o, pa, v_smem(v_st.index));
      turn_pass(wg);
      wgmma_wait<1>();  // S(t)
      fence_operands(reinterpret_cast<float(&)[kNTiles * 4]>(s));
      k_pipe.consumer_release(k_st, lane);
      const bool jumped = mods_and_softmax(s, t, k0, alpha);
      // P V(t - 1) must complete before O is rescaled and P(t) packed over P(t - 1). The wait sits behind the branch on
      // the rescale vote: ptxas hoists a wgmma wait to the top of its basic block, and in the softmax's block it would
      // wait for P V(t - 1) before the softmax, so no exponential would overlap the GEMM.
      if (SoftmaxT::warp_jumped(jumped)) {
        wait_pv(o);
        softmax.scale_o(o, alpha);
      }
      wait_pv(o);  // returns at once after the branch's wait
      v_pipe.consumer_release(v_st, lane);
      pack(s, pa);
    }

    // Every S GEMM of this warpgroup has completed: the producer may load the next work tile's Q.
    named_barrier_arrive(Traits::kBarQueryEmpty, kQueryEmptyThreads);
    v_pipe.consumer_wait(v_st);
    issue_pv(o, pa, v_smem(v_st.index));
    wait_pv(o);
    v_pipe.consumer_release(v_st, lane);
  }
};

}  // namespace flex
