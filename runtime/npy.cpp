#include "runtime/npy.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>

#include "dsl/error.h"

namespace flexjit {

int64_t NpyArray::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string NpyArray::shape_str() const { return fmt::format("[{}]", fmt::join(shape, ", ")); }

uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if (std::isnan(f)) return static_cast<uint16_t>((u >> 16) | 0x40);
  uint32_t rounding = 0x7fff + ((u >> 16) & 1);
  return static_cast<uint16_t>((u + rounding) >> 16);
}

float bf16_to_float(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t float_to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000;
  uint32_t mant = x & 0x007fffff;
  int32_t exp = static_cast<int32_t>((x >> 23) & 0xff);
  if (exp == 0xff) return static_cast<uint16_t>(sign | 0x7c00 | (mant ? 0x200 : 0));
  int32_t e = exp - 127 + 15;
  if (e >= 0x1f) return static_cast<uint16_t>(sign | 0x7c00);
  if (e <= 0) {
    if (e < -10) return static_cast<uint16_t>(sign);
    mant |= 0x00800000;
    uint32_t shift = static_cast<uint32_t>(14 - e);
    uint32_t half = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1);
    uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = sign | (static_cast<uint32_t>(e) << 10) | (mant >> 13);
  uint32_t rem = mant & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) ++half;
  return static_cast<uint16_t>(half);
}

float fp8_to_float(uint8_t bits, dsl::DType t) {
  const bool e4m3 = t == dsl::DType::F8E4M3;
  const int mant_bits = e4m3 ? 3 : 2, bias = e4m3 ? 7 : 15;
  const int exp = (bits & 0x7f) >> mant_bits, mant = bits & ((1 << mant_bits) - 1);
  const float sign = bits & 0x80 ? -1.f : 1.f;
  if (e4m3 && (bits & 0x7f) == 0x7f) return std::nanf("");
  if (!e4m3 && exp == 0x1f) return mant ? std::nanf("") : sign * INFINITY;
  if (exp == 0) return sign * std::ldexp(static_cast<float>(mant), 1 - bias - mant_bits);
  return sign * std::ldexp(static_cast<float>(mant | (1 << mant_bits)), exp - bias - mant_bits);
}

uint8_t float_to_fp8(float f, dsl::DType t) {
  const bool e4m3 = t == dsl::DType::F8E4M3;
  if (std::isnan(f)) return 0x7f;  // a NaN code of both formats
  // The finite non-negative codes ascend with their values, so the nearest code is found by a binary search of
  // their values; decoded once per format because the benchmarks quantise caches of half a billion elements.
  using Table = std::array<float, 0x7f>;
  static const auto make = [](dsl::DType type) {
    Table v{};
    for (size_t c = 0; c < v.size(); ++c) v[c] = fp8_to_float(static_cast<uint8_t>(c), type);
    return v;
  };
  static const Table e4m3_values = make(dsl::DType::F8E4M3), e5m2_values = make(dsl::DType::F8E5M2);
  const Table& values = e4m3 ? e4m3_values : e5m2_values;
  const int top = e4m3 ? 0x7e : 0x7b;  // the largest finite code; larger magnitudes saturate to it
  const uint8_t sign = std::signbit(f) ? 0x80 : 0;
  const float a = std::fabs(f);
  if (a >= values[size_t(top)]) return static_cast<uint8_t>(sign | top);
  // hi: the first code above a (a < values[top], so hi <= top); lo below it. Ties go to the even code.
  const int hi = static_cast<int>(std::upper_bound(values.begin(), values.begin() + top, a) - values.begin());
  const int lo = hi - 1;
  const float dl = a - values[size_t(lo)], dh = values[size_t(hi)] - a;
  const int code = dl < dh || (dl == dh && (lo & 1) == 0) ? lo : hi;
  return static_cast<uint8_t>(sign | code);
}

float half_to_float(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while (!(mant & 0x400));
      u = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | ((mant & 0x3ff) << 13);
    }
  } else if (exp == 0x1f) {
    u = sign | 0x7f800000 | (mant << 13);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

double NpyArray::get(int64_t i) const {
  switch (dtype) {
    case dsl::DType::F32: return as<float>()[i];
    case dsl::DType::F16: return half_to_float(as<uint16_t>()[i]);
    case dsl::DType::BF16: return bf16_to_float(as<uint16_t>()[i]);
    case dsl::DType::I32: return as<int32_t>()[i];
    case dsl::DType::I64: return static_cast<double>(as<int64_t>()[i]);
    case dsl::DType::U8: return as<uint8_t>()[i];
    case dsl::DType::Bool: return as<uint8_t>()[i] != 0;
    case dsl::DType::F8E4M3:
    case dsl::DType::F8E5M2: return fp8_to_float(as<uint8_t>()[i], dtype);
  }
  return 0;
}

namespace {

// The value of `'key': <value>` in the header dict, as raw text.
std::string dict_value(const std::string& header, const std::string& key, const std::string& what) {
  size_t k = header.find("'" + key + "'");
  if (k == std::string::npos) throw Error(fmt::format("{}: .npy header has no '{}' entry", what, key));
  size_t colon = header.find(':', k);
  if (colon == std::string::npos) throw Error(fmt::format("{}: malformed .npy header", what));
  size_t v = header.find_first_not_of(" ", colon + 1);
  if (v == std::string::npos) throw Error(fmt::format("{}: malformed .npy header", what));
  if (header[v] == '(') {
    size_t e = header.find(')', v);
    if (e == std::string::npos) throw Error(fmt::format("{}: malformed shape in .npy header", what));
    return header.substr(v, e - v + 1);
  }
  size_t e = header.find_first_of(",}", v);
  return header.substr(v, e == std::string::npos ? std::string::npos : e - v);
}

dsl::DType parse_descr(std::string d, const std::string& what) {
  auto strip = [](std::string s) {
    while (!s.empty() && (s.front() == '\'' || s.front() == '"' || s.front() == ' ')) s.erase(s.begin());
    while (!s.empty() && (s.back() == '\'' || s.back() == '"' || s.back() == ' ')) s.pop_back();
    return s;
  };
  d = strip(d);
  if (d == "<f4") return dsl::DType::F32;
  if (d == "<f2") return dsl::DType::F16;
  if (d == "<u2" || d == "<V2" || d == "bfloat16" || d == "<bf16") return dsl::DType::BF16;
  if (d == "<i4") return dsl::DType::I32;
  if (d == "<i8") return dsl::DType::I64;
  if (d == "|u1" || d == "<u1") return dsl::DType::U8;
  if (d == "|b1") return dsl::DType::Bool;
  throw Error(fmt::format("{}: unsupported .npy dtype '{}'; use float32, float16, bfloat16 (as uint16), int32, int64, uint8 or bool, "
                          "little-endian",
                          what, d));
}

std::vector<int64_t> parse_shape(const std::string& s, const std::string& what) {
  std::vector<int64_t> shape;
  std::string cur;
  for (char c : s) {
    if (c >= '0' && c <= '9') {
      cur += c;
    } else if (c == ',' || c == ')') {
      if (!cur.empty()) {
        if (cur.size() > 15) throw Error(fmt::format("{}: .npy dimension too large", what));
        shape.push_back(std::stoll(cur));
        cur.clear();
      }
    } else if (c != '(' && c != ' ' && c != 'L') {
      throw Error(fmt::format("{}: malformed shape '{}' in .npy header", what, s));
    }
  }
  return shape;
}

}  // namespace

NpyArray parse_npy(const std::vector<uint8_t>& bytes, const std::string& what) {
  static const uint8_t magic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
  if (bytes.size() < 10 || std::memcmp(bytes.data(), magic, 6) != 0) throw Error(fmt::format("{}: not a .npy file (bad magic)", what));
  uint8_t major = bytes[6];
  size_t header_len, offset;
  if (major == 1) {
    header_len = bytes[8] | (bytes[9] << 8);
    offset = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) throw Error(fmt::format("{}: truncated .npy header", what));
    header_len = bytes[8] | (bytes[9] << 8) | (static_cast<size_t>(bytes[10]) << 16) | (static_cast<size_t>(bytes[11]) << 24);
    offset = 12;
  } else {
    throw Error(fmt::format("{}: unsupported .npy format version {}", what, major));
  }
  if (offset + header_len > bytes.size()) throw Error(fmt::format("{}: truncated .npy header", what));
  std::string header(bytes.begin() + offset, bytes.begin() + offset + header_len);
  NpyArray a;
  a.dtype = parse_descr(dict_value(header, "descr", what), what);
  if (dict_value(header, "fortran_order", what).find("True") != std::string::npos)
    throw Error(fmt::format("{}: Fortran-order arrays are not supported; save with np.ascontiguousarray", what));
  a.shape = parse_shape(dict_value(header, "shape", what), what);
  int64_t n = 1;
  for (int64_t d : a.shape) {
    if (d < 0 || (d > 0 && n > (int64_t(1) << 40) / d)) throw Error(fmt::format("{}: .npy shape too large", what));
    n *= d;
  }
  size_t need = static_cast<size_t>(n) * dsl::dtype_size(a.dtype);
  size_t data_at = offset + header_len;
  if (bytes.size() - data_at < need)
    throw Error(fmt::format("{}: truncated .npy data: shape {} needs {} bytes, file has {}", what, a.shape_str(), need, bytes.size() - data_at));
  a.data.assign(bytes.begin() + data_at, bytes.begin() + data_at + need);
  return a;
}

NpyArray read_npy(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(fmt::format("cannot open '{}': {}", path, std::strerror(errno)));
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return parse_npy(bytes, path);
}

void write_npy(const std::string& path, const NpyArray& a) {
  const char* descr = "<f4";
  switch (a.dtype) {
    case dsl::DType::F32: descr = "<f4"; break;
    case dsl::DType::F16: descr = "<f2"; break;
    case dsl::DType::BF16: descr = "<u2"; break;
    case dsl::DType::I32: descr = "<i4"; break;
    case dsl::DType::I64: descr = "<i8"; break;
    case dsl::DType::U8: descr = "|u1"; break;
    case dsl::DType::Bool: descr = "|b1"; break;
    case dsl::DType::F8E4M3:
    case dsl::DType::F8E5M2: descr = "|u1"; break;  // numpy has no FP8: the raw bytes, as bf16 is written
  }
  std::string shape = "(";
  for (size_t i = 0; i < a.shape.size(); ++i) shape += std::to_string(a.shape[i]) + (a.shape.size() == 1 || i + 1 < a.shape.size() ? "," : "");
  shape += ")";
  std::string header = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': {}, }}", descr, shape);
  size_t total = 10 + header.size() + 1;
  header += std::string((64 - total % 64) % 64, ' ') + "\n";
  std::ofstream f(path, std::ios::binary);
  if (!f) throw Error(fmt::format("cannot write '{}': {}", path, std::strerror(errno)));
  const uint8_t magic[8] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0};
  f.write(reinterpret_cast<const char*>(magic), 8);
  uint16_t len = static_cast<uint16_t>(header.size());
  f.put(static_cast<char>(len & 0xff));
  f.put(static_cast<char>(len >> 8));
  f << header;
  f.write(reinterpret_cast<const char*>(a.data.data()), static_cast<std::streamsize>(a.data.size()));
  if (!f) throw Error(fmt::format("write to '{}' failed", path));
}

}  // namespace flexjit
