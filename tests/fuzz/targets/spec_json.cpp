// Spec files (`flexjit check SPEC`, flexjit_compile): any text is either a spec that checks or
// is rejected with diagnostics inside the text; an accepted spec survives spec_to_json and
// back unchanged; building its IR succeeds or reports positioned errors.
#include <string>

#include "compiler/frontend.h"
#include "dsl/spec.h"
#include "fuzz/frontend_property.h"
#include "fuzz/targets/targets.h"

namespace flexjit::fuzz {

std::string run_spec_json(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    dsl::Diagnostics diags;
    std::optional<dsl::Spec> spec = dsl::parse_spec_json(text, "spec.json", diags);
    if (!spec) return check_diagnostics(diags, /*need_source=*/false);
    if (!diags.list().empty()) return "accepted a spec with diagnostics: " + diags.list().front().message;
    const std::string json = dsl::spec_to_json(*spec);
    dsl::Diagnostics again;
    std::optional<dsl::Spec> reread = dsl::parse_spec_json(json, "round-trip.json", again);
    if (!reread) return "spec_to_json wrote a spec that does not parse: " + json;
    if (dsl::spec_to_json(*reread) != json) return "spec_to_json does not round-trip: " + json;
    try {
      (void)build_spec_ir(*spec);
    } catch (const CompileError& e) {
      return check_diagnostics(e.diagnostics(), /*need_source=*/false);
    }
  } catch (const std::exception& e) {
    return std::string("unexpected exception: ") + e.what();
  }
  return "";
}

}  // namespace flexjit::fuzz
