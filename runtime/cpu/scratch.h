// Per-thread scratch memory of the CPU kernels (forward and backward): one allocation per worker thread, carved into
// regions that each start on a cache line, so that two regions never share a line and vector loads of a region's
// start are aligned.
#pragma once
#include <algorithm>
#include <cstddef>
#include <memory>
#include <new>
#include <vector>

namespace flexjit::cpu {

// Hands out region offsets in order; total() is the allocation's size.
class ScratchRegions {
 public:
  static constexpr size_t kAlign = 64;
  // The offset of a new region of `bytes` (at least one byte, so that every region has its own address).
  size_t take(size_t bytes) {
    const size_t off = total_;
    total_ = (total_ + std::max<size_t>(bytes, 1) + kAlign - 1) / kAlign * kAlign;
    return off;
  }
  size_t total() const { return total_; }

 private:
  size_t total_ = 0;
};

struct AlignedFree {
  void operator()(void* p) const { ::operator delete(p, std::align_val_t{ScratchRegions::kAlign}); }
};
using ScratchBlock = std::unique_ptr<void, AlignedFree>;

// `threads` blocks of `bytes` each, aligned as ScratchRegions' offsets assume.
inline std::vector<ScratchBlock> allocate_scratch(size_t threads, size_t bytes) {
  std::vector<ScratchBlock> out;
  out.reserve(threads);
  for (size_t t = 0; t < threads; ++t) out.emplace_back(::operator new(bytes, std::align_val_t{ScratchRegions::kAlign}));
  return out;
}

}  // namespace flexjit::cpu
