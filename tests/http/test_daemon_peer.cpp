// The daemon and `troupe bench` with layers on a remote `troupe peer` process: a configured peer that holds a
// model's layers, dies and comes back; bench --rpc's round trips; and the peer's debug lines
// (TROUPE_RPC_DEBUG, GGML_RPC_DEBUG).
#include <catch2/catch.hpp>

#include <httplib.h>
#include <nlohmann/json.hpp>
#include <poll.h>

#include <condition_variable>
#include <mutex>
#include <optional>
#include <regex>
#include <thread>

#include "tests/http/daemon_fixture.h"
#include "tests/http/daemon_process.h"
#include "tests/http/stories_daemon.h"
#include "tests/test_models.h"

using namespace troupe;
using namespace troupe::test;
using json = nlohmann::json;
using Catch::Matchers::Contains;

// `troupe peer --port P` on 127.0.0.1 (0: any free port): its address from the first line it prints;
// SIGTERMed at the end (or SIGKILLed by kill()).
class peer_server {
 public:
  explicit peer_server(int port = 0) {
    int out = -1;
    std::tie(pid_, out) = test::spawn_piped({TROUPE_BIN, "peer", "--port", std::to_string(port), "-t", "1", "--device", "cpu"}, STDOUT_FILENO);
    std::string line;
    char ch = 0;
    pollfd pfd{out, POLLIN, 0};
    while (line.find('\n') == std::string::npos && poll(&pfd, 1, 30000) > 0 && read(out, &ch, 1) == 1) line += ch;
    close(out);
    std::smatch m;
    REQUIRE(std::regex_search(line, m, std::regex("listening on (127\\.0\\.0\\.1:[0-9]+)")));
    address_ = m[1];
  }
  ~peer_server() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    waitpid(pid_, nullptr, 0);
  }
  void kill() {
    ::kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  const std::string& address() const { return address_; }
  int port() const { return std::stoi(address_.substr(address_.rfind(':') + 1)); }

 private:
  pid_t pid_ = -1;
  std::string address_;
};

TEST_CASE("daemon: a configured remote peer holds the model's layers, dies and comes back", "[http][daemon][peer]") {
  const auto model = test::model_path("stories260K.gguf");
  if (!model) return;
  peer_server peer;
  // Every layer (and the output) on the peer's CPU device; the answer is still the reference.
  test::daemon_process d("[server]\nport = 0\n[[peer]]\nname = \"box\"\naddress = \"" + peer.address() +
                         "\"\n[[model]]\nname = \"stories\"\npath = \"" + model->string() +
                         "\"\nchat_template = \"raw\"\nthreads = 1\nn_ctx = 512\nn_seq_max = 2\n"
                         "devices = [{ device = \"RPC[" + peer.address() + "]#0\", layers = 5 }]\n");
  CHECK_THAT(d.log(), Contains("peer box (" + peer.address() + ") is up with 1 device(s)"));
  httplib::Client c("127.0.0.1", d.port());
  c.set_read_timeout(60, 0);
  auto r = c.Post("/v1/chat/completions", greedy_chat().dump(), "application/json");
  REQUIRE(r);
  REQUIRE(r->status == 200);
  CHECK(json::parse(r->body)["choices"][0]["tokens"].get<std::vector<int>>() == reference_tokens);
  // The weights are the peer's memory, not this host's.
  auto mem = c.Get("/metrics");
  REQUIRE(mem);
  CHECK_THAT(mem->body, Contains("troupe_memory_bytes{buft=\"RPC[" + peer.address() + "]#0\""));

  // A second session: a streamed answer holds the first one while another request comes.
  {
    json slow = greedy_chat(200);
    slow["stream"] = true;
    raw_request held(d.port(), "/v1/chat/completions", slow.dump());
    REQUIRE(held.read_until("data: "));
    r = c.Post("/v1/chat/completions", greedy_chat().dump(), "application/json");
    REQUIRE(r);
    REQUIRE(r->status == 200);
  }

  // The peer dies: the daemon keeps serving, says the model is down, and answers its requests with an
  // error naming the peer.
  const int port = peer.port();
  peer.kill();
  auto ready = [&] {
    auto h = c.Get("/health");
    return h && json::parse(h->body)["models"][0]["ready"].get<bool>();
  };
  REQUIRE(eventually([&] { return !ready(); }));
  auto h = c.Get("/health");
  REQUIRE(h);
  CHECK(h->status == 503);
  CHECK(json::parse(h->body)["status"] == "unavailable");
  CHECK(metric(c, "troupe_model_ready{model=\"stories\"}") == 0);
  r = c.Post("/v1/chat/completions", greedy_chat().dump(), "application/json");
  REQUIRE(r);
  CHECK_THAT(r->body, Contains("error") && Contains(peer.address()));

  // It comes back on the same port: the model is loaded onto it again by itself, and the next request is
  // answered right (on a new session: the old ones went with the old weights).
  peer_server again(port);
  REQUIRE(again.address() == peer.address());
  REQUIRE(eventually(ready));
  r = c.Post("/v1/chat/completions", greedy_chat().dump(), "application/json");
  REQUIRE(r);
  REQUIRE(r->status == 200);
  CHECK(json::parse(r->body)["choices"][0]["tokens"].get<std::vector<int>>() == reference_tokens);
  CHECK_THAT(d.log(), Contains("model stories is loaded again"));
  // The idle session of before had ended with the old weights: the request went to a new one.
  CHECK_THAT(d.log(), Contains("retrying on a new session"));
  d.signal(SIGTERM);
  CHECK(d.wait_exit(std::chrono::seconds(30)) == 0);
  CHECK_THAT(d.log(), Contains("stopped: 0 bytes still held"));
}

TEST_CASE("troupe bench --rpc: generation with every layer on a troupe peer", "[http][peer][bench]") {
  const auto model = test::model_path("stories260K.gguf");
  if (!model) return;
  peer_server peer;
  const auto [st, text] = test::run_captured({TROUPE_BIN, "bench", "-m", model->string(), "-p", "0", "-n", "16", "-r", "2",
                                              "-t", "1", "-o", "json", "--rpc", peer.address()});
  INFO(text);
  REQUIRE(WIFEXITED(st));
  REQUIRE(WEXITSTATUS(st) == 0);
  const json j = json::parse(text);
  REQUIRE(j.size() == 1);
  CHECK(j[0]["backend"] == "RPC");
  CHECK(j[0]["test"] == "tg16");
  CHECK(j[0]["avg_ts"].get<double>() > 0);
  // One round trip per token: inputs travel with the graph, the logits with the reply.
  CHECK(j[0]["round_trips_per_token"].get<double>() == 1.0);
  CHECK(j[0]["graphs_sent_per_token"].get<double>() < 0.5);
}

namespace {

// `troupe peer --port 0 -t 1` with `env` (NAME=VALUE) in its environment (TROUPE_RPC_DEBUG, GGML_RPC_DEBUG
// and TROUPE_LOG_LEVEL taken out of the rest), its stdout and stderr read into one text.
class logged_peer {
 public:
  explicit logged_peer(const std::string& env) {
    int out = -1;
    std::tie(pid_, out) = test::spawn_piped({TROUPE_BIN, "peer", "--port", "0", "-t", "1", "--device", "cpu"},
                                            {STDOUT_FILENO, STDERR_FILENO}, {"TROUPE_RPC_DEBUG", "GGML_RPC_DEBUG", "TROUPE_LOG_LEVEL", env});
    reader_ = std::thread([this, fd = out] {
      char buf[4096];
      for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;) {
        std::lock_guard l(mu_);
        out_.append(buf, static_cast<size_t>(n));
        cv_.notify_all();
      }
      close(fd);
    });
    address_ = match(std::regex("listening on (127\\.0\\.0\\.1:[0-9]+)"), 1).value_or("");
  }
  ~logged_peer() {
    ::kill(pid_, SIGTERM);
    waitpid(pid_, nullptr, 0);
    reader_.join();
  }
  // Waits (at most a minute) until the output matches re; returns the match's group `group`, copied while
  // the lock is held (the reader thread grows the text, which moves it: a match kept past the lock would
  // point into freed memory, as ThreadSanitizer found), or nothing.
  std::optional<std::string> match(const std::regex& re, size_t group = 0) {
    std::unique_lock l(mu_);
    std::optional<std::string> got;
    cv_.wait_for(l, std::chrono::seconds(60), [&] {
      std::smatch m;
      if (!std::regex_search(out_, m, re)) return false;
      got = m[group].str();
      return true;
    });
    return got;
  }
  bool wait_for(const std::regex& re) { return match(re).has_value(); }
  std::string text() {
    std::lock_guard l(mu_);
    return out_;
  }
  const std::string& address() const { return address_; }

 private:
  pid_t pid_ = -1;
  std::mutex mu_;
  std::condition_variable cv_;
  std::string out_;
  std::string address_;
  std::thread reader_;
};

size_t count_matches(const std::string& text, const std::regex& re) {
  return static_cast<size_t>(std::distance(std::sregex_iterator(text.begin(), text.end(), re), std::sregex_iterator()));
}

}  // namespace

TEST_CASE("TROUPE_RPC_DEBUG=1 troupe peer serving troupe bench --rpc on SmolLM2: a debug line for every request it received, streamed uploads included", "[http][peer][bench][debug]") {
  const auto model = test::smollm2_path();
  if (!model) return;
  logged_peer peer("TROUPE_RPC_DEBUG=1");
  REQUIRE_FALSE(peer.address().empty());
  const auto [st, text] = test::run_captured({TROUPE_BIN, "bench", "-m", model->string(), "-p", "32", "-n", "4", "-r", "1",
                                              "-t", "1", "-o", "json", "--rpc", peer.address()});
  INFO(text);
  REQUIRE(WIFEXITED(st));
  REQUIRE(WEXITSTATUS(st) == 0);
  const json j = json::parse(text);
  REQUIRE(j.size() == 2);
  const uint64_t requests = j[1]["rpc_requests"].get<uint64_t>();
  // The bench's connection has closed: the peer's session logged it after its last command.
  CHECK(peer.wait_for(std::regex("\\[debug\\] rpc 127\\.0\\.0\\.1:[0-9]+: closed; freeing")));
  const std::string log = peer.text();
  const std::regex line("\\[debug\\] rpc 127\\.0\\.0\\.1:[0-9]+: (hello|device_count|alloc_buffer|get_alignment|get_max_size|"
                        "buffer_get_base|free_buffer|buffer_clear|set_tensor|set_tensor_hash|get_tensor|copy_tensor|graph_compute|"
                        "graph_recompute|get_device_memory|init_tensor|get_alloc_size) ");
  INFO(log.substr(0, 20000));
  CHECK(requests > 100);
  CHECK(count_matches(log, line) == requests);
  CHECK(count_matches(log, std::regex("set_tensor handle [0-9]+, offset [0-9]+, size [0-9]+ \\(streamed\\)")) > 0);  // weights over 1 MiB
  CHECK(log.find("graph_compute device 0, ") != std::string::npos);
}

TEST_CASE("GGML_RPC_DEBUG, llama.cpp's name, switches the peer's debug lines on too", "[http][peer][debug]") {
  const auto model = test::model_path("stories260K.gguf");
  if (!model) return;
  for (const std::string value : {"1", "0"}) {
    INFO("GGML_RPC_DEBUG=" << value);
    logged_peer peer("GGML_RPC_DEBUG=" + value);
    REQUIRE_FALSE(peer.address().empty());
    const auto [st, text] = test::run_captured({TROUPE_BIN, "bench", "-m", model->string(), "-p", "0", "-n", "2", "-r", "1",
                                                "-t", "1", "-o", "json", "--rpc", peer.address()});
    REQUIRE(WIFEXITED(st));
    REQUIRE(WEXITSTATUS(st) == 0);
    if (value == "1") {
      CHECK(peer.wait_for(std::regex("\\[debug\\] rpc 127\\.0\\.0\\.1:[0-9]+: hello client [0-9.]+ -> ok")));
      CHECK(peer.wait_for(std::regex("\\[debug\\] rpc 127\\.0\\.0\\.1:[0-9]+: device_count -> 1 devices")));
    } else {
      CHECK(peer.text().find("[debug]") == std::string::npos);
    }
  }
}
