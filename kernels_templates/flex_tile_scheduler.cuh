// The forward kernels' work: which (b, h, query tile) a linear work index is, in what order the launch takes them,
// and which KV tiles each visits (from the block mask).
#pragma once
#include "flex_params.cuh"
#include "flex_sm90_pipeline.cuh"

namespace flex {

// The work of one query tile: its (b, h, query tile), sequence lengths, row offsets of a ragged batch, and the KV
// tiles to visit in order (partial tiles, which run mask_mod, first; then full ones).
struct ForwardTiles {
  int b, h, hkv, m_block, m0, seqlen_q, seqlen_kv;
  long long q_row0, kv_row0;  // first row of this sequence in packed (ragged) tensors; 0 when dense
  int q_pos0, kv_pos0;        // the positions the mods see for query row 0 and KV row 0 (a shard's offsets; else 0)
  const int* partial_idx;
  const int* full_idx;
  int n_partial, n_full;
  __device__ __forceinline__ int count() const { return n_partial + n_full; }
  __device__ __forceinline__ int at(int t) const {
    if (t < n_partial) return partial_idx != nullptr ? partial_idx[t] : t;
    return full_idx != nullptr ? full_idx[t - n_partial] : t - n_partial;
  }
};

// The order of a launch's work: work index t = ((b x head groups + group) x query tiles + rank) x heads in the group
// + head in the group. Heads go in groups of kHeadGroup so that the K/V of the heads in flight stay in L2 while
// every query tile of the group runs; within a group the heaviest query tiles come first (the reversed tile index,
// which is heaviest under causal-like masks, or the block mask's ranked order for data-dependent masks, whose
// heavy tiles sit anywhere), so that the last work of the launch is its lightest.
// kBlockN: the KV tile the block mask (or, without one, the kernel) uses.
template <int kBlockM, int kBlockN, bool kHasMaskMod, bool kVarlen>
struct TileScheduler {
  static constexpr int kHeadGroup = 8;

  __device__ __forceinline__ static int query_tiles(const FlexForwardParams& p) { return (p.seqlen_q + kBlockM - 1) / kBlockM; }
  __device__ __forceinline__ static int num_work(const FlexForwardParams& p) { return p.batch * p.heads * query_tiles(p); }

  // Fills w for work index t; false when a ragged batch's query tile lies past its sequence's end (no work).
  __device__ __forceinline__ static bool work(const FlexForwardParams& p, int t, ForwardTiles& w) {
    const int nq = query_tiles(p);
    const int per_batch = p.heads * nq;
    w.b = t / per_batch;
    const int in_batch = t - w.b * per_batch;
    const int group = in_batch / (kHeadGroup * nq);
    const int i = in_batch - group * (kHeadGroup * nq);
    const int group_heads = min(kHeadGroup, p.heads - group * kHeadGroup);
    const int rank = i / group_heads;
    w.h = group * kHeadGroup + (i - rank * group_heads);
    w.hkv = p.heads == p.kv_heads ? w.h : w.h / (p.heads / p.kv_heads);
    const FlexBlockMask& bm = p.block_mask;
    const long long mask_row = (long long)w.b * bm.stride_b + (long long)w.h * bm.stride_h;
    if (!kVarlen && bm.q_order != nullptr) {
      const int4 e = __ldg(reinterpret_cast<const int4*>(bm.q_order + mask_row + rank));
      w.m_block = e.x;
      w.n_partial = e.y;
      w.n_full = e.z;
      w.partial_idx = bm.kv_partial_idx + (mask_row + w.m_block) * bm.max_kv_tiles;
      w.full_idx = bm.kv_full_idx + (mask_row + w.m_block) * bm.max_kv_tiles;
      return geometry(p, w);
    }
    w.m_block = nq - 1 - rank;
    if (!geometry(p, w)) return false;
    lists(p, mask_row, w);
    return true;
  }

 private:
  // Sequence lengths and offsets of w's (b, query tile); false past a ragged sequence's end.
  __device__ __forceinline__ static bool geometry(const FlexForwardParams& p, ForwardTiles& w) {
    w.m0 = w.m_block * kBlockM;
    w.seqlen_q = p.seqlen_q;
    w.seqlen_kv = p.seqlen_kv;
    w.q_row0 = 0;
    w.kv_row0 = 0;
    w.q_pos0 = FLEX_SHARD_POSITIONS && !kVarlen ? p.q_offset : 0;
    w.kv_pos0 = FLEX_SHARD_POSITIONS && !kVarlen ? p.kv_offset : 0;
    if constexpr (kVarlen) {
      w.q_row0 = p.cu_seqlens_q[w.b];
      w.kv_row0 = p.cu_seqlens_kv[w.b];
      w.seqlen_q = p.cu_seqlens_q[w.b + 1] - (int)w.q_row0;
      w.seqlen_kv = p.cu_seqlens_kv[w.b + 1] - (int)w.kv_row0;
      if (w.m0 >= w.seqlen_q) return false;
    }
    return true;
  }

  // The KV tile lists of w from the block mask; without one, every tile below the sequence's KV length (partial when
  // the variant has a mask_mod; without a mask_mod a "partial" tile needs no masking, so every tile is full).
  __device__ __forceinline__ static void lists(const FlexForwardParams& p, long long mask_row, ForwardTiles& w) {
    const FlexBlockMask& bm = p.block_mask;
    w.partial_idx = nullptr;
    w.full_idx = nullptr;
    w.n_partial = 0;
    w.n_full = 0;
    if (bm.kv_num_partial != nullptr || bm.kv_num_full != nullptr) {
      const long long off = mask_row + w.m_block;
      if (bm.kv_num_partial != nullptr) {
        w.n_partial = bm.kv_num_partial[off];
        w.partial_idx = bm.kv_partial_idx + off * bm.max_kv_tiles;
      }
      if (bm.kv_num_full != nullptr) {
        w.n_full = bm.kv_num_full[off];
        w.full_idx = bm.kv_full_idx + off * bm.max_kv_tiles;
      }
    } else {
      const int n_blocks = (w.seqlen_kv + kBlockN - 1) / kBlockN;
      if (kHasMaskMod) w.n_partial = n_blocks;
      else w.n_full = n_blocks;
    }
  }
};

// The warp-specialised kernel's persistent CTAs take work indices in TileScheduler's order dynamically: CTA c starts
// with index c, and each later index comes from the launch's atomic counter, so a CTA that finished light work takes
// the next heaviest and the launch ends balanced (a static stride over causal work left CTAs idle for the longest
// one). The producer warp fetches each index and publishes it in a two-slot shared-memory ring (full / empty
// mbarriers) that the consumer warps read; an index past the last work ends every role's loop.
// smem: 2 ints of indices, then the ring's 4 mbarriers (8-byte aligned).
struct WorkQueue {
  unsigned slots, bars;  // shared addresses: the indices; full[2], empty[2]
  int slot = 0;
  unsigned phase = 0;

  __device__ __forceinline__ WorkQueue(unsigned smem) : slots(smem), bars(smem + 8) {}
  __device__ __forceinline__ unsigned full(int s) const { return bars + 8u * (unsigned)s; }
  __device__ __forceinline__ unsigned empty(int s) const { return bars + 16u + 8u * (unsigned)s; }

  // One thread, before the CTA's first barrier.
  __device__ __forceinline__ void init(int consumer_warps) const {
    for (int s = 0; s < 2; ++s) {
      mbarrier_init(full(s), 1);
      mbarrier_init(empty(s), (unsigned)consumer_warps);
    }
  }
  __device__ __forceinline__ void advance() {
    slot ^= 1;
    phase ^= (unsigned)(slot == 0);
  }

  // Producer leader: publishes work index t once the consumers have read the slot's previous index.
  __device__ __forceinline__ void publish(int t) {
    mbarrier_wait(empty(slot), phase ^ 1u);
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(slots + 4u * (unsigned)slot), "r"(t) : "memory");
    mbarrier_arrive(full(slot));  // release: the index is visible to whoever completes the wait
    advance();
  }
  // Producer leader: the index after the first wave's (the counter's next value).
  __device__ __forceinline__ static int fetch(const FlexForwardParams& p) { return atomicAdd(p.tile_counter, 1) + (int)gridDim.x; }
  // Producer leader, after its last publish: the launch's last CTA to finish zeroes the counter for the next launch
  // (every CTA's last fetch came before its arrival here).
  __device__ __forceinline__ static void finish(const FlexForwardParams& p) {
    if (atomicAdd(p.tile_counter + 1, 1) == (int)gridDim.x - 1) {
      atomicExch(p.tile_counter, 0);
      atomicExch(p.tile_counter + 1, 0);
    }
  }
  // Consumer warp: the next work index (each warp reads it, then releases the slot).
  __device__ __forceinline__ int next(int lane) {
    mbarrier_wait(full(slot), phase);
    int t;
    asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(t) : "r"(slots + 4u * (unsigned)slot) : "memory");
    __syncwarp();
    if (lane == 0) mbarrier_arrive(empty(slot));
    advance();
    return t;
  }
};

}  // namespace flex
