// Who may talk to a peer: incompatible versions refused, the key proved both ways, no listening beyond
// loopback without a key, and connections that never say hello closed.
#include <catch2/catch.hpp>

#include "backends/cpu/cpu_backend.h"
#include "backends/rpc/rpc.h"
#include "backends/rpc/rpc_client.h"
#include "tests/net/loopback_fixture.h"
#include "tests/net/raw_socket.h"
#include "tests/net/test_server.h"

using namespace troupe;
using namespace troupe::rpc;
using namespace troupe::rpc::loopback_fixture;
using namespace std::chrono_literals;

TEST_CASE("incompatible versions are refused", "[rpc][version]") {
  const version ours = protocol_version;
  SECTION("a server with a newer minor version") {
    auto srv = testing::start_server({.server_version = {ours.major, static_cast<uint16_t>(ours.minor + 1), 0}});
    client c(local(srv->port()));
    try {
      c.connect();
      FAIL("connected");
    } catch (const remote_error& e) {
      CHECK(e.code() == status::version_mismatch);
      CHECK_THAT(e.what(), Catch::Contains("incompatible") && Catch::Contains("upgrade troupe here"));
    }
    CHECK_FALSE(c.connected());
  }
  SECTION("a peer of the protocol before progress frames and supports_op (1.0.0) is refused, saying so") {
    auto srv = testing::start_server({.server_version = {1, 0, 0}});
    client c(local(srv->port()));
    try {
      c.connect();
      FAIL("connected");
    } catch (const remote_error& e) {
      CHECK(e.code() == status::version_mismatch);
      CHECK_THAT(e.what(), Catch::Contains("127.0.0.1") && Catch::Contains("hello") && Catch::Contains("incompatible") &&
                               Catch::Contains("1.0.0") && Catch::Contains("on the peer"));
    }
    CHECK_FALSE(c.connected());
  }
  SECTION("a client with another major version") {
    auto srv = testing::start_server();
    client_options o = local(srv->port());
    o.client_version = {static_cast<uint16_t>(ours.major + 1), 0, 0};
    client c(o);
    CHECK_THROWS_AS(c.connect(), remote_error);
    o.client_version = {ours.major, static_cast<uint16_t>(ours.minor + 4), 2};  // a newer minor client, an older server
    client ok(o);
    CHECK_NOTHROW(ok.connect());
  }
  SECTION("commands before hello close the connection") {
    auto srv = testing::start_server();
    testing::raw_conn rc(srv->port());
    REQUIRE(rc.read_frame());  // greeting
    const auto r = rc.call(testing::alloc(0, 64));
    REQUIRE(r);
    CHECK(static_cast<status>(r->code) == status::protocol);
    CHECK(rc.closed_by_peer());
  }
}

TEST_CASE("a peer with a key accepts only clients that know it, and proves it knows it too", "[rpc][auth]") {
  const std::string key = "correct horse battery staple";
  auto srv = testing::start_server({.key = key});
  client none(local(srv->port()));
  try {
    none.connect();
    FAIL("connected without a key");
  } catch (const remote_error& e) {
    CHECK(e.code() == status::auth_failed);
  }
  client wrong(local(srv->port(), "correct horse battery stapler"));
  CHECK_THROWS_AS(wrong.connect(), remote_error);
  client right(local(srv->port(), key));
  REQUIRE_NOTHROW(right.connect());
  CHECK(right.devices().size() == 1);
  // A client that has a key refuses a peer that cannot prove it has it.
  auto open = testing::start_server();
  client c(local(open->port(), key));
  CHECK_THROWS_WITH(c.connect(), Catch::Contains("did not prove"));
  // Raw: a replayed proof for another nonce fails.
  testing::raw_conn rc(srv->port());
  REQUIRE(rc.read_frame());
  CHECK(rc.call(testing::hello(nonce{}, key))->code == static_cast<uint8_t>(status::auth_failed));
  CHECK(rc.closed_by_peer());
  CHECK(testing::wait_for([&] { return srv->stats().connections == 1; }));  // only `right`
}

TEST_CASE("binding anything but loopback without a key is refused", "[rpc][auth]") {
  CHECK(is_loopback_host("127.0.0.1"));
  CHECK(is_loopback_host("localhost"));
  CHECK_FALSE(is_loopback_host("0.0.0.0"));
  // A documentation address (never this machine's): refused before any socket is opened.
  CHECK_THROWS_WITH(peer_server({.host = "192.0.2.1", .devices = {&cpu::cpu_device()}}),
                    Catch::Contains("not a loopback address"));
}

TEST_CASE("a connection that never says hello is closed", "[rpc][auth]") {
  auto srv = testing::start_server({.hello_timeout = 200ms});
  testing::raw_conn rc(srv->port());
  REQUIRE(rc.read_frame());
  CHECK(testing::wait_for([&] { return srv->stats().connections == 0; }));
  CHECK(rc.closed_by_peer());
}
