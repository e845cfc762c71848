// `flexjit viz`: the PNG it writes decodes (libpng) to the panels it announces, with exactly
// as many kept-pair pixels as pairs the mask keeps, for every gallery spec; the --text
// pictures of causal, sliding-window and document masks match tests/golden/viz/*.txt
// (FLEXJIT_UPDATE_GOLDEN=1 rewrites them after an intended change).
#include <catch2/catch.hpp>
#include <png.h>

#include <filesystem>
#include <regex>

#include "runtime/npy.h"
#include "support/golden.h"
#include "support/shell.h"
#include "support/spec_loading.h"
#include "unit/cpu/gallery_inputs.h"

using namespace flexjit;
namespace fs = std::filesystem;

namespace {

fs::path scratch_dir() {
  fs::path d = fs::temp_directory_path() / ("flexjit-viz-test-" + std::to_string(::getpid()));
  fs::create_directories(d);
  return d;
}

std::string npy_of(const test::HostBuffer& b, const fs::path& dir) {
  NpyArray a;
  a.dtype = b.dtype;
  a.shape = b.shape;
  a.data.assign(b.bytes.begin(), b.bytes.end());
  const std::string path = (dir / (b.name + ".npy")).string();
  write_npy(path, a);
  return path;
}

struct DecodedPng {
  int width = 0, height = 0;
  std::vector<uint8_t> rgb;
};

DecodedPng decode_png(const std::string& path) {
  png_image image{};
  image.version = PNG_IMAGE_VERSION;
  REQUIRE(png_image_begin_read_from_file(&image, path.c_str()) != 0);
  image.format = PNG_FORMAT_RGB;
  DecodedPng out{static_cast<int>(image.width), static_cast<int>(image.height), std::vector<uint8_t>(PNG_IMAGE_SIZE(image))};
  REQUIRE(png_image_finish_read(&image, nullptr, out.rgb.data(), 0, nullptr) != 0);
  return out;
}

int64_t first_int(const std::string& text, const std::string& pattern) {
  std::smatch m;
  REQUIRE(std::regex_search(text, m, std::regex(pattern)));
  return std::stoll(m[1].str());
}

}  // namespace

TEST_CASE("viz writes a PNG of the mask, score_mod and block mask for every gallery spec", "[cli][viz]") {
  const fs::path dir = scratch_dir();
  const test::Sizes s{1, 2, 2, 40, 56, 64};
  for (const fs::path& path : test::gallery_specs()) {
    const dsl::Spec spec = test::load_spec(path);
    INFO(spec.name);
    std::mt19937_64 rng(3);
    std::string cmd = test::cli_path() + " viz " + path.string() + " --shape 1,2,40,56 --at b=0,h=1 --tile 16,16 --out " +
                      (dir / "mask.png").string();
    for (const test::HostBuffer& b : test::make_buffers(spec, s, rng)) cmd += " --load " + b.name + "=" + npy_of(b, dir);
    for (const auto& [name, value] : test::gallery_params(spec, s)) cmd += " --set " + name + "=" + std::to_string(static_cast<long long>(value));
    const test::ShellResult r = test::run_shell(cmd);
    INFO(cmd << "\n" << r.out);
    REQUIRE(r.status == 0);
    const int64_t kept = first_int(r.out, "kept ([0-9]+) of 2240 pairs");
    const int64_t width = first_int(r.out, "mask.png \\(([0-9]+) x"), height = first_int(r.out, "mask.png \\([0-9]+ x ([0-9]+)\\)");
    const int64_t zoom = first_int(r.out, "([0-9]+) x [0-9]+ pixels per pair");
    const DecodedPng png = decode_png((dir / "mask.png").string());
    CHECK(png.width == width);
    CHECK(png.height == height);
    CHECK(png.height == 40 * zoom + 16);
    const int panels = spec.score_mod ? 3 : 2;
    CHECK(png.width == panels * 56 * zoom + 16 + (panels - 1) * 16);
    // Pixels in the kept colour (#1f77b4): the mask panel's kept pairs, nothing else.
    int64_t kept_pixels = 0;
    for (size_t i = 0; i + 2 < png.rgb.size(); i += 3) kept_pixels += png.rgb[i] == 31 && png.rgb[i + 1] == 119 && png.rgb[i + 2] == 180;
    CHECK(kept_pixels == kept * zoom * zoom);
    if (spec.name == "causal") CHECK(kept == 40 * 41 / 2);
    if (!spec.mask_mod) CHECK(kept == 40 * 56);
  }
  fs::remove_all(dir);
}

TEST_CASE("viz --text pictures of causal, sliding-window and document masks match the goldens", "[cli][viz][golden]") {
  const fs::path dir = scratch_dir();
  NpyArray doc;
  doc.dtype = dsl::DType::I32;
  doc.shape = {24};
  doc.data.resize(24 * 4);
  const int32_t lengths[] = {5, 9, 3, 7};
  for (int32_t id = 0, pos = 0; id < 4; ++id)
    for (int32_t i = 0; i < lengths[id]; ++i, ++pos) doc.as<int32_t>()[pos] = id;
  write_npy((dir / "doc.npy").string(), doc);
  const std::string g = test::gallery_dir().string() + "/";
  const std::pair<const char*, std::string> cases[] = {
      {"causal", "causal.json --shape 1,1,16,16 --tile 4,4"},
      {"causal_downsampled", "causal.json --shape 1,1,100,130 --width 26"},
      {"sliding_window", "sliding_window.json --shape 1,1,20,24 --set window=6 --tile 8,8"},
      {"document", "document.json --shape 1,1,24,24 --tile 8,8 --load doc=" + (dir / "doc.npy").string()},
  };
  for (const auto& [name, args] : cases) {
    const test::ShellResult r = test::run_shell(test::cli_path() + " viz " + g + args + " --text");
    INFO(name << "\n" << r.out);
    REQUIRE(r.status == 0);
    test::check_golden(test::source_dir() / "tests" / "golden" / "viz" / (std::string(name) + ".txt"), r.out);
  }
  fs::remove_all(dir);
}

TEST_CASE("viz reports what it needs", "[cli][viz]") {
  const std::string g = test::gallery_dir().string() + "/";
  test::ShellResult r = test::run_shell(test::cli_path() + " viz " + g + "document.json --shape 1,1,8,8 --text");
  CHECK(r.status == 1);
  CHECK(r.out.find("--load doc=FILE.npy") != std::string::npos);
  r = test::run_shell(test::cli_path() + " viz " + g + "causal.json --shape 1,1,8,8");
  CHECK(r.status == 1);
  CHECK(r.out.find("give --out FILE.png") != std::string::npos);
  r = test::run_shell(test::cli_path() + " viz " + g + "causal.json --shape 1,2,8,8 --at h=2 --text");
  CHECK(r.status == 1);
  CHECK(r.out.find("outside the shape") != std::string::npos);
  r = test::run_shell(test::cli_path() + " viz " + g + "causal.json --shape 1,8,8 --text");
  CHECK(r.status == 1);
  CHECK(r.out.find("--shape expects B,H,Sq,Skv") != std::string::npos);
}
