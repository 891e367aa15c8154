// A peer server and the client library over loopback: every command against the local result, the weight
// cache, version and authentication refusals, clients that vanish mid-transfer, peers that come and go.
#include <catch2/catch.hpp>

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>

#include "backends/cpu/cpu_backend.h"
#include "backends/rpc/rpc.h"
#include "backends/rpc/rpc_client.h"
#include "backends/rpc/rpc_device.h"
#include "runtime/log.h"
#include "runtime/ops.h"
#include "tests/net/raw_socket.h"
#include "tests/net/test_server.h"
#include "tests/support/failing_backend.h"

extern char** environ;

using namespace troupe;
using namespace troupe::rpc;
using namespace std::chrono_literals;

namespace {

std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

client_options local(uint16_t port, std::string key = {}) {
  return client_options{.host = "127.0.0.1", .port = port, .key = std::move(key), .io_timeout = 20s};
}

// y = rms_norm(mul_mat(w, x) + b) * 0.5, with w [64, 32], x [64, 5], b [32, 5]: on `dev`, inputs from seed.
std::vector<float> small_graph(device_i& dev, backend_i& be, uint32_t seed) {
  context ctx({.max_tensors = 16, .no_alloc = true});
  tensor* w = ctx.new_tensor_2d(type::f32, 64, 32);
  tensor* x = ctx.new_tensor_2d(type::f32, 64, 5);
  tensor* b = ctx.new_tensor_2d(type::f32, 32, 5);
  tensor* y = scale(ctx, rms_norm(ctx, add(ctx, mul_mat(ctx, w, x), b), 1e-5f), 0.5f);
  graph g;
  g.build_forward_expand(y);
  buffer_ptr buf = alloc_ctx_tensors(ctx, dev.buffer_type());
  for (tensor* t : {w, x, b}) {
    const auto v = random_floats(static_cast<size_t>(nelements(*t)), seed++);
    tensor_set(*t, v.data(), 0, nbytes(*t));
  }
  be.graph_compute(g);
  std::vector<float> out(static_cast<size_t>(nelements(*y)));
  tensor_get(*y, out.data(), 0, nbytes(*y));
  return out;
}

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

TEST_CASE("every command over loopback matches the local device", "[rpc][loopback]") {
  auto srv = testing::start_server();
  client c(local(srv->port()));
  c.connect();
  CHECK(c.connected());
  CHECK(c.server_version() == protocol_version);
  device_i& cpu = cpu::cpu_device();

  SECTION("device queries") {
    const auto devs = c.devices();
    REQUIRE(devs.size() == 1);
    CHECK(devs[0].name == "CPU");
    CHECK(devs[0].description == cpu.description());
    CHECK(devs[0].type == device_type::cpu);
    CHECK(c.alignment(0) == cpu.buffer_type().alignment());
    CHECK(c.max_size(0) == cpu.buffer_type().max_size());
    const device_memory m = c.memory(0);
    CHECK(m.total == cpu.memory().total);
    CHECK(m.free > 0);
    tensor t;
    t.ne = {10, 3, 1, 1};
    t.nb = dense_strides(type::f32, t.ne);
    CHECK(c.alloc_size(0, to_wire(t, nullptr)) == nbytes(t));
    CHECK_THROWS_AS(c.alignment(1), remote_error);
  }

  SECTION("buffers: set, get, clear, copy, base, init, free") {
    const remote_buffer b = c.alloc_buffer(0, 4096);
    CHECK(c.buffer_base(b) != 0);
    const auto bytes = random_bytes(4096, 1);
    c.set_tensor(b, 0, bytes.data(), 4096, false);
    std::vector<uint8_t> got(4096);
    c.get_tensor(b, 0, got.data(), 4096);
    CHECK(got == bytes);
    std::vector<uint8_t> part(100);
    c.get_tensor(b, 1000, part.data(), 100);
    CHECK(std::equal(part.begin(), part.end(), bytes.begin() + 1000));
    c.copy_tensor(b, 0, b, 2048, 1024);  // within one buffer
    c.get_tensor(b, 2048, part.data(), 100);
    CHECK(std::equal(part.begin(), part.end(), bytes.begin()));
    const remote_buffer b2 = c.alloc_buffer(0, 1024);
    c.copy_tensor(b, 100, b2, 0, 1024);
    std::vector<uint8_t> got2(1024);
    c.get_tensor(b2, 0, got2.data(), 1024);
    CHECK(std::equal(got2.begin(), got2.end(), bytes.begin() + 100));
    c.buffer_clear(b2, 7);
    c.get_tensor(b2, 0, got2.data(), 1024);
    CHECK(std::all_of(got2.begin(), got2.end(), [](uint8_t x) { return x == 7; }));
    tensor t;
    t.ne = {16, 4, 1, 1};
    t.nb = dense_strides(type::f32, t.ne);
    wire_tensor w = to_wire(t, nullptr);
    w.buffer = b.handle;
    w.offset = 64;
    CHECK_NOTHROW(c.init_tensor(w));
    c.free_buffer(b2);
    CHECK_THROWS_AS(c.buffer_clear(b2, 0), remote_error);  // freed: unknown handle
    CHECK(srv->stats().buffers == 1);
    c.free_buffer(b);
    CHECK(srv->stats().buffers == 0);
  }

  SECTION("a remote device computes graphs like the local one; unchanged graphs are recomputed") {
    const auto devs = add_peer("127.0.0.1:" + std::to_string(srv->port()));
    REQUIRE(devs.size() == 1);
    device_i& remote = *devs[0];
    CHECK(remote.name() == "RPC[127.0.0.1:" + std::to_string(srv->port()) + "]#0");
    CHECK(remote.type() == device_type::accel);
    CHECK_FALSE(remote.buffer_type().is_host());
    auto rbe = remote.init_backend();
    auto lbe = cpu::make_cpu_backend({.n_threads = 2});
    const auto want = small_graph(cpu, *lbe, 10);
    const auto got = small_graph(remote, *rbe, 10);
    REQUIRE(got.size() == want.size());
    for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == Approx(want[i]).epsilon(1e-6));

    // The same graph twice on fresh buffers is not the same message (other handles); within one set of
    // buffers and tensors it is, and goes as graph_recompute.
    auto cl = client_of(remote);
    context ctx({.max_tensors = 8, .no_alloc = true});
    tensor* a = ctx.new_tensor_1d(type::f32, 256);
    tensor* y = scale(ctx, a, 2.0f);
    graph g;
    g.build_forward_expand(y);
    buffer_ptr buf = alloc_ctx_tensors(ctx, remote.buffer_type());
    cl->reset_stats();
    for (int round = 0; round < 3; ++round) {
      const auto in = random_floats(256, 100 + static_cast<uint32_t>(round));
      tensor_set(*a, in.data(), 0, nbytes(*a));
      rbe->graph_compute(g);
      std::vector<float> out(256);
      tensor_get(*y, out.data(), 0, nbytes(*y));
      for (size_t i = 0; i < 256; ++i) REQUIRE(out[i] == 2.0f * in[i]);
    }
    client_stats s = cl->stats();
    CHECK(s.graphs_sent == 1);
    CHECK(s.graphs_recomputed == 2);
    CHECK(s.round_trips == 6);  // per round: compute (or recompute) and get; set_tensor has no reply

    // An output's bytes come back with the graph's reply: reading it costs no round trip, until anything
    // else is sent.
    y->flags |= flag_output;
    cl->reset_stats();
    for (int round = 0; round < 3; ++round) {
      const auto in = random_floats(256, 200 + static_cast<uint32_t>(round));
      tensor_set(*a, in.data(), 0, nbytes(*a));
      rbe->graph_compute(g);
      std::vector<float> out(256);
      tensor_get(*y, out.data(), 0, nbytes(*y));
      for (size_t i = 0; i < 256; ++i) REQUIRE(out[i] == 2.0f * in[i]);
      std::vector<uint8_t> part(100);
      tensor_get(*y, part.data(), 40, 100);  // a part of it
      REQUIRE(std::memcmp(part.data(), reinterpret_cast<const uint8_t*>(out.data()) + 40, 100) == 0);
    }
    s = cl->stats();
    CHECK(s.round_trips == 3);
    CHECK(s.outputs_served == 6);
    // After a set, the output copy is stale and the bytes come from the peer.
    const std::vector<float> zeros(256, 0.0f);
    tensor_set(*y, zeros.data(), 0, nbytes(*y));
    std::vector<float> out(256, 1.0f);
    tensor_get(*y, out.data(), 0, nbytes(*y));
    CHECK(out == zeros);
    CHECK(cl->stats().round_trips == 4);

    // A pipeline's slots: graph 1 (its own buffers) goes out and computes after graph 0's reply and before
    // graph 0's output is read; that read is still answered from graph 0's reply. A write into the output
    // makes the next read go to the peer.
    context ctx2({.max_tensors = 8, .no_alloc = true});
    tensor* a2 = ctx2.new_tensor_1d(type::f32, 256);
    tensor* y2 = scale(ctx2, a2, 3.0f);
    y2->flags |= flag_output;
    graph g2;
    g2.build_forward_expand(y2);
    buffer_ptr buf2 = alloc_ctx_tensors(ctx2, remote.buffer_type());
    const auto in0 = random_floats(256, 300);
    const auto in1 = random_floats(256, 301);
    tensor_set(*a, in0.data(), 0, nbytes(*a));
    rbe->graph_compute(g);
    tensor_set(*a2, in1.data(), 0, nbytes(*a2));
    rbe->graph_compute(g2);
    cl->reset_stats();
    std::vector<float> out0(256), out1(256);
    tensor_get(*y, out0.data(), 0, nbytes(*y));
    tensor_get(*y2, out1.data(), 0, nbytes(*y2));
    for (size_t i = 0; i < 256; ++i) {
      REQUIRE(out0[i] == 2.0f * in0[i]);
      REQUIRE(out1[i] == 3.0f * in1[i]);
    }
    s = cl->stats();
    CHECK(s.round_trips == 0);
    CHECK(s.outputs_served == 2);
    tensor_set(*y, zeros.data(), 64, 16);  // overlaps y's copy only
    tensor_get(*y2, out1.data(), 0, nbytes(*y2));
    tensor_get(*y, out0.data(), 0, nbytes(*y));
    CHECK(out0[16] == 0.0f);
    CHECK(out0[15] == 2.0f * in0[15]);
    s = cl->stats();
    CHECK(s.round_trips == 1);  // y's read went to the peer, y2's did not
    CHECK(s.outputs_served == 3);
    // Running graph 1 again drops its own copy (it rewrites its buffer), not graph 0's: a fresh reply.
    rbe->graph_compute(g2);
    tensor_get(*y2, out1.data(), 0, nbytes(*y2));
    for (size_t i = 0; i < 256; ++i) REQUIRE(out1[i] == 3.0f * in1[i]);
    CHECK(cl->stats().outputs_served == 4);
  }
}

TEST_CASE("graphs submitted without waiting: replies in order, a write after a submission wins over its late reply, a failure fails its own graph", "[rpc][loopback][queue]") {
  std::atomic<int> graphs{0}, fail_at{-1};
  server_options so;
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
  server_options so;
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

TEST_CASE("cacheable uploads of 10 MiB and more are served from the peer's cache the second time", "[rpc][cache]") {
  testing::temp_dir dir("troupe-rpc-cache");
  auto srv = testing::start_server({.cache_dir = dir.path()});
  const size_t n = 12u << 20;
  const auto bytes = random_bytes(n, 42);
  {
    client c(local(srv->port()));
    c.connect();
    const remote_buffer b = c.alloc_buffer(0, n);
    c.set_tensor(b, 0, bytes.data(), n, true);
    const client_stats s = c.stats();
    CHECK(s.cache_misses == 1);
    CHECK(s.bytes_sent > n);
    std::vector<uint8_t> got(n);
    c.get_tensor(b, 0, got.data(), n);  // also waits for the upload to finish
    CHECK(got == bytes);
    CHECK(srv->stats().cache_stores == 1);
  }
  client c(local(srv->port()));
  c.connect();
  const remote_buffer b = c.alloc_buffer(0, n);
  c.reset_stats();
  c.set_tensor(b, 0, bytes.data(), n, true);
  const client_stats s = c.stats();
  CHECK(s.cache_hits == 1);
  CHECK(s.bytes_sent < 1024);  // a hash, not 12 MiB
  INFO("bytes sent for a 12 MiB cached upload: " << s.bytes_sent);
  std::vector<uint8_t> got(n);
  c.get_tensor(b, 0, got.data(), n);
  CHECK(got == bytes);
  CHECK(srv->stats().cache_hits == 1);
  // Not cacheable (not weights): always sent.
  c.reset_stats();
  c.set_tensor(b, 0, bytes.data(), n, false);
  c.get_tensor(b, 0, got.data(), 16);
  CHECK(c.stats().bytes_sent > n);
}

TEST_CASE("incompatible versions are refused", "[rpc][version]") {
  SECTION("a server with a newer minor version") {
    auto srv = testing::start_server({.server_version = {1, 1, 0}});
    client c(local(srv->port()));
    try {
      c.connect();
      FAIL("connected");
    } catch (const remote_error& e) {
      CHECK(e.code() == status::version_mismatch);
      CHECK_THAT(e.what(), Catch::Contains("incompatible"));
    }
    CHECK_FALSE(c.connected());
  }
  SECTION("a client with another major version") {
    auto srv = testing::start_server();
    client_options o = local(srv->port());
    o.client_version = {2, 0, 0};
    client c(o);
    CHECK_THROWS_AS(c.connect(), remote_error);
    o.client_version = {1, 4, 2};  // a newer minor client talks to an older server
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
  CHECK_THROWS_WITH(server({.host = "192.0.2.1", .devices = {&cpu::cpu_device()}}),
                    Catch::Contains("not a loopback address"));
}

TEST_CASE("a connection that never says hello is closed", "[rpc][auth]") {
  auto srv = testing::start_server({.hello_timeout = 200ms});
  testing::raw_conn rc(srv->port());
  REQUIRE(rc.read_frame());
  CHECK(testing::wait_for([&] { return srv->stats().connections == 0; }));
  CHECK(rc.closed_by_peer());
}

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

namespace {

// A second device on the peer: host memory of its own buffer type, computed by the CPU kernels.
class second_cpu final : public device_i {
 public:
  std::string_view name() const override { return "CPU-b"; }
  std::string description() const override { return "a second host device"; }
  device_type type() const override { return device_type::cpu; }
  device_memory memory() const override { return {1u << 30, 2u << 30}; }
  device_caps caps() const override { return {}; }
  backend_ptr init_backend() override { return cpu::make_cpu_backend({.n_threads = 1}); }
  buffer_type_i& buffer_type() override { return *bt_; }
  bool supports_op(const tensor& t) const override { return cpu::cpu_device().supports_op(t); }
  bool supports_buft(const buffer_type_i& b) const override { return b.is_host(); }

 private:
  std::unique_ptr<buffer_type_i> bt_ = cpu::make_host_buffer_type("CPU-b", 1u << 20);
};

}  // namespace

TEST_CASE("several devices per server, each its own remote device", "[rpc][loopback]") {
  second_cpu b;
  auto srv = testing::start_server({.devices = {&cpu::cpu_device(), &b}});
  const auto devs = add_peer("127.0.0.1:" + std::to_string(srv->port()));
  REQUIRE(devs.size() == 2);
  CHECK(devs[1]->name() == "RPC[127.0.0.1:" + std::to_string(srv->port()) + "]#1");
  CHECK_THAT(devs[1]->description(), Catch::Contains("a second host device"));
  CHECK(devs[1]->memory().total == (2u << 30));
  CHECK(devs[1]->buffer_type().max_size() == (1u << 20));
  CHECK_THROWS_AS(devs[1]->buffer_type().alloc_buffer(2u << 20), backend_error);
  CHECK(remote_index(*devs[1]) == 1);
  CHECK(client_of(*devs[0]) == client_of(*devs[1]));  // one connection per peer
  CHECK_FALSE(devs[0]->supports_buft(devs[1]->buffer_type()));
  auto lbe = cpu::make_cpu_backend({.n_threads = 2});
  const auto want = small_graph(cpu::cpu_device(), *lbe, 7);
  for (device_i* d : devs) {
    INFO(d->name());
    auto be = d->init_backend();
    const auto got = small_graph(*d, *be, 7);
    REQUIRE(got.size() == want.size());
    for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == Approx(want[i]).epsilon(1e-6));
  }
}

TEST_CASE("a peer that refuses an allocation is an out-of-memory error on the client, by type", "[rpc][loopback]") {
  auto srv = testing::start_server({.max_connection_bytes = 1u << 20});
  client c(local(srv->port()));
  c.connect();
  const remote_buffer fits = c.alloc_buffer(0, 512u << 10);
  CHECK_THROWS_AS(c.alloc_buffer(0, 768u << 10), out_of_memory_error);  // over the connection's limit
  bool refused = false;
  try {
    c.alloc_buffer(7, 1024);  // no such device: a bad request, not memory
  } catch (const out_of_memory_error&) {
    FAIL("a bad device index is not an out-of-memory error");
  } catch (const remote_error& e) {
    refused = e.code() != status::ok;
  }
  CHECK(refused);
  c.free_buffer(fits);
  CHECK_NOTHROW(c.free_buffer(c.alloc_buffer(0, 768u << 10)));  // room again
}
