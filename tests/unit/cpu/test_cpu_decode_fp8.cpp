// The CPU decode as the oracle of FP8 KV caches (DecodePlanOptions::kv_dtype): e4m3 and e5m2
// caches quantised here with float_to_fp8, per-KV-head and single scales, contiguous and paged,
// GQA 2, bf16 Q and O, against the float64 reference of the dequantised values (scale *
// fp8_to_float); a sequence the mask hides entirely; and the argument errors.
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>

#include "compiler/frontend.h"
#include "dsl/error.h"
#include "runtime/cpu/cpu_backend.h"
#include "runtime/flexjit.hpp"
#include "runtime/npy.h"
#include "unit/cpu/decode_inputs.h"
#include "unit/cpu/gallery_inputs.h"
#include "support/error_text.h"

using namespace flexjit;

namespace {

using flexjit::test::error_of;

constexpr uint16_t kPoisonBf16 = 0x7fc1;  // a NaN: rows the decode writes must lose it, the others keep it
const float kPoisonF32 = std::numeric_limits<float>::quiet_NaN();
constexpr int64_t kB = 3, kH = 4, kHkv = 2, kSq = 2, kD = 64, kCap = 96;
const std::vector<int32_t> kKvLens = {37, 20, 96}, kQLens = {2, 1, 1};
constexpr int64_t kHiddenSeq = 1;  // the mask keeps nothing of this sequence

// Causal at the decode positions, and nothing of sequence kHiddenSeq.
dsl::Spec fp8_spec() {
  dsl::Spec spec;
  spec.name = "causal_hiding_b1";
  spec.mask_mod = fmt::format("q >= kv && b != {}", kHiddenSeq);
  spec.dtype = DType::BF16;
  spec.head_dim = static_cast<int>(kD);
  return spec;
}

std::shared_ptr<Kernel> fp8_kernel(Runtime& rt) {
  cpu::install();
  return rt.compile(fp8_spec());
}

DecodePlanOptions plan_options(int page, std::optional<DType> kv_dtype) {
  DecodePlanOptions po = test::cpu_plan_options(kB, kH, kHkv, kSq, kCap, page);
  po.kv_dtype = kv_dtype;
  return po;
}

// An FP8 cache [B, Hkv, cap, D]: its bytes and the values they stand for (scale[h] * value).
struct Fp8Cache {
  std::vector<uint8_t> bytes;
  std::vector<float> values;
};

// Random non-zero values quantised with float_to_fp8 at the KV head's scale.
Fp8Cache quantised_cache(DType t, const std::vector<float>& scale, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> mag(0.05f, 1.5f);
  std::bernoulli_distribution negative(0.5);
  Fp8Cache c;
  c.bytes.resize(static_cast<size_t>(kB * kHkv * kCap * kD));
  c.values.resize(c.bytes.size());
  for (size_t i = 0; i < c.bytes.size(); ++i) {
    const float s = scale[scale.size() == 1 ? 0 : (i / static_cast<size_t>(kCap * kD)) % static_cast<size_t>(kHkv)];
    const float x = negative(rng) ? -mag(rng) : mag(rng);
    c.bytes[i] = float_to_fp8(x / s, t);
    c.values[i] = s * fp8_to_float(c.bytes[i], t);
    REQUIRE(c.values[i] != 0.0f);
  }
  return c;
}

// Rows [0, len) of every head of sequence b of a [B, heads, rows, D] array.
std::vector<float> sequence_rows(const std::vector<float>& t, int64_t b, int64_t heads, int64_t rows, int64_t len) {
  std::vector<float> out;
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < len * kD; ++i) out.push_back(t[static_cast<size_t>((b * heads + h) * rows * kD + i)]);
  return out;
}

// One FP8 decode (format t, scales of kHkv entries or one, page size `page`, 0: contiguous)
// against the float64 reference of the dequantised cache.
void check_fp8_decode(DType t, const std::vector<float>& k_scale, const std::vector<float>& v_scale, int page, uint64_t seed) {
  const std::string what = fmt::format("{} {} scale(s) page {}", dsl::dtype_name(t), k_scale.size(), page);
  INFO(what);
  Runtime rt;
  std::shared_ptr<Kernel> kernel = fp8_kernel(rt);
  std::unique_ptr<DecodePlan> plan = kernel->plan_decode(plan_options(page, t));
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.5f, 1.5f);
  std::vector<uint16_t> q_bits(static_cast<size_t>(kB * kH * kSq * kD));
  std::vector<float> q(q_bits.size());  // the bf16 values of q
  for (size_t i = 0; i < q.size(); ++i) q[i] = bf16_to_float(q_bits[i] = float_to_bf16(u(rng)));
  Fp8Cache k = quantised_cache(t, k_scale, rng), v = quantised_cache(t, v_scale, rng);

  std::vector<uint16_t> o(static_cast<size_t>(kB * kH * kSq * kD), kPoisonBf16);
  std::vector<float> lse(static_cast<size_t>(kB * kH * kSq), kPoisonF32);
  std::vector<int32_t> kv_lens = kKvLens, q_lens = kQLens;
  std::vector<float> ks = k_scale, vs = v_scale;
  test::PagedCache<uint8_t> pc;
  DecodeArgs a;
  a.q = Tensor::contiguous(q_bits.data(), DType::BF16, {kB, kH, kSq, kD});
  if (page > 0) {
    pc = test::to_pages(k.bytes, v.bytes, kB, kHkv, kCap, kD, kv_lens, page, false, uint8_t{0x7f}, rng);  // unused slots: NaN
    a.k = Tensor::contiguous(pc.k.data(), t, {pc.num_pages, page, kHkv, kD});
    a.v = Tensor::contiguous(pc.v.data(), t, {pc.num_pages, page, kHkv, kD});
    a.page_table = Tensor::contiguous(pc.table.data(), DType::I32, {kB, pc.max_pages});
  } else {
    a.k = Tensor::contiguous(k.bytes.data(), t, {kB, kHkv, kCap, kD});
    a.v = Tensor::contiguous(v.bytes.data(), t, {kB, kHkv, kCap, kD});
  }
  a.kv_lens = Tensor::contiguous(kv_lens.data(), DType::I32, {kB});
  a.q_lens = Tensor::contiguous(q_lens.data(), DType::I32, {kB});
  a.o = Tensor::contiguous(o.data(), DType::BF16, {kB, kH, kSq, kD});
  a.lse = Tensor::contiguous(lse.data(), DType::F32, {kB, kH, kSq});
  a.k_scale = Tensor::contiguous(ks.data(), DType::F32, {static_cast<int64_t>(ks.size())});
  a.v_scale = Tensor::contiguous(vs.data(), DType::F32, {static_cast<int64_t>(vs.size())});
  kernel->decode(*plan, a);

  SpecIR ir = build_spec_ir(fp8_spec());
  EvalEnv env = test::eval_env(ir.checked, test::Sizes{kB, kH, kHkv, kSq, kCap, kD}, {}, {});
  int64_t checked = 0;
  for (int64_t b = 0; b < kB; ++b) {
    const int64_t ql = q_lens[static_cast<size_t>(b)], kl = kv_lens[static_cast<size_t>(b)];
    test::RefResult ref = test::reference_sequence(ir, env, b, true, kH, kHkv, ql, kl, kD, sequence_rows(q, b, kH, kSq, ql),
                                                   sequence_rows(k.values, b, kHkv, kCap, kl), sequence_rows(v.values, b, kHkv, kCap, kl), kl - ql);
    for (int64_t h = 0; h < kH; ++h)
      for (int64_t i = 0; i < kSq; ++i) {
        INFO(fmt::format("b {} h {} row {} (q_len {}, kv_len {})", b, h, i, ql, kl));
        const size_t row = static_cast<size_t>((b * kH + h) * kSq + i);
        const uint16_t* orow = &o[row * static_cast<size_t>(kD)];
        if (i >= ql) {  // past the sequence's query rows: left alone
          REQUIRE(std::isnan(lse[row]));
          for (int64_t d = 0; d < kD; ++d) REQUIRE(orow[d] == kPoisonBf16);
          continue;
        }
        const size_t rr = static_cast<size_t>(h * ql + i);
        if (b == kHiddenSeq) {
          REQUIRE(ref.lse[rr] == -std::numeric_limits<double>::infinity());
          REQUIRE(lse[row] == -std::numeric_limits<float>::infinity());
          for (int64_t d = 0; d < kD; ++d) REQUIRE(bf16_to_float(orow[d]) == 0.0f);
          continue;
        }
        // LSE is f32: 1e-4 relative. O is bf16: half an ulp (2^-9 relative) from the rounding plus
        // the fp32 accumulation; NaN fails every comparison.
        REQUIRE(std::abs(lse[row] - ref.lse[rr]) <= 1e-4 * std::max(1.0, std::abs(ref.lse[rr])));
        double row_max = 0;
        for (int64_t d = 0; d < kD; ++d) row_max = std::max(row_max, std::abs(ref.o[rr * kD + static_cast<size_t>(d)]));
        for (int64_t d = 0; d < kD; ++d) {
          const double want = ref.o[rr * kD + static_cast<size_t>(d)], got = bf16_to_float(orow[d]);
          INFO(fmt::format("d {}: {} vs reference {}", d, got, want));
          REQUIRE(std::abs(got - want) <= std::abs(want) / 256 + 1e-5 * row_max);
          ++checked;
        }
      }
  }
  CHECK(checked == (kQLens[0] + kQLens[2]) * kH * kD);
}

}  // namespace

TEST_CASE("CPU decode: FP8 KV caches match the dequantised reference", "[cpu][decode][fp8]") {
  uint64_t seed = 800;
  for (DType t : {DType::F8E4M3, DType::F8E5M2})
    for (int page : {0, 16}) {
      check_fp8_decode(t, {0.004f, 0.011f}, {0.007f, 0.003f}, page, seed++);  // per KV head (values up to 1.5 / 0.003 = 500)
      check_fp8_decode(t, {0.01f}, {0.02f}, page, seed++);                     // one scale for the cache
    }
}

TEST_CASE("CPU decode: FP8 argument errors say what to change", "[cpu][decode][fp8][errors]") {
  Runtime rt;
  std::shared_ptr<Kernel> kernel = fp8_kernel(rt);
  std::vector<uint16_t> q(static_cast<size_t>(kB * kH * kSq * kD), 0x3f80), o = q, k16(static_cast<size_t>(kB * kHkv * kCap * kD), 0x3f80);
  std::vector<uint8_t> k8(k16.size(), 0x38);
  std::vector<int32_t> kv_lens = kKvLens, q_lens = kQLens;
  std::vector<float> scales = {0.5f, 0.25f, 1.0f};
  std::vector<int32_t> int_scales = {1, 1};
  auto args = [&](DType kv, void* k) {
    DecodeArgs a;
    a.q = Tensor::contiguous(q.data(), DType::BF16, {kB, kH, kSq, kD});
    a.k = Tensor::contiguous(k, kv, {kB, kHkv, kCap, kD});
    a.v = a.k;
    a.kv_lens = Tensor::contiguous(kv_lens.data(), DType::I32, {kB});
    a.q_lens = Tensor::contiguous(q_lens.data(), DType::I32, {kB});
    a.o = Tensor::contiguous(o.data(), DType::BF16, {kB, kH, kSq, kD});
    return a;
  };
  std::unique_ptr<DecodePlan> fp8 = kernel->plan_decode(plan_options(0, DType::F8E4M3));
  std::unique_ptr<DecodePlan> bf16 = kernel->plan_decode(plan_options(0, std::nullopt));
  CHECK_NOTHROW(kernel->decode(*fp8, args(DType::F8E4M3, k8.data())));
  CHECK_NOTHROW(kernel->decode(*bf16, args(DType::BF16, k16.data())));

  CHECK_THAT(error_of([&] { kernel->decode(*fp8, args(DType::BF16, k16.data())); }),
             Catch::Contains("`k` is bf16 but the plan's KV cache is f8e4m3 (its kv_dtype); pass k and v in that dtype, or plan with kv_dtype bf16"));
  CHECK_THAT(error_of([&] { kernel->decode(*bf16, args(DType::F8E5M2, k8.data())); }),
             Catch::Contains("`k` is f8e5m2 but the plan's KV cache is bf16 (the spec's dtype; the plan sets no kv_dtype)"));
  CHECK_THAT(error_of([&] { kernel->decode(*fp8, args(DType::F8E5M2, k8.data())); }), Catch::Contains("`k` is f8e5m2 but the plan's KV cache is f8e4m3"));

  DecodeArgs a = args(DType::BF16, k16.data());
  a.k_scale = Tensor::contiguous(scales.data(), DType::F32, {kHkv});
  CHECK_THAT(error_of([&] { kernel->decode(*bf16, a); }),
             Catch::Contains("`k_scale` is only for FP8 caches, but the plan's KV cache is bf16; plan with kv_dtype f8e4m3 or f8e5m2"));

  a = args(DType::F8E4M3, k8.data());
  a.v_scale = Tensor::contiguous(scales.data(), DType::F32, {3});
  CHECK_THAT(error_of([&] { kernel->decode(*fp8, a); }),
             Catch::Contains("`v_scale` must be an f32 tensor of shape [2] (one scale per KV head) or [1], got f32 [3]"));
  a.v_scale = Tensor::contiguous(int_scales.data(), DType::I32, {kHkv});
  CHECK_THAT(error_of([&] { kernel->decode(*fp8, a); }), Catch::Contains("`v_scale` must be an f32 tensor of shape [2]"));
  a.v_scale = Tensor::contiguous(scales.data(), DType::F32, {1});
  a.k_scale = Tensor::contiguous(scales.data(), DType::F32, {kHkv});
  CHECK_THAT(error_of([&] { kernel->decode(*fp8, a); }), Catch::Contains("k_scale has shape [2] and v_scale [1]: they must have the same shape"));
  a.v_scale = Tensor::contiguous(scales.data(), DType::F32, {kHkv});
  CHECK_NOTHROW(kernel->decode(*fp8, a));

  // kv_dtype must be the spec's dtype or FP8 (checked when planning or at the first decode).
  CHECK_THAT(error_of([&] { kernel->decode(*kernel->plan_decode(plan_options(0, DType::F16)), args(DType::F16, k16.data())); }),
             Catch::Contains("kv_dtype f16 is not supported for a bf16 spec; use bf16 (the spec's dtype), f8e4m3 or f8e5m2"));
  CHECK_NOTHROW(kernel->decode(*kernel->plan_decode(plan_options(0, DType::BF16)), args(DType::BF16, k16.data())));
}
