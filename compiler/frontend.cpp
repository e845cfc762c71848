#include "compiler/frontend.h"

#include "compiler/passes/pipeline.h"

namespace flexjit {

SpecIR build_spec_ir(const dsl::Spec& spec, const std::function<void(const std::string&, const SpecIR&)>& dump) {
  dsl::Diagnostics diags;
  dsl::validate_spec(spec, spec.name, diags);
  auto checked = dsl::check_spec(spec, diags);
  if (diags.has_errors() || !checked) throw CompileError(std::move(diags));
  return optimize(lower_spec(*checked), dump);
}

}  // namespace flexjit
