// `flexjit run --ring R`: one launch's whole-sequence tensors sharded over R virtual ranks of this process (on the CPU
// backend, or on R streams of one GPU), run through RingAttention, and the results gathered back into the
// whole-sequence outputs, so that the files written compare directly with a plain `flexjit run` of the same inputs.
#pragma once
#include <memory>
#include <string>

#include "runtime/flexjit.hpp"
#include "runtime/ring.h"

namespace flexjit::tools {

// The value of --ring-sharding: zigzag or contiguous; anything else throws flexjit::Error.
RingSharding parse_ring_sharding(const std::string& name);

struct RingRun {
  int ranks = 0;
  RingSharding sharding = RingSharding::Zigzag;
};

// Fills whole.o (and whole.lse when given). whole: an AttentionArgs of one sequence (q and k of equal length).
void ring_forward(const std::shared_ptr<Kernel>& kernel, const RingRun& ring, const AttentionArgs& whole);
// Fills whole.dq, dk, dv and whole.grads from whole.o, lse and d_o.
void ring_backward(const std::shared_ptr<Kernel>& kernel, const RingRun& ring, const BackwardArgs& whole);

}  // namespace flexjit::tools
