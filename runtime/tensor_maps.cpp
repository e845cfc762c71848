#include "runtime/tensor_maps.h"

#include <fmt/format.h>

#include <cstdint>

#include "dsl/error.h"

namespace flexjit::runtime {

namespace {

constexpr int64_t kMaxStrideBytes = int64_t{1} << 40;  // cuTensorMapEncodeTiled's bound

bool describable(const Tensor& t) {
  const std::vector<int64_t> s = t.effective_strides();
  for (int i = 0; i < 3; ++i) {
    if (s[i] < 0 || s[i] * 2 >= kMaxStrideBytes) return false;
    if (s[i] == 0 && t.shape[i] != 1) return false;  // a broadcast dimension: no tensor map stride is 0
  }
  return true;
}

void encode(const CudaDriver& d, CUtensorMap* map, const Tensor& t, int region_cols, CUtensorMapSwizzle swizzle, const char* name) {
  const std::vector<int64_t> s = t.effective_strides();
  // Innermost first: D, S, heads, B. A stride over a dimension of size 1 is never used; 16 keeps the driver's
  // multiple-of-16 rule.
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(t.shape[3]), static_cast<cuuint64_t>(t.shape[2]),
                              static_cast<cuuint64_t>(t.shape[1]), static_cast<cuuint64_t>(t.shape[0])};
  auto stride_bytes = [&](int i) { return static_cast<cuuint64_t>(s[i] > 0 ? s[i] * 2 : 16); };
  const cuuint64_t strides[3] = {stride_bytes(2), stride_bytes(1), stride_bytes(0)};
  const cuuint32_t box[4] = {static_cast<cuuint32_t>(region_cols), 64, 1, 1};
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  const CUtensorMapDataType type = t.dtype == DType::F16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  CUresult r = d.cuTensorMapEncodeTiled(map, type, 4, t.data, dims, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                                        CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw Error(fmt::format("encoding the TMA tensor map of {} (shape [{}], strides [{}]) failed: {}", name, fmt::join(t.shape, ", "),
                            fmt::join(s, ", "), cu_error_text(r)));
}

}  // namespace

bool tensor_maps_describe(const AttentionArgs& a) { return describable(a.q) && describable(a.k) && describable(a.v); }

FlexForwardTmaMaps encode_forward_tensor_maps(const CudaDriver& d, const AttentionArgs& a, const ForwardConfig& cfg) {
  static_assert(sizeof(FlexTensorMap) == sizeof(CUtensorMap) && alignof(FlexTensorMap) == alignof(CUtensorMap),
                "FlexTensorMap must be laid out as CUtensorMap");
  // FlexSm90Swizzle: the widest swizzle whose row divides the head dim; a region is one swizzle row wide.
  const int swizzle_bytes = cfg.head_dim % 64 == 0 ? 128 : cfg.head_dim % 32 == 0 ? 64 : 32;
  const CUtensorMapSwizzle swizzle = swizzle_bytes == 128 ? CU_TENSOR_MAP_SWIZZLE_128B
                                     : swizzle_bytes == 64 ? CU_TENSOR_MAP_SWIZZLE_64B
                                                           : CU_TENSOR_MAP_SWIZZLE_32B;
  FlexForwardTmaMaps maps{};
  encode(d, reinterpret_cast<CUtensorMap*>(&maps.q), a.q, swizzle_bytes / 2, swizzle, "q");
  encode(d, reinterpret_cast<CUtensorMap*>(&maps.k), a.k, swizzle_bytes / 2, swizzle, "k");
  encode(d, reinterpret_cast<CUtensorMap*>(&maps.v), a.v, swizzle_bytes / 2, swizzle, "v");
  return maps;
}

}  // namespace flexjit::runtime
