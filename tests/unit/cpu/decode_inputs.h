// What the CPU decode tests (test_cpu_decode.cpp, test_cpu_decode_fp8.cpp) share: CPU plan
// options, placing a contiguous KV cache in shuffled pages, and the float64 reference of one
// decode sequence.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "compiler/bindings.h"
#include "compiler/spec_ir.h"
#include "runtime/flexjit.hpp"
#include "support/attention_reference.h"

namespace flexjit::test {

// A CPU decode plan's options; page 0: a contiguous cache.
inline DecodePlanOptions cpu_plan_options(int64_t B, int64_t H, int64_t Hkv, int64_t Sq, int64_t max_kv, int page = 0, bool head_major = false) {
  DecodePlanOptions po;
  po.device = Device::cpu();
  po.batch = static_cast<int>(B);
  po.heads = static_cast<int>(H);
  po.kv_heads = static_cast<int>(Hkv);
  po.max_seqlen_q = static_cast<int>(Sq);
  po.max_seqlen_kv = static_cast<int>(max_kv);
  po.page_size = page;
  po.head_major_pages = head_major;
  return po;
}

// A paged KV cache: k and v as [num_pages, page, Hkv, D] (or [num_pages, Hkv, page, D] when
// head-major) and the [B, max_pages] page table.
template <class T>
struct PagedCache {
  std::vector<T> k, v;
  std::vector<int32_t> table;
  int64_t max_pages = 0, num_pages = 0;
};

// Positions [0, kv_lens[b]) of every sequence of contiguous [B, Hkv, cap, D] caches k and v, in
// pages of a shuffled pool with three spare pages. Slots no sequence uses hold `unused`
// (NaN for float caches: reading one would show).
template <class T>
PagedCache<T> to_pages(const std::vector<T>& k, const std::vector<T>& v, int64_t B, int64_t Hkv, int64_t cap, int64_t D,
                       const std::vector<int32_t>& kv_lens, int page, bool head_major, T unused, std::mt19937_64& rng) {
  PagedCache<T> out;
  out.max_pages = (cap + page - 1) / page;
  out.num_pages = B * out.max_pages + 3;
  std::vector<int32_t> order(static_cast<size_t>(out.num_pages));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  out.table.assign(order.begin(), order.begin() + B * out.max_pages);
  out.k.assign(static_cast<size_t>(out.num_pages * page * Hkv * D), unused);
  out.v.assign(out.k.size(), unused);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t p = 0; p < kv_lens[static_cast<size_t>(b)]; ++p)
      for (int64_t h = 0; h < Hkv; ++h)
        for (int64_t d = 0; d < D; ++d) {
          int64_t pg = out.table[static_cast<size_t>(b * out.max_pages + p / page)], slot = p % page;
          int64_t at = head_major ? ((pg * Hkv + h) * page + slot) * D + d : ((pg * page + slot) * Hkv + h) * D + d;
          size_t from = static_cast<size_t>(((b * Hkv + h) * cap + p) * D + d);
          out.k[static_cast<size_t>(at)] = k[from];
          out.v[static_cast<size_t>(at)] = v[from];
        }
  return out;
}

// The float64 reference for one sequence: its q [H, Sq, D], k [Hkv, Skv, D], v [Hkv, Skv, Dv]
// with the query positions shifted by `query_offset`. Mods that read b see the sequence index:
// the sequence is then placed at batch `b` of a reference launch whose earlier batches are zeros.
inline RefResult reference_sequence(const SpecIR& ir, const EvalEnv& env, int64_t b, bool uses_b, int64_t H, int64_t Hkv, int64_t sq, int64_t skv,
                                    int64_t D, const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                                    int64_t query_offset) {
  const int64_t nb = uses_b ? b + 1 : 1;
  RefShape s{nb, H, Hkv, sq, skv, D, D};
  std::vector<float> qq(static_cast<size_t>(nb * H * sq * D)), kk(static_cast<size_t>(nb * Hkv * skv * D)), vv(kk.size());
  std::copy(q.begin(), q.end(), qq.end() - static_cast<std::ptrdiff_t>(q.size()));
  std::copy(k.begin(), k.end(), kk.end() - static_cast<std::ptrdiff_t>(k.size()));
  std::copy(v.begin(), v.end(), vv.end() - static_cast<std::ptrdiff_t>(v.size()));
  RefResult r = reference_attention(ir, s, qq, kk, vv, env, 1.0 / std::sqrt(static_cast<double>(D)), query_offset);
  RefResult last;
  last.o.assign(r.o.end() - H * sq * D, r.o.end());
  last.lse.assign(r.lse.end() - H * sq, r.lse.end());
  return last;
}

}  // namespace flexjit::test
