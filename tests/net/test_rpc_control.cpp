// A slow peer is not a dead one, and a remote device says what it computes (issue 54), over a peer server in
// this process: control connections (probes and capability questions on the peer's control thread),
// supports_op answered by the peer's own device and cached per question, progress frames that carry a graph
// longer than the client's timeout (plain TCP and TLS), health checks answered during such a graph, and a
// refused graph that fails only itself.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <thread>

#include "backends/cpu/cpu_backend.h"
#include "backends/rpc/rpc.h"
#include "backends/rpc/rpc_client.h"
#include "backends/rpc/rpc_device.h"
#include "runtime/ops.h"
#include "tests/net/loopback_fixture.h"
#include "tests/net/test_server.h"
#include "tests/support/certificate.h"

using namespace troupe;
using namespace troupe::rpc;
using namespace troupe::rpc::loopback_fixture;
using namespace std::chrono_literals;

namespace {

// A "GPU" on the peer that cannot multiply by weights that are not f32 (as Vulkan cannot by IQ4_XS): host
// memory of its own buffer type, the CPU kernels for everything else.
class picky_gpu final : public device_i {
 public:
  std::string_view name() const override { return "Picky0"; }
  std::string description() const override { return "a device that multiplies by f32 weights only"; }
  device_type type() const override { return device_type::gpu; }
  device_memory memory() const override { return {1u << 30, 2u << 30}; }
  device_caps caps() const override { return {}; }
  backend_ptr init_backend() override { return cpu::make_cpu_backend({.n_threads = 1}); }
  buffer_type_i& buffer_type() override { return *bt_; }
  bool supports_op(const tensor& t) const override {
    asked += 1;
    if (t.op == op::mul_mat && t.src[0] != nullptr && t.src[0]->type != type::f32) return false;
    return cpu::cpu_device().supports_op(t);
  }
  bool supports_buft(const buffer_type_i& b) const override { return &b == bt_.get(); }
  mutable std::atomic<int> asked{0};

 private:
  std::unique_ptr<buffer_type_i> bt_ = cpu::make_host_buffer_type("Picky0", 64u << 20);
};

// y = factor * a over 256 floats on dev, y an output.
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
  // Runs the graph on be (at once, or queued and waited for); whether y is 2 * the input. No Catch
  // assertion inside (callers check the result on the test's thread: Catch is not thread-safe).
  bool run(backend_i& be, bool queued, uint32_t seed) {
    const auto in = random_floats(256, seed);
    tensor_set(*a, in.data(), 0, nbytes(*a));
    if (queued) {
      be.graph_submit(g);
      while (!be.finish_oldest(std::chrono::milliseconds(50))) {
      }
    } else {
      be.graph_compute(g);
    }
    std::vector<float> out(256);
    tensor_get(*y, out.data(), 0, nbytes(*y));
    for (size_t i = 0; i < out.size(); ++i) {
      if (out[i] != 2.0f * in[i]) return false;
    }
    return true;
  }
};

// A self-signed certificate in dir: the server serves TLS with it and the client trusts it.
void use_tls(const std::filesystem::path& dir, peer_server_options& so, client_options& o) {
  test::make_certificate(dir, "cert");
  so.tls_cert = dir / "cert.pem";
  so.tls_key = dir / "cert.key";
  o.tls = true;
  o.tls_ca_file = dir / "cert.pem";
}

}  // namespace

TEST_CASE("a control connection: probes and capability questions on the peer's control thread, no buffers", "[rpc][loopback][control]") {
  auto srv = testing::start_server();
  client_options o = local(srv->port());
  o.control = true;
  client c(o);
  c.connect();
  CHECK(c.devices().size() == 1);
  CHECK(c.alignment(0) > 0);
  try {
    c.alloc_buffer(0, 64);
    FAIL("a control connection allocated a buffer");
  } catch (const remote_error& e) {
    CHECK(e.code() == status::bad_request);
    CHECK_THAT(e.what(), Catch::Contains("127.0.0.1") && Catch::Contains("alloc_buffer") && Catch::Contains("control connection"));
  }
  CHECK(c.connected());  // a refused request keeps the connection
  CHECK(c.devices().size() == 1);
  CHECK(srv->stats().control_connections == 1);
  CHECK(c.probe(2s));  // a fresh control connection of its own
  CHECK(srv->stats().control_connections == 2);
}

TEST_CASE("supports_op: the peer's own device answers, once per distinct question", "[rpc][loopback][control]") {
  picky_gpu gpu;
  auto srv = testing::start_server({.devices = {&gpu}});
  const auto devs = add_peer("127.0.0.1:" + std::to_string(srv->port()));
  REQUIRE(devs.size() == 1);
  device_i& remote = *devs[0];
  CHECK(remote.type() == device_type::gpu);
  auto c = client_of(remote);
  c->reset_stats();
  context ctx({.max_tensors = 16, .no_alloc = true});
  tensor* w32 = ctx.new_tensor_2d(type::f32, 64, 32);
  tensor* wq = ctx.new_tensor_2d(type::q8_0, 64, 32);
  tensor* x = ctx.new_tensor_2d(type::f32, 64, 4);
  tensor* by32 = mul_mat(ctx, w32, x);
  tensor* byq = mul_mat(ctx, wq, x);
  tensor* sum = add(ctx, by32, by32);  // one source twice
  const int before = gpu.asked.load();
  CHECK(remote.supports_op(*by32));
  CHECK_FALSE(remote.supports_op(*byq));
  CHECK(remote.supports_op(*sum));
  CHECK(gpu.asked.load() == before + 3);
  CHECK(c->stats().op_questions == 3);
  CHECK(srv->stats().op_questions == 3);
  // Asked again: answered here. Views compute nothing: never asked.
  CHECK_FALSE(remote.supports_op(*byq));
  CHECK(remote.supports_op(*by32));
  CHECK(remote.supports_op(*transpose(ctx, x)));
  CHECK(c->stats().op_questions == 3);
  // Another shape is another question.
  tensor* x8 = ctx.new_tensor_2d(type::f32, 64, 8);
  CHECK_FALSE(remote.supports_op(*mul_mat(ctx, wq, x8)));
  CHECK(c->stats().op_questions == 4);

  SECTION("a question the peer cannot read is refused, naming the command and the field") {
    std::vector<uint8_t> q = op_question(*by32);
    // The node's ne[1] (entry 2, after the u32 count): 32 rows of the product where its sources make 32 x 4.
    const size_t node_at = 4 + 2 * wire_tensor::wire_size;
    const size_t ne1_at = node_at + 8 + 8;
    store_le(q.data() + ne1_at, uint64_t{5});
    try {
      c->supports_op(0, q);
      FAIL("answered");
    } catch (const remote_error& e) {
      CHECK(e.code() == status::bad_request);
      CHECK_THAT(e.what(), Catch::Contains("127.0.0.1") && Catch::Contains("supports_op") && Catch::Contains("node"));
    }
    CHECK(c->supports_op(0, op_question(*by32)));  // the control connection stays
  }
  SECTION("a remote CPU is answered by this process's CPU kernels, without a question") {
    auto cpu_srv = testing::start_server();
    const auto cdevs = add_peer("127.0.0.1:" + std::to_string(cpu_srv->port()));
    auto cc = client_of(*cdevs[0]);
    CHECK(cdevs[0]->supports_op(*byq));
    CHECK(cc->stats().op_questions == 0);
    CHECK(cpu_srv->stats().control_connections == 0);
  }
}

TEST_CASE("a graph the peer refuses fails that request, naming the peer and the command, and the connection stays", "[rpc][loopback][control]") {
  picky_gpu gpu;
  auto srv = testing::start_server({.devices = {&gpu}});
  const auto devs = add_peer("127.0.0.1:" + std::to_string(srv->port()));
  device_i& remote = *devs[0];
  auto c = client_of(remote);
  const uint64_t epoch = c->epoch();
  // w (q8_0) x x on the picky device, sent as it is (no scheduler to place it elsewhere).
  context ctx({.max_tensors = 8, .no_alloc = true});
  tensor* w = ctx.new_tensor_2d(type::q8_0, 64, 32);
  tensor* x = ctx.new_tensor_2d(type::f32, 64, 4);
  tensor* y = mul_mat(ctx, w, x);
  graph g;
  g.build_forward_expand(y);
  buffer_ptr buf = alloc_ctx_tensors(ctx, remote.buffer_type());
  auto be = remote.init_backend();
  try {
    be->graph_compute(g);
    FAIL("computed");
  } catch (const remote_error& e) {
    CHECK(e.code() == status::bad_request);
    CHECK_THAT(e.what(), Catch::Contains("127.0.0.1") && Catch::Contains("graph_compute") && Catch::Contains("Picky0 cannot compute"));
  }
  CHECK(c->connected());
  CHECK(c->epoch() == epoch);
  scaled ok(remote, 2.0f);
  CHECK(ok.run(*be, false, 3));
  CHECK(ok.run(*be, true, 4));
}

TEST_CASE("a graph longer than the client's timeout completes: the peer's progress frames restart it", "[rpc][loopback][control][progress]") {
  testing::temp_dir dir("troupe-progress");
  const bool tls = GENERATE(false, true);
  INFO((tls ? "TLS" : "plain TCP"));
  peer_server_options so{.progress_interval = 100ms, .graph_delay = 1200ms};
  client_options o{.host = "127.0.0.1", .io_timeout = 500ms};
  if (tls) use_tls(dir.path(), so, o);
  auto srv = testing::start_server(so);
  o.port = srv->port();
  auto c = std::make_shared<client>(o);
  const auto devs = add_peer(c);
  scaled s(*devs[0], 2.0f);
  auto be = devs[0]->init_backend();
  CHECK(s.run(*be, false, 11));
  CHECK(c->stats().progress_frames >= 5);
  CHECK(srv->stats().progress_frames >= 5);
  CHECK(s.run(*be, true, 12));  // queued (computed at once over TLS)
  CHECK(c->stats().progress_frames >= 10);

  SECTION("without progress frames, the same graph times out") {
    so.progress_interval = 60s;
    auto quiet = testing::start_server(so);
    client_options q = o;
    q.port = quiet->port();
    auto qc = std::make_shared<client>(q);
    const auto qdevs = add_peer(qc);
    scaled t(*qdevs[0], 2.0f);
    auto qbe = qdevs[0]->init_backend();
    CHECK_THROWS_WITH(t.run(*qbe, false, 13), Catch::Contains("timed out"));
  }
}

TEST_CASE("health checks are answered while a graph runs longer than their timeout", "[rpc][loopback][control][progress]") {
  testing::temp_dir dir("troupe-health");
  const bool tls = GENERATE(false, true);
  INFO((tls ? "TLS" : "plain TCP"));
  peer_server_options so{.io_threads = 1, .graph_delay = 1500ms};
  client_options o{.host = "127.0.0.1", .io_timeout = 20s};
  if (tls) use_tls(dir.path(), so, o);
  auto srv = testing::start_server(so);
  o.port = srv->port();
  auto c = std::make_shared<client>(o);
  const auto devs = add_peer(c);
  scaled s(*devs[0], 2.0f);
  auto be = devs[0]->init_backend();
  std::atomic<bool> done{false}, right{false};
  std::thread t([&] {
    right = s.run(*be, false, 21);
    done = true;
  });
  std::this_thread::sleep_for(300ms);  // the graph is on its way (stats() would wait for it: it holds the connection)
  int checks = 0, passed = 0;
  while (!done.load() && checks < 40) {
    const auto t0 = std::chrono::steady_clock::now();
    const bool ok = c->health_check(300ms);
    const auto took = std::chrono::steady_clock::now() - t0;
    checks += 1;
    passed += ok ? 1 : 0;
    CHECK(took < 1s);
    std::this_thread::sleep_for(100ms);
  }
  t.join();
  CHECK(done.load());
  CHECK(right.load());
  CHECK(checks >= 3);
  CHECK(passed == checks);
  CHECK(srv->stats().control_connections >= 1);
}
