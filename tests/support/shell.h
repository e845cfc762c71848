// Running a command line from a test: its exit status and its stdout and stderr together.
#pragma once
#include <sys/wait.h>

#include <cstdio>
#include <stdexcept>
#include <string>

namespace flexjit::test {

struct ShellResult {
  int status;       // the exit status; -1 when the command did not exit normally
  std::string out;  // stdout and stderr together
};

inline ShellResult run_shell(const std::string& command) {
  const std::string cmd = command + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) throw std::runtime_error("popen failed for: " + command);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int rc = pclose(p);
  return {WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, out};
}

}  // namespace flexjit::test
