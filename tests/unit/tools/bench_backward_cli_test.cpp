// `flexjit bench-backward` on a machine without a GPU: the dQ strategy option is validated and documented
// before the command needs a device.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "support/test_paths.h"

namespace {

// Exit status of the CLI with `args`; its stdout and stderr into `out`.
int bench_backward(const std::string& args, std::string& out) {
  const std::filesystem::path log = std::filesystem::temp_directory_path() / "flexjit-bench-backward-cli-test.txt";
  const int rc = std::system((flexjit::test::cli_path() + " bench-backward " + args + " > " + log.string() + " 2>&1").c_str());
  std::ifstream f(log);
  out.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  std::filesystem::remove(log);
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

}  // namespace

TEST_CASE("bench-backward: --dq takes atomic, qmajor or auto", "[cli]") {
  std::string out;
  CHECK(bench_backward("--help", out) == 0);
  CHECK(out.find("--dq") != std::string::npos);
  CHECK(out.find("qmajor") != std::string::npos);
  CHECK(bench_backward("--mask 'q >= kv' --shape 1,1,1,64,64,64 --head-dim 64 --dq sideways", out) != 0);
  CHECK(out.find("--dq") != std::string::npos);
}
