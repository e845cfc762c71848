// Every checked-in fuzz input - the seed corpus (tests/fuzz/corpus/<target>) and the inputs
// that once found a bug (tests/fuzz/regressions/<target>) - replayed through its target in the
// ordinary builds, so a regression fails `make test` without libFuzzer.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

#include "fuzz/targets/targets.h"
#include "support/test_paths.h"

namespace fs = std::filesystem;

namespace {

std::vector<fs::path> inputs_in(const fs::path& dir) {
  std::vector<fs::path> out;
  if (!fs::is_directory(dir)) return out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file()) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<uint8_t> read_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

}  // namespace

TEST_CASE("every checked-in fuzz input keeps its target's property", "[fuzz]") {
  const fs::path root = flexjit::test::source_dir() / "tests" / "fuzz";
  for (const flexjit::fuzz::Target& t : flexjit::fuzz::all_targets()) {
    std::vector<fs::path> seeds = inputs_in(root / "corpus" / t.name);
    INFO("target " << t.name);
    CHECK(seeds.size() >= 3);
    std::vector<fs::path> regressions = inputs_in(root / "regressions" / t.name);
    seeds.insert(seeds.end(), regressions.begin(), regressions.end());
    for (const fs::path& p : seeds) {
      std::vector<uint8_t> bytes = read_bytes(p);
      INFO("input " << p.string());
      CHECK(t.run(bytes.data(), bytes.size()) == "");
    }
  }
}
