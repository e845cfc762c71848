// The message of the flexjit::Error a call throws, for tests that check what an error says.
#pragma once
#include <string>

#include "dsl/error.h"

namespace flexjit::test {

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no flexjit::Error)";
}

}  // namespace flexjit::test
