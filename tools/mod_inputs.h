// The values the mods need to be evaluated on the host (`flexjit eval`, `flexjit viz`):
// parameters and shape symbols from --set NAME=VALUE, captured buffers from --load NAME=FILE.npy.
#pragma once
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "compiler/bindings.h"
#include "compiler/spec_ir.h"
#include "runtime/npy.h"

namespace flexjit::tools {

// "NAME=VALUE" split at the first '='; throws flexjit::Error naming `flag` when malformed.
std::pair<std::string, std::string> split_assignment(const std::string& s, const char* flag);

struct ModInputs {
  std::map<std::string, std::string> values;                       // --set, by name
  std::vector<NpyArray> arrays;                                    // by spec buffer index (empty when not loaded)
  std::vector<std::optional<std::vector<int64_t>>> buffer_shapes;  // by spec buffer index; nullopt when not loaded

  // The loaded buffers as the interpreter reads them (an empty view for a buffer not loaded).
  std::vector<BufferView> buffer_views() const;
};

// Reads --set and --load, checking each loaded array's dtype against its declaration.
ModInputs read_mod_inputs(const dsl::Spec& spec, const std::vector<std::string>& sets, const std::vector<std::string>& loads);

// Throws flexjit::Error saying which flag to add when the mods use a shape symbol, runtime
// parameter or buffer that has no value.
void require_mod_inputs(const SpecIR& ir, const BoundValues& bound, const ModInputs& inputs);

}  // namespace flexjit::tools
