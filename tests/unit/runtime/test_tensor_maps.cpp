// Which launches the TMA kernel can describe (runtime/tensor_maps.h): no GPU needed.
#include <catch2/catch.hpp>

#include "runtime/tensor_maps.h"

using namespace flexjit;

namespace {

AttentionArgs dense_args(int64_t B, int64_t H, int64_t S, int64_t D) {
  static char storage[16];
  AttentionArgs a;
  a.q = Tensor::contiguous(storage, DType::BF16, {B, H, S, D});
  a.k = Tensor::contiguous(storage, DType::BF16, {B, H, S, D});
  a.v = Tensor::contiguous(storage, DType::BF16, {B, H, S, D});
  return a;
}

}  // namespace

TEST_CASE("tensor maps describe dense, [B, S, H, D] and size-1 broadcast layouts, not zero or negative strides", "[runtime]") {
  AttentionArgs a = dense_args(2, 4, 100, 128);
  CHECK(runtime::tensor_maps_describe(a));
  a.k.strides = {100 * 4 * 128, 128, 4 * 128, 1};  // [B, S, H, D] storage
  CHECK(runtime::tensor_maps_describe(a));

  AttentionArgs one = dense_args(1, 1, 100, 128);
  one.v.strides = {0, 0, 128, 1};  // zero strides over dimensions of size 1 are never used
  CHECK(runtime::tensor_maps_describe(one));

  AttentionArgs bcast = dense_args(2, 4, 100, 128);
  bcast.k.strides = {0, 100 * 128, 128, 1};  // k shared by both batches
  CHECK_FALSE(runtime::tensor_maps_describe(bcast));

  AttentionArgs flipped = dense_args(2, 4, 100, 128);
  flipped.q.strides = {4 * 100 * 128, 100 * 128, -128, 1};  // positions reversed
  CHECK_FALSE(runtime::tensor_maps_describe(flipped));
}
