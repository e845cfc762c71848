// The exception type for user-facing errors (bad input, misuse) across the library.
#pragma once
#include <stdexcept>
#include <string>

namespace flexjit {

// A user error: the message says what went wrong, where, and how to fix it. The CLI
// maps it to exit code 1; any other exception is an internal error (exit code 2).
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace flexjit
