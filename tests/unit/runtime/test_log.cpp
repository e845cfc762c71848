// Tests of leveled logging and warn_once.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "runtime/log.h"

using namespace flexjit::runtime;

namespace {

// Captures messages for one test and restores stderr and the level afterwards.
struct CapturedLog {
  std::vector<std::pair<LogLevel, std::string>> messages;
  LogLevel saved = log_level();
  CapturedLog() {
    set_log_sink([this](LogLevel level, std::string_view m) { messages.emplace_back(level, std::string(m)); });
  }
  ~CapturedLog() {
    set_log_sink({});
    set_log_level(saved);
  }
};

}  // namespace

TEST_CASE("log: messages below the level are dropped", "[runtime][log]") {
  CapturedLog cap;
  set_log_level(LogLevel::warn);
  log_info("hidden {}", 1);
  log_warn("shown {}", 2);
  log_error("shown {}", 3);
  REQUIRE(cap.messages.size() == 2);
  CHECK(cap.messages[0].first == LogLevel::warn);
  CHECK(cap.messages[0].second == "shown 2");
  CHECK(cap.messages[1].first == LogLevel::error);

  set_log_level(LogLevel::debug);
  CHECK(log_enabled(LogLevel::debug));
  log_debug("now {}", "visible");
  REQUIRE(cap.messages.size() == 3);
  CHECK(cap.messages[2].second == "now visible");

  set_log_level(LogLevel::off);
  CHECK_FALSE(log_enabled(LogLevel::error));
  log_error("never");
  CHECK(cap.messages.size() == 3);
}

TEST_CASE("log: warn_once warns once per key", "[runtime][log]") {
  CapturedLog cap;
  set_log_level(LogLevel::warn);
  CHECK(warn_once("test-log-key-a", "first"));
  CHECK_FALSE(warn_once("test-log-key-a", "second"));
  CHECK(warn_once("test-log-key-b", "other key"));
  REQUIRE(cap.messages.size() == 2);
  CHECK(cap.messages[0].second == "first");
  CHECK(cap.messages[1].second == "other key");
}

TEST_CASE("log: level names", "[runtime][log]") {
  CHECK(std::string(log_level_name(LogLevel::debug)) == "debug");
  CHECK(std::string(log_level_name(LogLevel::info)) == "info");
  CHECK(std::string(log_level_name(LogLevel::warn)) == "warn");
}
