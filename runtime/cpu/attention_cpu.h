// The CPU attention driver: splits a forward launch into (b, h, query tile) work items over
// std::threads, classifies (query tile, KV tile) blocks for sparsity and runs the query-tile
// kernel built for the best instruction set this CPU supports.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "compiler/bindings.h"
#include "compiler/spec_ir.h"
#include "runtime/cpu/attention_tile.h"

namespace flexjit::cpu {

enum class Isa { Generic, Avx2, Avx512 };
const char* isa_name(Isa isa);  // "generic", "avx2", "avx512"

// The instruction sets compiled into this build that this CPU can run, best last.
std::vector<Isa> supported_isas();

// The ISA launches use: `requested` ("" = the best supported; else one of isa_name's
// spellings). Throws flexjit::Error for an unknown or unsupported name.
Isa choose_isa(const std::string& requested);

// What the driver needs to classify blocks of a mask_mod at launch values.
struct BlockSparsity {
  const SpecIR* ir = nullptr;       // its mask_mod is classified (null or no mask_mod: every block full)
  const BoundValues* values = nullptr;
  bool uses_b = true, uses_h = true;  // whether the mask depends on b / on h or kv_head
};

struct DriverOptions {
  int threads = 0;  // 0: std::thread::hardware_concurrency()
  Isa isa = Isa::Generic;
};

// Runs the whole launch and returns the OR of the error bits the mods raised. `job` must be
// complete except for `scratch`, `classify` and `classify_ctx`, which this fills.
uint32_t run_attention(AttentionJob job, const BlockSparsity& sparsity, const DriverOptions& options);

}  // namespace flexjit::cpu
