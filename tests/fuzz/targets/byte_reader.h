// Reads a fuzz input as a stream of choices: small integers, picks from tables, flags. Past
// the end every read returns zero, so any input is a complete, deterministic scenario.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace flexjit::fuzz {

class ByteReader {
 public:
  ByteReader(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  uint8_t byte() { return at_ < size_ ? data_[at_++] : 0; }
  uint32_t u32() {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(byte()) << (8 * i);
    return v;
  }
  bool flag() { return byte() & 1; }
  // True with probability about n / 256.
  bool chance(int n) { return byte() < n; }
  // An index in [0, n).
  size_t below(size_t n) { return n ? byte() % n : 0; }
  template <class T>
  const T& pick(const std::vector<T>& table) { return table[below(table.size())]; }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t at_ = 0;
};

}  // namespace flexjit::fuzz
