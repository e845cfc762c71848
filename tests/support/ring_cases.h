// The masks and biases the ring attention tests shard (tests/unit/cpu/test_cpu_ring.cpp on the CPU backend,
// tests/gpu/ring_test.cpp on a GPU): causal, documents, a sliding window, ALiBi with learnable slopes and a learnable
// relative bias, each a spec over a sequence of Skv positions (L = 2 Skv - 1 relative offsets).
#pragma once
#include <string>
#include <vector>

namespace flexjit::test {

struct RingCase {
  std::string name, score_mod, mask_mod;
  std::vector<std::string> buffers;
  std::string grad;  // the buffer whose gradient is checked ("" for none)
  // Whether the mask empties some blocks of a ring (those below the diagonal of the causal ones).
  bool triangular() const { return mask_mod.rfind("q >= kv", 0) == 0; }
};

inline const std::vector<RingCase>& ring_cases() {
  static const std::vector<RingCase> all{
      {"causal", "", "q >= kv", {}, ""},
      {"document", "", "doc[q] == doc[kv]", {"doc: i32[Skv]"}, ""},
      {"sliding_window", "", "q >= kv && q - kv < 40", {}, ""},
      {"alibi_learnable", "score + slope[h] * (kv - q)", "q >= kv", {"slope: f32[H]"}, "slope"},
      {"relative_bias", "score + rel[q - kv + Skv - 1]", "", {"rel: f32[L]"}, "rel"},
  };
  return all;
}

}  // namespace flexjit::test
