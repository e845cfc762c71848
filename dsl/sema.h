// Semantic checks: names, types, arities and index counts of score_mod / mask_mod programs,
// annotating the AST in place for lowering to IR.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "dsl/ast.h"
#include "dsl/diagnostic.h"
#include "dsl/spec.h"

namespace flexjit::dsl {

enum class ModKind { Score, Mask };
const char* mod_kind_name(ModKind k);  // "score_mod" / "mask_mod"

struct CheckedProgram {
  ModKind kind;
  std::shared_ptr<const Source> source;
  std::shared_ptr<Program> ast;  // annotated by sema; shared so checked specs copy cheaply
};

// A spec whose programs parsed and type-checked.
struct CheckedSpec {
  Spec spec;
  std::vector<std::string> symbols;  // standard symbols, then the custom ones from buffer shapes
  std::optional<CheckedProgram> score_mod;
  std::optional<CheckedProgram> mask_mod;
  int symbol_index(const std::string& name) const;  // -1 if absent
};

// Parses and checks both programs of a spec, reporting every error to diags. Returns
// nullopt if there was any error. Never throws on bad input.
std::optional<CheckedSpec> check_spec(const Spec& spec, Diagnostics& diags);

// Checks one program against a spec's declarations (used by check_spec and tests).
CheckedProgram check_program(ModKind kind, const std::string& text, const Spec& spec,
                             const std::vector<std::string>& symbols, Diagnostics& diags);

// The symbols of a spec: standard ones then custom ones in order of first appearance.
std::vector<std::string> collect_symbols(const Spec& spec);

}  // namespace flexjit::dsl
