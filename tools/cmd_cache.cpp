// `flexjit cache ls|info|clear`: inspect or empty the on-disk kernel cache.
#include <fmt/chrono.h>
#include <fmt/format.h>

#include "runtime/disk_cache.h"
#include "tools/commands.h"

namespace flexjit::tools {

void add_cache_command(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand("cache", "Inspect or clear the on-disk kernel cache ($FLEXJIT_CACHE_DIR)");
  cmd->require_subcommand(1);
  auto* ls = cmd->add_subcommand("ls", "List cache entries: architecture, hash, size, kernels");
  auto* info = cmd->add_subcommand("info", "Show the cache root, entry count and size");
  auto* clear = cmd->add_subcommand("clear", "Remove every cache entry");
  ls->callback([&action] {
    action = [] {
      runtime::DiskCache cache;
      for (const runtime::DiskCacheEntry& e : cache.list()) {
        std::string kernels = e.valid ? fmt::format("{}", fmt::join(e.entries, ",")) : "INVALID: " + e.problem;
        std::string name;
        if (e.valid) {
          size_t k = e.key_text.find("kernel=");
          if (k != std::string::npos) name = e.key_text.substr(k + 7, e.key_text.find('\n', k) - k - 7);
        }
        fmt::print("{:<8} {} {:>9} B  {} {}\n", e.arch, e.hash, e.size_bytes, name, kernels);
      }
      return 0;
    };
  });
  info->callback([&action] {
    action = [] {
      runtime::DiskCache cache;
      runtime::DiskCacheInfo i = cache.info();
      fmt::print("root: {}\nentries: {}\nbytes: {}\nwritable: {}\n", i.root.string(), i.entries, i.total_bytes, i.writable ? "yes" : "no");
      return 0;
    };
  });
  clear->callback([&action] {
    action = [] {
      runtime::DiskCache cache;
      fmt::print("removed {} entries from {}\n", cache.clear(), cache.root().string());
      return 0;
    };
  });
}

}  // namespace flexjit::tools
