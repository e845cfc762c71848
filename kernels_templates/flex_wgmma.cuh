// Hopper (sm_90a) tensor-core building blocks: swizzled shared-memory tiles, wgmma matrix descriptors, fences.
#pragma once
#include "flex_mma.cuh"
#include "flex_wgmma_ops.cuh"

namespace flex {

// A [kRows][kCols] tile of 16-bit elements in shared memory, laid out as the wgmma descriptors expect:
// the columns are cut into regions of kSwizzleBytes / 2 elements; each region is a [kRows][kSwizzleBytes]
// block (regions one after another), and inside every 8-row atom of a region the 16-byte chunk c of row r
// sits at chunk c ^ (r's swizzle phase) (CUTLASS's Swizzle<B, 4, 3> on the byte offset, B = log2 of the
// chunks per row). The hardware applies the same XOR to absolute address bits, so the tile must start on a
// 1024-byte boundary. kSwizzleBytes is 128, 64 or 32; a narrower swizzle lets head dims 80 and 96 be stored
// without padding (80 = 5 x 16 elements, 96 = 3 x 32).
// The same tile serves both as a K-major operand (rows are M or N, the columns are K: Q and K in S = Q K^T)
// and as an MN-major operand (rows are K, the columns are N: V in O = P V).
// kSpareAfter > 0: two spare regions, one between regions kSpareAfter - 1 and kSpareAfter and one after the last,
// so that an MN-major GEMM over the columns before (or from) kSpareAfter regions runs on into a spare region (the
// backward's selector columns appended to its dQ GEMM).
template <int kRows, int kCols, int kSwizzle, int kSpareAfter = 0>
struct SwizzledTile {
  static constexpr int kSwizzleBytes = kSwizzle;
  static constexpr int kRegionCols = kSwizzleBytes / 2;        // elements per region row
  static constexpr int kRegions = kCols / kRegionCols;
  static constexpr int kRegionBytes = kRows * kSwizzleBytes;
  static constexpr int kSpares = kSpareAfter > 0 ? 2 : 0;
  static constexpr int kBytes = (kRegions + kSpares) * kRegionBytes;
  static constexpr int kChunksPerRegionRow = kSwizzleBytes / 16;
  static constexpr int kChunksPerRow = kCols / 8;
  static constexpr int kAtomBytes = 8 * kSwizzleBytes;           // 8 rows: the period of the XOR pattern
  // Descriptor swizzle mode: 1 = 128 B, 2 = 64 B, 3 = 32 B.
  static constexpr unsigned long long kMode = kSwizzleBytes == 128 ? 1ull : kSwizzleBytes == 64 ? 2ull : 3ull;

  static_assert(kSwizzleBytes == 128 || kSwizzleBytes == 64 || kSwizzleBytes == 32, "SwizzledTile: swizzle must be 32, 64 or 128 bytes");
  static_assert(kCols % kRegionCols == 0, "SwizzledTile: the columns must fill whole swizzle regions");
  static_assert(kRows % 8 == 0, "SwizzledTile: rows must fill whole 8-row swizzle atoms");
  static_assert(kSpareAfter >= 0 && kSpareAfter < kRegions, "SwizzledTile: spare regions go between or after the regions");

  // Byte offset of region r, and of spare region i (0: the one after region kSpareAfter - 1, 1: after the last).
  static __device__ __forceinline__ unsigned region_offset(int r) { return (r + (kSpareAfter > 0 && r >= kSpareAfter ? 1 : 0)) * kRegionBytes; }
  static __device__ __forceinline__ unsigned spare_offset(int i) { return (i == 0 ? kSpareAfter : kRegions + 1) * kRegionBytes; }

  // Byte offset of the 16-byte chunk `chunk` (columns 8 * chunk .. + 7) of row `row`. The XOR reads row bits only
  // (regions are whole multiples of the 8-row atom), so with spare regions it acts on the offset inside the region.
  static __device__ __forceinline__ unsigned chunk_offset(int row, int chunk) {
    const unsigned region = chunk / kChunksPerRegionRow;
    const unsigned c = chunk % kChunksPerRegionRow;
    if constexpr (kSpareAfter > 0) {
      const unsigned o = row * kSwizzleBytes + c * 16;
      return region_offset(region) + (o ^ ((o >> 3) & ((kChunksPerRegionRow - 1) << 4)));
    } else {
      const unsigned o = region * kRegionBytes + row * kSwizzleBytes + c * 16;
      return o ^ ((o >> 3) & ((kChunksPerRegionRow - 1) << 4));
    }
  }
};

// Which 16-byte chunks of a kRows-row copy into a swizzled tile a thread takes: chunk c of rows r, r + kRowsPerPass,
// ... (threads past the last full pass row take none).
template <class Tile, int kRows, int kNThreads>
struct SwizzledRowCopy {
  static constexpr int kChunks = Tile::kChunksPerRow;
  static constexpr int kRowsPerPass = kNThreads / kChunks;
  static constexpr int kPasses = (kRows + kRowsPerPass - 1) / kRowsPerPass;
  int r, c;
  __device__ __forceinline__ explicit SwizzledRowCopy(int tid) : r(tid / kChunks), c(tid % kChunks) {}
  __device__ __forceinline__ bool takes_part() const { return r < kRowsPerPass; }
  // The tile row of pass i, when there is one.
  __device__ __forceinline__ bool has_row(int i) const { return kRows % kRowsPerPass == 0 || r + i * kRowsPerPass < kRows; }
};

// Async copy of rows [row0, row0 + kRows) of a [S, D] slice into a swizzled tile; rows at or past seqlen are
// zero-filled without reading global memory (masked anyway, and 0 * 0 is no NaN in P V).
template <class Tile, int kRows, int kNThreads, class Element>
__device__ __forceinline__ void load_swizzled_rows(unsigned smem, const Element* g, long long stride_s, int row0, int seqlen, int tid) {
  using Copy = SwizzledRowCopy<Tile, kRows, kNThreads>;
  const Copy cp(tid);
  if (!cp.takes_part()) return;
  const Element* src = g + (long long)(row0 + cp.r) * stride_s + cp.c * 8;
#pragma unroll
  for (int i = 0; i < Copy::kPasses; ++i) {
    const int row = cp.r + i * Copy::kRowsPerPass;
    if (cp.has_row(i)) {
      const bool valid = row0 + row < seqlen;
      cp_async_16(smem + Tile::chunk_offset(row, cp.c), valid ? src : g, valid);
    }
    src += Copy::kRowsPerPass * stride_s;
  }
}

// As load_swizzled_rows, for rows in groups of kGroupRows: local row r is global row row0 + (r / kGroupRows) *
// group_stride + r % kGroupRows (the backward's spread rows). Addresses are computed per pass; it runs once per CTA.
template <class Tile, int kRows, int kNThreads, int kGroupRows, class Element>
__device__ __forceinline__ void load_swizzled_row_groups(unsigned smem, const Element* g, long long stride_s, int row0, int group_stride,
                                                         int seqlen, int tid) {
  using Copy = SwizzledRowCopy<Tile, kRows, kNThreads>;
  const Copy cp(tid);
  if (!cp.takes_part()) return;
#pragma unroll
  for (int i = 0; i < Copy::kPasses; ++i) {
    const int row = cp.r + i * Copy::kRowsPerPass;
    if (cp.has_row(i)) {
      const int grow = row0 + (row / kGroupRows) * group_stride + row % kGroupRows;
      const bool valid = grow < seqlen;
      cp_async_16(smem + Tile::chunk_offset(row, cp.c), valid ? g + (long long)grow * stride_s + cp.c * 8 : g, valid);
    }
  }
}

// Matrix descriptor fields (PTX ISA, "Matrix Descriptor Format" of wgmma): start address, leading- and
// stride-dimension byte offsets (all >> 4), swizzle mode in bits 62-63. Base offset 0: tiles are
// 1024-byte aligned and starts move by whole atoms or along a swizzled row.
__device__ __forceinline__ unsigned long long make_desc(unsigned start, unsigned lbo, unsigned sbo, unsigned long long mode) {
  return (unsigned long long)((start & 0x3FFFF) >> 4) | ((unsigned long long)((lbo & 0x3FFFF) >> 4) << 16) |
         ((unsigned long long)((sbo & 0x3FFFF) >> 4) << 32) | (mode << 62);
}

// K-major operand: 64 (A) or N (B) rows starting at `row0`, the 16 K columns starting at `k0` (multiple of 16).
// Along a swizzled row the start simply moves by 32 bytes per k-step; the 8-row groups are one atom apart.
template <class Tile>
__device__ __forceinline__ unsigned k_major_offset(int k0) {
  return Tile::region_offset(k0 / Tile::kRegionCols) + (k0 % Tile::kRegionCols) * 2;
}
template <class Tile>
__device__ __forceinline__ unsigned long long desc_k_major(unsigned tile_base, int row0, int k0) {
  return make_desc(tile_base + row0 * Tile::kSwizzleBytes + k_major_offset<Tile>(k0), 16, Tile::kAtomBytes, Tile::kMode);
}

// MN-major operand: the 16 K rows starting at `k0` (multiple of 16), M/N columns from `col0` (a region boundary).
// Consecutive regions (kSwizzleBytes / 2 columns each) are the leading-dimension step, 8-row groups the stride.
template <class Tile>
__device__ __forceinline__ unsigned mn_major_offset(int k0, int col0) {
  return Tile::region_offset(col0 / Tile::kRegionCols) + k0 * Tile::kSwizzleBytes;
}
template <class Tile>
__device__ __forceinline__ unsigned long long desc_mn_major(unsigned tile_base, int k0, int col0) {
  return make_desc(tile_base + mn_major_offset<Tile>(k0, col0), Tile::kRegionBytes, Tile::kAtomBytes, Tile::kMode);
}

// A descriptor whose start lies `bytes` (a multiple of 16) further on: one add to the low word, where the start
// field (address >> 4) sits, instead of rebuilding the descriptor. Exact while the start stays below 2^18, which
// every shared-memory address of an sm_90 CTA (at most 227 KB) does.
__device__ __forceinline__ unsigned long long desc_advance(unsigned long long desc, unsigned bytes) {
  return (desc & 0xFFFFFFFF00000000ull) | (unsigned)((unsigned)desc + (bytes >> 4));
}

// Orders this warpgroup's earlier register writes (accumulators, A fragments) before the next wgmma.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Waits until at most kPending committed wgmma groups of this warpgroup are in flight.
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
// Pins accumulator registers at this point of the program: without it the compiler may read or write them
// between a wgmma and the wait that makes them valid.
template <int N>
__device__ __forceinline__ void fence_operands(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
// Shared memory written through the generic proxy (st.shared, cp.async) becomes visible to the tensor cores'
// async proxy only after this fence in each writing thread (then a barrier).
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// Bulk reduction (the TMA unit): global fp32 dst[i] += shared src[i] for `bytes` bytes (multiple of 16, both 16-byte
// aligned), in this thread's bulk group; the source is read asynchronously after the caller's fence_proxy_async
// and barrier. bulk_wait_read: this thread's groups have read their sources (the buffer may be written again);
// bulk_wait: they have completed.
__device__ __forceinline__ void bulk_reduce_add_f32(float* dst, unsigned src, unsigned bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst), "r"(src), "r"(bytes) : "memory");
}
// The same with 64-bit integers (fixed point): integer addition is associative, so the sum does not depend on the
// order the reductions arrive in.
__device__ __forceinline__ void bulk_reduce_add_u64(unsigned long long* dst, unsigned src, unsigned bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.u64 [%0], [%1], %2;\n" ::"l"(dst), "r"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }
__device__ __forceinline__ void bulk_wait() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }

}  // namespace flex
