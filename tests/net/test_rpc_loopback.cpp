// A peer server and the client library over loopback, command by command: every command against the local
// device's result, the weight cache, several devices behind one server, and allocations the peer refuses.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>

#include "backends/cpu/cpu_backend.h"
#include "backends/rpc/rpc.h"
#include "backends/rpc/rpc_client.h"
#include "backends/rpc/rpc_device.h"
#include "runtime/ops.h"
#include "tests/net/loopback_fixture.h"
#include "tests/net/test_server.h"

using namespace troupe;
using namespace troupe::rpc;
using namespace troupe::rpc::loopback_fixture;
using namespace std::chrono_literals;

namespace {

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
