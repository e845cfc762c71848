// Launch parameters of ring attention's element-wise steps (flex_ring.cuh): plain structs shared by NVRTC device code
// and host C++ (no CUDA types), like flex_params.cuh.
#pragma once

// Element types the steps convert between (values of FlexRingView::dtype).
enum FlexRingDType { kFlexRingF32 = 0, kFlexRingBf16 = 1, kFlexRingF16 = 2 };

// What flexjit_ring_copy does with each element (FlexRingCopyParams::mode).
enum FlexRingCopyMode {
  kFlexRingAssign = 0,  // dst = src, converted to dst's type (one rounding)
  kFlexRingAdd = 1,     // dst += src, dst f32
  kFlexRingRaw = 2,     // dst = src bit for bit, elements of elem_bytes bytes (any type: buffers, integer tensors)
};

// A strided view of up to four dims (leading dims of size 1 for fewer): element (i0, i1, i2, i3) sits at
// data + i0 * stride[0] + ... + i3 * stride[3] elements.
struct FlexRingView {
  void* data;
  long long stride[4];
  int dtype;  // FlexRingDType; unused by raw copies
};

// One element-wise pass over a [shape[0], shape[1], shape[2], shape[3]] box of two views.
struct FlexRingCopyParams {
  FlexRingView src, dst;
  long long shape[4];
  int mode;        // FlexRingCopyMode
  int elem_bytes;  // raw copies: 1, 2, 4 or 8
};

// Merges one block's partial output into a rank's running fp32 output, row by row of [batch, heads, rows]:
// lse_acc = log(exp(lse_acc) + exp(lse_part)), o_acc weighted by each side's share.
struct FlexRingMergeParams {
  FlexRingView o_part, o_acc;      // [batch, heads, rows, dv]; o_acc f32
  FlexRingView lse_part, lse_acc;  // [batch, heads, rows] (stride[3] unused), both f32
  long long batch, heads, rows;
  int dv;
};
