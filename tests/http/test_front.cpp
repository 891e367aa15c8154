// The daemon's event-loop HTTP front (net/http/front.h) against hostile clients, on a real `troupe serve`
// process: a thousand idle and half-sent connections, ten thousand connect-and-close, the connection limit,
// the header and body deadlines and the keep-alive limit. Raw sockets on 127.0.0.1, so that the test decides
// what is sent and when.
//
// Timings are printed as figures (docs/reliability.md), not asserted: a busy machine makes any bound a
// flaky test. What is asserted is that the answers come (a thread-per-connection server would leave /health
// unanswered while 200 connections are held; the event-loop front must not) and that descriptors and threads
// come back.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "net/http/front.h"
#include "tests/http/client_socket.h"
#include "tests/http/daemon_process.h"
#include "tests/http/stories_daemon.h"
#include "tests/test_models.h"

using namespace troupe;
using namespace troupe::test;
using json = nlohmann::json;
using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;

namespace {

using steady = std::chrono::steady_clock;

// Entries of a /proc/<pid>/ folder (fd: open descriptors, task: threads).
size_t proc_count(pid_t pid, const char* what) {
  std::error_code ec;
  size_t n = 0;
  for (auto it = std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/" + what, ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    ++n;
  }
  return n;
}

// Polls until pred() holds (true) or `seconds` passed.
template <class Pred>
bool within(int seconds, Pred pred) {
  const auto until = steady::now() + std::chrono::seconds(seconds);
  while (steady::now() < until) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return pred();
}

// Raises this process's descriptor limit toward `want`; returns the limit now.
rlim_t raise_fd_limit(rlim_t want) {
  rlimit rl{};
  REQUIRE(getrlimit(RLIMIT_NOFILE, &rl) == 0);
  if (rl.rlim_cur < want) {
    rl.rlim_cur = std::min(want, rl.rlim_max);
    setrlimit(RLIMIT_NOFILE, &rl);
    getrlimit(RLIMIT_NOFILE, &rl);
  }
  return rl.rlim_cur;
}

double ms_since(steady::time_point t0) { return std::chrono::duration<double, std::milli>(steady::now() - t0).count(); }

const std::string health_request = "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";

// A connection that has sent `text` (in one write) within half of `deadline_s` of its connect(), as this
// process measured it: a deadline the daemon arms at accept cannot have passed before the text arrived,
// however busy the machine. A try that took longer tests nothing: it is read to its close (the daemon is done
// with it) and made again; `voided` counts the tries the daemon counted as timed out (answered 408, or
// closed with no answer).
std::unique_ptr<client_socket> sent_in_time(int port, const std::string& text, int deadline_s, int& voided) {
  for (int attempt = 0; attempt < 100; ++attempt) {
    const auto t0 = steady::now();
    auto s = std::make_unique<client_socket>(port);
    REQUIRE(s->connected());
    const bool sent = s->send_text(text);
    if (sent && steady::now() - t0 < std::chrono::milliseconds(500 * deadline_s)) return s;
    s->read_to_close();
    if (s->received().empty() || s->received().rfind("HTTP/1.1 408", 0) == 0) ++voided;
  }
  FAIL("100 tries to connect and send within " << 500 * deadline_s << " ms, all too slow");
  return nullptr;
}

// A value of the daemon's /metrics, asked on a connection of its own sent in time (sent_in_time) and closed
// by the daemon after the answer; -1 when absent.
double metric_in_time(int port, const std::string& name, int deadline_s, int& voided) {
  auto s = sent_in_time(port, "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", deadline_s, voided);
  s->read_to_close();
  const std::string& got = s->received();
  const size_t at = got.find("\n" + name + " ");
  if (at == std::string::npos) return -1;
  return std::stod(got.substr(at + name.size() + 2));
}

}  // namespace

TEST_CASE("front: 1,000 idle and half-sent connections starve neither /health nor a completion", "[http][front]") {
  const auto model = test::model_path("stories260K.gguf");
  if (!model) return;
  constexpr size_t held = 1000;
  const rlim_t limit = raise_fd_limit(held + 200);
  if (limit < held + 100) {
    FAIL("this test holds " << held << " connections and may open only " << limit << " descriptors (ulimit -Hn)");
  }
  // Deadlines longer than the test, so that the held connections stay held.
  test::daemon_process d(stories_config(model->string(), "header_timeout_s = 300\nread_timeout_s = 300\n"));
  std::vector<std::unique_ptr<client_socket>> hold;
  for (size_t i = 0; i < held; ++i) {
    auto s = std::make_unique<client_socket>(d.port());
    REQUIRE(s->connected());
    if (i % 2 == 1) {
      // Half a request: a request line and part of a header, never finished.
      REQUIRE(s->send_text(i % 4 == 1 ? "GET /health HTTP/1.1\r\nHo" : "POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 500\r\n\r\n{\"mo"));
    }
    hold.push_back(std::move(s));
  }
  httplib::Client c("127.0.0.1", d.port());
  c.set_connection_timeout(30, 0);
  c.set_read_timeout(60, 0);
  // Every held connection was accepted (the gauge counts them, and the connection asking).
  CHECK(within(30, [&] { return metric(c, "troupe_http_connections") >= static_cast<double>(held + 1); }));

  std::vector<double> health_ms;
  for (int i = 0; i < 20; ++i) {
    client_socket h(d.port());
    REQUIRE(h.connected());
    const auto t0 = steady::now();
    REQUIRE(h.send_text(health_request));
    const std::string r = h.read_response();
    health_ms.push_back(ms_since(t0));
    CHECK_THAT(r, StartsWith("HTTP/1.1 200"));
    CHECK_THAT(r, Contains("\"status\":\"ok\""));
  }
  const auto t0 = steady::now();
  auto r = c.Post("/v1/chat/completions", greedy_chat().dump(), "application/json");
  const double completion_ms = ms_since(t0);
  REQUIRE(r);
  REQUIRE(r->status == 200);
  const json j = json::parse(r->body);
  CHECK(j["choices"][0]["tokens"].get<std::vector<int>>() == reference_tokens);
  CHECK(j["choices"][0]["message"]["content"] == reference_text);
  std::sort(health_ms.begin(), health_ms.end());
  std::printf("front: %zu connections held: /health median %.2f ms, max %.2f ms (20 new connections); a 32-token "
              "completion %.0f ms\n", held, health_ms[health_ms.size() / 2], health_ms.back(), completion_ms);

  // Let go: the daemon's count returns to the one connection asking.
  hold.clear();
  CHECK(within(30, [&] { return metric(c, "troupe_http_connections") == 1; }));
}

TEST_CASE("front: 10,000 connections opened and closed leave no descriptor or thread behind", "[http][front]") {
  const auto model = test::model_path("stories260K.gguf");
  if (!model) return;
  test::daemon_process d(stories_config(model->string()));
  {
    // The pools and the model are up; one exchange on a connection of its own first.
    client_socket warm(d.port());
    REQUIRE(warm.send_text(health_request));
    REQUIRE_THAT(warm.read_response(), StartsWith("HTTP/1.1 200"));
  }
  httplib::Client c("127.0.0.1", d.port());
  REQUIRE(within(30, [&] { return metric(c, "troupe_http_connections") == 1; }));
  // The counts before: the least of a few readings (the asking connection's close is asynchronous).
  size_t fds = SIZE_MAX, threads = SIZE_MAX;
  for (int i = 0; i < 10; ++i) {
    fds = std::min(fds, proc_count(d.pid(), "fd"));
    threads = std::min(threads, proc_count(d.pid(), "task"));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  REQUIRE(fds > 0);
  REQUIRE(threads > 0);

  const auto t0 = steady::now();
  constexpr int n = 10000;
  int connected = 0, answered = 0;
  for (int i = 0; i < n; ++i) {
    client_socket s(d.port());
    connected += s.connected();
    if (i % 10 == 0) {
      // Every tenth asks first and reads its answer; every other one closes at once, a third of those with a
      // reset rather than a FIN (and no TIME_WAIT left on this side).
      answered += s.send_text(health_request) && s.read_response().rfind("HTTP/1.1 200", 0) == 0;
    } else if (i % 3 == 0) {
      s.reset_now();
    }
  }
  const double seconds = ms_since(t0) / 1000;
  CHECK(connected == n);
  CHECK(answered == n / 10);
  // Each connection's end reaches the daemon's loop asynchronously: wait for the gauge, then compare.
  CHECK(within(30, [&] { return metric(c, "troupe_http_connections") <= 1; }));
  CHECK(within(30, [&] { return proc_count(d.pid(), "fd") <= fds; }));
  CHECK(within(30, [&] { return proc_count(d.pid(), "task") <= threads; }));
  CHECK(metric(c, "troupe_http_connections_total") >= n + 2);
  std::printf("front: %d connections opened and closed in %.1f s (%.0f per s); descriptors %zu -> %zu, threads %zu -> %zu\n",
              n, seconds, n / seconds, fds, proc_count(d.pid(), "fd"), threads, proc_count(d.pid(), "task"));
}

TEST_CASE("front: beyond max_connections a connection is answered 503 in the OpenAI error shape", "[http][front]") {
  const auto model = test::model_path("stories260K.gguf");
  if (!model) return;
  test::daemon_process d(stories_config(model->string(), "max_connections = 8\nheader_timeout_s = 300\nkeep_alive_timeout_s = 300\n"));
  // Eight keep-alive connections, each answered once (so each is known to be accepted), then held.
  std::vector<std::unique_ptr<client_socket>> hold;
  for (int i = 0; i < 8; ++i) {
    auto s = std::make_unique<client_socket>(d.port());
    REQUIRE(s->send_text(health_request));
    REQUIRE_THAT(s->read_response(), StartsWith("HTTP/1.1 200"));
    hold.push_back(std::move(s));
  }
  {
    client_socket over(d.port());
    REQUIRE(over.connected());
    over.send_text(health_request);  // may be refused by the close: the answer is what counts
    CHECK(over.read_to_close());
    const std::string& r = over.received();
    CHECK_THAT(r, StartsWith("HTTP/1.1 503"));
    CHECK_THAT(r, Contains("Connection: close"));
    const size_t body = r.find("\r\n\r\n");
    REQUIRE(body != std::string::npos);
    const json e = json::parse(r.substr(body + 4));
    CHECK_THAT(e["error"]["message"].get<std::string>(), Contains("8 connections"));
    CHECK(e["error"].contains("type"));
  }
  // One held connection closes: a new one is served again (once the daemon saw the close).
  hold.pop_back();
  CHECK(within(30, [&] {
    client_socket s(d.port());
    return s.send_text(health_request) && s.read_response().rfind("HTTP/1.1 200", 0) == 0;
  }));
  REQUIRE(hold[0]->send_text("GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"));
  const std::string m = hold[0]->read_response();
  CHECK_THAT(m, Contains("\ntroupe_http_connections_rejected_total "));
  CHECK_THAT(m, !Contains("\ntroupe_http_connections_rejected_total 0\n"));
}

TEST_CASE("front: a header or body that misses its deadline is answered 408, and keep-alive ends at keep_alive_max",
          "[http][front]") {
  const auto model = test::model_path("stories260K.gguf");
  if (!model) return;
  // Each section starts a daemon whose only short deadline is the one it tests; the others are longer than
  // the test, so that no other step of it races a deadline.
  const auto daemon_with = [&](const std::string& deadlines) {
    return std::make_unique<test::daemon_process>(stories_config(model->string(), deadlines));
  };

  SECTION("half a header") {
    auto d = daemon_with("header_timeout_s = 1\nread_timeout_s = 300\nkeep_alive_timeout_s = 300\n");
    int voided = 0;  // connections this test gave up on that the daemon counted as timed out
    auto s = sent_in_time(d->port(), "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n", 1, voided);
    CHECK(s->read_to_close());
    CHECK_THAT(s->received(), StartsWith("HTTP/1.1 408"));
    CHECK_THAT(s->received(), Contains("header_timeout_s"));
    const double timeouts = metric_in_time(d->port(), "troupe_http_timeouts_total", 1, voided);
    CHECK(timeouts == 1 + voided);
  }
  SECTION("a body shorter than its Content-Length") {
    // The header and part of the body in one write: the body's deadline starts once the header is read.
    auto d = daemon_with("header_timeout_s = 300\nread_timeout_s = 1\nkeep_alive_timeout_s = 300\n");
    client_socket s(d->port());
    REQUIRE(s.send_text("POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                        "Content-Length: 100\r\n\r\n{\"model\": \"st"));
    CHECK(s.read_to_close());
    CHECK_THAT(s.received(), StartsWith("HTTP/1.1 408"));
    CHECK_THAT(s.received(), Contains("read_timeout_s"));
    httplib::Client c("127.0.0.1", d->port());
    CHECK(metric(c, "troupe_http_timeouts_total") == 1);
  }
  SECTION("a connection that never sends closes quietly (as a browser's preconnection expects)") {
    auto d = daemon_with("header_timeout_s = 1\nread_timeout_s = 300\nkeep_alive_timeout_s = 300\n");
    client_socket s(d->port());
    CHECK(s.read_to_close());
    CHECK(s.received().empty());
  }
  SECTION("keep-alive: pipelined requests are answered in order; the third request is the last") {
    // Deadlines longer than the test: whenever this process sends, the connection is still open.
    auto d = daemon_with("header_timeout_s = 300\nread_timeout_s = 300\nkeep_alive_timeout_s = 300\nkeep_alive_max = 3\n");
    client_socket s(d->port());
    REQUIRE(s.send_text(health_request));
    const std::string first = s.read_response();
    CHECK_THAT(first, StartsWith("HTTP/1.1 200"));
    CHECK_THAT(first, Contains("Connection: keep-alive"));
    REQUIRE(s.send_text(health_request + health_request));  // two at once (pipelined): answered in order
    CHECK_THAT(s.read_response(), Contains("Connection: keep-alive"));
    const std::string third = s.read_response();
    CHECK_THAT(third, StartsWith("HTTP/1.1 200"));
    CHECK_THAT(third, Contains("Connection: close"));
    CHECK(s.read_to_close());
    CHECK(s.received().empty());
  }
  SECTION("keep-alive: a connection idle between requests closes quietly") {
    auto d = daemon_with("header_timeout_s = 1\nread_timeout_s = 300\nkeep_alive_timeout_s = 1\n");
    int voided = 0;
    auto idle = sent_in_time(d->port(), health_request, 1, voided);
    CHECK_THAT(idle->read_response(), StartsWith("HTTP/1.1 200"));
    CHECK(idle->read_to_close());  // after keep_alive_timeout_s + header_timeout_s, with no 408
    CHECK(idle->received().empty());
  }
}

TEST_CASE("front::parse: pipelined requests, chunked bodies, and each refusal with its status", "[http][front]") {
  http::front::options o;
  o.max_header_bytes = 256;
  o.max_body_bytes = 64;
  using http::front::parse;

  const auto two = parse("GET /health?x=1 HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer k\r\n\r\n"
                         "POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n{\"a\r\n2\r\n\":\r\n0\r\n\r\n",
                         o);
  CHECK(two.status == 0);
  CHECK(two.complete);
  REQUIRE(two.requests.size() == 2);
  CHECK(two.requests[0].method == "GET");
  CHECK(two.requests[0].path == "/health");
  CHECK(two.requests[0].query == "x=1");
  CHECK(two.requests[0].header("authorization") == "Bearer k");
  CHECK(two.requests[1].path == "/v1/completions");
  CHECK(two.requests[1].body == "{\"a\":");

  // Connection: close ends what is read; keep_alive_max too.
  CHECK(parse("GET / HTTP/1.1\r\nConnection: close\r\n\r\nGET / HTTP/1.1\r\n\r\n", o).requests.size() == 1);
  o.keep_alive_max = 2;
  CHECK(parse("GET / HTTP/1.1\r\n\r\nGET / HTTP/1.1\r\n\r\nGET / HTTP/1.1\r\n\r\n", o).requests.size() == 2);

  const auto cut = parse("POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\n12345", o);
  CHECK(cut.requests.empty());
  CHECK_FALSE(cut.complete);
  CHECK_FALSE(parse("GET / HTTP/1.1\r\nHo", o).complete);

  const auto bad = parse("GET / HTTP/1.1\r\nHost a\r\n\r\n", o);
  CHECK(bad.status == 400);
  CHECK_THAT(bad.message, StartsWith("malformed HTTP request"));
  const auto big_body = parse("POST / HTTP/1.1\r\nContent-Length: 65\r\n\r\n", o);
  CHECK(big_body.status == 413);
  CHECK_THAT(big_body.message, Contains("larger than 64 bytes"));
  const auto big_chunks = parse("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n41\r\n" + std::string(65, 'x') + "\r\n0\r\n\r\n", o);
  CHECK(big_chunks.status == 413);
  const auto big_header = parse("GET / HTTP/1.1\r\nX: " + std::string(300, 'y') + "\r\n\r\n", o);
  CHECK(big_header.status == 431);
}

TEST_CASE("front: a writer's head leaves with its first chunk, so a failure before it gets its own status", "[http][front]") {
  // What the writers saw, checked on this thread afterwards (Catch's assertions are not thread-safe, and the
  // writers run on the front's workers).
  std::atomic<bool> refuse_before = false, refuse_started = true, late_started = false, late_refused = true;
  http::front::handlers h;
  h.handle = [&](const http::front::request& req, http::front::response& res) {
    if (req.path == "/refuse") {
      res.set_chunked("text/event-stream", [&](http::front::body_sink& s) {
        refuse_started = s.started();
        refuse_before = true;
        return s.refuse(503, R"({"error":{"message":"down"}})", "application/json");
      });
    } else if (req.path == "/late") {
      res.set_chunked("text/event-stream", [&](http::front::body_sink& s) {
        if (!s.write("data: a\n\n")) return false;
        late_started = s.started();
        late_refused = s.refuse(503, "too late", "text/plain");
        return s.write("data: {\"error\": 1}\n\n") && s.done();
      });
    } else {
      res.set_chunked("text/plain", [](http::front::body_sink&) -> bool { throw std::runtime_error("boom"); });
    }
  };
  h.error = [](const http::front::request&, int status, const std::string& message) {
    return json{{"error", {{"message", message}, {"status", status}}}}.dump();
  };
  http::front::listener srv(http::front::options{}, h);
  const int port = srv.bind();
  std::thread loop([&] { srv.run(); });

  client_socket s(port);
  REQUIRE(s.send_text("GET /refuse HTTP/1.1\r\nHost: a\r\n\r\n"));
  const std::string refused = s.read_response();
  CHECK_THAT(refused, StartsWith("HTTP/1.1 503"));
  CHECK_THAT(refused, Contains("Content-Type: application/json\r\n"));
  CHECK_THAT(refused, Contains("Content-Length: 28\r\n"));
  CHECK_THAT(refused, Contains("Connection: keep-alive"));
  CHECK_THAT(refused, !Contains("chunked"));
  CHECK_THAT(refused, Contains("\r\n\r\n{\"error\":{\"message\":\"down\"}}"));

  // The same connection goes on: a writer that started keeps its 200 and ends its body normally.
  REQUIRE(s.send_text("GET /late HTTP/1.1\r\nHost: a\r\n\r\n"));
  REQUIRE(s.read_until("0\r\n\r\n"));
  CHECK_THAT(s.received(), StartsWith("HTTP/1.1 200"));
  CHECK_THAT(s.received(), Contains("Transfer-Encoding: chunked"));
  CHECK_THAT(s.received(), Contains("data: a\n\n") && Contains("data: {\"error\": 1}\n\n"));

  client_socket t(port);
  REQUIRE(t.send_text("GET /throws HTTP/1.1\r\nHost: a\r\n\r\n"));
  const std::string failed = t.read_response();
  CHECK_THAT(failed, StartsWith("HTTP/1.1 500"));
  CHECK_THAT(failed, Contains("the answer could not be written"));

  srv.stop();
  loop.join();
  CHECK(refuse_before);
  CHECK_FALSE(refuse_started);
  CHECK(late_started);
  CHECK_FALSE(late_refused);
}
