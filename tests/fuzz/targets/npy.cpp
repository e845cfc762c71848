// .npy files (`flexjit run/eval --buffer x=FILE`): any bytes either parse into an array whose
// data matches its shape and dtype, which write_npy and read_npy then round-trip exactly, or
// are rejected with flexjit::Error.
#include <unistd.h>

#include <filesystem>
#include <string>

#include "dsl/error.h"
#include "fuzz/targets/targets.h"
#include "runtime/npy.h"

namespace flexjit::fuzz {

namespace {

std::string round_trip(const NpyArray& a) {
  static const std::string path =
      (std::filesystem::temp_directory_path() / ("flexjit-fuzz-npy-" + std::to_string(::getpid()) + ".npy")).string();
  write_npy(path, a);
  NpyArray b = read_npy(path);
  std::filesystem::remove(path);
  if (b.dtype != a.dtype || b.shape != a.shape || b.data != a.data) return "write_npy then read_npy changed the array " + a.shape_str();
  return "";
}

}  // namespace

std::string run_npy(const uint8_t* data, size_t size) {
  std::vector<uint8_t> bytes(data, data + size);
  NpyArray a;
  try {
    a = parse_npy(bytes, "fuzz.npy");
  } catch (const Error&) {
    return "";
  } catch (const std::exception& e) {
    return std::string("parse_npy threw something other than flexjit::Error: ") + e.what();
  }
  const int64_t n = a.numel();
  if (n < 0 || a.data.size() != static_cast<size_t>(n) * dsl::dtype_size(a.dtype))
    return "parsed array " + a.shape_str() + " holds " + std::to_string(a.data.size()) + " bytes";
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += a.get(i);
  (void)sum;
  try {
    return round_trip(a);
  } catch (const std::exception& e) {
    return std::string("a parsed array does not round-trip: ") + e.what();
  }
}

}  // namespace flexjit::fuzz
