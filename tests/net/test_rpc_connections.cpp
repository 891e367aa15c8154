// Connections that come and go: a client killed mid-upload, a peer that goes away and comes back, many
// clients at once, and busy polling of a lone connection.
#include <catch2/catch.hpp>

#include <poll.h>
#include <unistd.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <atomic>
#include <string>
#include <thread>

#include "backends/rpc/rpc.h"
#include "backends/rpc/rpc_client.h"
#include "tests/net/loopback_fixture.h"
#include "tests/net/test_server.h"

extern char** environ;

using namespace troupe;
using namespace troupe::rpc;
using namespace troupe::rpc::loopback_fixture;
using namespace std::chrono_literals;

TEST_CASE("a client killed in the middle of an upload frees its buffers", "[rpc][loopback]") {
  auto srv = testing::start_server();
  int out[2];
  REQUIRE(::pipe(out) == 0);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  posix_spawn_file_actions_addclose(&fa, out[0]);
  const std::string port = std::to_string(srv->port());
  char* argv[] = {const_cast<char*>(TROUPE_RPC_STALL_CLIENT), const_cast<char*>(port.c_str()), nullptr};
  pid_t pid = 0;
  REQUIRE(posix_spawn(&pid, TROUPE_RPC_STALL_CLIENT, &fa, nullptr, argv, environ) == 0);
  posix_spawn_file_actions_destroy(&fa);
  ::close(out[1]);
  pollfd p{out[0], POLLIN, 0};
  REQUIRE(::poll(&p, 1, 10000) == 1);
  char buf[16] = {};
  REQUIRE(::read(out[0], buf, sizeof buf - 1) > 0);
  ::close(out[0]);
  CHECK(std::string(buf) == "ready\n");
  CHECK(srv->stats().buffers == 1);
  CHECK(srv->stats().buffer_bytes == 64u << 20);
  ::kill(pid, SIGKILL);
  int st = 0;
  ::waitpid(pid, &st, 0);
  CHECK(testing::wait_for([&] { return srv->stats().buffers == 0 && srv->stats().connections == 0; }));
  CHECK(srv->stats().buffer_bytes == 0);
  // And the server still serves.
  client c(local(srv->port()));
  c.connect();
  CHECK(c.devices().size() == 1);
}

TEST_CASE("clients survive a peer that goes away and comes back", "[rpc][loopback]") {
  auto srv = testing::start_server();
  const uint16_t port = srv->port();
  client c(local(port));
  c.connect();
  const remote_buffer b = c.alloc_buffer(0, 1024);
  const uint64_t epoch = c.epoch();
  srv->stop();
  srv.reset();
  std::vector<uint8_t> got(16);
  CHECK_THROWS_AS(c.get_tensor(b, 0, got.data(), 16), backend_error);  // no abort: an error
  CHECK_FALSE(c.connected());
  CHECK_FALSE(c.health_check(500ms));
  CHECK_THROWS_AS(c.devices(), backend_error);  // auto-reconnect fails: nobody listens

  srv = testing::start_server({.port = port});
  CHECK(c.devices().size() == 1);  // reconnected by itself
  CHECK(c.epoch() == epoch + 1);
  CHECK(c.health_check(2000ms));
  CHECK_THROWS_WITH(c.get_tensor(b, 0, got.data(), 16), Catch::Contains("lost"));
  CHECK_NOTHROW(c.free_buffer(b));  // a lost buffer frees nothing
  const remote_buffer b2 = c.alloc_buffer(0, 1024);
  CHECK(b2.epoch == c.epoch());
  c.reconnect();
  CHECK(testing::wait_for([&] { return srv->stats().buffers == 0; }));
}

TEST_CASE("many clients at once, each with its own buffers", "[rpc][loopback]") {
  auto srv = testing::start_server({.io_threads = 2});
  std::vector<std::thread> threads;
  std::atomic<int> good{0};
  for (int i = 0; i < 6; ++i) {
    threads.emplace_back([&, i] {
      try {
        client c(local(srv->port()));
        c.connect();
        const auto bytes = random_bytes(100000, static_cast<uint32_t>(i));
        const remote_buffer b = c.alloc_buffer(0, bytes.size());
        for (int k = 0; k < 20; ++k) {
          c.set_tensor(b, 0, bytes.data(), bytes.size(), false);
          std::vector<uint8_t> got(bytes.size());
          c.get_tensor(b, 0, got.data(), got.size());
          if (got != bytes) return;
        }
        good += 1;
      } catch (const std::exception&) {
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(good == 6);
  CHECK(testing::wait_for([&] { return srv->stats().buffers == 0; }));
}

TEST_CASE("a lone connection is busy polled, connections sharing an io thread are not", "[rpc][loopback]") {
  // Which reads polling answers depends on timing (a request that comes after the window is waited for as
  // usual), so this counts: with polling off nothing is polled; with it on, among 200 back-to-back requests
  // some are; while two connections share the server's one io thread none are (polling one would hold up
  // the other). Every answer is right throughout.
  const auto bytes = random_bytes(4096, 7);
  auto exercise = [&](client& c, remote_buffer b, int n) {
    for (int i = 0; i < n; ++i) {
      c.set_tensor(b, 0, bytes.data(), bytes.size(), false);
      std::vector<uint8_t> got(bytes.size());
      c.get_tensor(b, 0, got.data(), got.size());
      REQUIRE(got == bytes);
    }
  };
  SECTION("off") {
    auto srv = testing::start_server({.io_threads = 1, .busy_poll = 0us});
    client_options o = local(srv->port());
    o.busy_poll = 0us;
    client c(o);
    c.connect();
    exercise(c, c.alloc_buffer(0, bytes.size()), 200);
    CHECK(srv->stats().polled_reads == 0);
    CHECK(c.stats().polled_reads == 0);
  }
  SECTION("on") {
    auto srv = testing::start_server({.io_threads = 1, .busy_poll = 20000us});
    client_options o = local(srv->port());
    o.busy_poll = 20000us;
    client c1(o);
    c1.connect();
    const remote_buffer b1 = c1.alloc_buffer(0, bytes.size());
    exercise(c1, b1, 200);
    CHECK(srv->stats().polled_reads > 0);
    CHECK(c1.stats().polled_reads > 0);
    {
      client c2(o);
      c2.connect();
      REQUIRE(testing::wait_for([&] { return srv->stats().connections == 2; }));
      const remote_buffer b2 = c2.alloc_buffer(0, bytes.size());
      const uint64_t before = srv->stats().polled_reads;
      for (int round = 0; round < 20; ++round) {
        exercise(c1, b1, 5);
        exercise(c2, b2, 5);
      }
      CHECK(srv->stats().polled_reads == before);
    }
    REQUIRE(testing::wait_for([&] { return srv->stats().connections == 1; }));
    const uint64_t before = srv->stats().polled_reads;
    exercise(c1, b1, 200);
    CHECK(srv->stats().polled_reads > before);
  }
}
