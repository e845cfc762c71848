// The CPU oracle for ragged prefill (Kernel::forward_varlen) and decode (Kernel::decode) against
// the float64 reference (tests/support/attention_reference.h) run per sequence: contiguous and
// paged KV caches (page sizes 1, 16, 64, head-major pages), mixed KV lengths, several query
// rows per sequence, GQA, causal masks at decode positions, sliding windows, ALiBi, mods that
// read b (the sequence index), packed sequences of lengths 1..300, and argument errors.
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "compiler/frontend.h"
#include "dsl/error.h"
#include "runtime/cpu/cpu_backend.h"
#include "runtime/flexjit.hpp"
#include "support/attention_reference.h"
#include "support/spec_loading.h"
#include "unit/cpu/decode_inputs.h"
#include "unit/cpu/gallery_inputs.h"

using namespace flexjit;
using test::reference_sequence;
using test::Sizes;

namespace {

const float kNanF = std::numeric_limits<float>::quiet_NaN();
constexpr float kUntouched = 12345.0f;  // rows a decode must leave alone

dsl::Spec f32_spec(dsl::Spec spec, int64_t D) {
  spec.dtype = DType::F32;
  spec.head_dim = static_cast<int>(D);
  spec.head_dim_v = 0;
  return spec;
}

dsl::Spec inline_spec(const std::string& name, const std::string& score_mod, const std::string& mask_mod, const std::vector<std::string>& buffers,
                      const std::vector<std::string>& params = {}) {
  dsl::Spec spec;
  spec.name = name;
  if (!score_mod.empty()) spec.score_mod = score_mod;
  if (!mask_mod.empty()) spec.mask_mod = mask_mod;
  dsl::Diagnostics diags;
  for (const std::string& b : buffers) REQUIRE(dsl::add_buffer(spec, b, "test", diags));
  for (const std::string& p : params) REQUIRE(dsl::add_param(spec, p, "test", diags));
  return spec;
}

// The specs of the decode and ragged tests; `uses_b` marks those whose mods read b.
struct Case {
  dsl::Spec spec;
  bool uses_b = false;
};

std::vector<Case> cases(int64_t D) {
  std::vector<Case> out;
  for (const char* name : {"causal.json", "sliding_window.json", "alibi_causal.json", "relative_bias.json", "softcap.json"})
    out.push_back({f32_spec(test::load_spec(test::gallery_dir() / name), D), false});
  out.push_back({f32_spec(inline_spec("per_seq", "score + bb[b] * (kv - q)", "kv <= q", {"bb: f32[B]"}), D), true});
  return out;
}

// O within 2e-4 of each row's largest |O|, LSE within 2e-4 relative; fully masked rows exact.
void expect_row(const double* ref_o, double ref_lse, const float* o, int64_t o_stride, float lse, int64_t D, const std::string& what) {
  INFO(what);
  if (ref_lse == -std::numeric_limits<double>::infinity()) {
    REQUIRE(lse == -std::numeric_limits<float>::infinity());
    for (int64_t d = 0; d < D; ++d) REQUIRE(o[d * o_stride] == 0.0f);
    return;
  }
  REQUIRE(std::abs(lse - ref_lse) <= 2e-4 * std::max(1.0, std::abs(ref_lse)));
  double scale = 1e-30;
  for (int64_t d = 0; d < D; ++d) scale = std::max(scale, std::abs(ref_o[d]));
  for (int64_t d = 0; d < D; ++d) REQUIRE(std::abs(o[d * o_stride] - ref_o[d]) <= 2e-4 * scale);
}

struct DecodeSetup {
  int64_t B = 4, H = 8, Hkv = 2, Sq = 4, D = 64, max_kv = 160;
  std::vector<int32_t> kv_lens = {1, 37, 150, 64}, q_lens = {1, 3, 4, 2};
};

// One decode run of `c` with page size `page` (0: contiguous) against the reference.
void check_decode(const Case& c, const DecodeSetup& ds, int page, bool head_major, uint64_t seed) {
  cpu::install();
  Runtime rt;
  std::shared_ptr<Kernel> kernel = rt.compile(c.spec);
  const int64_t B = ds.B, H = ds.H, Hkv = ds.Hkv, Sq = ds.Sq, D = ds.D, cap = ds.max_kv;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.5f, 1.5f);
  std::vector<float> q(static_cast<size_t>(B * H * Sq * D)), k(static_cast<size_t>(B * Hkv * cap * D)), v(k.size());
  for (auto* t : {&q, &k, &v})
    for (float& x : *t) x = u(rng);
  Sizes sz{B, H, Hkv, Sq, cap, D};
  // Decode positions reach q = max_kv - 1: relative tables need 2 * Skv - 1 entries (L).
  std::vector<test::HostBuffer> buffers = test::make_buffers(c.spec, Sizes{B, H, Hkv, cap, cap, D}, rng);
  auto params = test::gallery_params(c.spec, sz);

  std::unique_ptr<DecodePlan> plan = kernel->plan_decode(test::cpu_plan_options(B, H, Hkv, Sq, cap, page, head_major));

  // Paged: every sequence's positions in pages of a shuffled pool (with spare pages).
  test::PagedCache<float> pc;
  if (page > 0) pc = test::to_pages(k, v, B, Hkv, cap, D, ds.kv_lens, page, head_major, kNanF, rng);
  std::vector<float> o(static_cast<size_t>(B * H * Sq * D), kUntouched), lse(static_cast<size_t>(B * H * Sq), kUntouched);
  std::vector<int32_t> kv_lens = ds.kv_lens, q_lens = ds.q_lens;
  DecodeArgs a;
  a.q = Tensor::contiguous(q.data(), DType::F32, {B, H, Sq, D});
  if (page > 0) {
    std::vector<int64_t> shape =
        head_major ? std::vector<int64_t>{pc.num_pages, Hkv, page, D} : std::vector<int64_t>{pc.num_pages, page, Hkv, D};
    a.k = Tensor::contiguous(pc.k.data(), DType::F32, shape);
    a.v = Tensor::contiguous(pc.v.data(), DType::F32, shape);
    a.page_table = Tensor::contiguous(pc.table.data(), DType::I32, {B, pc.max_pages});
  } else {
    a.k = Tensor::contiguous(k.data(), DType::F32, {B, Hkv, cap, D});
    a.v = Tensor::contiguous(v.data(), DType::F32, {B, Hkv, cap, D});
  }
  a.kv_lens = Tensor::contiguous(kv_lens.data(), DType::I32, {B});
  a.q_lens = Tensor::contiguous(q_lens.data(), DType::I32, {B});
  a.o = Tensor::contiguous(o.data(), DType::F32, {B, H, Sq, D});
  a.lse = Tensor::contiguous(lse.data(), DType::F32, {B, H, Sq});
  for (test::HostBuffer& hb : buffers) a.buffers.push_back({hb.name, hb.tensor()});
  a.params = params;
  kernel->decode(*plan, a);

  SpecIR ir = build_spec_ir(c.spec);
  EvalEnv env = test::eval_env(ir.checked, sz, buffers, params);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t ql = q_lens[static_cast<size_t>(b)], kl = kv_lens[static_cast<size_t>(b)];
    std::vector<float> qb, kb, vb;
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < ql * D; ++i) qb.push_back(q[static_cast<size_t>((b * H + h) * Sq * D + i)]);
    for (int64_t h = 0; h < Hkv; ++h)
      for (int64_t i = 0; i < kl * D; ++i) {
        kb.push_back(k[static_cast<size_t>((b * Hkv + h) * cap * D + i)]);
        vb.push_back(v[static_cast<size_t>((b * Hkv + h) * cap * D + i)]);
      }
    test::RefResult ref = reference_sequence(ir, env, b, c.uses_b, H, Hkv, ql, kl, D, qb, kb, vb, kl - ql);
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < Sq; ++i) {
        size_t row = static_cast<size_t>((b * H + h) * Sq + i);
        std::string what = fmt::format("{} page {}{} b {} h {} row {} (q_len {}, kv_len {})", c.spec.name, page, head_major ? " head-major" : "", b,
                                       h, i, ql, kl);
        if (i >= ql) {
          INFO(what);
          REQUIRE(lse[row] == kUntouched);
          for (int64_t d = 0; d < D; ++d) REQUIRE(o[row * static_cast<size_t>(D) + static_cast<size_t>(d)] == kUntouched);
          continue;
        }
        size_t rr = static_cast<size_t>(h * ql + i);
        expect_row(&ref.o[rr * static_cast<size_t>(D)], ref.lse[rr], &o[row * static_cast<size_t>(D)], 1, lse[row], D, what);
      }
  }
}

}  // namespace

TEST_CASE("CPU decode: contiguous and paged KV caches match the reference", "[cpu][decode]") {
  DecodeSetup ds;
  uint64_t seed = 1;
  for (const Case& c : cases(ds.D)) {
    for (int page : {0, 1, 16, 64}) check_decode(c, ds, page, false, seed++);
  }
}

TEST_CASE("CPU decode: head-major pages, one query row, head dim 80", "[cpu][decode]") {
  DecodeSetup ds;
  ds.D = 80;
  ds.Sq = 1;
  ds.q_lens = {1, 1, 1, 1};
  ds.kv_lens = {5, 160, 1, 99};
  uint64_t seed = 50;
  for (const Case& c : cases(ds.D)) {
    check_decode(c, ds, 16, true, seed++);
    check_decode(c, ds, 0, false, seed++);
  }
}

namespace {

// Packs sequences of query lengths `lq` and KV lengths `lk` and checks forward_varlen of `c`
// against the reference per sequence (at_kv_end: VarlenArgs::queries_at_kv_end, query row i at
// position lk - lq + i).
void check_varlen(const Case& c, const std::vector<int32_t>& lq, const std::vector<int32_t>& lk, uint64_t seed, bool at_kv_end = false) {
  cpu::install();
  const int64_t H = 4, Hkv = 1, D = 64;
  const int64_t B = static_cast<int64_t>(lq.size());
  std::vector<int32_t> cq = {0}, ck = {0};
  for (int64_t b = 0; b < B; ++b) {
    cq.push_back(cq.back() + lq[static_cast<size_t>(b)]);
    ck.push_back(ck.back() + lk[static_cast<size_t>(b)]);
  }
  const int64_t tq = cq.back(), tk = ck.back();
  const int64_t max_q = *std::max_element(lq.begin(), lq.end()), max_kv = *std::max_element(lk.begin(), lk.end());
  Runtime rt;
  std::shared_ptr<Kernel> kernel = rt.compile(c.spec);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.5f, 1.5f);
  std::vector<float> q(static_cast<size_t>(tq * H * D)), k(static_cast<size_t>(tk * Hkv * D)), v(k.size());
  for (auto* t : {&q, &k, &v})
    for (float& x : *t) x = u(rng);
  Sizes sz{B, H, Hkv, max_q, max_kv, D};
  std::vector<test::HostBuffer> buffers = test::make_buffers(c.spec, sz, rng);
  auto params = test::gallery_params(c.spec, sz);
  std::vector<float> o(static_cast<size_t>(tq * H * D), kNanF), lse(static_cast<size_t>(H * tq), kNanF);
  VarlenArgs a;
  a.q = Tensor::contiguous(q.data(), DType::F32, {tq, H, D});
  a.k = Tensor::contiguous(k.data(), DType::F32, {tk, Hkv, D});
  a.v = Tensor::contiguous(v.data(), DType::F32, {tk, Hkv, D});
  a.o = Tensor::contiguous(o.data(), DType::F32, {tq, H, D});
  a.lse = Tensor::contiguous(lse.data(), DType::F32, {H, tq});
  a.cu_seqlens_q = Tensor::contiguous(cq.data(), DType::I32, {B + 1});
  a.cu_seqlens_kv = Tensor::contiguous(ck.data(), DType::I32, {B + 1});
  a.max_seqlen_q = static_cast<int>(max_q);
  a.max_seqlen_kv = static_cast<int>(max_kv);
  for (test::HostBuffer& hb : buffers) a.buffers.push_back({hb.name, hb.tensor()});
  a.params = params;
  a.device = Device::cpu();
  a.queries_at_kv_end = at_kv_end;
  kernel->forward_varlen(a);

  SpecIR ir = build_spec_ir(c.spec);
  EvalEnv env = test::eval_env(ir.checked, sz, buffers, params);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t sq = lq[static_cast<size_t>(b)], skv = lk[static_cast<size_t>(b)];
    if (sq == 0) continue;
    std::vector<float> qb, kb, vb;  // [H, sq, D] and [Hkv, skv, D] from the packed rows
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < sq; ++i)
        for (int64_t d = 0; d < D; ++d) qb.push_back(q[static_cast<size_t>(((cq[static_cast<size_t>(b)] + i) * H + h) * D + d)]);
    for (int64_t h = 0; h < Hkv; ++h)
      for (int64_t i = 0; i < skv; ++i)
        for (int64_t d = 0; d < D; ++d) {
          kb.push_back(k[static_cast<size_t>(((ck[static_cast<size_t>(b)] + i) * Hkv + h) * D + d)]);
          vb.push_back(v[static_cast<size_t>(((ck[static_cast<size_t>(b)] + i) * Hkv + h) * D + d)]);
        }
    test::RefResult ref = reference_sequence(ir, env, b, c.uses_b, H, Hkv, sq, skv, D, qb, kb, vb, at_kv_end ? skv - sq : 0);
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < sq; ++i) {
        size_t rr = static_cast<size_t>(h * sq + i);
        size_t row = static_cast<size_t>(cq[static_cast<size_t>(b)] + i);
        expect_row(&ref.o[rr * static_cast<size_t>(D)], ref.lse[rr], &o[(row * static_cast<size_t>(H) + static_cast<size_t>(h)) * static_cast<size_t>(D)], 1,
                   lse[static_cast<size_t>(h * tq) + row], D, fmt::format("{} sequence {} h {} row {}", c.spec.name, b, h, i));
      }
  }
}

}  // namespace

TEST_CASE("CPU ragged prefill: packed sequences of lengths 0..300 match the reference", "[cpu][varlen]") {
  uint64_t seed = 70;
  // Lengths 1..300 (and an empty sequence), Sq != Skv within a sequence, GQA 4:1.
  std::vector<Case> all = cases(64);
  check_varlen(all[0], {1, 300, 17, 64, 129, 0}, {1, 300, 40, 64, 200, 3}, seed++);
  for (const Case& c : all) check_varlen(c, {1, 100, 17, 64, 0}, {1, 130, 40, 64, 3}, seed++);
}

TEST_CASE("CPU ragged prefill with the queries at the end of their KV (chunked prefill) matches the reference", "[cpu][varlen]") {
  uint64_t seed = 90;
  // max_seqlen_q = max_seqlen_kv, so the gallery's position-indexed buffers (sized by Sq + Skv) cover the positions.
  for (const Case& c : cases(64)) check_varlen(c, {1, 230, 17, 30, 0}, {1, 230, 40, 64, 3}, seed++, /*at_kv_end=*/true);
}

// Decode's queries sit at KV positions up to Skv - 1: a buffer indexed by the query position and sized by the query
// rows (t: [Sq]) is out of range there although the forward's ranges (q < Sq) prove it in range. The CPU compiles
// such launches with the KV positions' ranges, so the load is checked and reported, never read out of range.
TEST_CASE("CPU decode: a load indexed by the query position is checked against the KV positions", "[cpu][decode][errors]") {
  cpu::install();
  dsl::Spec spec = f32_spec(test::load_spec(test::gallery_dir() / "causal.json"), 64);
  spec.score_mod = std::string("score + t[q]");
  dsl::Diagnostics diags;
  dsl::add_buffer(spec, "t: f32[Sq]", "test", diags);
  REQUIRE(!diags.has_errors());
  Runtime rt;
  std::shared_ptr<Kernel> kernel = rt.compile(spec);
  const int64_t B = 1, H = 2, Sq = 1, D = 64, cap = 32;
  std::vector<float> q(static_cast<size_t>(B * H * Sq * D), 0.1f), k(static_cast<size_t>(B * H * cap * D), 0.1f), v = k, o = q, t = {0.5f};
  std::vector<int32_t> kv_lens = {10};
  std::unique_ptr<DecodePlan> plan = kernel->plan_decode(test::cpu_plan_options(1, 2, 2, 1, 32));
  DecodeArgs a;
  a.q = Tensor::contiguous(q.data(), DType::F32, {B, H, Sq, D});
  a.k = Tensor::contiguous(k.data(), DType::F32, {B, H, cap, D});
  a.v = Tensor::contiguous(v.data(), DType::F32, {B, H, cap, D});
  a.kv_lens = Tensor::contiguous(kv_lens.data(), DType::I32, {B});
  a.o = Tensor::contiguous(o.data(), DType::F32, {B, H, Sq, D});
  a.buffers = {{"t", Tensor::contiguous(t.data(), DType::F32, {1})}};
  CHECK_THROWS_WITH(kernel->decode(*plan, a), Catch::Contains("out of range"));  // q = 9 against t's one entry
}

TEST_CASE("CPU decode and ragged prefill: argument errors are reported", "[cpu][decode][varlen][errors]") {
  cpu::install();
  Runtime rt;
  std::shared_ptr<Kernel> kernel = rt.compile(f32_spec(test::load_spec(test::gallery_dir() / "causal.json"), 64));
  const int64_t B = 2, H = 2, Sq = 2, D = 64, cap = 32, P = 16;
  std::vector<float> q(static_cast<size_t>(B * H * Sq * D), 0.1f), k(static_cast<size_t>(B * H * cap * D), 0.1f), v = k, o = q;
  std::vector<int32_t> kv_lens = {4, 32}, q_lens = {2, 1}, table = {0, 1, 2, 3};
  DecodePlanOptions po = test::cpu_plan_options(2, 2, 2, 2, 32);
  std::unique_ptr<DecodePlan> plan = kernel->plan_decode(po);
  auto args = [&] {
    DecodeArgs a;
    a.q = Tensor::contiguous(q.data(), DType::F32, {B, H, Sq, D});
    a.k = Tensor::contiguous(k.data(), DType::F32, {B, H, cap, D});
    a.v = Tensor::contiguous(v.data(), DType::F32, {B, H, cap, D});
    a.kv_lens = Tensor::contiguous(kv_lens.data(), DType::I32, {B});
    a.q_lens = Tensor::contiguous(q_lens.data(), DType::I32, {B});
    a.o = Tensor::contiguous(o.data(), DType::F32, {B, H, Sq, D});
    return a;
  };
  CHECK_NOTHROW(kernel->decode(*plan, args()));
  kv_lens = {1, 32};  // fewer KV positions than the sequence's query rows
  CHECK_THROWS_WITH(kernel->decode(*plan, args()), Catch::Contains("kv_lens[0] is 1 but must be in 2..32"));
  kv_lens = {4, 33};
  CHECK_THROWS_WITH(kernel->decode(*plan, args()), Catch::Contains("kv_lens[1] is 33"));
  kv_lens = {4, 32};
  q_lens = {0, 1};
  CHECK_THROWS_WITH(kernel->decode(*plan, args()), Catch::Contains("q_lens[0] is 0 but must be in 1..2"));
  q_lens = {2, 1};
  DecodeArgs a = args();
  a.kv_lens = {};
  CHECK_THROWS_WITH(kernel->decode(*plan, a), Catch::Contains("`kv_lens` has no data"));

  po.page_size = P;
  std::unique_ptr<DecodePlan> paged = kernel->plan_decode(po);
  a = args();
  a.k = Tensor::contiguous(k.data(), DType::F32, {4, P, H, D});
  a.v = Tensor::contiguous(v.data(), DType::F32, {4, P, H, D});
  a.page_table = Tensor::contiguous(table.data(), DType::I32, {B, 2});
  CHECK_NOTHROW(kernel->decode(*paged, a));
  table = {0, 1, 2, 7};
  CHECK_THROWS_WITH(kernel->decode(*paged, a), Catch::Contains("page_table[1, 1] is 7 but there are 4 pages"));
  a.page_table = {};
  CHECK_THROWS_WITH(kernel->decode(*paged, a), Catch::Contains("`page_table` has no data"));

  std::vector<int32_t> cu = {0, 3, 2};
  VarlenArgs va;
  va.q = Tensor::contiguous(q.data(), DType::F32, {4, H, D});
  va.k = Tensor::contiguous(k.data(), DType::F32, {4, H, D});
  va.v = Tensor::contiguous(v.data(), DType::F32, {4, H, D});
  va.o = Tensor::contiguous(o.data(), DType::F32, {4, H, D});
  va.cu_seqlens_q = Tensor::contiguous(cu.data(), DType::I32, {3});
  va.cu_seqlens_kv = Tensor::contiguous(cu.data(), DType::I32, {3});
  va.max_seqlen_q = 4;
  va.max_seqlen_kv = 4;
  va.device = Device::cpu();
  CHECK_THROWS_WITH(kernel->forward_varlen(va), Catch::Contains("cu_seqlens_q decreases at sequence 1"));
  cu = {0, 3, 4};
  va.max_seqlen_q = 2;
  CHECK_THROWS_WITH(kernel->forward_varlen(va), Catch::Contains("sequence 0 has 3 rows in cu_seqlens_q but the bound (max_seqlen_q) is 2"));
  va.max_seqlen_q = 4;
  CHECK_NOTHROW(kernel->forward_varlen(va));
  cu = {0, 3, 5};
  CHECK_THROWS_WITH(kernel->forward_varlen(va), Catch::Contains("exceeds the 4 rows"));
  std::vector<int32_t> cu_kv = {0, 2, 4};
  cu = {0, 3, 4};
  va.cu_seqlens_kv = Tensor::contiguous(cu_kv.data(), DType::I32, {3});
  va.queries_at_kv_end = true;
  CHECK_THROWS_WITH(kernel->forward_varlen(va), Catch::Contains("sequence 0 has 3 query rows but 2 KV rows"));
}
