#include "compiler/codegen/params_layout.h"

#include <fmt/format.h>

namespace flexjit {

std::string buffer_field(const dsl::BufferDecl& b) { return "buf_" + b.name; }

std::string reciprocal_field(const dsl::ParamDecl& p) { return "param_" + p.name + "_inv"; }

std::string divisor_field(const dsl::ParamDecl& p) { return "param_" + p.name + "_div"; }

std::string int32_field(const dsl::ParamDecl& p) { return "param_" + p.name + "_i32"; }

ParamsLayout make_params_layout(const SpecIR& ir) {
  ParamsLayout layout;
  layout.slots.push_back({SlotKind::ErrorFlags, 0, 0, "error_flags"});
  const auto& spec = ir.spec();
  for (size_t i = 0; i < spec.buffers.size(); ++i) {
    const dsl::BufferDecl& b = spec.buffers[i];
    std::string f = buffer_field(b);
    layout.slots.push_back({SlotKind::BufferData, int(i), 0, f});
    for (size_t d = 0; d < b.shape.size(); ++d) layout.slots.push_back({SlotKind::BufferStride, int(i), int(d), fmt::format("{}_s{}", f, d)});
    for (size_t d = 0; d < b.shape.size(); ++d) layout.slots.push_back({SlotKind::BufferExtent, int(i), int(d), fmt::format("{}_n{}", f, d)});
  }
  for (size_t i = 0; i < ir.checked.symbols.size(); ++i)
    layout.slots.push_back({SlotKind::Symbol, int(i), 0, "sym_" + ir.checked.symbols[i]});
  for (size_t i = 0; i < spec.params.size(); ++i) {
    const dsl::ParamDecl& p = spec.params[i];
    if (p.is_const) continue;
    SlotKind k = p.type == dsl::ValueType::Float ? SlotKind::FloatParam : p.type == dsl::ValueType::Bool ? SlotKind::BoolParam : SlotKind::IntParam;
    layout.slots.push_back({k, int(i), 0, "param_" + p.name});
    if (k == SlotKind::FloatParam) layout.slots.push_back({SlotKind::FloatParamReciprocal, int(i), 0, reciprocal_field(p)});
    if (k == SlotKind::IntParam) {
      layout.slots.push_back({SlotKind::IntParamDivisor, int(i), 0, divisor_field(p)});
      layout.slots.push_back({SlotKind::IntParamInt32, int(i), 0, int32_field(p)});
    }
  }
  return layout;
}

}  // namespace flexjit
