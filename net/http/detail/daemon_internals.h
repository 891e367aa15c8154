// What the daemon's files share (internal to troupe_http): its listener, the per-thread request context
// that the access log and the request counters read after the response, and the error response.
#pragma once

#include <httplib.h>
#include <sys/socket.h>

#include <chrono>
#include <cstdint>

#include "net/http/openai.h"
#include "net/http/server.h"

namespace troupe::http {

// httplib's server with the listen backlog raised: 0.11 listens with a backlog of 5, and when a burst of
// clients connects at once (16 in the load test) the kernel's accept queue overflows, their handshakes are
// retried after seconds, and a request that arrives after the keep-alive wait is dropped.
class daemon::listener : public httplib::Server {
 public:
  void raise_backlog() {
    const socket_t s = svr_sock_.load();
    if (s != INVALID_SOCKET) ::listen(s, SOMAXCONN);
  }
};

}  // namespace troupe::http

namespace troupe::http::detail {

using clock_type = std::chrono::steady_clock;

// Per HTTP worker thread: when the request being handled started, whether its client went away and
// whether it was counted yet (for the access log and the request counters: a response is counted just before
// its last bytes are written, in the post-routing handler or, for an answer written by a content provider,
// by the provider; the access log runs after the response, on the same thread).
inline thread_local clock_type::time_point request_start;
inline thread_local bool client_gone = false;
inline thread_local bool request_counted = false;

inline int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

inline void send_error(httplib::Response& res, const api_error& e) {
  res.status = e.status();
  res.set_content(dump(e.body()), "application/json");
}

}  // namespace troupe::http::detail
