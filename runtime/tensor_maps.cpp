#include "runtime/tensor_maps.h"

#include <fmt/format.h>

#include <cstdint>

#include "dsl/error.h"

namespace flexjit::runtime {

namespace {

constexpr int64_t kMaxStrideBytes = int64_t{1} << 40;  // cuTensorMapEncodeTiled's bound

// A [B, heads, S, D] tensor, or a packed [total, heads, D] one as [1, heads, total, D]: (shape, element strides).
struct Dims4 {
  int64_t shape[4], strides[4];
};
Dims4 as_4d(const Tensor& t) {
  if (t.shape.size() == 3) return Dims4{{1, t.shape[1], t.shape[0], t.shape[2]}, {0, t.stride(1), t.stride(0), t.stride(2)}};
  return Dims4{{t.shape[0], t.shape[1], t.shape[2], t.shape[3]}, {t.stride(0), t.stride(1), t.stride(2), t.stride(3)}};
}

bool describable(const Tensor& t) {
  if (t.shape.size() != 3 && t.shape.size() != 4) return false;
  const Dims4 d = as_4d(t);
  for (int i = 0; i < 3; ++i) {
    if (d.strides[i] < 0 || d.strides[i] * 2 >= kMaxStrideBytes) return false;
    if (d.strides[i] == 0 && d.shape[i] != 1) return false;  // a broadcast dimension: no tensor map stride is 0
  }
  return true;
}

void encode(const CudaDriver& d, CUtensorMap* map, const Tensor& t, int region_cols, int rows, CUtensorMapSwizzle swizzle, const char* name) {
  const Dims4 t4 = as_4d(t);
  // Innermost first: D, S, heads, B. A stride over a dimension of size 1 is never used; 16 keeps the driver's
  // multiple-of-16 rule.
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(t4.shape[3]), static_cast<cuuint64_t>(t4.shape[2]),
                              static_cast<cuuint64_t>(t4.shape[1]), static_cast<cuuint64_t>(t4.shape[0])};
  auto stride_bytes = [&](int i) { return static_cast<cuuint64_t>(t4.strides[i] > 0 ? t4.strides[i] * 2 : 16); };
  const cuuint64_t strides[3] = {stride_bytes(2), stride_bytes(1), stride_bytes(0)};
  const cuuint32_t box[4] = {static_cast<cuuint32_t>(region_cols), static_cast<cuuint32_t>(rows), 1, 1};
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  const CUtensorMapDataType type = t.dtype == DType::F16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  CUresult r = d.cuTensorMapEncodeTiled(map, type, 4, t.data, dims, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                                        CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw Error(fmt::format("encoding the TMA tensor map of {} (shape [{}], strides [{}]) failed: {}", name, fmt::join(t.shape, ", "),
                            fmt::join(t.effective_strides(), ", "), cu_error_text(r)));
}

static_assert(sizeof(FlexTensorMap) == sizeof(CUtensorMap) && alignof(FlexTensorMap) == alignof(CUtensorMap),
              "FlexTensorMap must be laid out as CUtensorMap");

// The map of a kernel tile with `swizzle_bytes` regions of `rows` rows (flex::SwizzledTile).
void encode_tile(const CudaDriver& d, FlexTensorMap* map, const Tensor& t, int rows, int swizzle_bytes, const char* name) {
  const CUtensorMapSwizzle swizzle = swizzle_bytes == 128 ? CU_TENSOR_MAP_SWIZZLE_128B
                                     : swizzle_bytes == 64 ? CU_TENSOR_MAP_SWIZZLE_64B
                                                           : CU_TENSOR_MAP_SWIZZLE_32B;
  encode(d, reinterpret_cast<CUtensorMap*>(map), t, swizzle_bytes / 2, rows, swizzle, name);
}

}  // namespace

bool tensor_maps_describe(const Tensor& q, const Tensor& k, const Tensor& v) { return describable(q) && describable(k) && describable(v); }
bool tensor_map_describes(const Tensor& t) { return describable(t); }

FlexForwardTmaMaps encode_forward_tensor_maps(const CudaDriver& d, const Tensor& q, const Tensor& k, const Tensor& v, const ForwardConfig& cfg) {
  FlexForwardTmaMaps maps{};
  encode_tile(d, &maps.q, q, cfg.block_m, cfg.swizzle_bytes, "q");
  encode_tile(d, &maps.k, k, cfg.block_n, cfg.swizzle_bytes, "k");
  encode_tile(d, &maps.v, v, cfg.block_n, cfg.swizzle_bytes, "v");
  return maps;
}

FlexBackwardTmaMaps encode_backward_tensor_maps(const CudaDriver& d, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& d_o,
                                                int block_m, int block_n, int swizzle_bytes) {
  FlexBackwardTmaMaps maps{};
  encode_tile(d, &maps.q, q, block_m, swizzle_bytes, "q");
  encode_tile(d, &maps.k, k, block_n, swizzle_bytes, "k");
  encode_tile(d, &maps.v, v, block_n, swizzle_bytes, "v");
  encode_tile(d, &maps.d_o, d_o, block_m, swizzle_bytes, "d_o");
  return maps;
}

const FlexForwardTmaMaps& TensorMapCache::get(const CudaDriver& d, const Tensor& q, const Tensor& k, const Tensor& v, const ForwardConfig& cfg) {
  // A fixed-size key (no allocation on the launch path); as_4d's view is what the maps encode.
  Key key{};
  size_t n = 0;
  for (int64_t x : {int64_t{cfg.head_dim}, int64_t{cfg.block_m}, int64_t{cfg.block_n}, int64_t{cfg.swizzle_bytes}}) key[n++] = x;
  for (const Tensor* t : {&q, &k, &v}) {
    const Dims4 dims = as_4d(*t);
    key[n++] = static_cast<int64_t>(reinterpret_cast<uintptr_t>(t->data));
    key[n++] = static_cast<int64_t>(t->dtype) * 8 + static_cast<int64_t>(t->shape.size());
    for (int i = 0; i < 4; ++i) key[n++] = dims.shape[i];
    for (int i = 0; i < 4; ++i) key[n++] = dims.strides[i];
  }
  if (!valid_ || key != key_) {
    maps_ = encode_forward_tensor_maps(d, q, k, v, cfg);
    key_ = key;
    valid_ = true;
  }
  return maps_;
}

}  // namespace flexjit::runtime
