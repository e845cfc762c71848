// Operands of the CPU backward tests (test_cpu_backward.cpp, test_cpu_varlen_backward.cpp): fp32
// values exact in the launch's dtype with their f32 / bf16 / fp16 storage (NaN-filled for outputs),
// NaN-filled buffer gradients, and the norm-wise comparison against the float64 reference.
#pragma once
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "runtime/flexjit.hpp"
#include "unit/cpu/gallery_inputs.h"

namespace flexjit::test {

inline const float kNanF = std::numeric_limits<float>::quiet_NaN();

inline float bf16_round(float f) {
  uint32_t u = static_cast<uint32_t>(float_to_bf16_bits(f)) << 16;
  float r;
  std::memcpy(&r, &u, 4);
  return r;
}

// fp16 bits of a value that is zero or a normal half (the test's inputs are multiples of 1/64).
inline uint16_t exact_half_bits(float f) {
  if (f == 0) return 0;
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>(((u >> 16) & 0x8000u) | ((((u >> 23) & 0xffu) - 112) << 10) | ((u >> 13) & 0x3ffu));
}

inline float half_bits_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16, ex = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
  if (ex == 0x1f) u = sign | 0x7f800000u | (man << 13);
  else if (ex != 0) u = sign | ((ex + 112) << 23) | (man << 13);
  else return (sign ? -1.0f : 1.0f) * static_cast<float>(man) * 5.9604644775390625e-08f;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Operands in the launch's dtype: fp32 values (already exact in it) and their storage.
struct Operands {
  DType dtype = DType::F32;
  std::vector<float> f32;
  std::vector<uint16_t> half;
  explicit Operands(DType dt, const std::vector<float>& values) : dtype(dt), f32(values) {
    for (float x : values) {
      if (dt == DType::BF16) half.push_back(float_to_bf16_bits(x));
      if (dt == DType::F16) half.push_back(exact_half_bits(x));
    }
  }
  Operands(DType dt, size_t n) : dtype(dt), f32(n, kNanF), half(dt == DType::F32 ? 0 : n, dt == DType::BF16 ? 0x7fc0 : 0x7e00) {}
  void* data() { return dtype == DType::F32 ? static_cast<void*>(f32.data()) : static_cast<void*>(half.data()); }
  Tensor tensor(std::vector<int64_t> shape) { return Tensor::contiguous(data(), dtype, std::move(shape)); }
  // The stored values as fp32.
  std::vector<float> values() const {
    if (dtype == DType::F32) return f32;
    std::vector<float> out;
    for (uint16_t h : half) {
      if (dtype == DType::F16) {
        out.push_back(half_bits_to_float(h));
        continue;
      }
      uint32_t u = static_cast<uint32_t>(h) << 16;
      float f;
      std::memcpy(&f, &u, 4);
      out.push_back(f);
    }
    return out;
  }
};

// ||out - ref|| <= rel * ||ref|| + abs * sqrt(n); never NaN.
inline void expect_close(const std::vector<float>& out, const std::vector<double>& ref, double rel, double abs, const std::string& what) {
  REQUIRE(out.size() == ref.size());
  double num = 0, den = 0;
  int64_t nan = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(out[i])) {
      ++nan;
      continue;
    }
    num += (out[i] - ref[i]) * (out[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  double err = std::sqrt(num), bound = rel * std::sqrt(den) + abs * std::sqrt(static_cast<double>(ref.size()));
  INFO(what << ": |out - ref| = " << err << ", |ref| = " << std::sqrt(den) << ", bound " << bound << ", non-finite " << nan);
  CHECK(nan == 0);
  CHECK(err <= bound);
}

// A NaN-filled f32 gradient of each buffer the spec marks `grad` (empty for the others and for those named in
// `skip`), each appended to `grads` under its buffer's name.
inline std::vector<std::vector<float>> poisoned_grads(const dsl::Spec& spec, std::vector<HostBuffer>& buffers, const std::vector<std::string>& skip,
                                                      std::vector<std::pair<std::string, Tensor>>& grads) {
  std::vector<std::vector<float>> out(spec.buffers.size());
  for (size_t i = 0; i < spec.buffers.size(); ++i) {
    if (!spec.buffers[i].requires_grad || std::find(skip.begin(), skip.end(), buffers[i].name) != skip.end()) continue;
    int64_t n = 1;
    for (int64_t e : buffers[i].shape) n *= e;
    out[i].assign(static_cast<size_t>(n), kNanF);
    grads.push_back({buffers[i].name, Tensor::contiguous(out[i].data(), DType::F32, buffers[i].shape)});
  }
  return out;
}

}  // namespace flexjit::test
