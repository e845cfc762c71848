// The exception carrying every diagnostic of a spec that failed to parse or check.
#pragma once
#include "dsl/diagnostic.h"
#include "dsl/error.h"

namespace flexjit {

class CompileError : public Error {
 public:
  explicit CompileError(dsl::Diagnostics d) : Error(d.render_text()), diagnostics_(std::move(d)) {}
  const dsl::Diagnostics& diagnostics() const { return diagnostics_; }

 private:
  dsl::Diagnostics diagnostics_;
};

}  // namespace flexjit
