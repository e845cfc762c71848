// Launch parameters of the FP8 widening pass of a ragged prefill (flex_fp8_widen.cuh): a plain struct shared by
// NVRTC device code and host C++ (no CUDA types), like flex_params.cuh.
#pragma once

// One packed K or V of FP8 bytes, [rows, heads, dim], widened into a contiguous [rows, heads, dim] copy of the kernel's
// element type.
struct FlexFp8WidenParams {
  const unsigned char* src;         // the FP8 bytes; row and head strides in bytes (= elements), dim contiguous
  void* dst;                        // the widened copy, contiguous
  const float* scale;               // dequantisation scales: [heads] or [1] (scale_per_head 0); null: 1
  long long src_stride_s, src_stride_h;
  long long rows;
  int heads, dim;                   // dim: a multiple of 8
  int scale_per_head;
};
