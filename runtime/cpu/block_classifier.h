// Block classes of a mask_mod for the CPU drivers (forward and backward): interval evaluation
// of the mask over each (query tile, KV tile) box at the launch's values, cached per block.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "runtime/cpu/attention_cpu.h"

namespace flexjit::cpu {

// The tiling the classes are for. `b_offset` and `q_offset` are added to b and to the query
// rows before the mask sees them (ragged and decode launches run one sequence at a time; a
// shard of a longer sequence sees global positions), and the KV tiles are kv_tiles.h's for
// `kv_offset`, so a tile is empty exactly when the mask excludes it at global positions.
struct BlockGrid {
  int64_t B = 0, H = 0, Hkv = 0, Sq = 0, Skv = 0, block_m = 64, block_n = 64;
  int64_t b_offset = 0, q_offset = 0, kv_offset = 0;
};

// Classes computed on first use and shared by every work item (and every b / h the mask
// ignores). Thread-safe; never throws from classify (an undecided box is partial).
class BlockClassifier {
 public:
  BlockClassifier(const BlockSparsity& s, const BlockGrid& grid);

  // A ClassifyFn: ctx is the BlockClassifier.
  static uint8_t classify(const void* ctx, int64_t b, int64_t h, int64_t q_tile, int64_t kv_tile);

 private:
  static constexpr uint8_t kUnknown = 0xff;
  uint8_t compute(int64_t b, int64_t h, int64_t qt, int64_t kt) const;

  ir::Expr mask_;
  const BoundValues& values_;
  std::vector<double> params_;
  bool uses_b_, uses_h_;
  BlockGrid g_;
  int64_t bm_ = 1, hm_ = 1, nqt_ = 0, nkt_ = 0;
  uint64_t generation_ = 0;
  std::unique_ptr<std::atomic<uint8_t>[]> table_;
};

// A classifier of `job`'s tiles set as its ClassifyFn when the launch has a mask_mod (else null, and every tile is
// full); it must outlive the job's run. Job: AttentionJob or BackwardJob.
template <class Job>
std::unique_ptr<BlockClassifier> attach_classifier(const BlockSparsity& s, Job& job) {
  if (!s.ir || !s.ir->mask_mod || !s.values) return nullptr;
  auto c = std::make_unique<BlockClassifier>(
      s, BlockGrid{job.B, job.H, job.Hkv, job.Sq, job.Skv, job.block_m, job.block_n, job.b_offset, job.q_offset, job.kv_offset});
  job.classify = &BlockClassifier::classify;
  job.classify_ctx = c.get();
  return c;
}

}  // namespace flexjit::cpu
