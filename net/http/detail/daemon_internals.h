// What the daemon's files share (internal to troupe_http): the per-thread request context that the
// request counters read, the count of requests in flight, and the error responses.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "actors/errors.h"
#include "net/http/front.h"
#include "net/http/metrics.h"
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

// The HTTP error for a request the actors failed: a full context or a bad id is the request's fault (400), a
// model that is down (its peer is gone, it is being loaded again) is a 503 to retry later, anything else a 500.
inline api_error error_for(const actors::request_error& e) {
  if (e.is(actors::errc::capacity)) return api_error(400, "invalid_request_error", e.what());
  if (e.is(actors::errc::bad_request)) return api_error(400, "invalid_request_error", e.what());
  if (e.is(actors::errc::down) || e.is(actors::errc::unavailable)) return api_error(503, "unavailable_error", e.what());
  return api_error(500, "server_error", e.what());
}

// How one answer goes out in one API's shape (OpenAI's chat and completions, Anthropic's messages): the
// events of a streamed answer, its end (a stream's last events or a plain answer's body) and its errors.
// write_answer drives it; the format keeps what it needs between pieces.
class answer_format {
 public:
  virtual ~answer_format() = default;
  // The text to send for a generated piece of a streamed answer ("" for nothing yet).
  virtual std::string stream(const actors::token_event& e) = 0;
  // The end: a stream's last events, or the whole body of a plain answer.
  virtual std::string finish(const actors::generate_reply& reply) = 0;
  // An error: the body of a refusal (nothing sent yet), and the text that ends a stream already under way.
  virtual std::string error_body(const api_error& e) const = 0;
  virtual std::string stream_error(const api_error& e) const = 0;
  // Whether some of a streamed answer went out (a failure after that cannot be answered with its status).
  bool started() const { return started_; }
  // The content type of a streamed answer.
  virtual const char* stream_type() const { return "text/event-stream"; }

 protected:
  bool started_ = false;
};

// Counts a request in flight for as long as it lives (a shutdown's grace period ends early when none is).
class in_flight_count {
 public:
  explicit in_flight_count(daemon_metrics& mx) : m_(mx) { m_.in_flight.fetch_add(1); }
  ~in_flight_count() { m_.in_flight.fetch_sub(1); }
  in_flight_count(const in_flight_count&) = delete;
  in_flight_count& operator=(const in_flight_count&) = delete;

 private:
  daemon_metrics& m_;
};

}  // namespace troupe::http::detail
