#include "runtime/log.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <unordered_set>

namespace flexjit::runtime {
namespace {

// Process-wide logging state. Allocated once and never freed, so that code running during
// static destruction (a cache's destructor) can still log safely.
struct LogState {
  std::once_flag env_once;
  std::atomic<int> level{static_cast<int>(LogLevel::warn)};
  std::mutex sink_mutex;  // serialises writes and guards `sink`
  LogSink sink;
  std::mutex once_mutex;  // guards `warned`
  std::unordered_set<std::string> warned;
};

LogState& state() {
  static LogState* s = new LogState;
  return *s;
}

// Writes without consulting the level: callers have decided already.
void emit(LogLevel level, std::string_view message) {
  LogState& s = state();
  std::lock_guard<std::mutex> lock(s.sink_mutex);
  if (s.sink) {
    s.sink(level, message);
    return;
  }
  std::string line = fmt::format("flexjit[{}]: {}\n", log_level_name(level), message);
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

bool parse_level(std::string_view text, LogLevel* out) {
  struct Name {
    std::string_view name;
    LogLevel level;
  };
  static constexpr Name kNames[] = {
      {"debug", LogLevel::debug}, {"info", LogLevel::info},   {"warn", LogLevel::warn},
      {"warning", LogLevel::warn}, {"error", LogLevel::error}, {"off", LogLevel::off},
      {"none", LogLevel::off},     {"0", LogLevel::off}};
  for (const Name& n : kNames) {
    if (n.name == text) {
      *out = n.level;
      return true;
    }
  }
  return false;
}

void init_from_env() {
  const char* env = std::getenv("FLEXJIT_LOG");
  if (!env || !*env) return;
  LogLevel level;
  if (parse_level(env, &level)) {
    state().level.store(static_cast<int>(level), std::memory_order_relaxed);
    return;
  }
  // Written directly: going through log_message here would re-enter this once-initialiser.
  emit(LogLevel::warn, fmt::format("FLEXJIT_LOG='{}' is not a log level; using 'warn'. "
                                   "Use one of debug, info, warn, error, off.",
                                   env));
}

}  // namespace

const char* log_level_name(LogLevel level) {
  switch (level) {
    case LogLevel::debug: return "debug";
    case LogLevel::info: return "info";
    case LogLevel::warn: return "warn";
    case LogLevel::error: return "error";
    case LogLevel::off: return "off";
  }
  return "?";
}

LogLevel log_level() {
  LogState& s = state();
  std::call_once(s.env_once, init_from_env);
  return static_cast<LogLevel>(s.level.load(std::memory_order_relaxed));
}

void set_log_level(LogLevel level) {
  LogState& s = state();
  // Read the environment first so that a later first call cannot overwrite this choice.
  std::call_once(s.env_once, init_from_env);
  s.level.store(static_cast<int>(level), std::memory_order_relaxed);
}

void set_log_sink(LogSink sink) {
  LogState& s = state();
  std::lock_guard<std::mutex> lock(s.sink_mutex);
  s.sink = std::move(sink);
}

void log_message(LogLevel level, std::string_view message) {
  if (log_enabled(level)) emit(level, message);
}

bool warn_once(std::string_view key, std::string_view message) {
  LogState& s = state();
  {
    std::lock_guard<std::mutex> lock(s.once_mutex);
    if (!s.warned.emplace(key).second) return false;
  }
  log_message(LogLevel::warn, message);
  return true;
}

}  // namespace flexjit::runtime
