// The layout of a generated variant's Params struct: one 8-byte slot per field, so the
// host can fill it without knowing the device compiler's struct rules.
#pragma once
#include <string>
#include <vector>

namespace flexjit {

enum class SlotKind {
  ErrorFlags,    // unsigned int* to the launch's error word (may be null: checks off)
  BufferData,    // const void* of buffer `index`
  BufferStride,  // element stride of dimension `dim` of buffer `index`
  BufferExtent,  // extent of dimension `dim` of buffer `index`
  Symbol,        // value of shape symbol `index` (CheckedSpec::symbols)
  IntParam,      // runtime int param `index` (long long)
  FloatParam,    // runtime float param `index` (float in the low 4 bytes)
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

}  // namespace flexjit
