#include "runtime/disk_cache.h"

#include <errno.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "dsl/error.h"
#include "runtime/log.h"

namespace flexjit::runtime {
namespace fs = std::filesystem;
namespace {

constexpr char kMagic[8] = {'F', 'L', 'E', 'X', 'J', 'I', 'T', 'K'};
// magic, format version, key schema, key length, JSON length, binary length.
constexpr size_t kHeaderBytes = 8 + 4 + 4 + 8 + 8 + 8;
constexpr size_t kChecksumBytes = 8;

std::uint64_t get_le(const std::uint8_t* p, int bytes) {
  std::uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<std::uint64_t>(p[i]) << (8 * i);
  return v;
}

std::string errno_text(int err) { return std::strerror(err); }

// A file's bytes and identity, read without locking.
struct FileImage {
  std::vector<std::uint8_t> bytes;
  dev_t dev = 0;
  ino_t ino = 0;
  std::int64_t mtime = 0;
};

// Reads `path` whole; false when it does not exist or cannot be read (both are misses).
bool read_file(const fs::path& path, FileImage* out) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  struct stat st;
  bool ok = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
  if (ok) {
    out->dev = st.st_dev;
    out->ino = st.st_ino;
    out->mtime = static_cast<std::int64_t>(st.st_mtime);
    out->bytes.resize(static_cast<size_t>(st.st_size));
    size_t done = 0;
    while (ok && done < out->bytes.size()) {
      ssize_t n = ::read(fd, out->bytes.data() + done, out->bytes.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        ok = false;
        break;
      }
      done += static_cast<size_t>(n);
    }
  }
  ::close(fd);
  return ok;
}

// The parts of an entry; decode() fills it or says what is wrong.
struct Decoded {
  std::string key_text;
  std::vector<std::string> entries;
  nlohmann::json metadata;
  std::vector<std::uint8_t> binary;
};

std::string decode(const std::vector<std::uint8_t>& b, Decoded* out) {
  if (b.size() < kHeaderBytes + kChecksumBytes) return fmt::format("truncated ({} bytes)", b.size());
  if (std::memcmp(b.data(), kMagic, sizeof kMagic) != 0) return "not a flexjit cache entry (bad magic)";
  const std::uint8_t* p = b.data() + 8;
  std::uint64_t format = get_le(p, 4), schema = get_le(p + 4, 4);
  std::uint64_t key_len = get_le(p + 8, 8), json_len = get_le(p + 16, 8), bin_len = get_le(p + 24, 8);
  if (format != DiskCache::kFormatVersion) return fmt::format("entry format {} (expected {})", format, DiskCache::kFormatVersion);
  if (schema != static_cast<std::uint64_t>(kCacheKeySchema)) return fmt::format("key schema {} (expected {})", schema, kCacheKeySchema);
  // Compared piecewise so that huge lengths in a corrupt header cannot overflow the sum.
  std::uint64_t body = b.size() - kHeaderBytes - kChecksumBytes;
  if (key_len > body || json_len > body - key_len || bin_len != body - key_len - json_len)
    return fmt::format("truncated or padded: lengths {}+{}+{} do not match {} bytes of body", key_len, json_len, bin_len, body);
  std::uint64_t stored = get_le(b.data() + b.size() - kChecksumBytes, 8);
  std::uint64_t actual = XXH3_64bits(b.data(), b.size() - kChecksumBytes);
  if (stored != actual) return "checksum mismatch";
  const char* text = reinterpret_cast<const char*>(b.data() + kHeaderBytes);
  out->key_text.assign(text, key_len);
  try {
    nlohmann::json j = nlohmann::json::parse(text + key_len, text + key_len + json_len);
    out->entries = j.at("entries").get<std::vector<std::string>>();
    out->metadata = j.at("metadata");
  } catch (const std::exception& e) {
    return fmt::format("bad JSON blob: {}", e.what());
  }
  const std::uint8_t* bin = b.data() + kHeaderBytes + key_len + json_len;
  out->binary.assign(bin, bin + bin_len);
  return {};
}

// Removes `path` only if it is still the file that was read: a concurrent writer may have
// renamed a good entry over it in between, and that one must survive.
void remove_if_same(const fs::path& path, const FileImage& image) {
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && st.st_dev == image.dev && st.st_ino == image.ino) ::unlink(path.c_str());
}

// Holds an exclusive flock on a lock file for its lifetime.
class FileLock {
 public:
  // Opens (creating) `path` and waits for the lock; on failure returns false and sets `error`.
  bool acquire(const fs::path& path, std::string* error) {
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) {
      *error = fmt::format("cannot create lock file {}: {}", path.string(), errno_text(errno));
      return false;
    }
    while (::flock(fd_, LOCK_EX) != 0) {
      if (errno == EINTR) continue;
      *error = fmt::format("cannot lock {}: {}", path.string(), errno_text(errno));
      ::close(fd_);
      fd_ = -1;
      return false;
    }
    return true;
  }
  ~FileLock() {
    if (fd_ >= 0) {
      ::flock(fd_, LOCK_UN);
      ::close(fd_);
    }
  }

 private:
  int fd_ = -1;
};

bool write_all(int fd, const std::uint8_t* data, size_t size) {
  size_t done = 0;
  while (done < size) {
    ssize_t n = ::write(fd, data + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

std::vector<std::uint8_t> encode_cache_entry(const CacheKey& key, const CompiledArtefact& artefact) {
  std::string json = nlohmann::json{{"entries", artefact.entries}, {"metadata", artefact.metadata}}.dump();
  const std::string& text = key.text();
  std::vector<std::uint8_t> out(kHeaderBytes + text.size() + json.size() + artefact.binary.size() + kChecksumBytes);
  std::uint8_t* p = out.data();
  auto put = [&p](const void* data, size_t size) {
    if (size) std::memcpy(p, data, size);
    p += size;
  };
  auto put_le = [&p](std::uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) *p++ = static_cast<std::uint8_t>(v >> (8 * i));
  };
  put(kMagic, sizeof kMagic);
  put_le(DiskCache::kFormatVersion, 4);
  put_le(static_cast<std::uint64_t>(kCacheKeySchema), 4);
  put_le(text.size(), 8);
  put_le(json.size(), 8);
  put_le(artefact.binary.size(), 8);
  put(text.data(), text.size());
  put(json.data(), json.size());
  put(artefact.binary.data(), artefact.binary.size());
  put_le(XXH3_64bits(out.data(), out.size() - kChecksumBytes), 8);
  return out;
}

fs::path DiskCache::default_root() {
  if (const char* dir = std::getenv("FLEXJIT_CACHE_DIR"); dir && *dir) return fs::path(dir);
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) return fs::path(xdg) / "flexjit";
  if (const char* home = std::getenv("HOME"); home && *home) return fs::path(home) / ".cache" / "flexjit";
  // No home (some daemons): a per-user directory that at least lasts until reboot.
  return fs::temp_directory_path() / fmt::format("flexjit-cache-{}", ::getuid());
}

DiskCache::DiskCache(fs::path root) : root_(std::move(root)) {}

fs::path DiskCache::entry_path(const CacheKey& key) const {
  if (key.arch().empty())
    throw Error("a disk cache key needs an architecture: call CacheKeyBuilder::arch(\"sm_90a\") before build()");
  return root_ / fmt::format("v{}", kFormatVersion) / key.arch() / key.hash().substr(0, 2) / (key.hash() + ".bin");
}

std::optional<CompiledArtefact> DiskCache::load(const CacheKey& key) const {
  fs::path path = entry_path(key);
  FileImage image;
  if (!read_file(path, &image)) return std::nullopt;
  Decoded d;
  std::string problem = decode(image.bytes, &d);
  if (problem.empty() && d.key_text != key.text())
    problem = "its key text differs from the requested key (a hash collision or a stale entry)";
  if (!problem.empty()) {
    log_info("disk cache: removing unusable entry {}: {}", path.string(), problem);
    remove_if_same(path, image);
    return std::nullopt;
  }
  CompiledArtefact a;
  a.binary = std::move(d.binary);
  a.entries = std::move(d.entries);
  a.metadata = std::move(d.metadata);
  return a;
}

void DiskCache::degrade(const std::string& why) {
  writable_.store(false, std::memory_order_relaxed);
  warn_once("disk-cache-unwritable:" + root_.string(),
            fmt::format("the kernel cache directory {} cannot be written ({}); compiled kernels are kept in "
                        "memory for this process only. Point FLEXJIT_CACHE_DIR at a writable directory to "
                        "keep them across runs.",
                        root_.string(), why));
}

bool DiskCache::store(const CacheKey& key, const CompiledArtefact& artefact) {
  if (!writable()) return false;
  fs::path path = entry_path(key);
  std::error_code ec;
  fs::create_directories(path.parent_path(), ec);
  if (ec) {
    degrade(fmt::format("cannot create {}: {}", path.parent_path().string(), ec.message()));
    return false;
  }
  std::vector<std::uint8_t> bytes = encode_cache_entry(key, artefact);
  // Unique per process and thread: two writers of one key never share a temporary file.
  static std::atomic<unsigned> counter{0};
  fs::path tmp = path;
  tmp += fmt::format(".tmp-{}-{}", ::getpid(), counter.fetch_add(1));
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    degrade(fmt::format("cannot create {}: {}", tmp.string(), errno_text(errno)));
    return false;
  }
  bool ok = write_all(fd, bytes.data(), bytes.size());
  int err = ok ? 0 : errno;
  // close() reports delayed write errors (NFS, quota) too. No fsync: after a crash a torn entry
  // fails its checksum and is recompiled, which is cheaper than syncing every store.
  if (::close(fd) != 0 && ok) {
    ok = false;
    err = errno;
  }
  if (ok && ::rename(tmp.c_str(), path.c_str()) != 0) {
    ok = false;
    err = errno;
  }
  if (!ok) {
    ::unlink(tmp.c_str());
    degrade(fmt::format("cannot write {}: {}", path.string(), errno_text(err)));
    return false;
  }
  log_debug("disk cache: stored {} ({} bytes)", path.string(), bytes.size());
  return true;
}

void DiskCache::remove(const CacheKey& key) const {
  std::error_code ec;
  fs::remove(entry_path(key), ec);
}

DiskLookup DiskCache::get_or_compile(const CacheKey& key, const std::function<CompiledArtefact()>& compile) {
  auto start = std::chrono::steady_clock::now();
  if (auto a = load(key)) return DiskLookup{std::move(*a), true, seconds_since(start)};

  FileLock lock;
  bool locked = false;
  if (writable()) {
    fs::path path = entry_path(key);
    std::error_code ec;
    fs::create_directories(path.parent_path(), ec);
    std::string error;
    if (ec)
      degrade(fmt::format("cannot create {}: {}", path.parent_path().string(), ec.message()));
    else if (!(locked = lock.acquire(fs::path(path).replace_extension(".lock"), &error)))
      degrade(error);
  }
  if (locked) {
    // Another process may have compiled it while this one waited for the lock.
    if (auto a = load(key)) {
      log_debug("disk cache: {} was compiled by another process meanwhile", key.hash());
      return DiskLookup{std::move(*a), true, seconds_since(start)};
    }
  }
  CompiledArtefact a = compile();
  store(key, a);
  return DiskLookup{std::move(a), false, seconds_since(start)};
}

std::vector<DiskCacheEntry> DiskCache::list() const {
  std::vector<DiskCacheEntry> out;
  fs::path top = root_ / fmt::format("v{}", kFormatVersion);
  std::error_code ec;
  for (fs::recursive_directory_iterator it(top, fs::directory_options::skip_permission_denied, ec), end;
       !ec && it != end; it.increment(ec)) {
    const fs::path& p = it->path();
    if (p.extension() != ".bin" || !it->is_regular_file(ec)) continue;
    DiskCacheEntry e;
    e.path = p;
    e.hash = p.stem().string();
    e.arch = p.parent_path().parent_path().filename().string();
    FileImage image;
    if (!read_file(p, &image)) {
      e.problem = "cannot be read";
      out.push_back(std::move(e));
      continue;
    }
    e.size_bytes = image.bytes.size();
    e.mtime_unix = image.mtime;
    Decoded d;
    e.problem = decode(image.bytes, &d);
    if (e.problem.empty() && xxh3_128_hex(d.key_text.data(), d.key_text.size()) != e.hash)
      e.problem = "its key text does not hash to its file name";
    e.valid = e.problem.empty();
    if (e.valid) {
      e.key_text = std::move(d.key_text);
      e.entries = std::move(d.entries);
      e.metadata = std::move(d.metadata);
    }
    out.push_back(std::move(e));
  }
  std::sort(out.begin(), out.end(), [](const DiskCacheEntry& a, const DiskCacheEntry& b) {
    return a.arch != b.arch ? a.arch < b.arch : a.hash < b.hash;
  });
  return out;
}

DiskCacheInfo DiskCache::info() const {
  DiskCacheInfo info;
  info.root = root_;
  info.writable = writable();
  fs::path top = root_ / fmt::format("v{}", kFormatVersion);
  std::error_code ec;
  for (fs::recursive_directory_iterator it(top, fs::directory_options::skip_permission_denied, ec), end;
       !ec && it != end; it.increment(ec)) {
    if (it->path().extension() != ".bin" || !it->is_regular_file(ec)) continue;
    std::uint64_t size = it->file_size(ec);
    if (ec) {
      ec.clear();
      continue;
    }
    ++info.entries;
    info.total_bytes += size;
  }
  return info;
}

std::size_t DiskCache::clear() {
  // Only files go: directories stay, so a concurrent writer's rename into one still succeeds.
  std::vector<fs::path> doomed;
  fs::path top = root_ / fmt::format("v{}", kFormatVersion);
  std::error_code ec;
  for (fs::recursive_directory_iterator it(top, fs::directory_options::skip_permission_denied, ec), end;
       !ec && it != end; it.increment(ec)) {
    std::string name = it->path().filename().string();
    if (ends_with(name, ".bin") || ends_with(name, ".lock")) {
      doomed.push_back(it->path());
    } else if (name.find(".bin.tmp-") != std::string::npos) {
      // A live writer renames its temporary file within moments; only a crashed one leaves it.
      std::error_code time_ec;
      auto age = fs::file_time_type::clock::now() - fs::last_write_time(it->path(), time_ec);
      if (!time_ec && age > std::chrono::minutes(10)) doomed.push_back(it->path());
    }
  }
  std::size_t removed = 0;
  for (const fs::path& p : doomed) {
    if (fs::remove(p, ec) && p.extension() == ".bin") ++removed;
  }
  log_info("disk cache: removed {} entries from {}", removed, root_.string());
  return removed;
}

}  // namespace flexjit::runtime
