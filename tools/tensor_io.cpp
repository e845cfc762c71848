#include "tools/tensor_io.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <thread>

#include "dsl/error.h"

namespace flexjit::tools {

Device parse_device(const std::string& text) {
  if (text == "cpu") return Device::cpu();
  if (text == "cuda") return Device::cuda(0);
  if (text.rfind("cuda:", 0) == 0) {
    char* end = nullptr;
    long n = std::strtol(text.c_str() + 5, &end, 10);
    if (*end == '\0' && end != text.c_str() + 5 && n >= 0) return Device::cuda(static_cast<int>(n));
  }
  throw Error(fmt::format("--device '{}' is not a device; use cpu, cuda or cuda:N", text));
}

Tensor PlacedTensor::tensor() {
  void* data = device_copy ? device_copy->data() : host.data.data();
  return Tensor{data, host.dtype, host.shape, {}};
}

PlacedTensor place(NpyArray a, const Device& device) {
  PlacedTensor t{std::move(a), nullptr};
  if (device.kind == Device::Kind::Cuda) {
    t.device_copy = std::make_unique<runtime::DeviceBuffer>(device.index, t.host.data.size());
    t.device_copy->upload(t.host.data.data(), t.host.data.size());
  }
  return t;
}

PlacedTensor place_empty(dsl::DType dtype, std::vector<int64_t> shape, const Device& device) {
  NpyArray a;
  a.dtype = dtype;
  a.shape = std::move(shape);
  a.data.assign(static_cast<size_t>(a.numel()) * dsl::dtype_size(dtype), 0xff);  // NaN poison for floats
  return place(std::move(a), device);
}

void fetch(PlacedTensor& t) {
  if (t.device_copy) t.device_copy->download(t.host.data.data(), t.host.data.size());
}

namespace {

// Elements [begin, end) of a, drawn from rng.
void fill_random(NpyArray& a, int64_t begin, int64_t end, std::mt19937& rng, int64_t int_lo, int64_t int_hi) {
  const dsl::DType dtype = a.dtype;
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_int_distribution<int64_t> ints(int_lo, std::max(int_lo, int_hi - 1));
  for (int64_t i = begin; i < end; ++i) {
    switch (dtype) {
      case dsl::DType::F32: a.as<float>()[i] = normal(rng); break;
      case dsl::DType::F16: a.as<uint16_t>()[i] = float_to_half(normal(rng)); break;
      case dsl::DType::BF16: a.as<uint16_t>()[i] = float_to_bf16(normal(rng)); break;
      case dsl::DType::I32: a.as<int32_t>()[i] = static_cast<int32_t>(ints(rng)); break;
      case dsl::DType::I64: a.as<int64_t>()[i] = ints(rng); break;
      case dsl::DType::U8: a.as<uint8_t>()[i] = static_cast<uint8_t>(ints(rng)); break;
      case dsl::DType::Bool: a.as<uint8_t>()[i] = static_cast<uint8_t>(ints(rng) & 1); break;
      case dsl::DType::F8E4M3:
      case dsl::DType::F8E5M2: a.as<uint8_t>()[i] = float_to_fp8(normal(rng), dtype); break;
    }
  }
}

}  // namespace

NpyArray random_array(dsl::DType dtype, std::vector<int64_t> shape, std::mt19937& rng, int64_t int_lo, int64_t int_hi) {
  NpyArray a;
  a.dtype = dtype;
  a.shape = std::move(shape);
  const int64_t n = a.numel();
  a.data.resize(static_cast<size_t>(n) * dsl::dtype_size(dtype));
  // Benchmark caches reach half a billion elements (a minute on one core): past one chunk, each chunk draws from
  // its own generator seeded from rng, on all cores. The values depend on the seed only, not on the core count.
  constexpr int64_t kChunk = int64_t(1) << 22;
  if (n <= kChunk) {
    fill_random(a, 0, n, rng, int_lo, int_hi);
    return a;
  }
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<uint32_t> seeds(static_cast<size_t>(chunks));
  for (uint32_t& s : seeds) s = static_cast<uint32_t>(rng());
  std::atomic<int64_t> next{0};
  auto work = [&] {
    for (int64_t c; (c = next.fetch_add(1)) < chunks;) {
      std::mt19937 local(seeds[static_cast<size_t>(c)]);
      fill_random(a, c * kChunk, std::min(n, (c + 1) * kChunk), local, int_lo, int_hi);
    }
  };
  const int64_t workers = std::min<int64_t>(chunks, std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (int64_t w = 1; w < workers; ++w) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  return a;
}

std::vector<int64_t> parse_shape(const std::string& text, const char* flag) {
  std::vector<int64_t> shape;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    char* end = nullptr;
    long long v = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v < 1) throw Error(fmt::format("{} expects positive integers separated by commas, got '{}'", flag, text));
    shape.push_back(v);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return shape;
}

}  // namespace flexjit::tools
