#include "runtime/cpu/block_classifier.h"

#include <algorithm>

#include "compiler/passes/interval_eval.h"
#include "runtime/cpu/kv_tiles.h"

namespace flexjit::cpu {

BlockClassifier::BlockClassifier(const BlockSparsity& s, const BlockGrid& grid)
    : mask_(s.ir->mask_mod), values_(*s.values), uses_b_(s.uses_b), uses_h_(s.uses_h), g_(grid) {
  static std::atomic<uint64_t> generations{0};
  generation_ = ++generations;
  bm_ = uses_b_ ? g_.B : 1;
  hm_ = uses_h_ ? g_.H : 1;
  nqt_ = (g_.Sq + g_.block_m - 1) / g_.block_m;
  nkt_ = kv_tile_count(g_.kv_offset, g_.Skv, g_.block_n);
  int64_t entries = bm_ * hm_ * nqt_ * nkt_;
  // Past a few hundred MB of table, classify every time instead of caching.
  if (entries <= (int64_t{1} << 28)) {
    table_ = std::make_unique<std::atomic<uint8_t>[]>(static_cast<size_t>(entries));
    for (int64_t i = 0; i < entries; ++i) table_[i].store(kUnknown, std::memory_order_relaxed);
  }
  for (const Value& v : values_.params) params_.push_back(v.as_double());
}

uint8_t BlockClassifier::classify(const void* ctx, int64_t b, int64_t h, int64_t qt, int64_t kt) {
  const BlockClassifier* c = static_cast<const BlockClassifier*>(ctx);
  int64_t bb = c->uses_b_ ? b : 0, hh = c->uses_h_ ? h : 0;
  if (!c->table_) return c->compute(bb, hh, qt, kt);
  std::atomic<uint8_t>& slot = c->table_[((bb * c->hm_ + hh) * c->nqt_ + qt) * c->nkt_ + kt];
  uint8_t v = slot.load(std::memory_order_relaxed);
  if (v != kUnknown) return v;
  v = c->compute(bb, hh, qt, kt);
  slot.store(v, std::memory_order_relaxed);  // racing writers store the same value
  return v;
}

uint8_t BlockClassifier::compute(int64_t b, int64_t h, int64_t qt, int64_t kt) const {
  thread_local IntervalEnv env;
  thread_local uint64_t env_generation = 0;
  if (env_generation != generation_) {
    env.symbols = values_.symbols;
    env.params = params_;
    env_generation = generation_;
  }
  auto set = [&](dsl::VarId v, int64_t lo, int64_t hi) { env.vars[static_cast<int>(v)] = {lo, hi}; };
  if (uses_b_) set(dsl::VarId::B, b + g_.b_offset, b + g_.b_offset);
  else set(dsl::VarId::B, g_.b_offset, g_.b_offset + g_.B - 1);
  if (uses_h_) {
    set(dsl::VarId::H, h, h);
    int64_t hkv = h / (g_.H / g_.Hkv);
    set(dsl::VarId::KvHead, hkv, hkv);
  } else {
    set(dsl::VarId::H, 0, g_.H - 1);
    set(dsl::VarId::KvHead, 0, g_.Hkv - 1);
  }
  set(dsl::VarId::Q, qt * g_.block_m + g_.q_offset, std::min(g_.Sq, (qt + 1) * g_.block_m) - 1 + g_.q_offset);
  const KvTile t = kv_tile(g_.kv_offset, g_.Skv, g_.block_n, kt);
  set(dsl::VarId::KV, t.k0 + t.lead, t.k0 + t.lead + t.n - 1);  // the tile's rows, not its padding
  try {
    switch (classify_box(mask_, env)) {
      case TriBool::False: return kTileEmpty;
      case TriBool::True: return kTileFull;
      case TriBool::Unknown: return kTilePartial;
    }
  } catch (...) {
    // Deciding nothing is always sound: the tile is evaluated element by element.
  }
  return kTilePartial;
}

}  // namespace flexjit::cpu
