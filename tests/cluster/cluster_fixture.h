// Helpers the cluster tests share (test_cluster, test_cluster_placement, test_cluster_tls): `troupe node`
// processes, the coordinator's port and /v1/cluster views from a daemon's log and HTTP port, bounded waits,
// and completions asked of a daemon whose model is placed over the cluster.
#pragma once

#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <httplib.h>

#include <chrono>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "tests/http/daemon_process.h"

namespace troupe::test::cluster_fixture {

using namespace std::chrono_literals;
using nlohmann::json;

// A `troupe node` process, its stdout collected on a thread; SIGKILLed by the destructor if still running.
class node_process {
 public:
  explicit node_process(std::vector<std::string> args) {
    args.insert(args.begin(), {TROUPE_BIN, "node"});
    int out = -1;
    std::tie(pid_, out) = test::spawn_piped(std::move(args), STDOUT_FILENO);
    reader_ = std::thread([this, out] {
      char buf[1024];
      for (;;) {
        const ssize_t n = read(out, buf, sizeof buf);
        if (n <= 0) break;
        std::lock_guard l(m_);
        text_.append(buf, static_cast<size_t>(n));
      }
      close(out);
    });
  }
  ~node_process() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (reader_.joinable()) reader_.join();
  }
  void signal(int sig) { kill(pid_, sig); }
  void kill9() {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  // The exit status, or -2 when still running after `within`.
  int wait_exit(std::chrono::milliseconds within) {
    const auto until = std::chrono::steady_clock::now() + within;
    while (std::chrono::steady_clock::now() < until) {
      int st = 0;
      if (waitpid(pid_, &st, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
      }
      std::this_thread::sleep_for(20ms);
    }
    return -2;
  }
  std::string output() {
    std::lock_guard l(m_);
    return text_;
  }

 private:
  pid_t pid_ = -1;
  std::thread reader_;
  std::mutex m_;
  std::string text_;
};

inline uint16_t coordinator_port(test::daemon_process& d) {
  std::smatch m;
  const std::string log = d.log();
  REQUIRE(std::regex_search(log, m, std::regex("cluster coordinator on 127\\.0\\.0\\.1:([0-9]+)")));
  return static_cast<uint16_t>(std::stoi(m[1]));
}

inline json cluster_at(int port) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(10, 0);
  auto r = c.Get("/v1/cluster");
  REQUIRE(r);
  REQUIRE(r->status == 200);
  return json::parse(r->body);
}

// The node named `name` in /v1/cluster (null when absent).
inline json node_named(const json& cl, const std::string& name) {
  for (const json& n : cl["nodes"]) {
    if (n["name"] == name) return n;
  }
  return nullptr;
}

inline bool is_up(const json& cl, const std::string& name, uint64_t epoch = 0) {
  const json n = node_named(cl, name);
  return !n.is_null() && n["state"] == "up" && (epoch == 0 || n["epoch"] == epoch);
}

inline std::vector<std::string> node_args(uint16_t coord, const std::string& name, std::vector<std::string> extra = {}) {
  std::vector<std::string> a = {"--join", "127.0.0.1:" + std::to_string(coord), "--name", name, "--device", "cpu", "-t", "1"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

inline bool wait_until(const std::function<bool()>& pred, std::chrono::seconds within = 20s) {
  const auto until = std::chrono::steady_clock::now() + within;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > until) return pred();
    std::this_thread::sleep_for(20ms);
  }
  return true;
}

struct answer {
  int status = 0;
  std::string text;  // the completion's text, or the error's message
};

inline answer complete(int port, const std::string& model) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(30, 0);
  const json body = {{"model", model}, {"prompt", "Once upon a time"}, {"max_tokens", 16}, {"temperature", 0}};
  auto r = c.Post("/v1/completions", body.dump(), "application/json");
  if (!r) return {-1, "no answer"};
  answer a{r->status, r->body};
  try {
    const json j = json::parse(r->body);
    if (j.contains("choices")) a.text = j["choices"][0]["text"];
    if (j.contains("error")) {
      a.text = j["error"]["message"];
      if (a.status == 200) a.status = 500;  // an answer that failed after its headers went out
    }
  } catch (const json::exception&) {
  }
  return a;
}

// A coordinating daemon with a model "stories" placed over the cluster and the same model "local" on its own
// CPU (the reference answer), with `cluster_extra` and `model_extra` lines in their tables.
inline std::string placement_config(const std::string& m, const std::string& cluster_extra, const std::string& model_extra) {
  return "[server]\nport = 0\n[cluster]\nport = 0\nheartbeat_ms = 100\ncoordinator_devices = false\n" + cluster_extra +
         "[[model]]\nname = \"stories\"\npath = \"" + m + "\"\nn_ctx = 256\nchat_template = \"raw\"\nplacement = \"cluster\"\n" +
         model_extra + "[[model]]\nname = \"local\"\npath = \"" + m + "\"\nn_ctx = 256\nchat_template = \"raw\"\n";
}

// Its HTTP port, once it is ready.
inline int http_port_when_ready(test::daemon_process& d) {
  REQUIRE(d.wait_for_log("info  ready", 60s));
  std::smatch mt;
  const std::string log = d.log();
  REQUIRE(std::regex_search(log, mt, std::regex("listening on http://127\\.0\\.0\\.1:([0-9]+)")));
  return std::stoi(mt[1]);
}

}  // namespace troupe::test::cluster_fixture
