// Turns program text into tokens, reporting malformed characters and literals.
#pragma once
#include <memory>
#include <vector>

#include "dsl/diagnostic.h"
#include "dsl/token.h"

namespace flexjit::dsl {

// Lexes the whole source. Bad characters produce a diagnostic and a Tok::Error token
// (so the parser can go on and report more); the list always ends with Tok::End.
std::vector<Token> lex(const std::shared_ptr<const Source>& src, Diagnostics& diags);

}  // namespace flexjit::dsl
