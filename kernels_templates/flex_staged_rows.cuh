// Score_mod summands a kernel stages in shared memory per query tile instead of loading per element
// (compiler/codegen/staged_terms.h): where such a term's rows live, and the copy of a [rows][64] block of them.
// Used by the Hopper KV-major backward (flex_backward_staged.cuh).
#pragma once
#include "flex_mma.cuh"

namespace flex {

// Where a staged term's rows live, from the variant's accessor (staged_col / staged_tile).
struct StagedRows {
  const void* base;      // element [lead..., 0, 0] of the buffer (2-byte elements)
  long long row_stride;  // elements from one query row to the next
  long long col_stride;  // elements from one column to the next (1: contiguous rows, copied asynchronously)
  long long cols;        // the buffer's last dim: columns at or past it are never read
  long long rows;        // the dim before it (query rows; the backward's blocked accumulators)
  long long grad_base;   // offset of element [lead..., 0, 0] in the buffer's contiguous gradient (backward only)
};

// Byte offset of the 16-byte chunk `chunk` (columns 8 chunk .. 8 chunk + 7) of row r in a block of 64 two-byte
// columns: 128-byte rows, chunks XOR-swizzled by r % 8. This is SwizzledTile<rows, 64, 128>'s layout, so a block
// is also a K-major wgmma operand, and 8 consecutive rows read by ldmatrix hit distinct banks.
__device__ __forceinline__ unsigned staged_block_offset(int r, int chunk) { return (unsigned)(r * 128 + ((chunk ^ (r & 7)) << 4)); }

__device__ __forceinline__ unsigned short staged_raw_at(const void* base, long long off) {
  return __ldg(static_cast<const unsigned short*>(base) + off);
}

// Rows [m0, m0 + kRows) x columns [0, 64) of the term into the block at `dst` (`smem_dst` is the same bytes as a
// generic pointer); rows at or past seqlen_q and columns at or past r.cols are zero. Only the kChunks 8-column
// chunks from chunk0 are copied when kChunks < 8 (the others are left as they are). Every thread of the CTA
// takes chunks tid, tid + kNThreads, ... Whole chunks of unit-stride, 16-byte aligned rows go by cp.async (the
// caller commits and waits); any other chunk by plain loads.
template <int kRows, int kNThreads, int kChunks = 8>
__device__ __forceinline__ void load_staged_block(unsigned char* smem_dst, unsigned dst, const StagedRows& r, int m0, int seqlen_q,
                                                  int tid, int chunk0 = 0) {
  const bool fast = r.col_stride == 1 && (reinterpret_cast<unsigned long long>(r.base) & 15) == 0 && (r.row_stride & 7) == 0;
  for (int i = tid; i < kRows * kChunks; i += kNThreads) {
    const int q = i / kChunks, chunk = chunk0 + i % kChunks;
    const int row = m0 + q;
    const bool valid = row < seqlen_q;
    const long long off = (long long)row * r.row_stride + (long long)chunk * 8 * r.col_stride;
    if (fast && chunk * 8 + 8 <= r.cols) {
      cp_async_16(dst + staged_block_offset(q, chunk), valid ? static_cast<const unsigned short*>(r.base) + off : r.base, valid);
    } else {
      unsigned w[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int c = chunk * 8 + 2 * k;
        const unsigned lo = valid && c < r.cols ? staged_raw_at(r.base, off + (2 * k) * r.col_stride) : 0u;
        const unsigned hi = valid && c + 1 < r.cols ? staged_raw_at(r.base, off + (2 * k + 1) * r.col_stride) : 0u;
        w[k] = lo | (hi << 16);
      }
      *reinterpret_cast<uint4*>(smem_dst + staged_block_offset(q, chunk)) = make_uint4(w[0], w[1], w[2], w[3]);
    }
  }
}

}  // namespace flex
