// What the daemon's files share (internal to troupe_http): the per-thread request context that the
// request counters read, and the error response.
#pragma once

#include <chrono>
#include <cstdint>

#include "net/http/front.h"
#include "net/http/openai.h"
#include "net/http/daemon.h"

namespace troupe::http::detail {

using clock_type = std::chrono::steady_clock;

// Per worker thread: when the request being handled started and whether it was counted yet (a response is
// counted just before its last bytes are written: once its handler returned or, for an answer written by a
// writer, by the writer before its last chunk; the writer runs on the handler's thread).
inline thread_local clock_type::time_point request_start;
inline thread_local bool request_counted = false;

inline int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

inline void send_error(front::response& res, const api_error& e) {
  res.status = e.status();
  res.set_content(dump(e.body()), "application/json");
}

}  // namespace troupe::http::detail
