// Graphs queued on a remote device without waiting: replies in order, writes after a submission, a failing
// graph and a lost connection; waits that time out, are woken, and find their reply later.
#include <catch2/catch.hpp>

#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <thread>

#include "backends/cpu/cpu_backend.h"
#include "backends/rpc/rpc.h"
#include "backends/rpc/rpc_client.h"
#include "backends/rpc/rpc_device.h"
#include "runtime/ops.h"
#include "tests/net/loopback_fixture.h"
#include "tests/net/test_server.h"
#include "tests/support/failing_backend.h"

using namespace troupe;
using namespace troupe::rpc;
using namespace troupe::rpc::loopback_fixture;
using namespace std::chrono_literals;

namespace {

// y = factor * a over 256 floats on dev, in a buffer of their own, y flagged as an output (its bytes come back
// with the graph's reply).
struct scaled {
  context ctx{context_params{.max_tensors = 4, .no_alloc = true}};
  tensor* a = ctx.new_tensor_1d(type::f32, 256);
  tensor* y;
  graph g;
  buffer_ptr buf;
  scaled(device_i& dev, float factor) : y(scale(ctx, a, factor)) {
    y->flags |= flag_output;
    g.build_forward_expand(y);
    buf = alloc_ctx_tensors(ctx, dev.buffer_type());
  }
};

}  // namespace

TEST_CASE("graphs submitted without waiting: replies in order, a write after a submission wins over its late reply, a failure fails its own graph", "[rpc][loopback][queue]") {
  std::atomic<int> graphs{0}, fail_at{-1};
  peer_server_options so;
  so.make_backend = [&](device_i&) -> backend_ptr { return std::make_unique<test::failing_backend>(graphs, fail_at); };
  auto srv = testing::start_server(std::move(so));
  const auto devs = add_peer("127.0.0.1:" + std::to_string(srv->port()));
  REQUIRE(devs.size() == 1);
  device_i& remote = *devs[0];
  auto cl = client_of(remote);
  auto rbe = remote.init_backend();
  REQUIRE(rbe->queues_graphs());
  // Two graphs on buffers of their own, as a pipeline's slots: y = 2 a, y2 = 3 a2, both outputs.
  scaled one(remote, 2.0f), two(remote, 3.0f);
  tensor *a = one.a, *y = one.y, *a2 = two.a, *y2 = two.y;
  graph &g = one.g, &g2 = two.g;
  const auto in0 = random_floats(256, 400), in1 = random_floats(256, 401);
  std::vector<float> out0(256), out1(256);
  auto check_outputs = [&] {
    tensor_get(*y, out0.data(), 0, nbytes(*y));
    tensor_get(*y2, out1.data(), 0, nbytes(*y2));
    for (size_t i = 0; i < 256; ++i) {
      REQUIRE(out0[i] == 2.0f * in0[i]);
      REQUIRE(out1[i] == 3.0f * in1[i]);
    }
  };

  SECTION("both go out before either reply is read; their outputs come with the replies") {
    cl->reset_stats();
    tensor_set(*a, in0.data(), 0, nbytes(*a));
    rbe->graph_submit(g);
    tensor_set(*a2, in1.data(), 0, nbytes(*a2));
    rbe->graph_submit(g2);
    client_stats s = cl->stats();
    CHECK(s.graphs_sent == 2);
    CHECK(s.round_trips == 0);  // nothing waited for yet
    CHECK(s.requests == 4);
    CHECK(rbe->finish_oldest(10s));
    CHECK(rbe->finish_oldest(10s));
    CHECK(rbe->finish_oldest(0us));  // none left
    check_outputs();
    s = cl->stats();
    CHECK(s.round_trips == 2);  // the two replies, nothing more
    CHECK(s.outputs_served == 2);
  }

  SECTION("a write after a submission wins over the copy in that graph's late reply") {
    tensor_set(*a, in0.data(), 0, nbytes(*a));
    rbe->graph_submit(g);
    const std::vector<float> zeros(16, 0.0f);
    tensor_set(*y, zeros.data(), 64, nbytes(*y) / 16);  // y[16..31] = 0, on the wire after the graph
    REQUIRE(rbe->finish_oldest(10s));
    tensor_get(*y, out0.data(), 0, nbytes(*y));
    for (size_t i = 0; i < 256; ++i) REQUIRE(out0[i] == (i >= 16 && i < 32 ? 0.0f : 2.0f * in0[i]));
  }

  SECTION("a request that needs its own reply reads the queued replies first") {
    tensor_set(*a, in0.data(), 0, nbytes(*a));
    rbe->graph_submit(g);
    std::vector<float> back(256);
    tensor_get(*a, back.data(), 0, nbytes(*a));  // not an output: a round trip, after the graph's reply
    CHECK(back == in0);
    const uint64_t trips = cl->stats().round_trips;
    CHECK(rbe->finish_oldest(0us));  // read already
    CHECK(cl->stats().round_trips == trips);
    tensor_get(*y, out0.data(), 0, nbytes(*y));
    for (size_t i = 0; i < 256; ++i) REQUIRE(out0[i] == 2.0f * in0[i]);
  }

  SECTION("a failing graph fails its own wait; the one sent after it completes") {
    graphs = 0;
    fail_at = 1;
    tensor_set(*a, in0.data(), 0, nbytes(*a));
    rbe->graph_submit(g);
    tensor_set(*a2, in1.data(), 0, nbytes(*a2));
    rbe->graph_submit(g2);
    CHECK_THROWS_WITH(rbe->finish_oldest(10s), Catch::Contains("graph_compute failed") && Catch::Contains("injected failure of graph 1"));
    CHECK(rbe->finish_oldest(10s));
    tensor_get(*y2, out1.data(), 0, nbytes(*y2));
    for (size_t i = 0; i < 256; ++i) REQUIRE(out1[i] == 3.0f * in1[i]);
    CHECK(cl->connected());
  }

  SECTION("a connection lost with graphs queued fails each of them, naming the peer") {
    tensor_set(*a, in0.data(), 0, nbytes(*a));
    rbe->graph_submit(g);
    rbe->graph_submit(g2);
    cl->mark_down("taken down by the test");
    CHECK_THROWS_WITH(rbe->finish_oldest(10s), Catch::Contains("is down: taken down by the test"));
    CHECK_THROWS_WITH(rbe->finish_oldest(10s), Catch::Contains("is down"));
    CHECK(rbe->finish_oldest(0us));  // nothing left to wait for
  }
}

TEST_CASE("a wait for a queued graph gives up at its timeout or when woken, and finds the reply later", "[rpc][loopback][queue]") {
  // The peer's backend holds every graph until the test lets it go: the reply cannot have come before.
  std::mutex hold;
  std::unique_lock held(hold);
  struct waiting final : backend_i {
    std::mutex& m;
    std::unique_ptr<cpu::cpu_backend> inner = cpu::make_cpu_backend({.n_threads = 1});
    explicit waiting(std::mutex& mu) : m(mu) {}
    std::string_view name() const override { return inner->name(); }
    device_i& device() const override { return inner->device(); }
    void graph_compute(graph& gr) override {
      std::lock_guard l(m);
      inner->graph_compute(gr);
    }
  };
  peer_server_options so;
  so.make_backend = [&](device_i&) -> backend_ptr { return std::make_unique<waiting>(hold); };
  auto srv = testing::start_server(std::move(so));
  const auto devs = add_peer("127.0.0.1:" + std::to_string(srv->port()));
  REQUIRE(devs.size() == 1);
  auto be = devs[0]->init_backend();
  scaled doubled(*devs[0], 2.0f);
  tensor *a = doubled.a, *y = doubled.y;
  graph& g = doubled.g;
  const auto in = random_floats(256, 500);
  tensor_set(*a, in.data(), 0, nbytes(*a));
  be->graph_submit(g);
  CHECK_FALSE(be->finish_oldest(20ms));
  const int ev = ::eventfd(1, EFD_CLOEXEC);  // readable already: the wait returns at once, not after 10 s
  REQUIRE(ev >= 0);
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_FALSE(be->finish_oldest(10s, ev));
  CHECK(std::chrono::steady_clock::now() - t0 < 9s);
  ::close(ev);
  held.unlock();
  CHECK(be->finish_oldest(10s));
  std::vector<float> out(256);
  tensor_get(*y, out.data(), 0, nbytes(*y));
  for (size_t i = 0; i < 256; ++i) REQUIRE(out[i] == 2.0f * in[i]);

  // A thread sleeping on the socket for a reply that another thread's request reads first is woken (its
  // wake fd), not left to its timeout.
  held.lock();
  be->graph_submit(g);
  const int quiet = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  REQUIRE(quiet >= 0);
  std::atomic<bool> returned{false};
  std::thread waiter([&] {
    be->finish_oldest(30s, quiet);
    returned = true;
  });
  std::this_thread::sleep_for(50ms);  // (asleep by now, or about to be: either way it must come back)
  held.unlock();
  std::vector<float> back(256);
  tensor_get(*a, back.data(), 0, nbytes(*a));  // not an output: reads the graph's reply, then its own
  CHECK(back == in);
  CHECK(testing::wait_for([&] { return returned.load(); }, 10s));
  waiter.join();
  ::close(quiet);
  CHECK(be->finish_oldest(0us));
}
