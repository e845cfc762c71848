// Tests of the disk cache: round trip, corrupt entries, unwritable directories, several processes.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "dsl/error.h"
#include "runtime/disk_cache.h"
#include "runtime/log.h"

using namespace flexjit::runtime;
namespace fs = std::filesystem;

namespace {

// A fresh directory under $TMPDIR, removed with everything in it at the end of the test.
struct TempDir {
  fs::path path;
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "flexjit-disk-cache-test-XXXXXX").string();
    REQUIRE(::mkdtemp(pattern.data()) != nullptr);
    path = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    fs::permissions(path, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(path, ec);
  }
};

CacheKey test_key(const std::string& ir, const std::string& arch = "sm_90a") {
  return CacheKeyBuilder().arch(arch).nvrtc_version("13.0").set("ir", ir).entries({"kernel"}).build();
}

CompiledArtefact test_artefact(const std::string& payload) {
  CompiledArtefact a;
  a.binary.assign(payload.begin(), payload.end());
  a.entries = {"kernel", "kernel_lse"};
  a.metadata = {{"resources", {{"kernel", {{"registers", 128}, {"shared_bytes", 49152}}}}}};
  return a;
}

std::vector<std::uint8_t> read_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::vector<std::uint8_t>(std::istreambuf_iterator<char>(f), {});
}

void write_bytes(const fs::path& p, const std::vector<std::uint8_t>& bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// Captures warnings while alive.
struct CapturedWarnings {
  std::vector<std::string> messages;
  CapturedWarnings() {
    set_log_sink([this](LogLevel level, std::string_view m) {
      if (level == LogLevel::warn) messages.emplace_back(m);
    });
  }
  ~CapturedWarnings() { set_log_sink({}); }
};

}  // namespace

TEST_CASE("disk cache: the root comes from the environment", "[runtime][disk_cache]") {
  const char* saved = std::getenv("FLEXJIT_CACHE_DIR");
  std::string saved_value = saved ? saved : "";
  ::setenv("FLEXJIT_CACHE_DIR", "/some/where", 1);
  CHECK(DiskCache::default_root() == fs::path("/some/where"));
  ::unsetenv("FLEXJIT_CACHE_DIR");
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  if (xdg && *xdg)
    CHECK(DiskCache::default_root() == fs::path(xdg) / "flexjit");
  else if (const char* home = std::getenv("HOME"); home && *home)
    CHECK(DiskCache::default_root() == fs::path(home) / ".cache" / "flexjit");
  if (saved) ::setenv("FLEXJIT_CACHE_DIR", saved_value.c_str(), 1);
}

TEST_CASE("disk cache: store and load round trip", "[runtime][disk_cache]") {
  TempDir dir;
  DiskCache cache(dir.path);
  CacheKey key = test_key("q - kv");
  fs::path path = cache.entry_path(key);
  CHECK(path == dir.path / "v1" / "sm_90a" / key.hash().substr(0, 2) / (key.hash() + ".bin"));

  CHECK_FALSE(cache.load(key).has_value());
  REQUIRE(cache.store(key, test_artefact("cubin bytes")));
  CHECK(fs::is_regular_file(path));
  auto loaded = cache.load(key);
  REQUIRE(loaded.has_value());
  CHECK(std::string(loaded->binary.begin(), loaded->binary.end()) == "cubin bytes");
  CHECK(loaded->entries == std::vector<std::string>{"kernel", "kernel_lse"});
  CHECK(loaded->metadata["resources"]["kernel"]["registers"] == 128);
  // No temporary file is left behind.
  CHECK(std::distance(fs::directory_iterator(path.parent_path()), fs::directory_iterator()) == 1);

  // A key differing only in architecture lives elsewhere and misses.
  CHECK_FALSE(cache.load(test_key("q - kv", "sm_80")).has_value());
}

TEST_CASE("disk cache: get_or_compile compiles on a miss only", "[runtime][disk_cache]") {
  TempDir dir;
  DiskCache cache(dir.path);
  CacheKey key = test_key("score * 2");
  int compiles = 0;
  auto compile = [&] {
    ++compiles;
    return test_artefact("v1");
  };
  DiskLookup first = cache.get_or_compile(key, compile);
  CHECK_FALSE(first.hit);
  CHECK(compiles == 1);
  DiskLookup second = cache.get_or_compile(key, compile);
  CHECK(second.hit);
  CHECK(compiles == 1);
  CHECK(second.artefact.binary == first.artefact.binary);

  // Another instance (another process, in effect) finds it too.
  DiskCache other(dir.path);
  CHECK(other.get_or_compile(key, compile).hit);
  CHECK(compiles == 1);
}

TEST_CASE("disk cache: a failing compile stores nothing", "[runtime][disk_cache]") {
  TempDir dir;
  DiskCache cache(dir.path);
  CacheKey key = test_key("broken");
  CHECK_THROWS_WITH(cache.get_or_compile(key, []() -> CompiledArtefact { throw std::runtime_error("boom"); }),
                    "boom");
  CHECK_FALSE(fs::exists(cache.entry_path(key)));
  CHECK_FALSE(cache.get_or_compile(key, [] { return test_artefact("ok"); }).hit);
  CHECK(cache.writable());
}

TEST_CASE("disk cache: corrupt, truncated and mismatching entries are removed and recompiled",
          "[runtime][disk_cache]") {
  TempDir dir;
  DiskCache cache(dir.path);
  CacheKey key = test_key("doc[q] == doc[kv]");
  CacheKey other_key = test_key("q >= kv");
  fs::path path = cache.entry_path(key);
  int compiles = 0;
  auto compile = [&] {
    ++compiles;
    return test_artefact("fresh cubin");
  };
  REQUIRE(cache.store(key, test_artefact("good cubin")));
  std::vector<std::uint8_t> good = read_bytes(path);

  std::vector<std::uint8_t> flipped = good;
  flipped[flipped.size() / 2] ^= 0x40;
  std::vector<std::uint8_t> truncated(good.begin(), good.begin() + static_cast<long>(good.size() / 2));
  std::vector<std::uint8_t> header_only(good.begin(), good.begin() + 20);
  std::vector<std::uint8_t> padded = good;
  padded.push_back(0);
  std::vector<std::uint8_t> garbage = {'n', 'o', 't', ' ', 'a', 'n', ' ', 'e', 'n', 't', 'r', 'y'};
  // A well-formed entry of another key at this key's path: a collision or a stale file.
  std::vector<std::uint8_t> foreign = encode_cache_entry(other_key, test_artefact("wrong kernel"));

  struct Case {
    const char* name;
    std::vector<std::uint8_t> bytes;
  };
  for (const Case& c : {Case{"flipped byte", flipped}, Case{"truncated", truncated}, Case{"header only", header_only},
                        Case{"padded", padded}, Case{"garbage", garbage}, Case{"empty", {}},
                        Case{"other key", foreign}}) {
    INFO(c.name);
    write_bytes(path, c.bytes);
    CHECK_FALSE(cache.load(key).has_value());
    CHECK_FALSE(fs::exists(path));  // removed

    write_bytes(path, c.bytes);
    int before = compiles;
    DiskLookup r = cache.get_or_compile(key, compile);
    CHECK_FALSE(r.hit);
    CHECK(compiles == before + 1);
    CHECK(std::string(r.artefact.binary.begin(), r.artefact.binary.end()) == "fresh cubin");
    // The recompiled entry replaced the bad one and now hits.
    CHECK(cache.get_or_compile(key, compile).hit);
    CHECK(compiles == before + 1);
  }
  CHECK(cache.writable());
}

TEST_CASE("disk cache: an unwritable directory degrades to memory with one warning", "[runtime][disk_cache]") {
  TempDir dir;
  // Running as root, chmod does not stop writes; a path below a regular file fails for everyone.
  fs::path file = dir.path / "a-file";
  write_bytes(file, {'x'});
  std::vector<fs::path> roots = {file / "cache"};
  if (::geteuid() != 0) {
    fs::path readonly = dir.path / "readonly";
    fs::create_directory(readonly);
    fs::permissions(readonly, fs::perms::owner_read | fs::perms::owner_exec | fs::perms::group_read |
                                  fs::perms::group_exec | fs::perms::others_read | fs::perms::others_exec);
    roots.push_back(readonly);
  }
  for (const fs::path& root : roots) {
    INFO(root.string());
    CapturedWarnings warnings;
    DiskCache cache(root);
    int compiles = 0;
    auto compile = [&] {
      ++compiles;
      return test_artefact("memory only");
    };
    DiskLookup a = cache.get_or_compile(test_key("a"), compile);
    DiskLookup b = cache.get_or_compile(test_key("b"), compile);
    DiskLookup a2 = cache.get_or_compile(test_key("a"), compile);
    CHECK_FALSE(cache.store(test_key("c"), test_artefact("c")));
    CHECK(std::string(a.artefact.binary.begin(), a.artefact.binary.end()) == "memory only");
    CHECK_FALSE(a.hit);
    CHECK_FALSE(b.hit);
    CHECK_FALSE(a2.hit);  // nothing was stored
    CHECK(compiles == 3);
    CHECK_FALSE(cache.writable());
    REQUIRE(warnings.messages.size() == 1);
    CHECK(warnings.messages[0].find(root.string()) != std::string::npos);
    CHECK(warnings.messages[0].find("FLEXJIT_CACHE_DIR") != std::string::npos);

    // A second cache on the same root does not warn again.
    DiskCache again(root);
    again.get_or_compile(test_key("d"), compile);
    CHECK(warnings.messages.size() == 1);
    CHECK(again.list().empty());
    CHECK(again.info().entries == 0);
  }
}

TEST_CASE("disk cache: several processes compile one key once", "[runtime][disk_cache]") {
  TempDir dir;
  fs::path counter = dir.path / "compiles.txt";
  CacheKey key = test_key("shared by processes");
  constexpr int kProcesses = 6;

  // Every child blocks on the pipe until the parent closes it, so they all start together.
  int gate[2];
  REQUIRE(::pipe(gate) == 0);
  std::vector<pid_t> children;
  std::fflush(nullptr);  // or the children may write the parent's buffered output again
  for (int i = 0; i < kProcesses; ++i) {
    pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::close(gate[1]);
      char c;
      while (::read(gate[0], &c, 1) > 0) {
      }
      int status = 1;
      try {
        DiskCache cache(dir.path / "cache");
        DiskLookup r = cache.get_or_compile(key, [&] {
          int fd = ::open(counter.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
          if (fd >= 0) {
            (void)!::write(fd, "compiled\n", 9);
            ::close(fd);
          }
          // Long enough that every other process arrives while this one compiles.
          std::this_thread::sleep_for(std::chrono::milliseconds(300));
          return test_artefact("cubin from one process");
        });
        if (std::string(r.artefact.binary.begin(), r.artefact.binary.end()) == "cubin from one process") status = 0;
      } catch (...) {
        status = 2;
      }
      ::_exit(status);
    }
    children.push_back(pid);
  }
  ::close(gate[0]);
  ::close(gate[1]);
  for (pid_t pid : children) {
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }
  std::ifstream f(counter);
  int lines = 0;
  for (std::string line; std::getline(f, line);) ++lines;
  CHECK(lines == 1);
  CHECK(DiskCache(dir.path / "cache").load(key).has_value());
}

TEST_CASE("disk cache: several threads compile one key once", "[runtime][disk_cache]") {
  TempDir dir;
  CacheKey key = test_key("shared by threads");
  std::atomic<int> compiles{0};
  std::atomic<bool> go{false};
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 6; ++i) {
    threads.emplace_back([&] {
      while (!go.load()) std::this_thread::yield();
      // One DiskCache per thread, as separate KernelCache instances would have.
      DiskCache cache(dir.path);
      DiskLookup r = cache.get_or_compile(key, [&] {
        ++compiles;
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        return test_artefact("one");
      });
      if (r.artefact.binary.size() == 3) ++ok;
    });
  }
  go = true;
  for (std::thread& t : threads) t.join();
  CHECK(compiles == 1);
  CHECK(ok == 6);
}

TEST_CASE("disk cache: ls, info and clear", "[runtime][disk_cache]") {
  TempDir dir;
  DiskCache cache(dir.path);
  CHECK(cache.list().empty());
  CHECK(cache.info().entries == 0);
  CacheKey k1 = test_key("one", "sm_80"), k2 = test_key("two", "sm_90a"), k3 = test_key("three", "sm_90a");
  REQUIRE(cache.store(k1, test_artefact("11")));
  REQUIRE(cache.store(k2, test_artefact("2222")));
  REQUIRE(cache.store(k3, test_artefact("333333")));
  // A corrupt file shows up as invalid rather than breaking the listing.
  {
    std::vector<std::uint8_t> bytes = read_bytes(cache.entry_path(k3));
    bytes[bytes.size() - 1] ^= 1;
    write_bytes(cache.entry_path(k3), bytes);
  }

  std::vector<DiskCacheEntry> entries = cache.list();
  REQUIRE(entries.size() == 3);
  CHECK(entries[0].arch == "sm_80");
  CHECK(entries[0].hash == k1.hash());
  CHECK(entries[0].valid);
  CHECK(entries[0].key_text == k1.text());
  CHECK(entries[0].entries == std::vector<std::string>{"kernel", "kernel_lse"});
  CHECK(entries[0].size_bytes == fs::file_size(cache.entry_path(k1)));
  CHECK(entries[0].mtime_unix > 0);
  int invalid = 0;
  for (const DiskCacheEntry& e : entries) {
    CHECK(e.arch == (e.hash == k1.hash() ? "sm_80" : "sm_90a"));
    if (!e.valid) {
      ++invalid;
      CHECK(e.hash == k3.hash());
      CHECK(e.problem == "checksum mismatch");
    }
  }
  CHECK(invalid == 1);

  DiskCacheInfo info = cache.info();
  CHECK(info.root == dir.path);
  CHECK(info.entries == 3);
  CHECK(info.total_bytes == entries[0].size_bytes + entries[1].size_bytes + entries[2].size_bytes);
  CHECK(info.writable);

  cache.get_or_compile(test_key("four"), [] { return test_artefact("4"); });  // leaves a lock file
  CHECK(cache.clear() == 4);
  CHECK(cache.list().empty());
  CHECK(cache.info().entries == 0);
  CHECK_FALSE(cache.load(k1).has_value());
  for (auto& p : fs::recursive_directory_iterator(dir.path)) CHECK(p.is_directory());
}

TEST_CASE("disk cache: a key without architecture is refused", "[runtime][disk_cache]") {
  TempDir dir;
  DiskCache cache(dir.path);
  CHECK_THROWS_AS(cache.entry_path(CacheKeyBuilder().build()), flexjit::Error);
}
