// Reading and writing NumPy .npy files (format 1.0-3.0, C order): how the CLI exchanges
// tensors with Python, and how captured buffers are loaded for `flexjit eval` and `run`.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "dsl/builtins.h"

namespace flexjit {

// A host tensor: raw little-endian elements in C order.
struct NpyArray {
  dsl::DType dtype = dsl::DType::F32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;  // element count * dtype size bytes

  int64_t numel() const;
  template <class T>
  const T* as() const { return reinterpret_cast<const T*>(data.data()); }
  template <class T>
  T* as() { return reinterpret_cast<T*>(data.data()); }
  // Element i converted to double (integers exactly up to 2^53, bf16/f16 exactly).
  double get(int64_t i) const;
  std::string shape_str() const;  // "[4, 16, 4096, 128]"
};

// Reads f32, f16, bf16 (stored as u2 / '<V2' / 'bfloat16' by ml_dtypes), i32, i64, u8 and
// bool arrays. Throws flexjit::Error naming the file and the problem (unsupported dtype,
// Fortran order, truncated data, big-endian, ...).
NpyArray read_npy(const std::string& path);
// Parses an in-memory .npy image (used by read_npy and the fuzz-style tests).
NpyArray parse_npy(const std::vector<uint8_t>& bytes, const std::string& what);

// Writes an array; bf16 is written as '<u2' (raw bits), the portable form. Throws on I/O errors.
void write_npy(const std::string& path, const NpyArray& a);

// fp32 <-> bf16 / f16 conversions (round to nearest even), for host-side data.
uint16_t float_to_bf16(float f);
float bf16_to_float(uint16_t b);
uint16_t float_to_half(float f);
float half_to_float(uint16_t h);
// FP8 (OCP e4m3 / e5m2; t is DType::F8E4M3 or F8E5M2) <-> fp32. float_to_fp8 rounds to nearest even and saturates
// to the largest finite value (448 / 57344), as FP8 KV caches are quantised; NaN stays NaN.
float fp8_to_float(uint8_t bits, dsl::DType t);
uint8_t float_to_fp8(float f, dsl::DType t);

}  // namespace flexjit
