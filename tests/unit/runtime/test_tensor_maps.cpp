// Which launches the warp-specialised kernel's tensor maps can describe (runtime/tensor_maps.h): no GPU needed.
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

bool describe(const AttentionArgs& a) { return runtime::tensor_maps_describe(a.q, a.k, a.v); }

}  // namespace

TEST_CASE("tensor maps describe dense, [B, S, H, D] and size-1 broadcast layouts, not zero or negative strides", "[runtime]") {
  AttentionArgs a = dense_args(2, 4, 100, 128);
  CHECK(describe(a));
  a.k.strides = {100 * 4 * 128, 128, 4 * 128, 1};  // [B, S, H, D] storage
  CHECK(describe(a));

  AttentionArgs one = dense_args(1, 1, 100, 128);
  one.v.strides = {0, 0, 128, 1};  // zero strides over dimensions of size 1 are never used
  CHECK(describe(one));

  AttentionArgs bcast = dense_args(2, 4, 100, 128);
  bcast.k.strides = {0, 100 * 128, 128, 1};  // k shared by both batches
  CHECK_FALSE(describe(bcast));

  AttentionArgs flipped = dense_args(2, 4, 100, 128);
  flipped.q.strides = {4 * 100 * 128, 100 * 128, -128, 1};  // positions reversed
  CHECK_FALSE(describe(flipped));
}

TEST_CASE("tensor maps describe the packed [total, heads, D] tensors of a ragged batch", "[runtime]") {
  static char storage[16];
  const Tensor packed = Tensor::contiguous(storage, DType::BF16, {1000, 8, 128});
  CHECK(runtime::tensor_maps_describe(packed, packed, packed));
  Tensor bshd = packed;
  bshd.strides = {128, 1000 * 128, 1};  // heads outermost: still positive strides
  CHECK(runtime::tensor_maps_describe(packed, bshd, bshd));
  Tensor shared_rows = packed;
  shared_rows.strides = {0, 128, 1};
  CHECK_FALSE(runtime::tensor_maps_describe(shared_rows, packed, packed));
}
