// Leveled logging to stderr, chosen by FLEXJIT_LOG=debug|info|warn|error|off (default warn).
#pragma once
#include <fmt/format.h>

#include <functional>
#include <string>
#include <string_view>

namespace flexjit::runtime {

enum class LogLevel { debug = 0, info = 1, warn = 2, error = 3, off = 4 };

// "debug", "info", "warn", "error", "off".
const char* log_level_name(LogLevel level);

// The current threshold. Read from FLEXJIT_LOG on first use; an unknown value keeps the
// default (warn) and says so once.
LogLevel log_level();

// Overrides FLEXJIT_LOG for the rest of the process (the CLI's --verbose, tests).
void set_log_level(LogLevel level);

// True when a message at `level` would be written; check it before building an expensive message.
inline bool log_enabled(LogLevel level) { return level >= log_level() && level != LogLevel::off; }

// Where messages go. The default writes "flexjit[info]: message\n" to stderr; tests install a
// sink to capture messages. Passing an empty function restores stderr. The sink is called
// under a lock, so it never runs concurrently with itself.
using LogSink = std::function<void(LogLevel, std::string_view)>;
void set_log_sink(LogSink sink);

// Writes one message if `level` is enabled. Thread-safe; each message is written whole.
void log_message(LogLevel level, std::string_view message);

// Writes `message` at warn level the first time `key` is seen in this process; returns true
// that first time (even when the level hides the message). For conditions that would otherwise
// repeat on every call (an unwritable cache directory).
bool warn_once(std::string_view key, std::string_view message);

template <typename... Args>
void log_debug(fmt::format_string<Args...> format, Args&&... args) {
  if (log_enabled(LogLevel::debug)) log_message(LogLevel::debug, fmt::format(format, std::forward<Args>(args)...));
}
template <typename... Args>
void log_info(fmt::format_string<Args...> format, Args&&... args) {
  if (log_enabled(LogLevel::info)) log_message(LogLevel::info, fmt::format(format, std::forward<Args>(args)...));
}
template <typename... Args>
void log_warn(fmt::format_string<Args...> format, Args&&... args) {
  if (log_enabled(LogLevel::warn)) log_message(LogLevel::warn, fmt::format(format, std::forward<Args>(args)...));
}
template <typename... Args>
void log_error(fmt::format_string<Args...> format, Args&&... args) {
  if (log_enabled(LogLevel::error)) log_message(LogLevel::error, fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace flexjit::runtime
