#include "runtime/log.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

namespace troupe {
namespace {

std::mutex& sink_mutex() {
  static std::mutex m;
  return m;
}

log_sink& sink() {
  static log_sink s;
  return s;
}

log_level level_from_env() {
  const char* v = std::getenv("TROUPE_LOG_LEVEL");
  if (v == nullptr) return log_level::info;
  for (int l = 0; l <= static_cast<int>(log_level::none); ++l) {
    if (log_level_name(static_cast<log_level>(l)) == v) return static_cast<log_level>(l);
  }
  return log_level::info;
}

std::atomic<int>& current_level() {
  static std::atomic<int> level{static_cast<int>(level_from_env())};
  return level;
}

}  // namespace

std::string_view log_level_name(log_level level) {
  switch (level) {
    case log_level::debug: return "debug";
    case log_level::info: return "info";
    case log_level::warn: return "warn";
    case log_level::error: return "error";
    case log_level::none: return "none";
  }
  return "unknown";
}

void set_log_sink(log_sink s) {
  std::lock_guard lock(sink_mutex());
  sink() = std::move(s);
}

void set_log_level(log_level level) { current_level().store(static_cast<int>(level)); }

log_level get_log_level() { return static_cast<log_level>(current_level().load(std::memory_order_relaxed)); }

void log_message(log_level level, std::string_view msg) {
  std::lock_guard lock(sink_mutex());
  if (sink()) {
    sink()(level, msg);
    return;
  }
  std::fprintf(stderr, "troupe: [%s] %.*s\n", std::string(log_level_name(level)).c_str(), static_cast<int>(msg.size()),
               msg.data());
}

}  // namespace troupe
