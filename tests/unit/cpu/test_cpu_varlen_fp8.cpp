// The CPU ragged prefill with FP8 K and V (VarlenArgs::k / v in f8e4m3 or f8e5m2, with k_scale /
// v_scale), the oracle of the GPU's: random finite non-zero codes of both formats in strided k and
// v, per-KV-head and single scales, GQA 2, packed sequences with an empty query range and an empty
// KV range, causal and no mask, f32 and bf16 specs. Each run is compared element by element with a
// ragged prefill of the same spec over K and V in the spec's dtype holding the dequantised values
// (scale * value, the bytes decoded here rather than by runtime/npy.h); then the argument errors.
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "dsl/error.h"
#include "runtime/cpu/cpu_backend.h"
#include "runtime/flexjit.hpp"
#include "runtime/npy.h"
#include "support/error_text.h"

using namespace flexjit;

namespace {

using flexjit::test::error_of;

constexpr int64_t kH = 4, kHkv = 2, kD = 64;
constexpr int64_t kPad = 16;        // k's rows are kD + kPad bytes apart; the padding holds NaN codes
constexpr uint8_t kNanCode = 0x7f;  // NaN in both formats
// Sequence 1 has no query rows, sequence 3 no KV rows (its rows: LSE -inf, O 0).
const std::vector<int32_t> kLenQ = {5, 0, 70, 33, 1}, kLenKv = {40, 12, 70, 0, 129};

// The value of a finite FP8 byte (OCP e4m3fn: exponent bias 7, 3 mantissa bits; e5m2: bias 15, 2).
double fp8_value(uint8_t c, DType t) {
  const int mant_bits = t == DType::F8E4M3 ? 3 : 2, bias = t == DType::F8E4M3 ? 7 : 15;
  const int e = (c & 0x7f) >> mant_bits, m = c & ((1 << mant_bits) - 1);
  const double mag = e == 0 ? std::ldexp(m, 1 - bias - mant_bits) : std::ldexp(m | (1 << mant_bits), e - bias - mant_bits);
  return (c & 0x80) ? -mag : mag;
}

bool finite_nonzero(uint8_t c, DType t) {
  const int magnitude = c & 0x7f;
  if (magnitude == 0) return false;
  return t == DType::F8E4M3 ? magnitude != 0x7f : (magnitude & 0x7c) != 0x7c;  // e4m3fn: S.1111.111 is NaN; e5m2: exponent 11111
}

dsl::Spec varlen_spec(DType dtype, bool causal) {
  dsl::Spec spec;
  spec.name = causal ? "causal" : "plain";
  if (causal) spec.mask_mod = "kv <= q";
  spec.dtype = dtype;
  spec.head_dim = static_cast<int>(kD);
  return spec;
}

// Packed sequence offsets [0, l0, l0 + l1, ...].
std::vector<int32_t> offsets(const std::vector<int32_t>& lengths) {
  std::vector<int32_t> cu = {0};
  for (int32_t l : lengths) cu.push_back(cu.back() + l);
  return cu;
}

// Elements of the spec's dtype (f32 or bf16) as raw bytes, with their f32 values.
struct SpecTensor {
  DType dtype;
  std::vector<char> bytes;
  size_t elem() const { return dtype == DType::F32 ? 4 : 2; }
  explicit SpecTensor(DType t, size_t n) : dtype(t), bytes(n * (t == DType::F32 ? 4 : 2)) {}
  void set(size_t i, float x) {
    if (dtype == DType::F32) {
      std::memcpy(bytes.data() + i * 4, &x, 4);
    } else {
      const uint16_t b = float_to_bf16(x);
      REQUIRE(bf16_to_float(b) == x);  // the values put here are exact in bf16
      std::memcpy(bytes.data() + i * 2, &b, 2);
    }
  }
  void poison() {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const uint16_t nan16 = 0x7fc1;
    for (size_t i = 0; i < bytes.size() / elem(); ++i) std::memcpy(bytes.data() + i * elem(), dtype == DType::F32 ? static_cast<const void*>(&nan) : &nan16, elem());
  }
  float get(size_t i) const {
    if (dtype == DType::F32) {
      float x;
      std::memcpy(&x, bytes.data() + i * 4, 4);
      return x;
    }
    uint16_t b;
    std::memcpy(&b, bytes.data() + i * 2, 2);
    return bf16_to_float(b);
  }
  Tensor tensor(std::vector<int64_t> shape) { return Tensor::contiguous(bytes.data(), dtype, std::move(shape)); }
};

// One FP8 ragged prefill (format t, scales of kHkv entries or one) against the same spec's ragged
// prefill over the dequantised K and V. bf16 specs take power-of-two scales, so that every
// dequantised value is exact in bf16 and both runs see the same K and V.
void check_fp8_varlen(DType t, DType spec_dtype, bool causal, const std::vector<float>& k_scale, const std::vector<float>& v_scale, uint64_t seed) {
  INFO(fmt::format("{} K / V, {} spec, {}, {} scale(s)", dsl::dtype_name(t), dsl::dtype_name(spec_dtype), causal ? "causal" : "no mask",
                   k_scale.size()));
  cpu::install();
  Runtime rt;
  std::shared_ptr<Kernel> kernel = rt.compile(varlen_spec(spec_dtype, causal));
  std::vector<int32_t> cq = offsets(kLenQ), ck = offsets(kLenKv);
  const int64_t B = static_cast<int64_t>(kLenQ.size()), tq = cq.back(), tk = ck.back();
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.5f, 1.5f);
  std::uniform_int_distribution<int> byte(0, 255);
  auto code = [&] {
    for (;;) {
      const uint8_t c = static_cast<uint8_t>(byte(rng));
      if (finite_nonzero(c, t)) return c;
    }
  };

  SpecTensor q(spec_dtype, static_cast<size_t>(tq * kH * kD));
  for (size_t i = 0; i < q.bytes.size() / q.elem(); ++i) q.set(i, spec_dtype == DType::F32 ? u(rng) : bf16_to_float(float_to_bf16(u(rng))));
  // FP8 k as [tk, Hkv, D] in rows of D + kPad codes; v stored head-major ([Hkv, tk, D] in memory).
  std::vector<uint8_t> k8(static_cast<size_t>(tk * kHkv * (kD + kPad)), kNanCode), v8(static_cast<size_t>(kHkv * tk * kD));
  SpecTensor k_ref(spec_dtype, static_cast<size_t>(tk * kHkv * kD)), v_ref(spec_dtype, k_ref.bytes.size() / k_ref.elem());
  for (int64_t r = 0; r < tk; ++r)
    for (int64_t h = 0; h < kHkv; ++h)
      for (int64_t d = 0; d < kD; ++d) {
        const size_t ref = static_cast<size_t>((r * kHkv + h) * kD + d);
        uint8_t& kc = k8[static_cast<size_t>((r * kHkv + h) * (kD + kPad) + d)];
        uint8_t& vc = v8[static_cast<size_t>((h * tk + r) * kD + d)];
        kc = code();
        vc = code();
        k_ref.set(ref, k_scale[k_scale.size() == 1 ? 0 : static_cast<size_t>(h)] * static_cast<float>(fp8_value(kc, t)));
        v_ref.set(ref, v_scale[v_scale.size() == 1 ? 0 : static_cast<size_t>(h)] * static_cast<float>(fp8_value(vc, t)));
      }
  std::vector<float> ks = k_scale, vs = v_scale;

  auto run = [&](const Tensor& k, const Tensor& v, const Tensor& k_sc, const Tensor& v_sc, SpecTensor& o, std::vector<float>& lse) {
    o.poison();
    lse.assign(static_cast<size_t>(kH * tq), std::numeric_limits<float>::quiet_NaN());
    VarlenArgs a;
    a.q = q.tensor({tq, kH, kD});
    a.k = k;
    a.v = v;
    a.k_scale = k_sc;
    a.v_scale = v_sc;
    a.o = o.tensor({tq, kH, kD});
    a.lse = Tensor::contiguous(lse.data(), DType::F32, {kH, tq});
    a.cu_seqlens_q = Tensor::contiguous(cq.data(), DType::I32, {B + 1});
    a.cu_seqlens_kv = Tensor::contiguous(ck.data(), DType::I32, {B + 1});
    a.max_seqlen_q = 70;
    a.max_seqlen_kv = 129;
    a.device = Device::cpu();
    kernel->forward_varlen(a);
  };
  SpecTensor o(spec_dtype, static_cast<size_t>(tq * kH * kD)), o_ref = o;
  std::vector<float> lse, lse_ref;
  run(Tensor{k8.data(), t, {tk, kHkv, kD}, {kHkv * (kD + kPad), kD + kPad, 1}}, Tensor{v8.data(), t, {tk, kHkv, kD}, {kD, tk * kD, 1}},
      Tensor::contiguous(ks.data(), DType::F32, {static_cast<int64_t>(ks.size())}),
      Tensor::contiguous(vs.data(), DType::F32, {static_cast<int64_t>(vs.size())}), o, lse);
  run(k_ref.tensor({tk, kHkv, kD}), v_ref.tensor({tk, kHkv, kD}), Tensor{}, Tensor{}, o_ref, lse_ref);

  // Both runs compute from the same f32 K and V values, so they agree exactly; NaN (the poison)
  // equals nothing.
  int64_t empty_rows = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = cq[static_cast<size_t>(b)]; i < cq[static_cast<size_t>(b + 1)]; ++i)
      for (int64_t h = 0; h < kH; ++h) {
        INFO(fmt::format("sequence {} row {} head {}", b, i - cq[static_cast<size_t>(b)], h));
        const size_t l = static_cast<size_t>(h * tq + i);
        REQUIRE(lse[l] == lse_ref[l]);
        if (lse_ref[l] == -std::numeric_limits<float>::infinity()) ++empty_rows;
        for (int64_t d = 0; d < kD; ++d) {
          const size_t e = static_cast<size_t>((i * kH + h) * kD + d);
          INFO(fmt::format("d {}: {} vs {}", d, o.get(e), o_ref.get(e)));
          REQUIRE(o.get(e) == o_ref.get(e));
        }
      }
  CHECK(empty_rows == kLenQ[3] * kH);  // the sequence without KV rows, and no other
}

}  // namespace

TEST_CASE("CPU ragged prefill: FP8 K and V match the prefill of their dequantised values", "[cpu][varlen][fp8]") {
  uint64_t seed = 900;
  for (DType t : {DType::F8E4M3, DType::F8E5M2}) {
    // Scales that bring the formats' ranges (448, 57344) to magnitudes up to about 14.
    const float unit = t == DType::F8E4M3 ? 1.0f / 32 : 1.0f / 4096;
    for (bool causal : {true, false}) {
      check_fp8_varlen(t, DType::F32, causal, {0.41f * unit, 0.87f * unit}, {0.63f * unit, 0.29f * unit}, seed++);  // per KV head
      check_fp8_varlen(t, DType::F32, causal, {0.77f * unit}, {0.53f * unit}, seed++);                             // one for all heads
      check_fp8_varlen(t, DType::BF16, causal, {unit / 2, unit}, {unit, unit / 4}, seed++);
      check_fp8_varlen(t, DType::BF16, causal, {unit}, {unit / 2}, seed++);
    }
  }
}

TEST_CASE("CPU ragged prefill: FP8 argument errors say what to change", "[cpu][varlen][fp8][errors]") {
  cpu::install();
  Runtime rt;
  std::shared_ptr<Kernel> kernel = rt.compile(varlen_spec(DType::BF16, true));
  const int64_t rows = 8;
  std::vector<uint16_t> q(static_cast<size_t>(rows * kH * kD), 0x3f80), o = q, kv16(static_cast<size_t>(rows * kHkv * kD), 0x3f80);
  std::vector<uint8_t> kv8(kv16.size(), 0x38);  // 1.0 in e4m3
  std::vector<int32_t> cu = {0, 3, rows};
  std::vector<float> scales = {0.5f, 0.25f, 1.0f};
  std::vector<int32_t> int_scales = {1, 1};
  auto data = [&](DType t) { return dsl::dtype_size(t) == 2 ? static_cast<void*>(kv16.data()) : kv8.data(); };
  auto args = [&](DType k_dtype, DType v_dtype) {
    VarlenArgs a;
    a.q = Tensor::contiguous(q.data(), DType::BF16, {rows, kH, kD});
    a.k = Tensor::contiguous(data(k_dtype), k_dtype, {rows, kHkv, kD});
    a.v = Tensor::contiguous(data(v_dtype), v_dtype, {rows, kHkv, kD});
    a.o = Tensor::contiguous(o.data(), DType::BF16, {rows, kH, kD});
    a.cu_seqlens_q = Tensor::contiguous(cu.data(), DType::I32, {3});
    a.cu_seqlens_kv = Tensor::contiguous(cu.data(), DType::I32, {3});
    a.max_seqlen_q = static_cast<int>(rows);
    a.max_seqlen_kv = static_cast<int>(rows);
    a.device = Device::cpu();
    return a;
  };
  CHECK_NOTHROW(kernel->forward_varlen(args(DType::F8E4M3, DType::F8E4M3)));  // no scales: 1
  CHECK_NOTHROW(kernel->forward_varlen(args(DType::BF16, DType::BF16)));

  CHECK_THAT(error_of([&] { kernel->forward_varlen(args(DType::F8E4M3, DType::BF16)); }),
             Catch::Contains("ragged prefill (CPU): `k` is f8e4m3 but `v` is bf16: pass both in the spec's dtype (bf16), or both in one FP8 format"));
  CHECK_THAT(error_of([&] { kernel->forward_varlen(args(DType::BF16, DType::F8E5M2)); }), Catch::Contains("`k` is bf16 but `v` is f8e5m2"));
  CHECK_THAT(error_of([&] { kernel->forward_varlen(args(DType::F8E4M3, DType::F8E5M2)); }), Catch::Contains("`k` is f8e4m3 but `v` is f8e5m2"));
  CHECK_THAT(error_of([&] { kernel->forward_varlen(args(DType::F16, DType::F16)); }),
             Catch::Contains("`k` is f16 but must be bf16 (the spec's dtype), or f8e4m3 or f8e5m2"));

  VarlenArgs a = args(DType::BF16, DType::BF16);
  a.k_scale = Tensor::contiguous(scales.data(), DType::F32, {kHkv});
  CHECK_THAT(error_of([&] { kernel->forward_varlen(a); }),
             Catch::Contains("`k_scale` is only for an FP8 k and v (f8e4m3 or f8e5m2), but k is bf16; pass k and v in FP8, or drop the scale"));

  a = args(DType::F8E5M2, DType::F8E5M2);
  a.v_scale = Tensor::contiguous(scales.data(), DType::F32, {3});
  CHECK_THAT(error_of([&] { kernel->forward_varlen(a); }),
             Catch::Contains("`v_scale` must be an f32 tensor of shape [2] (one scale per KV head) or [1], got f32 [3]"));
  a.v_scale = Tensor::contiguous(scales.data(), DType::F32, {kHkv, 1});
  CHECK_THAT(error_of([&] { kernel->forward_varlen(a); }), Catch::Contains("`v_scale` must be an f32 tensor of shape [2] (one scale per KV head) or [1], got f32 [2, 1]"));
  a.v_scale = Tensor::contiguous(int_scales.data(), DType::I32, {kHkv});
  CHECK_THAT(error_of([&] { kernel->forward_varlen(a); }), Catch::Contains("`v_scale` must be an f32 tensor of shape [2]"));
  a.v_scale = Tensor::contiguous(scales.data(), DType::F32, {1});
  a.k_scale = Tensor::contiguous(scales.data(), DType::F32, {kHkv});
  CHECK_THAT(error_of([&] { kernel->forward_varlen(a); }), Catch::Contains("k_scale has shape [2] and v_scale [1]: they must have the same shape"));
  a.v_scale = Tensor::contiguous(scales.data(), DType::F32, {kHkv});
  CHECK_NOTHROW(kernel->forward_varlen(a));
}
