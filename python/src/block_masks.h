// The device block masks behind one Python BlockMask: built on the first launch of each kernel
// and device that uses it (a mask's tiles are its kernel's), then reused by every later launch.
#pragma once
#include <map>
#include <memory>
#include <mutex>
#include <tuple>

#include "runtime/flexjit.hpp"

namespace flexjit::python {

class BlockMasks {
 public:
  // The mask for a forward launch of `kernel` (null on the CPU, which classifies tiles itself).
  // Builds it on the launch's stream the first time, so a CUDA graph captures a warm mask only.
  const BlockMask* for_forward(Kernel& kernel, const AttentionArgs& launch);
  // The forward's mask when the backward can take it (128 x 64 tiles), else null (the
  // backward then builds its own).
  const BlockMask* for_backward(Kernel& kernel, const BackwardArgs& launch);

 private:
  using Key = std::tuple<const Kernel*, int, int64_t, int64_t, int64_t, int64_t>;
  static Key key_of(const Kernel& kernel, int device, const Tensor& q, const Tensor& k);

  std::mutex mutex_;
  std::map<Key, std::unique_ptr<BlockMask>> masks_;
};

}  // namespace flexjit::python
