// Logging for library code: levels, a replaceable sink (the daemon routes it to spdlog; tests capture it).
//
//   TROUPE_LOG(warn, "chat template not recognised, using ChatML");
//   set_log_sink([](log_level l, std::string_view msg) { ... });
#pragma once

#include <functional>
#include <sstream>
#include <string_view>

namespace troupe {

enum class log_level : int { debug = 0, info = 1, warn = 2, error = 3, none = 4 };

using log_sink = std::function<void(log_level, std::string_view)>;

// Replaces the sink (default: stderr, "troupe: [level] message"). Thread-safe.
void set_log_sink(log_sink sink);
// Messages below this level are dropped before formatting. Default: info, or TROUPE_LOG_LEVEL from the
// environment (debug, info, warn, error, none).
void set_log_level(log_level level);
log_level get_log_level();
void log_message(log_level level, std::string_view msg);
std::string_view log_level_name(log_level level);

}  // namespace troupe

#define TROUPE_LOG(level, expr)                                              \
  do {                                                                       \
    if (::troupe::log_level::level >= ::troupe::get_log_level()) {           \
      std::ostringstream troupe_log_os_;                                     \
      troupe_log_os_ << expr;                                                \
      ::troupe::log_message(::troupe::log_level::level, troupe_log_os_.str()); \
    }                                                                        \
  } while (0)
