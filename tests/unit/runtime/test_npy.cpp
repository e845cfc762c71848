// .npy reading and writing: every supported dtype round-trips, numpy's header forms parse,
// and malformed files are errors naming the file, never crashes.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "dsl/error.h"
#include "runtime/npy.h"

using namespace flexjit;

namespace {
std::vector<uint8_t> header_image(const std::string& dict, const std::vector<uint8_t>& data) {
  std::string h = dict;
  while ((10 + h.size() + 1) % 64) h += ' ';
  h += '\n';
  std::vector<uint8_t> out = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, static_cast<uint8_t>(h.size() & 0xff), static_cast<uint8_t>(h.size() >> 8)};
  out.insert(out.end(), h.begin(), h.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}
}  // namespace

TEST_CASE("every dtype round-trips through a file", "[npy]") {
  auto path = std::filesystem::temp_directory_path() / "flexjit_npy_test.npy";
  for (dsl::DType dt : {dsl::DType::F32, dsl::DType::F16, dsl::DType::BF16, dsl::DType::I32, dsl::DType::I64, dsl::DType::U8, dsl::DType::Bool}) {
    NpyArray a;
    a.dtype = dt;
    a.shape = {2, 3, 5};
    a.data.resize(30 * dsl::dtype_size(dt));
    for (size_t i = 0; i < a.data.size(); ++i) a.data[i] = static_cast<uint8_t>(i * 37 + 11);
    if (dt == dsl::DType::Bool)
      for (auto& b : a.data) b &= 1;
    write_npy(path.string(), a);
    NpyArray b = read_npy(path.string());
    CHECK(b.dtype == dt);
    CHECK(b.shape == a.shape);
    CHECK(b.data == a.data);
  }
  NpyArray scalar_like;
  scalar_like.dtype = dsl::DType::F32;
  scalar_like.shape = {4};
  scalar_like.data.resize(16);
  write_npy(path.string(), scalar_like);
  CHECK(read_npy(path.string()).shape == std::vector<int64_t>{4});
  std::filesystem::remove(path);
}

TEST_CASE("numpy's header forms parse (bfloat16 as u2, V2 and ml_dtypes names)", "[npy]") {
  std::vector<uint8_t> two(4, 0);
  for (const char* descr : {"'<u2'", "'<V2'", "'bfloat16'"}) {
    auto img = header_image(std::string("{'descr': ") + descr + ", 'fortran_order': False, 'shape': (2,), }", two);
    CHECK(parse_npy(img, "x").dtype == dsl::DType::BF16);
  }
  auto f16 = header_image("{'descr': '<f2', 'fortran_order': False, 'shape': (1, 2), }", two);
  CHECK(parse_npy(f16, "x").dtype == dsl::DType::F16);
  CHECK(half_to_float(float_to_half(1.5f)) == 1.5f);
  CHECK(bf16_to_float(float_to_bf16(-3.0f)) == -3.0f);
  CHECK(std::isinf(half_to_float(float_to_half(1e6f))));
  CHECK(std::isnan(bf16_to_float(float_to_bf16(NAN))));
}

TEST_CASE("malformed .npy files are errors that name the file", "[npy]") {
  std::vector<uint8_t> data(8, 0);
  auto expect_error = [](const std::vector<uint8_t>& img, const char* fragment) {
    try {
      parse_npy(img, "bad.npy");
      FAIL("accepted a malformed file");
    } catch (const Error& e) {
      std::string m = e.what();
      INFO(m);
      CHECK(m.find("bad.npy") != std::string::npos);
      CHECK(m.find(fragment) != std::string::npos);
    }
  };
  expect_error({1, 2, 3}, "not a .npy file");
  expect_error(header_image("{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", data), "unsupported .npy dtype");
  expect_error(header_image("{'descr': '<f4', 'fortran_order': True, 'shape': (2,), }", data), "Fortran");
  expect_error(header_image("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", data), "truncated");
  expect_error(header_image("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999, 99999999999), }", data), "too large");
  auto img = header_image("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", data);
  img.resize(12);
  expect_error(img, "truncated");
  try {
    read_npy("/nonexistent/dir/x.npy");
    FAIL("opened a missing file");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("/nonexistent/dir/x.npy") != std::string::npos);
  }
}

TEST_CASE("FP8 quantisation: every finite code round-trips, halfway values go to the even code, large values saturate",
          "[npy][fp8]") {
  for (dsl::DType t : {dsl::DType::F8E4M3, dsl::DType::F8E5M2}) {
    const bool e4m3 = t == dsl::DType::F8E4M3;
    const int top = e4m3 ? 0x7e : 0x7b;
    INFO((e4m3 ? "e4m3" : "e5m2"));
    for (int c = 0; c <= top; ++c) {
      for (uint8_t sign : {uint8_t(0), uint8_t(0x80)}) {
        const uint8_t code = static_cast<uint8_t>(sign | c);
        CHECK(float_to_fp8(fp8_to_float(code, t), t) == code);
      }
      if (c == top) continue;
      // Halfway between codes c and c+1: the even one of the two.
      const float mid = 0.5f * (fp8_to_float(uint8_t(c), t) + fp8_to_float(uint8_t(c + 1), t));
      CHECK(float_to_fp8(mid, t) == ((c & 1) == 0 ? c : c + 1));
      CHECK(float_to_fp8(std::nextafter(mid, 0.f), t) == c);
      CHECK(float_to_fp8(std::nextafter(mid, 1e9f), t) == c + 1);
    }
    CHECK(float_to_fp8(1e30f, t) == top);
    CHECK(float_to_fp8(-1e30f, t) == (0x80 | top));
    CHECK(std::isnan(fp8_to_float(float_to_fp8(std::nanf(""), t), t)));
  }
  CHECK(fp8_to_float(float_to_fp8(448.f, dsl::DType::F8E4M3), dsl::DType::F8E4M3) == 448.f);
  CHECK(fp8_to_float(float_to_fp8(57344.f, dsl::DType::F8E5M2), dsl::DType::F8E5M2) == 57344.f);
}
