// `troupe peer` (TROUPE_PEER_BIN) as a child process on an ephemeral port of 127.0.0.1, for tests over a real
// peer: its address is read from the first line it prints; with the object it is continued (if stopped),
// terminated and reaped.
#pragma once

#include <catch2/catch.hpp>

#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <string>
#include <vector>

extern char** environ;

namespace troupe::test {

class peer_process {
 public:
  explicit peer_process(std::vector<std::string> extra = {}, const std::string& device = "cpu") {
    int out[2];
    REQUIRE(::pipe(out) == 0);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    posix_spawn_file_actions_addclose(&fa, out[0]);
    std::vector<std::string> args = {TROUPE_PEER_BIN, "peer", "--host", "127.0.0.1", "--port", "0", "--threads", "2", "--device", device};
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    REQUIRE(posix_spawn(&pid_, TROUPE_PEER_BIN, &fa, nullptr, argv.data(), environ) == 0);
    posix_spawn_file_actions_destroy(&fa);
    ::close(out[1]);
    std::string line;  // "troupe peer: listening on 127.0.0.1:PORT (...)"
    pollfd p{out[0], POLLIN, 0};
    while (line.find('\n') == std::string::npos && ::poll(&p, 1, 20000) == 1) {
      char buf[256];
      const ssize_t n = ::read(out[0], buf, sizeof buf);
      if (n <= 0) break;
      line.append(buf, static_cast<size_t>(n));
    }
    out_ = out[0];
    const auto at = line.rfind("127.0.0.1:");
    REQUIRE(at != std::string::npos);
    port_ = static_cast<uint16_t>(std::stoi(line.substr(at + 10)));
  }
  peer_process(const peer_process&) = delete;
  peer_process& operator=(const peer_process&) = delete;
  ~peer_process() {
    if (pid_ > 0) stop();
    if (out_ >= 0) ::close(out_);
  }

  // SIGCONT (a stopped peer cannot act on SIGTERM), SIGTERM, then reaps it; returns the wait status.
  int stop() {
    ::kill(pid_, SIGCONT);
    ::kill(pid_, SIGTERM);
    int st = 0;
    ::waitpid(pid_, &st, 0);
    pid_ = -1;
    return st;
  }
  void stop_signal() { REQUIRE(::kill(pid_, SIGSTOP) == 0); }
  void cont_signal() { REQUIRE(::kill(pid_, SIGCONT) == 0); }
  uint16_t port() const { return port_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  pid_t pid_ = -1;
  int out_ = -1;
  uint16_t port_ = 0;
};

}  // namespace troupe::test
