// Tests of the in-memory kernel cache: single flight, failures, disk fallback, hit latency.
#include <catch2/catch.hpp>

#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <stdexcept>
#include <thread>
#include <vector>

#include "runtime/kernel_cache.h"

using namespace flexjit::runtime;
namespace fs = std::filesystem;

namespace {

struct TempDir {
  fs::path path;
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "flexjit-kernel-cache-test-XXXXXX").string();
    REQUIRE(::mkdtemp(pattern.data()) != nullptr);
    path = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

CacheKey test_key(const std::string& ir) {
  return CacheKeyBuilder().arch("sm_80").nvrtc_version("13.0").set("ir", ir).build();
}

CompiledArtefact test_artefact(const std::string& payload) {
  CompiledArtefact a;
  a.binary.assign(payload.begin(), payload.end());
  a.entries = {"kernel"};
  return a;
}

}  // namespace

TEST_CASE("kernel cache: memory hit after the first compile", "[runtime][kernel_cache]") {
  KernelCache cache;  // memory only
  CacheKey key = test_key("score");
  int compiles = 0;
  auto compile = [&] {
    ++compiles;
    return test_artefact("abc");
  };
  CHECK(cache.find(key) == nullptr);
  CacheLookup first = cache.get_or_compile(key, compile);
  CHECK(first.source == CacheSource::compiled);
  CacheLookup second = cache.get_or_compile(key, compile);
  CHECK(second.source == CacheSource::memory);
  CHECK(second.artefact == first.artefact);  // the same object, not a copy
  CHECK(compiles == 1);
  CHECK(cache.find(key) == first.artefact);
  CHECK(cache.size() == 1);
  cache.clear();
  CHECK(cache.size() == 0);
  CHECK(cache.get_or_compile(key, compile).source == CacheSource::compiled);
  CHECK(compiles == 2);
  CHECK(std::string(cache_source_name(CacheSource::disk)) == "disk");
}

TEST_CASE("kernel cache: concurrent requests for one key compile once", "[runtime][kernel_cache]") {
  TempDir dir;
  KernelCache cache(std::make_shared<DiskCache>(dir.path));
  CacheKey key = test_key("one key, many threads");
  std::atomic<int> compiles{0};
  std::atomic<bool> go{false};
  constexpr int kThreads = 8;
  std::vector<std::shared_ptr<const CompiledArtefact>> got(kThreads);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      while (!go.load()) std::this_thread::yield();
      got[static_cast<size_t>(i)] = cache.get_or_compile(key, [&] {
        ++compiles;
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        return test_artefact("shared");
      }).artefact;
    });
  }
  go = true;
  for (std::thread& t : threads) t.join();
  CHECK(compiles == 1);
  for (const auto& a : got) CHECK(a == got[0]);
  CHECK(cache.size() == 1);
}

TEST_CASE("kernel cache: a failed compile reaches every waiter and is not cached", "[runtime][kernel_cache]") {
  KernelCache cache;
  CacheKey key = test_key("fails once");
  std::atomic<int> compiles{0};
  std::atomic<int> errors{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&] {
      while (!go.load()) std::this_thread::yield();
      try {
        cache.get_or_compile(key, [&]() -> CompiledArtefact {
          ++compiles;
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
          throw std::runtime_error("NVRTC said no");
        });
      } catch (const std::runtime_error& e) {
        if (std::string(e.what()) == "NVRTC said no") ++errors;
      }
    });
  }
  go = true;
  for (std::thread& t : threads) t.join();
  CHECK(errors == 4);
  CHECK(compiles >= 1);  // a thread arriving after the failure was reported tries again
  CHECK(cache.size() == 0);
  CHECK(cache.find(key) == nullptr);
  CacheLookup ok = cache.get_or_compile(key, [] { return test_artefact("fixed"); });
  CHECK(ok.source == CacheSource::compiled);
}

TEST_CASE("kernel cache: falls back to the disk cache and invalidates both", "[runtime][kernel_cache]") {
  TempDir dir;
  CacheKey key = test_key("on disk");
  int compiles = 0;
  auto compile = [&] {
    ++compiles;
    return test_artefact("from nvrtc");
  };
  {
    KernelCache first(std::make_shared<DiskCache>(dir.path));
    CHECK(first.get_or_compile(key, compile).source == CacheSource::compiled);
  }
  KernelCache second(std::make_shared<DiskCache>(dir.path));  // a later process
  CacheLookup from_disk = second.get_or_compile(key, compile);
  CHECK(from_disk.source == CacheSource::disk);
  CHECK(std::string(from_disk.artefact->binary.begin(), from_disk.artefact->binary.end()) == "from nvrtc");
  CHECK(second.get_or_compile(key, compile).source == CacheSource::memory);
  CHECK(compiles == 1);

  // The driver refused the cubin: forget it everywhere, and the next request compiles again.
  second.invalidate(key);
  CHECK(second.find(key) == nullptr);
  CHECK_FALSE(second.disk()->load(key).has_value());
  CHECK(second.get_or_compile(key, compile).source == CacheSource::compiled);
  CHECK(compiles == 2);
  CHECK(from_disk.artefact->binary.size() == 10);  // holders keep the old artefact
}

TEST_CASE("kernel cache: in-memory hit latency", "[runtime][kernel_cache]") {
  KernelCache cache;
  // A realistic key: a few kilobytes of canonical IR and options.
  std::string ir(4096, 'x');
  CacheKey key = CacheKeyBuilder()
                     .arch("sm_90a")
                     .nvrtc_version("13.0")
                     .set("score_mod", ir)
                     .options({"-default-device", "--std=c++17", "-I/usr/local/cuda/include"})
                     .build();
  cache.get_or_compile(key, [] { return test_artefact("k"); });
  constexpr int kIterations = 200000;
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kIterations; ++i) {
    CacheLookup r = cache.get_or_compile(key, [] { return test_artefact("never"); });
    if (r.source != CacheSource::memory) FAIL("expected a memory hit");
  }
  double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count() / kIterations;
  std::printf("kernel cache: in-memory hit takes %.0f ns on average (%d hits, 4 KiB of key text)\n", ns, kIterations);
  SUCCEED();
}

TEST_CASE("kernel cache: make_artefact packs an NVRTC result", "[runtime][kernel_cache]") {
  NvrtcOutput out;
  out.cubin = {0x7f, 'E', 'L', 'F'};
  out.log = "ptxas info";
  out.seconds = 1.5;
  KernelResources r;
  r.name = "_Z3fooPf";
  r.registers = 96;
  r.shared_bytes = 1024;
  out.resources.push_back(r);
  out.lowered_names.emplace_back("foo<1>", "_Z3fooILi1EEvPf");

  CompiledArtefact a = make_artefact(out);
  CHECK(a.binary == out.cubin);
  CHECK(a.entries == std::vector<std::string>{"_Z3fooILi1EEvPf"});
  CHECK(a.metadata["resources"]["_Z3fooPf"]["registers"] == 96);
  CHECK(a.metadata["resources"]["_Z3fooPf"]["shared_bytes"] == 1024);
  CHECK(a.metadata["lowered_names"]["foo<1>"] == "_Z3fooILi1EEvPf");
  CHECK(a.metadata["compile_seconds"] == 1.5);

  out.lowered_names.clear();
  CHECK(make_artefact(out).entries == std::vector<std::string>{"_Z3fooPf"});
  CHECK(make_artefact(out, {"mine"}).entries == std::vector<std::string>{"mine"});
}
