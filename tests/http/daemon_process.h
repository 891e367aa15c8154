// A real `troupe serve` process for the daemon's integration tests: writes the configuration to a
// temporary file, starts the daemon on port 0 (any free port on 127.0.0.1), collects its stderr on a
// thread, and waits until it prints the address and "ready". The destructor sends SIGTERM, then SIGKILL
// if it is still running after 30 s.
#pragma once

#include <catch2/catch.hpp>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <regex>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

extern char** environ;

namespace troupe::test {

// Starts args[0] with args, its file descriptors `fds` (stdout, stderr or both) going into one pipe;
// returns the process id and the pipe's read end. `env`: the environment's entries whose names are listed
// are dropped ("NAME") or replaced ("NAME=VALUE"); the rest are inherited.
inline std::pair<pid_t, int> spawn_piped(std::vector<std::string> args, std::vector<int> fds,
                                         const std::vector<std::string>& env = {}) {
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_text;
  const auto name_of = [](std::string_view e) { return e.substr(0, e.find('=')); };
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view v(*e);
    if (std::none_of(env.begin(), env.end(), [&](const std::string& x) { return name_of(x) == name_of(v); })) env_text.emplace_back(v);
  }
  for (const std::string& x : env) {
    if (x.find('=') != std::string::npos) env_text.push_back(x);
  }
  std::vector<char*> envp;
  for (std::string& e : env_text) envp.push_back(e.data());
  envp.push_back(nullptr);
  int p[2];
  REQUIRE(pipe(p) == 0);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  for (int fd : fds) posix_spawn_file_actions_adddup2(&fa, p[1], fd);
  posix_spawn_file_actions_addclose(&fa, p[0]);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  close(p[1]);
  REQUIRE(rc == 0);
  return {pid, p[0]};
}

inline std::pair<pid_t, int> spawn_piped(std::vector<std::string> args, int fd) {
  return spawn_piped(std::move(args), std::vector<int>{fd});
}

// Runs args[0] with args to its end: (exit status as waitpid gives it, its stdout).
inline std::pair<int, std::string> run_captured(std::vector<std::string> args) {
  auto [pid, out] = spawn_piped(std::move(args), STDOUT_FILENO);
  std::string text;
  char buf[4096];
  for (ssize_t n; (n = read(out, buf, sizeof buf)) > 0;) text.append(buf, static_cast<size_t>(n));
  close(out);
  int st = 0;
  REQUIRE(waitpid(pid, &st, 0) == pid);
  return {st, text};
}

class daemon_process {
 public:
  // Starts `troupe serve --config <file with config_text> extra_args...`. Waits for "ready" when asked.
  explicit daemon_process(const std::string& config_text, std::vector<std::string> extra_args = {}, bool wait_ready = true) {
    static int counter = 0;
    dir_ = std::filesystem::temp_directory_path() /
           ("troupe-daemon-test-" + std::to_string(getpid()) + "-" + std::to_string(counter++));
    std::filesystem::create_directories(dir_);
    config_ = dir_ / "daemon.toml";
    std::ofstream(config_) << config_text;
    std::vector<std::string> args = {TROUPE_BIN, "serve", "--config", config_.string()};
    args.insert(args.end(), extra_args.begin(), extra_args.end());
    int err = -1;
    std::tie(pid_, err) = spawn_piped(std::move(args), STDERR_FILENO);
    reader_ = std::thread([this, fd = err] {
      char buf[4096];
      std::string partial;
      for (;;) {
        const ssize_t n = read(fd, buf, sizeof buf);
        if (n <= 0) break;
        std::lock_guard l(m_);
        log_.append(buf, static_cast<size_t>(n));
        cv_.notify_all();
      }
      close(fd);
      std::lock_guard l(m_);
      eof_ = true;
      cv_.notify_all();
    });
    if (wait_ready) {
      REQUIRE(wait_for_log("info  ready", std::chrono::seconds(120)));
      std::smatch mt;
      const std::string text = log();
      REQUIRE(std::regex_search(text, mt, std::regex("listening on http://127\\.0\\.0\\.1:([0-9]+)")));
      port_ = std::stoi(mt[1]);
    }
  }
  ~daemon_process() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      if (wait_exit(std::chrono::seconds(30)) == -2) {
        kill(pid_, SIGKILL);
        waitpid(pid_, nullptr, 0);
      }
    }
    if (reader_.joinable()) reader_.join();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  daemon_process(const daemon_process&) = delete;
  daemon_process& operator=(const daemon_process&) = delete;

  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  const std::filesystem::path& dir() const { return dir_; }
  std::string log() {
    std::lock_guard l(m_);
    return log_;
  }
  // Whether stderr showed `text` within the time.
  bool wait_for_log(const std::string& text, std::chrono::milliseconds within) {
    std::unique_lock l(m_);
    return cv_.wait_for(l, within, [&] { return log_.find(text) != std::string::npos || eof_; }) &&
           log_.find(text) != std::string::npos;
  }
  void signal(int sig) { kill(pid_, sig); }
  // The exit code (-1: killed by a signal), or -2 if still running after the time.
  int wait_exit(std::chrono::milliseconds within) {
    const auto until = std::chrono::steady_clock::now() + within;
    while (std::chrono::steady_clock::now() < until) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        if (reader_.joinable()) reader_.join();
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return -2;
  }

 private:
  std::filesystem::path dir_, config_;
  pid_t pid_ = -1;
  int port_ = -1;
  std::thread reader_;
  std::mutex m_;
  std::condition_variable cv_;
  std::string log_;
  bool eof_ = false;
};

}  // namespace troupe::test
