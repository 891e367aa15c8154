// The op conformance suite on a remote device: a peer server on loopback in this process serving the CPU,
// registered with add_peer, every case of the table against the CPU reference path.
#include <catch2/catch.hpp>

#include "backends/cpu/cpu_backend.h"
#include "backends/rpc/rpc.h"
#include "tests/backends/conformance_runner.h"
#include "tests/net/test_server.h"

using namespace troupe;
using namespace troupe::testing;

TEST_CASE("every op on a loopback peer matches the CPU reference", "[rpc][conformance]") {
  auto srv = rpc::testing::start_server();
  const auto devs = rpc::add_peer("127.0.0.1:" + std::to_string(srv->port()));
  REQUIRE(devs.size() == 1);
  device_i& dev = *devs[0];
  auto be = dev.init_backend();
  auto reference = cpu::make_cpu_backend({.reference = true});
  const auto cases = conformance_cases();
  size_t compared = 0, attention = 0;
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    const op_case& c = cases[ci];
    INFO("case: " << c.name);
    const auto ref = run_case(c, ci, *reference, nullptr);
    REQUIRE(ref.has_value());
    // The peer runs the CPU backend, which must support every case, flash_attn included (protocol 2.1: a
    // peer's CPU keeps the CPU's KV layout and attention).
    attention += c.name.rfind("flash_attn", 0) == 0 ? 1 : 0;
    if (check_case(c, ci, *ref, *be, std::string(dev.name()), true)) ++compared;
  }
  CHECK(attention >= 13);
  CHECK(compared == cases.size());
  const auto s = rpc::client_of(dev)->stats();
  INFO(s.graphs_sent << " graphs sent, " << s.round_trips << " round trips, " << s.bytes_sent << " bytes sent");
  CHECK(s.graphs_sent >= cases.size());
  CHECK(srv->stats().error_replies == 0);
}
