// Moving .npy tensors between files, host memory and devices for the run and bench commands.
#pragma once
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "runtime/device_memory.h"
#include "runtime/flexjit.hpp"
#include "runtime/npy.h"

namespace flexjit::tools {

// "cpu", "cuda" (device 0) or "cuda:N".
Device parse_device(const std::string& text);

// A host array placed where a launch needs it: on the device (an owned copy) or, for the
// CPU backend, the host array itself.
struct PlacedTensor {
  NpyArray host;
  std::unique_ptr<runtime::DeviceBuffer> device_copy;
  Tensor tensor() ;
};
PlacedTensor place(NpyArray a, const Device& device);
PlacedTensor place_empty(dsl::DType dtype, std::vector<int64_t> shape, const Device& device);
// Copies a placed tensor's contents back to its host array (after a launch).
void fetch(PlacedTensor& t);

// A random tensor: normal floats, integers uniform in [int_lo, int_hi) (bools: 0 or 1).
NpyArray random_array(dsl::DType dtype, std::vector<int64_t> shape, std::mt19937& rng, int64_t int_lo, int64_t int_hi);

// Parses "4,16,4096" into a shape.
std::vector<int64_t> parse_shape(const std::string& text, const char* flag);

}  // namespace flexjit::tools
