#include "block_masks.h"

namespace flexjit::python {

BlockMasks::Key BlockMasks::key_of(const Kernel& kernel, int device, const Tensor& q, const Tensor& k) {
  return {&kernel, device, q.shape[0], q.shape[1], q.shape[2], k.shape[2]};
}

const BlockMask* BlockMasks::for_forward(Kernel& kernel, const AttentionArgs& launch) {
  if (launch.device.kind == Device::Kind::Cpu || !kernel.spec().mask_mod) return nullptr;
  Key key = key_of(kernel, launch.device.index, launch.q, launch.k);
  std::lock_guard<std::mutex> lock(mutex_);
  std::unique_ptr<BlockMask>& mask = masks_[key];
  if (!mask) mask = kernel.build_block_mask(launch);
  return mask.get();
}

const BlockMask* BlockMasks::for_backward(Kernel& kernel, const BackwardArgs& launch) {
  if (launch.device.kind == Device::Kind::Cpu || !kernel.spec().mask_mod) return nullptr;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = masks_.find(key_of(kernel, launch.device.index, launch.q, launch.k));
  if (it == masks_.end() || it->second->q_tile() != 128 || it->second->kv_tile() != 64) return nullptr;
  return it->second.get();
}

}  // namespace flexjit::python
