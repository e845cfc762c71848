// The layout of a generated variant's Params struct: one 8-byte slot per field, so the
// host can fill it without knowing the device compiler's struct rules.
#pragma once
#include <string>
#include <vector>

#include "compiler/spec_ir.h"

namespace flexjit {

enum class SlotKind {
  ErrorFlags,    // unsigned int* to the launch's error word (may be null: checks off)
  BufferData,    // const void* of buffer `index`
  BufferStride,  // element stride of dimension `dim` of buffer `index`
  BufferExtent,  // extent of dimension `dim` of buffer `index`
  Symbol,        // value of shape symbol `index` (CheckedSpec::symbols)
  IntParam,      // runtime int param `index` (long long)
  FloatParam,    // runtime float param `index` (float in the low 4 bytes)
  FloatParamReciprocal,  // 1 / runtime float param `index`, rounded once by the host (a division by it multiplies by this)
  IntParamDivisor,  // fj::divisor_magic of runtime int param `index` (flex_int_divisor.cuh: a floor division by it multiplies)
  IntParamInt32,    // runtime int param `index` saturated to int32 (int in the low 4 bytes): compared with 32-bit values
  BoolParam,     // runtime bool param `index` (0 or 1 as long long)
};

struct ParamSlot {
  SlotKind kind;
  int index = 0;
  int dim = 0;
  std::string field;  // the field's name in the generated struct
};

struct ParamsLayout {
  std::vector<ParamSlot> slots;  // slot i lives at byte offset 8 * i
  size_t bytes() const { return slots.size() * 8; }
};

// The layout every back end uses for a spec: the error word, then per buffer its pointer,
// strides and extents, then every shape symbol, then the runtime parameters (a float one followed by its reciprocal, an
// int one by its divisor multiplier and its saturated 32-bit copy).
ParamsLayout make_params_layout(const SpecIR& ir);

// The name of a buffer's field in the Params struct ("buf_" + name).
std::string buffer_field(const dsl::BufferDecl& b);

// The name of a runtime float parameter's reciprocal field ("param_" + name + "_inv").
std::string reciprocal_field(const dsl::ParamDecl& p);

// The name of a runtime int parameter's divisor multiplier field ("param_" + name + "_div").
std::string divisor_field(const dsl::ParamDecl& p);

// The name of a runtime int parameter's saturated 32-bit copy ("param_" + name + "_i32").
std::string int32_field(const dsl::ParamDecl& p);

}  // namespace flexjit
