// The daemon's HTTP/1.1 front end: connections multiplexed on a few event-loop threads (Boost.Beast over
// Boost.Asio), handlers run on worker pools. An idle or slow client holds a socket and a few hundred bytes,
// never a thread: the loop reads every request's header and body under deadlines, and only a request that
// has fully arrived is handed to a worker.
//
//   front::listener s(opts, {.handle = ..., .error = ..., .heavy = ..., .log = ...});
//   const int port = s.bind();
//   std::thread t([&] { s.run(); });   // returns once stop() was called and every exchange has ended
//   ...  s.stop();                     // from any thread, any number of times
//
// Limits (front::options and its listen_options): at most max_connections open at once (one more is
// answered 503 and closed); a request's header must arrive within header_timeout_s (a keep-alive connection
// waits keep_alive_timeout_s for its next request first) and its body within read_timeout_s; a response
// chunk that cannot be written within write_timeout_s ends the connection; keep_alive_max requests per
// connection. A request whose header or body misses its deadline is answered 408 and closed (a connection
// that sent nothing of its next request is closed quietly). Headers over max_header_bytes: 431; bodies over
// max_body_bytes: 413; malformed requests: 400; each a JSON body made by handlers::error, then the
// connection is closed.
//
// Workers: handlers::heavy says which requests go to the `worker_threads` pool (the completions: a handler
// there may wait for a session and write its answer for minutes); the rest (health, metrics, the listing
// routes) go to a pool of their own, so that no number of generating requests can delay /health.
//
// A handler fills a response: a whole body (set_content), or a writer that is called on the same worker
// thread after the handler returned and writes the body in chunks (chunked transfer encoding; HTTP/1.0:
// until the connection closes). The head goes out with the first chunk, so a writer that fails before
// writing anything can still answer an error status (body_sink::refuse). A write returns false once the
// client is gone, so a writer can stop.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace troupe::http::front {

struct request {
  std::string method;  // "GET", "POST", ...
  std::string path;    // the target before any '?'
  std::string query;   // after the '?', undecoded
  std::string body;
  std::string remote_addr;
  std::vector<std::pair<std::string, std::string>> headers;
  // The value of the first header named `name` (case-insensitive), or "".
  std::string header(std::string_view name) const;
};

class body_sink {
 public:
  virtual ~body_sink() = default;
  // Writes one chunk (an empty one is skipped); false once the client is gone (then every later write is
  // false too).
  virtual bool write(std::string_view data) = 0;
  // Ends the body. Without it the connection is closed after the writer returns (the client sees a body
  // cut short).
  virtual bool done() = 0;
  // Whether anything of the response went out: its status line and header leave with the first chunk, so
  // until then the writer may still answer otherwise (refuse).
  virtual bool started() const = 0;
  // Before anything went out: answers `status` with this whole body instead (a failure before the first
  // token is a real 503, which clients retry, rather than an error inside a 200). Returns whether it was
  // written; false, with nothing written, once the body has started.
  virtual bool refuse(int status, std::string_view body, std::string_view content_type) = 0;
};

// Writes a response's body; returns whether it was written to the end.
using body_writer = std::function<bool(body_sink&)>;

struct response {
  int status = 200;
  std::string content_type;
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
  body_writer writer;  // set: the body is written by it, in chunks

  void set_header(std::string name, std::string value) { headers.emplace_back(std::move(name), std::move(value)); }
  void set_content(std::string content, std::string type) {
    body = std::move(content);
    content_type = std::move(type);
  }
  void set_chunked(std::string type, body_writer w) {
    content_type = std::move(type);
    writer = std::move(w);
  }
};

// Connection figures, updated by the server (for the daemon's metrics).
struct connection_counters {
  std::atomic<int64_t> open{0};
  std::atomic<uint64_t> accepted{0};
  std::atomic<uint64_t> rejected{0};   // over max_connections: answered 503
  std::atomic<uint64_t> timed_out{0};  // a header, body or write deadline passed
};

// Where the front listens and the limits of its connections; also the daemon's [server] keys of the same
// names (http::server_config in net/http/daemon_config.h extends this struct).
struct listen_options {
  std::string host = "127.0.0.1";
  uint16_t port = 0;                    // 0: any free port (the daemon's default is 8080: server_config)
  uint32_t io_threads = 2;              // event-loop threads: every connection's reads and writes
  uint32_t max_connections = 4096;      // open at once; one more is answered 503 and closed
  uint32_t header_timeout_s = 10;       // a request's header must arrive within this
  uint32_t keep_alive_timeout_s = 5;    // an idle keep-alive connection is closed after this
  uint32_t keep_alive_max = 1000;       // requests per connection
  uint32_t read_timeout_s = 30;         // a request's body must arrive within this
  uint32_t write_timeout_s = 30;        // each write of a response must be taken within this
  uint64_t max_body_bytes = 8u << 20;   // largest request body
};

struct options : listen_options {
  uint32_t worker_threads = 8;  // the heavy requests' pool
  uint32_t light_threads = 2;   // everything else
  uint32_t max_header_bytes = 64u << 10;
  connection_counters* counters = nullptr;  // optional
};

struct handlers {
  // Answers a request that has fully arrived (on a worker thread). An exception is answered 500.
  std::function<void(const request&, response&)> handle;
  // The body of an error the front itself answers (400, 408, 413, 431, 503), on an event-loop thread:
  // quick, no blocking. `req` has what arrived of the request (method and path may be empty).
  std::function<std::string(const request& req, int status, const std::string& message)> error;
  // Whether a request goes to the worker_threads pool (unset: all do).
  std::function<bool(const request&)> heavy;
  // After an exchange's last byte was written or the client went away (status 499), with its duration.
  std::function<void(const request&, int status, double seconds)> log;
};

// What the front makes of the bytes a client sent on one connection, without a socket (the same parser,
// limits and conversion as a connection; for the fuzzer and tests): the requests they hold in order, up to
// the first the front would refuse, or the one after which the connection would close.
struct parse_outcome {
  std::vector<request> requests;
  int status = 0;  // the refusal (400, 413, 431) that ended the bytes; 0: none
  std::string message;
  bool complete = true;  // false: the bytes end inside a request
};
parse_outcome parse(std::string_view bytes, const options& opts);

class listener {
 public:
  listener(options opts, handlers h);
  ~listener();
  listener(const listener&) = delete;
  listener& operator=(const listener&) = delete;

  // Listens on host:port; returns the port. Throws troupe::error when it cannot.
  int bind();
  // Runs the event loop on io_threads threads (this one among them) until stop() and the end of every
  // exchange in progress.
  void run();
  // Stops accepting and closes the connections that wait for a request; those answering one close after
  // their response. Safe from any thread, before or during run(), more than once.
  void stop();

  struct impl;  // (front.cpp)

 private:
  std::shared_ptr<impl> impl_;
};

}  // namespace troupe::http::front
