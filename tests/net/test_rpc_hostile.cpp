// Hostile input: every malformed frame is answered with an error or the connection is dropped, and the
// server keeps serving a second, well-behaved client. Plus a bounded random-frame run over the frame handler
// (the fuzzer, tests/fuzz/fuzz_rpc.cpp, runs the same handler for much longer).
#include <catch2/catch.hpp>

#include <random>

#include "backends/cpu/cpu_backend.h"
#include "backends/rpc/rpc_client.h"
#include "net/rpc/frame_handler.h"
#include "tests/net/raw_socket.h"
#include "tests/net/test_server.h"

using namespace troupe;
using namespace troupe::rpc;
using namespace troupe::rpc::testing;
using namespace std::chrono_literals;

namespace {

// A well-behaved client on the side: it must keep working whatever the hostile one does.
struct bystander {
  explicit bystander(uint16_t port) : c({.host = "127.0.0.1", .port = port, .io_timeout = 10s}) {
    c.connect();
    b = c.alloc_buffer(0, 1024);
    std::vector<uint8_t> v(1024, 3);
    c.set_tensor(b, 0, v.data(), v.size(), false);
  }
  bool fine() {
    std::vector<uint8_t> got(1024);
    c.get_tensor(b, 0, got.data(), got.size());
    return std::all_of(got.begin(), got.end(), [](uint8_t x) { return x == 3; }) && c.devices().size() == 1;
  }
  client c;
  remote_buffer b;
};

status code_of(const std::optional<frame>& f) { return static_cast<status>(f->code); }

// A connection after hello with one 1 KiB buffer (handle 1).
std::unique_ptr<raw_conn> ready(uint16_t port) {
  auto rc = std::make_unique<raw_conn>(port);
  REQUIRE(rc->hello() == status::ok);
  const auto a = rc->call(alloc(0, 1024));
  REQUIRE(a);
  REQUIRE(code_of(a) == status::ok);
  return rc;
}

}  // namespace

TEST_CASE("hostile frames are answered or dropped, and other clients are still served", "[rpc][hostile]") {
  auto srv = start_server({.max_buffer_size = 64u << 20});
  bystander other(srv->port());

  SECTION("truncated frames: a header cut short, a payload cut short, then silence or a close") {
    {
      raw_conn rc(srv->port());
      REQUIRE(rc.hello() == status::ok);
      const uint8_t half[4] = {static_cast<uint8_t>(command::device_count), 100, 0, 0};
      REQUIRE(rc.send_bytes(half));
    }  // closed mid-header
    {
      auto rc = ready(srv->port());
      REQUIRE(rc->send_header(static_cast<uint8_t>(command::get_tensor), 24));
      const uint8_t part[10] = {1};
      REQUIRE(rc->send_bytes(part));
      rc->reset();  // closed mid-payload
    }
    {
      auto rc = ready(srv->port());
      // A payload shorter than its command needs: an error reply, and the connection goes on.
      frame f = get(1, 0, 16);
      f.payload.resize(10);
      const auto r = rc->call(f);
      REQUIRE(r);
      CHECK(code_of(r) == status::bad_request);
      CHECK(code_of(rc->call(device_count())) == status::ok);
      // Trailing bytes are refused too.
      frame g = base(1);
      g.payload.push_back(0);
      CHECK(code_of(rc->call(g)) == status::bad_request);
    }
  }

  SECTION("huge sizes: frames, buffers, reads") {
    {
      raw_conn rc(srv->port());
      REQUIRE(rc.hello() == status::ok);
      REQUIRE(rc.send_header(static_cast<uint8_t>(command::graph_compute), uint64_t{1} << 62));
      const auto r = rc.read_frame();
      REQUIRE(r);
      CHECK(code_of(r) == status::protocol);
      CHECK(rc.closed_by_peer());
    }
    {
      raw_conn rc(srv->port());
      REQUIRE(rc.hello() == status::ok);
      // set_tensor may be large, but not larger than its buffer: dropped before anything is read.
      REQUIRE(rc.call(alloc(0, 1024)));
      std::vector<uint8_t> prefix;
      writer w(prefix);
      w.u64(1);
      w.u64(0);
      w.u32(0);
      REQUIRE(rc.send_header(static_cast<uint8_t>(command::set_tensor), set_tensor_prefix + (uint64_t{1} << 50)));
      REQUIRE(rc.send_bytes(prefix));
      CHECK(rc.closed_by_peer());
    }
    auto rc = ready(srv->port());
    CHECK(code_of(rc->call(alloc(0, uint64_t{1} << 62))) == status::failed);  // over max_buffer_size
    CHECK(code_of(rc->call(get(1, 0, uint64_t{1} << 62))) == status::bad_request);
    CHECK(code_of(rc->call(get(1, UINT64_MAX, 2))) == status::bad_request);
    CHECK(code_of(rc->call(copy(1, 0, 1, 512, UINT64_MAX - 100))) == status::bad_request);
    frame g = graph_frame(0, {});
    writer(g.payload).u32(0);
    g.payload[4] = 0xff;  // claims 255 entries, has none
    CHECK(code_of(rc->call(g)) == status::bad_request);
  }

  SECTION("unknown commands close the connection") {
    raw_conn rc(srv->port());
    REQUIRE(rc.hello() == status::ok);
    const auto r = rc.call(frame{200, {}});
    REQUIRE(r);
    CHECK(code_of(r) == status::protocol);
    CHECK(rc.closed_by_peer());
  }

  SECTION("foreign buffer handles: another connection's, freed ones, made-up ones") {
    auto rc = ready(srv->port());
    // `other` holds handle 1 on its connection; on this one, handle 1 is this connection's own buffer, and
    // other's buffer is unreachable whatever the number.
    for (uint64_t h : {uint64_t{2}, uint64_t{3}, uint64_t{0}, uint64_t{1} << 63}) {
      CHECK(code_of(rc->call(get(h, 0, 4))) == status::not_found);
      CHECK(code_of(rc->call(free_buffer(h))) == status::not_found);
      CHECK(code_of(rc->call(copy(1, 0, h, 0, 4))) == status::not_found);
    }
    CHECK(code_of(rc->call(free_buffer(1))) == status::ok);
    CHECK(code_of(rc->call(clear(1, 0))) == status::not_found);
    // set_tensor has no reply: its error comes with the next one.
    const std::vector<uint8_t> bytes(16, 1);
    REQUIRE(rc->send_frame(set(1, 0, bytes)));
    const auto r = rc->call(device_count());
    CHECK(code_of(r) == status::bad_request);
    CHECK_THAT(std::string(r->payload.begin(), r->payload.end()), Catch::Contains("unknown buffer handle"));
    CHECK(code_of(rc->call(device_count())) == status::ok);
    CHECK(code_of(rc->call(alloc(7, 16))) == status::not_found);  // no device 7
  }

  SECTION("out-of-bounds offsets") {
    auto rc = ready(srv->port());
    CHECK(code_of(rc->call(get(1, 1000, 25))) == status::bad_request);
    CHECK(code_of(rc->call(get(1, 1025, 0))) == status::bad_request);
    CHECK(code_of(rc->call(copy(1, 1000, 1, 0, 100))) == status::bad_request);
    CHECK(code_of(rc->call(set_hash(1, 1020, 8, 0))) == status::bad_request);
    wire_tensor t = leaf_f32(1, 1000, {16, 1, 1, 1});  // 64 bytes from 1000
    CHECK(code_of(rc->call(init_tensor(t))) == status::bad_request);
    auto g = sample_graph(1);
    g[4].offset = 1000;  // the result would end past the buffer
    CHECK(code_of(rc->call(graph_frame(0, g))) == status::bad_request);
    g = sample_graph(1);
    g[1].nb[1] = uint64_t{1} << 47;  // strides reaching far past the buffer
    CHECK(code_of(rc->call(graph_frame(0, g))) == status::bad_request);
    // Output ranges read back with a graph's reply are checked like any other range.
    CHECK(code_of(rc->call(recompute(0, 1, 1000, 100))) == status::bad_request);
    CHECK(code_of(rc->call(recompute(0, 1, UINT64_MAX, 2))) == status::bad_request);
    CHECK(code_of(rc->call(recompute(0, 77, 0, 4))) == status::not_found);
    // In-bounds still works.
    CHECK(code_of(rc->call(get(1, 1000, 24))) == status::ok);
    CHECK(code_of(rc->call(recompute(0, 1, 0, 24))) == status::no_graph);
  }

  SECTION("invalid types and shapes") {
    auto rc = ready(srv->port());
    auto bad_leaf = [&](auto mutate) {
      auto g = sample_graph(1);
      mutate(g[0]);
      return code_of(rc->call(graph_frame(0, g)));
    };
    CHECK(bad_leaf([](wire_tensor& t) { t.type = 4; }) == status::bad_request);       // retired id
    CHECK(bad_leaf([](wire_tensor& t) { t.type = 5000; }) == status::bad_request);
    CHECK(bad_leaf([](wire_tensor& t) { t.ne[1] = 0; }) == status::bad_request);
    CHECK(bad_leaf([](wire_tensor& t) { t.ne[2] = -4; }) == status::bad_request);
    CHECK(bad_leaf([](wire_tensor& t) { t.ne = {1 << 20, 1 << 20, 1 << 20, 1}; }) == status::bad_request);
    CHECK(bad_leaf([](wire_tensor& t) {  // q4_0 with ne[0] not a multiple of 32
      t.type = 2;
      t.ne = {16, 1, 1, 1};
      t.nb = {18, 18, 18, 18};
    }) == status::bad_request);
    CHECK(bad_leaf([](wire_tensor& t) { t.nb[1] = 0; }) == status::bad_request);   // overlaps itself
    CHECK(bad_leaf([](wire_tensor& t) { t.op = 3; }) == status::bad_request);     // a leaf with an op
    auto bad_node = [&](auto mutate) {
      auto g = sample_graph(1);
      mutate(g[2]);
      return code_of(rc->call(graph_frame(0, g)));
    };
    CHECK(bad_node([](wire_tensor& t) { t.op = 0; }) == status::bad_request);
    CHECK(bad_node([](wire_tensor& t) { t.op = 200; }) == status::bad_request);
    CHECK(bad_node([](wire_tensor& t) { t.ne[0] = 5; }) == status::bad_request);          // not mul_mat's shape
    CHECK(bad_node([](wire_tensor& t) { t.type = 1; }) == status::bad_request);           // not mul_mat's type
    CHECK(bad_node([](wire_tensor& t) { t.op_params[3] = 9; }) == status::bad_request);   // parameters
    CHECK(bad_node([](wire_tensor& t) { t.src = {1, 0, -1, -1}; }) == status::bad_request);  // a.ne[1] != ..
    CHECK(bad_node([](wire_tensor& t) { t.op = static_cast<uint8_t>(op::view); }) == status::bad_request);
    CHECK(bad_node([](wire_tensor& t) {  // permute with axes that are not a permutation
      t.op = static_cast<uint8_t>(op::permute);
      t.src = {0, -1, -1, -1};
      t.op_params[0] = 7;
    }) == status::bad_request);
    CHECK(bad_node([](wire_tensor& t) {  // rope with n_dims past the row
      t.op = static_cast<uint8_t>(op::rope);
      t.op_params[0] = 1000;
    }) == status::bad_request);
    // get_alloc_size of nonsense.
    wire_tensor t = leaf_f32(0, 0, {16, 1, 1, 1});
    t.type = 99;
    CHECK(code_of(rc->call(alloc_size(0, t))) == status::bad_request);
    // The valid graph still runs.
    CHECK(code_of(rc->call(graph_frame(0, sample_graph(1)))) == status::ok);
  }

  SECTION("graphs whose sources point outside the message") {
    auto rc = ready(srv->port());
    for (int32_t s : {5, 2, 4, -2, 1000000, INT32_MIN}) {  // later entries, itself, nonsense
      auto g = sample_graph(1);
      g[2].src[1] = s;
      INFO("source " << s);
      const auto r = rc->call(graph_frame(0, g));
      REQUIRE(r);
      CHECK(code_of(r) == status::bad_request);
    }
    CHECK(code_of(rc->call(graph_frame(0, sample_graph(1)))) == status::ok);
    CHECK(code_of(rc->call(recompute(0))) == status::ok);
    CHECK(code_of(rc->call(free_buffer(1))) == status::ok);
    CHECK(code_of(rc->call(recompute(0))) == status::no_graph);  // the buffer it used is gone
  }

  CHECK(other.fine());
}

TEST_CASE("random frames against the frame handler: errors, never crashes", "[rpc][hostile][fuzz]") {
  frame_handler_config cfg;
  cfg.devices = {&cpu::cpu_device()};
  cfg.make_backend = [](device_i&) -> backend_ptr { return cpu::make_cpu_backend({.n_threads = 1}); };
  cfg.max_buffer_size = 1u << 20;
  cfg.max_connection_bytes = 4u << 20;
  cfg.max_buffers = 64;
  std::mt19937 rng(1234);
  const auto seeds = sample_sessions();
  size_t frames = 0, errors = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    // A seed session with mutations: flipped bytes, truncations, swapped codes, random frames.
    std::vector<frame> fs = seeds[static_cast<size_t>(iter) % seeds.size()];
    const int n_mut = 1 + static_cast<int>(rng() % 4);
    for (int m = 0; m < n_mut; ++m) {
      frame& f = fs[rng() % fs.size()];
      switch (rng() % 5) {
        case 0:
          if (!f.payload.empty()) f.payload[rng() % f.payload.size()] ^= static_cast<uint8_t>(1u << (rng() % 8));
          break;
        case 1: f.payload.resize(rng() % (f.payload.size() + 1)); break;
        case 2: f.code = static_cast<uint8_t>(rng() % 20); break;
        case 3:
          if (f.payload.size() >= 8) {
            const size_t at = rng() % (f.payload.size() - 7);
            const uint64_t v = rng() % 3 == 0 ? UINT64_MAX : rng() % 2 == 0 ? 0 : rng();
            for (int k = 0; k < 8; ++k) f.payload[at + static_cast<size_t>(k)] = static_cast<uint8_t>(v >> (8 * k));
          }
          break;
        default: {
          frame r;
          r.code = static_cast<uint8_t>(rng() % 18);
          r.payload.resize(rng() % 64);
          for (auto& b : r.payload) b = static_cast<uint8_t>(rng());
          fs.insert(fs.begin() + static_cast<std::ptrdiff_t>(rng() % (fs.size() + 1)), r);
        }
      }
    }
    frame_handler s(cfg, "random");
    const frame h = hello();
    REQUIRE(s.handle(h.code, h.payload).st == status::ok);
    for (const frame& f : fs) {
      const reply r = s.handle(f.code, f.payload);
      ++frames;
      if (r.st != status::ok) {
        ++errors;
        REQUIRE(r.tail.empty());
      }
      if (r.close) break;
    }
  }
  INFO(frames << " frames, " << errors << " error replies");
  CHECK(frames > 10000);
  CHECK(errors > 1000);
}
