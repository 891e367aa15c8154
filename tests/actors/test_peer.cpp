// The remote-peer actor against a real peer server process (rpc_peer: the rpc::peer_server `troupe peer` runs) on
// 127.0.0.1: it connects and reports up; the
// peer hangs (SIGSTOP) with a request in flight, which then fails promptly (not after the 300 s I/O
// timeout); the peer is killed, its devices fail fast naming it, the status names the model that needs it,
// reconnect attempts back off within their bound; the peer restarts on the same port, the actor reconnects
// (epoch + 1) and the devices work again. Every wait is bounded by a generous deadline; nothing here times
// performance.
#include <catch2/catch.hpp>

#include <caf/all.hpp>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "actors/errors.h"
#include "actors/peer_actor.h"
#include "actors/engine.h"
#include "actors/engine_config.h"
#include "actors/supervisor_actor.h"
#include "backends/cpu/cpu_backend.h"
#include "backends/registry.h"
#include "backends/rpc/rpc.h"
#include "llm/generator.h"
#include "llm/llm_context.h"
#include "llm/model.h"
#include "llm/vocab.h"
#include "runtime/ops.h"
#include "tests/support/gated_device.h"
#include "tests/actors/ask.h"
#include "tests/net/test_server.h"
#include "tests/test_models.h"

extern char** environ;

using namespace troupe;
using namespace troupe::actors;
using namespace std::chrono_literals;

namespace {

// A peer server process on 127.0.0.1 (port 0: an ephemeral one), one CPU thread; SIGKILLed by the destructor.
class peer_process {
 public:
  explicit peer_process(uint16_t port = 0) {
    int out[2];
    REQUIRE(::pipe(out) == 0);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, out[1], STDOUT_FILENO);
    posix_spawn_file_actions_addclose(&fa, out[0]);
    std::vector<std::string> args = {TROUPE_RPC_PEER, std::to_string(port)};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const int rc = posix_spawn(&pid_, TROUPE_RPC_PEER, &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    ::close(out[1]);
    out_ = out[0];
    REQUIRE(rc == 0);
    // "listening on 127.0.0.1:PORT"
    std::string line;
    pollfd p{out_, POLLIN, 0};
    while (line.find('\n') == std::string::npos && ::poll(&p, 1, 30000) == 1) {
      char buf[256];
      const ssize_t n = ::read(out_, buf, sizeof buf);
      if (n <= 0) break;
      line.append(buf, static_cast<size_t>(n));
    }
    const auto at = line.rfind("127.0.0.1:");
    INFO("rpc_peer said: " << line);
    REQUIRE(at != std::string::npos);
    port_ = static_cast<uint16_t>(std::stoi(line.substr(at + 10)));
  }
  ~peer_process() {
    kill();
    if (out_ >= 0) ::close(out_);
  }
  // SIGSTOP returns once the process has stopped (the signal alone may leave it running a moment longer).
  void signal(int sig) {
    if (pid_ <= 0) return;
    ::kill(pid_, sig);
    if (sig == SIGSTOP) {
      int st = 0;
      REQUIRE(::waitpid(pid_, &st, WUNTRACED) == pid_);
      REQUIRE(WIFSTOPPED(st));
    }
  }
  void kill() {
    if (pid_ <= 0) return;
    int st = 0;
    if (::waitpid(pid_, &st, WNOHANG) == pid_) {
      // It ended before it was killed: a crash of the peer is a failure of its own.
      if (WIFSIGNALED(st)) FAIL_CHECK("the peer process died of signal " << WTERMSIG(st));
      if (WIFEXITED(st)) FAIL_CHECK("the peer process exited with status " << WEXITSTATUS(st));
      pid_ = -1;
      return;
    }
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, &st, 0);
    pid_ = -1;
  }
  uint16_t port() const { return port_; }

 private:
  pid_t pid_ = -1;
  int out_ = -1;
  uint16_t port_ = 0;
};

caf::actor_system_config& config() {
  static caf::actor_system_config cfg = [] {
    caf::actor_system_config c;
    add_message_types(c);
    c.set("scheduler.max-threads", 2);
    return c;
  }();
  return cfg;
}

using test::ask;

// Polls the peer's status until pred holds (at most `limit`); returns the last status seen.
peer_status wait_for(caf::actor_system& sys, const peer_actor& p, const std::function<bool(const peer_status&)>& pred,
                     std::chrono::milliseconds limit = 30s) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  peer_status last;
  while (std::chrono::steady_clock::now() < deadline) {
    const auto s = ask<peer_status>(sys, p, get_atom_v, status_atom_v);
    REQUIRE(s);
    last = *s;
    if (pred(last)) return last;
    std::this_thread::sleep_for(20ms);
  }
  return last;
}

peer_params fast_params(uint16_t port) {
  peer_params p;
  p.name = "box";
  p.host = "127.0.0.1";
  p.port = port;
  p.connect_timeout = 1000ms;
  p.health_interval = 100ms;
  p.health_timeout = 2000ms;  // generous: a loaded machine must not look like a hung peer
  p.backoff = {.initial = 20ms, .max = 200ms, .jitter = 0.5};
  return p;
}

// A [[peer]] on this machine, with the configuration's defaults.
peer_params configured_peer(const std::string& name, uint16_t port) {
  peer_params p;
  p.name = name;
  p.host = "127.0.0.1";
  p.port = port;
  return p;
}

// Writes 256 floats to a new buffer of dev, reads them back: whether they round-trip.
bool device_works(device_i& dev) {
  buffer_ptr b = dev.buffer_type().alloc_buffer(1024);
  context ctx({.max_tensors = 1, .no_alloc = true});
  tensor* t = ctx.new_tensor_1d(type::f32, 256);
  tensor_alloc(*b, *t, b->base());
  std::vector<float> in(256), out(256, 0.0f);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i) * 0.5f;
  tensor_set(*t, in.data(), 0, sizeof(float) * in.size());
  tensor_get(*t, out.data(), 0, sizeof(float) * out.size());
  return in == out;
}

// Stops actors when a test ends early (a failed REQUIRE): the actor system's destructor waits for them.
struct stop_on_exit {
  std::function<void()> f;
  ~stop_on_exit() { f(); }
};

// One session of the model with every layer on `device` (a peer's), one thread, 128 cells.
model_settings settings_on(const std::string& name, const std::string& path, const std::string& device) {
  return {.name = name, .path = path, .devices = {{device, 99}}, .n_ctx = 128, .n_seq_max = 1, .n_threads = 1};
}

// The same as a load request for the supervisor.
load_request load_on(const std::string& name, const std::string& path, const std::string& device) {
  return {settings_on(name, path, device), {}};
}

// The status of the actor named `name` ("model:m", "device:CPU"), if it is listed (a copy: the status is
// often a temporary).
std::optional<actor_status> find_actor(const engine_status& s, const std::string& name) {
  for (const actor_status& a : s.actors) {
    if (a.name == name) return a;
  }
  return std::nullopt;
}

generate_request greedy(const std::string& prompt, int n) {
  generate_request r;
  r.prompt = prompt;
  r.params = generation_params::greedy(n);
  return r;
}

}  // namespace

TEST_CASE("peer backoff: exponential from the initial delay, jittered, never above the bound", "[actors][peer]") {
  const backoff_params b{.initial = 100ms, .max = 2000ms, .jitter = 0.5};
  CHECK(backoff_delay(b, 1, 0.0) == 100ms);
  CHECK(backoff_delay(b, 2, 0.0) == 200ms);
  CHECK(backoff_delay(b, 3, 0.0) == 400ms);
  CHECK(backoff_delay(b, 5, 0.0) == 1600ms);
  CHECK(backoff_delay(b, 6, 0.0) == 2000ms);
  CHECK(backoff_delay(b, 4000000000u, 0.0) == 2000ms);
  // Jitter takes off up to half.
  CHECK(backoff_delay(b, 1, 0.999) >= 50ms);
  CHECK(backoff_delay(b, 1, 0.999) < 51ms);
  for (uint32_t n = 1; n < 100; ++n) {
    for (double u : {0.0, 0.25, 0.5, 0.75, 0.999}) {
      const auto d = backoff_delay(b, n, u);
      CHECK(d <= 2000ms);
      CHECK(d >= 50ms);
    }
  }
  CHECK(backoff_delay({.initial = 100ms, .max = 2000ms, .jitter = 0.0}, 3, 0.9) == 400ms);
}

TEST_CASE("[[peer]] tables in the runtime configuration", "[actors][peer][config]") {
  const engine_config c = parse_engine_config(R"(
[[peer]]
name = "box"
address = "10.0.0.2:50052"
tls = true
tls_ca = "ca.pem"
busy_poll_us = 0

[[peer]]
name = "v6"
address = "[::1]:7000"
)");
  REQUIRE(c.peers.size() == 2);
  CHECK(c.peers[0].name == "box");
  CHECK(c.peers[0].host == "10.0.0.2");
  CHECK(c.peers[0].port == 50052);
  CHECK(c.peers[0].tls);
  CHECK(c.peers[0].tls_ca_file == "ca.pem");
  CHECK(c.peers[0].busy_poll == 0us);
  CHECK(load_peer_key(c.peers[0]).busy_poll == 0us);
  CHECK(c.peers[1].busy_poll == 250us);
  CHECK(c.peers[1].connect_timeout == 3000ms);
  CHECK(c.peers[1].host == "::1");
  CHECK(c.peers[1].port == 7000);
  CHECK_THROWS_WITH(parse_engine_config("[[peer]]\nname = \"x\"\naddress = \"nohost\"\n"), Catch::Contains("host:port"));
  CHECK_THROWS_WITH(parse_engine_config("[[peer]]\naddress = \"h:1\"\n"), Catch::Contains("name"));
  CHECK_THROWS_WITH(parse_engine_config("[[peer]]\nname = \"x\"\naddress = \"h:1\"\nkey = \"k\"\n"), Catch::Contains("'key'"));
  CHECK_THROWS_WITH(parse_engine_config("[[peer]]\nname = \"x\"\naddress = \"h:1\"\n[[peer]]\nname = \"x\"\naddress = \"h:2\"\n"),
                    Catch::Contains("twice"));
  CHECK_THROWS_WITH(parse_engine_config("[[peer]]\nname = \"x\"\naddress = \"h:1\"\nbusy_poll_us = -5\n"),
                    Catch::Contains("busy_poll_us"));
  peer_params missing;
  missing.name = "x";
  missing.host = "h";
  missing.port = 1;
  missing.key_file = "/nonexistent/peer.key";
  CHECK_THROWS_WITH(load_peer_key(missing), Catch::Contains("peer x") && Catch::Contains("/nonexistent/peer.key"));
}

TEST_CASE("a peer that cannot be reached is down, with its error, and retried within the backoff bound", "[actors][peer]") {
  // A port nobody listens on: bind one, note it, close it.
  uint16_t port = 0;
  {
    peer_process tmp;
    port = tmp.port();
  }
  caf::actor_system sys{config()};
  const peer_actor p = spawn_peer_actor(sys, fast_params(port));
  stop_on_exit guard{[p] { caf::anon_send_exit(p, caf::exit_reason::user_shutdown); }};
  const peer_status s = wait_for(sys, p, [](const peer_status& x) { return x.failures >= 4; });
  CHECK(s.state != "up");
  CHECK(s.failures >= 4);
  CHECK(s.epoch == 0);
  CHECK(s.retry_in_ms <= 200);
  CHECK_THAT(s.last_error, Catch::Contains("127.0.0.1:" + std::to_string(port)));
  const auto mem = ask<peer_memory>(sys, p, memory_atom_v);
  REQUIRE_FALSE(mem);
  CHECK(is(mem.error(), errc::down));
  CHECK_THAT(describe(mem.error()), Catch::Contains("box"));
}

TEST_CASE("the peer actor: up, hung with a request in flight, killed, restarted", "[actors][peer]") {
  // reload: the supervisor loads the model again by itself after the peer reconnected (the default);
  // otherwise the model stays down, saying so, until the user loads it again.
  const bool reload = GENERATE(true, false);
  INFO("reload_on_reconnect = " << reload);
  register_builtin_backends();
  auto peer = std::make_unique<peer_process>();
  const uint16_t port = peer->port();
  const std::string addr = "127.0.0.1:" + std::to_string(port);
  caf::actor_system sys{config()};
  const peer_actor p = spawn_peer_actor(sys, fast_params(port));

  // ---- up: devices registered and working, health checks passing ----
  peer_status s = wait_for(sys, p, [](const peer_status& x) { return x.state == "up" && x.health_checks >= 2; });
  REQUIRE(s.state == "up");
  CHECK(s.epoch == 1);
  CHECK(s.name == "box");
  CHECK(s.address == addr);
  REQUIRE(s.devices.size() >= 1);
  CHECK(s.devices[0] == "RPC[" + addr + "]#0");
  device_i* dev = registry::instance().find(s.devices[0]);
  REQUIRE(dev != nullptr);
  CHECK(device_works(*dev));
  const auto mem = ask<peer_memory>(sys, p, memory_atom_v);
  REQUIRE(mem);
  CHECK(mem->peer == addr);
  REQUIRE(mem->devices.size() == s.devices.size());
  CHECK(mem->devices[0].name == s.devices[0]);
  CHECK(mem->devices[0].total > 0);

  // A supervisor with the peer's device; a model with layers on it when the test model is there.
  auto env = std::make_shared<engine_env>();
  const auto model = test::model_path("stories260K.gguf");
  const supervisor_actor sup = spawn_supervisor(
      sys, env, {.devices = {"CPU", s.devices[0]}, .n_threads = 1, .peers = {p}, .reload_on_reconnect = reload});
  // The supervisor stops the peer actor too (a second shutdown request after the test's own is refused).
  stop_on_exit guard{[sup] { caf::anon_send(sup, shutdown_atom_v); }};
  caf::expected<session_actor> sess{caf::error{}};
  std::string first_text;
  if (model) {
    const auto info = ask<model_info>(sys, sup, load_atom_v, load_on("m", model->string(), s.devices[0]));
    if (!info) FAIL(describe(info.error()));
    sess = ask<session_actor>(sys, sup, open_atom_v, session_request{"m"});
    REQUIRE(sess);
    const auto r = ask<generate_reply>(sys, *sess, generate_atom_v, greedy("Once upon a time", 8));
    if (!r) FAIL(describe(r.error()));
    CHECK(r->tokens.size() == 8);
    first_text = r->text;
    s = wait_for(sys, p, [](const peer_status& x) { return x.models.size() == 1; });
    CHECK(s.models == std::vector<std::string>{"m"});
  }

  // ---- the peer hangs: a request in flight fails once the health check gives up, not after 300 s ----
  buffer_ptr buf = dev->buffer_type().alloc_buffer(4096);
  context bctx({.max_tensors = 1, .no_alloc = true});
  tensor* bt = bctx.new_tensor_1d(type::i8, 64);
  tensor_alloc(*buf, *bt, buf->base());
  peer->signal(SIGSTOP);
  const auto t0 = std::chrono::steady_clock::now();
  auto pending = std::async(std::launch::async, [&]() -> std::string {
    std::vector<uint8_t> out(64);
    try {
      buf->get_tensor(*bt, out.data(), 0, out.size());
      return "";
    } catch (const backend_error& e) {
      return e.what();
    }
  });
  REQUIRE(pending.wait_for(60s) == std::future_status::ready);
  const std::string pending_error = pending.get();
  const auto waited = std::chrono::steady_clock::now() - t0;
  CHECK_THAT(pending_error, Catch::Contains(addr));
  CHECK(waited < 60s);  // generous: the health timeout is 2 s, the I/O timeout 300 s
  s = wait_for(sys, p, [](const peer_status& x) { return x.state != "up"; });
  CHECK(s.state != "up");
  CHECK_FALSE(s.last_error.empty());

  // ---- killed: devices fail fast naming the peer, the runtime reports who needs it ----
  peer->kill();
  peer.reset();
  const auto t1 = std::chrono::steady_clock::now();
  try {
    dev->buffer_type().alloc_buffer(1024);
    FAIL("allocating on a peer that is down succeeded");
  } catch (const backend_error& e) {
    CHECK_THAT(std::string(e.what()), Catch::Contains(addr) && Catch::Contains("down"));
  }
  CHECK(std::chrono::steady_clock::now() - t1 < 5s);  // no connect attempt, no waiting
  CHECK_THROWS_AS(buf->clear(0), backend_error);
  buf.reset();  // freeing a lost buffer is quiet
  if (model) {
    // A pending answer errors out (no hang), and the model is reported down because of the peer.
    const auto r = ask<generate_reply>(sys, *sess, generate_atom_v, greedy("Once upon a time", 8));
    REQUIRE_FALSE(r);
    CHECK_THAT(describe(r.error()), Catch::Contains(addr));
    const auto rs = ask<engine_status>(sys, sup, get_atom_v, status_atom_v);
    REQUIRE(rs);
    REQUIRE(rs->peers.size() == 1);
    CHECK(rs->peers[0].name == "box");
    CHECK(rs->peers[0].state != "up");
    CHECK(rs->peers[0].models == std::vector<std::string>{"m"});
    bool model_reported = false;
    for (const actor_status& a : rs->actors) {
      if (a.name == "model:m") {
        CHECK_FALSE(a.up);
        CHECK_THAT(a.last_error, Catch::Contains("needs peer box"));
        model_reported = true;
      }
    }
    CHECK(model_reported);
    const auto again = ask<session_actor>(sys, sup, open_atom_v, session_request{"m"});
    REQUIRE_FALSE(again);
    CHECK(is(again.error(), errc::down));
    CHECK_THAT(describe(again.error()), Catch::Contains("peer box"));
  }
  // Attempts keep failing, each wait within the bound.
  s = wait_for(sys, p, [](const peer_status& x) { return x.state == "down" && x.failures >= 3; });
  CHECK(s.failures >= 3);
  CHECK(s.retry_in_ms <= 200);
  CHECK(s.epoch == 1);

  // ---- restarted on the same port: reconnect, epoch 2, the devices work again ----
  peer = std::make_unique<peer_process>(port);
  s = wait_for(sys, p, [](const peer_status& x) { return x.state == "up" && x.epoch == 2; });
  REQUIRE(s.state == "up");
  CHECK(s.epoch == 2);
  CHECK(s.failures == 0);
  CHECK(device_works(*dev));
  CHECK(ask<peer_memory>(sys, p, memory_atom_v));
  if (model && reload) {
    // The model's weights went with the old connection: the supervisor loads it again by itself.
    auto model_up = [&] {
      const auto rs = ask<engine_status>(sys, sup, get_atom_v, status_atom_v);
      REQUIRE(rs);
      const auto a = find_actor(*rs, "model:m");
      return a && a->up;
    };
    const auto deadline = std::chrono::steady_clock::now() + 60s;
    while (!model_up() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(20ms);
    REQUIRE(model_up());
    s = wait_for(sys, p, [](const peer_status& x) { return x.models.size() == 1; });
    CHECK(s.models == std::vector<std::string>{"m"});
  }
  if (model && !reload) {
    // The model's weights went with the old connection: it stays down and says so until loaded again.
    const auto rs = ask<engine_status>(sys, sup, get_atom_v, status_atom_v);
    REQUIRE(rs);
    for (const actor_status& a : rs->actors) {
      if (a.name == "model:m") {
        CHECK_FALSE(a.up);
        CHECK_THAT(a.last_error, Catch::Contains("load the model again"));
      }
    }
    REQUIRE(ask<bool>(sys, sup, unload_atom_v, std::string("m")));
    const auto info = ask<model_info>(sys, sup, load_atom_v, load_on("m", model->string(), s.devices[0]));
    if (!info) FAIL(describe(info.error()));
  }
  if (model) {
    // Either way, loaded again it answers as before.
    const auto s2 = ask<session_actor>(sys, sup, open_atom_v, session_request{"m"});
    REQUIRE(s2);
    const auto r = ask<generate_reply>(sys, *s2, generate_atom_v, greedy("Once upon a time", 8));
    if (!r) FAIL(describe(r.error()));
    CHECK(r->text == first_text);
  }
  const auto final_b = ask<memory_breakdown>(sys, sup, shutdown_atom_v);
  REQUIRE(final_b);
  CHECK(final_b->n_rejected == 0);
}

TEST_CASE("a peer that comes up after the engine started: its devices join, a model loads onto it", "[actors][peer]") {
  register_builtin_backends();
  // A port nobody listens on yet: bind one, note it, close it.
  uint16_t port = 0;
  {
    peer_process tmp;
    port = tmp.port();
  }
  const std::string device = "RPC[127.0.0.1:" + std::to_string(port) + "]#0";
  engine_config cfg;
  cfg.n_threads = 1;
  cfg.peers = {configured_peer("late", port)};
  engine eng(cfg);
  auto has_device_actor = [&] {
    const auto a = find_actor(eng.status(), "device:" + device);
    return a && a->up;
  };
  REQUIRE(eng.status().peers.size() == 1);
  CHECK(eng.status().peers[0].state != "up");
  CHECK_FALSE(has_device_actor());

  peer_process peer(port);
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (!has_device_actor() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(20ms);
  REQUIRE(has_device_actor());
  CHECK(eng.status().peers[0].state == "up");

  const auto path = test::model_path("stories260K.gguf");
  if (!path) return;
  const model_info info = eng.load_model(settings_on("m", path->string(), device));
  CHECK(info.n_layer == 5);
  const memory_breakdown mb = eng.memory();
  bool on_peer = false;
  for (const buft_usage& u : mb.entries) on_peer |= u.device == device && u.model > 0;
  CHECK(on_peer);
  session s = eng.open_session("m");
  const generate_reply r = s.generate("Once upon a time", generation_params::greedy(8));
  // The same tokens as the synchronous generator on the local CPU.
  auto m = llm::model::load(*path);
  llm::vocab v(m->meta());
  llm::llm_context c(*m, {.n_ctx = 128, .n_threads = 1});
  llm::generator gen(c, v);
  llm::generate_params gp;
  gp.max_tokens = 8;
  gp.temperature = 0.0f;
  CHECK(r.tokens == gen.generate(v.tokenize("Once upon a time", true), gp).tokens);
  s.close();
  const memory_breakdown final_b = eng.shutdown();
  CHECK(final_b.model == 0);
  CHECK(final_b.n_rejected == 0);
}

TEST_CASE("a shutdown while a model is being loaded again waits for it, and everything is given back", "[actors][peer]") {
  // The peer is a server in this process whose device allocates through a gate: once the first server has
  // gone and the gate is closed, the second server's first allocation (the reload's weights) waits there.
  // The shutdown begins while it waits, so the shutdown always meets a reload in progress.
  const auto path = test::model_path("stories260K.gguf");
  if (!path) return;
  register_builtin_backends();
  test::alloc_gate gate;
  test::gated_device gated(cpu::cpu_device(), gate);
  std::unique_ptr<rpc::peer_server> first = rpc::testing::start_server({.devices = {&gated}});
  const uint16_t port = first->port();
  std::unique_ptr<rpc::peer_server> second;  // the peer once it is back, on the same port
  const std::string device = "RPC[127.0.0.1:" + std::to_string(port) + "]#0";
  engine_config cfg;
  cfg.n_threads = 1;
  peer_params pp = configured_peer("box", port);
  pp.health_interval = 100ms;
  pp.backoff = {.initial = 20ms, .max = 200ms, .jitter = 0.5};
  // While the reload's allocation is held, health checks probe on connections of their own, which may wait
  // behind it on the server's io thread: generous, so that the held peer is not taken for a hung one (the
  // first server's going is found by its closed connection, not by a timeout).
  pp.health_timeout = 600s;
  cfg.peers = {pp};
  engine eng(cfg);
  struct open_at_exit {  // a failed REQUIRE must not leave the engine's shutdown waiting at the gate
    test::alloc_gate& g;
    ~open_at_exit() { g.open(); }
  } opener{gate};
  auto deadline = std::chrono::steady_clock::now() + 60s;
  const auto device_up = [&] {
    const auto a = find_actor(eng.status(), "device:" + device);
    return a && a->up;
  };
  while (!device_up() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(20ms);
  REQUIRE(device_up());
  eng.load_model(settings_on("m", path->string(), device));
  uint64_t on_peer = 0;  // the model's weights on the peer
  for (const buft_usage& u : eng.memory().entries) on_peer += u.device == device ? u.model : 0;
  REQUIRE(on_peer > 0);
  auto model_error = [&]() -> std::optional<std::string> {
    const auto a = find_actor(eng.status(), "model:m");
    if (!a) return std::nullopt;
    return a->up ? std::string() : a->last_error;
  };

  gate.close();
  first->stop();  // the peer goes away, and its buffers with it
  deadline = std::chrono::steady_clock::now() + 60s;
  while (model_error().value_or("").find("needs peer box") == std::string::npos && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(5ms);
  }
  REQUIRE_THAT(model_error().value_or(""), Catch::Contains("needs peer box"));
  second = rpc::testing::start_server({.port = port, .devices = {&gated}});
  // The peer actor reconnects, the supervisor loads the model again, and its upload waits at the gate.
  REQUIRE(gate.wait_held(60s));
  const auto loading = model_error();
  REQUIRE(loading);
  CHECK_THAT(*loading, Catch::Contains("loading it again"));

  caf::scoped_actor self{eng.system()};
  auto shutdown = self->request(eng.supervisor(), 120s, shutdown_atom_v);
  // Asked by the same actor after the shutdown, so the supervisor has begun the shutdown when it answers.
  std::string during;
  self->request(eng.supervisor(), 60s, get_atom_v, status_atom_v)
      .receive(
          [&](const engine_status& st) {
            const auto a = find_actor(st, "model:m");
            during = a ? a->last_error : "(no model:m)";
          },
          [&](caf::error& e) { during = "(status failed: " + describe(e) + ")"; });
  CHECK_THAT(during, Catch::Contains("loading it again"));  // the reload is still running
  gate.open();
  std::optional<memory_breakdown> b;
  std::string failed;
  shutdown.receive([&](memory_breakdown& x) { b = std::move(x); }, [&](caf::error& e) { failed = describe(e); });
  INFO("the shutdown during a reload: " << failed);
  REQUIRE(b);
  CHECK(b->model == 0);
  CHECK(b->context == 0);
  CHECK(b->compute == 0);
  CHECK(b->n_rejected == 0);
  // The reload went on to the end (its weights were uploaded to the new peer) and they were given back
  // there before the shutdown answered.
  CHECK(gate.passed() >= 1);
  CHECK(second->stats().bytes_received.load() >= on_peer);
  CHECK(second->stats().buffers.load() == 0);
  CHECK(second->stats().buffer_bytes.load() == 0);
}
