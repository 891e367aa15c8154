// Models with their layers on a remote peer: the same greedy tokens as on the local CPU. The peer runs in this
// process (a server on loopback) or as a real `troupe peer` process.
#include <catch2/catch.hpp>

#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <string>

#include "backends/registry.h"
#include "backends/cpu/cpu_backend.h"
#include "backends/rpc/rpc.h"
#include "backends/rpc/rpc_client.h"
#include "llm/llm_context.h"
#include "runtime/trace.h"
#include "tests/net/test_server.h"
#include "tests/support/greedy.h"
#include "tests/support/peer_process.h"
#include "tests/support/queued_trace.h"
#include "tests/support/ring.h"
#include "tests/support/failing_backend.h"
#include "tests/support/tcp_proxy.h"
#include "tests/test_models.h"

extern char** environ;

using namespace troupe;
using namespace troupe::llm;

namespace {

using test::argmax_of;
using test::greedy;
using test::stories_prompt;
using test::stories_ref;

using test::peer_process;

// A prompt of 100 tokens spread over the vocabulary, every one an output: 7 micro-batches of 16.
batch hundred_tokens(const model& m) {
  batch b;
  for (int32_t i = 0; i < 100; ++i) b.add(static_cast<int32_t>((i * 7919 + 13) % m.hp().n_vocab), i, 0, true);
  return b;
}

}  // namespace

TEST_CASE("stories260K with every layer on a loopback peer: the 32 greedy tokens of the reference", "[rpc][llm]") {
  const auto path = test::model_path("stories260K.gguf");
  if (!path) return;
  auto srv = rpc::testing::start_server();
  const auto devs = rpc::add_peer("127.0.0.1:" + std::to_string(srv->port()));
  REQUIRE(devs.size() == 1);
  auto m = model::load(*path, {.devices = {{devs[0], 99}}});
  for (const auto& l : m->layers()) CHECK(&l.buft->device() == devs[0]);
  llm_context ctx(*m, {.n_ctx = 256, .n_threads = 2});
  REQUIRE(ctx.sched().n_backends() == 2);
  CHECK(&ctx.sched().backend(0).device() == devs[0]);
  auto client = rpc::client_of(*devs[0]);
  client->reset_stats();
  CHECK(greedy(ctx, stories_prompt, 32) == stories_ref);
  const auto s = client->stats();
  // 33 decodes: the prompt, then one per token.
  WARN("stories260K on a loopback peer: " << static_cast<double>(s.round_trips) / 33 << " round trips and "
                                          << static_cast<double>(s.requests) / 33 << " frames per token; "
                                          << s.graphs_sent << " graphs sent, " << s.graphs_recomputed << " recomputed");
  CHECK(s.round_trips <= 33 * 3);
  CHECK(srv->stats().error_replies == 0);
}

TEST_CASE("a model layer on a real `troupe peer` process", "[rpc][llm][process]") {
  const auto path = test::model_path("stories260K.gguf");
  if (!path) return;
  peer_process peer;
  const auto devs = rpc::add_peer("127.0.0.1:" + std::to_string(peer.port()));
  REQUIRE(devs.size() == 1);
  CHECK_THAT(devs[0]->description(), Catch::Contains("CPU"));
  auto m = model::load(*path, {.devices = {{devs[0], 99}}});
  {
    llm_context ctx(*m, {.n_ctx = 64, .n_threads = 1});
    CHECK(greedy(ctx, stories_prompt, 8) == std::vector<int32_t>(stories_ref.begin(), stories_ref.begin() + 8));
  }
  m.reset();
  const int st = peer.stop();
  CHECK(WIFEXITED(st));
  CHECK(WEXITSTATUS(st) == 0);
  // The peer is gone: the device answers with errors, it does not take the process down.
  auto c = rpc::client_of(*devs[0]);
  CHECK_FALSE(c->health_check(std::chrono::milliseconds(500)));
  CHECK_THROWS_AS(devs[0]->buffer_type().alloc_buffer(1024), backend_error);
}

TEST_CASE("a model on a `troupe peer --device vulkan` process: the reference's tokens from its Vulkan device", "[rpc][llm][process][vulkan]") {
  const auto path = test::model_path("stories260K.gguf");
  if (!path) return;
  register_builtin_backends();
  if (registry::instance().find("Vulkan0") == nullptr) {
    return test::skip_unless_ci("no Vulkan device on this machine (troupe devices says why; CI has lavapipe's)");
  }
  peer_process peer({}, "vulkan");
  const auto devs = rpc::add_peer("127.0.0.1:" + std::to_string(peer.port()));
  REQUIRE(devs.size() == 1);
  CHECK_THAT(devs[0]->description(), !Catch::Contains("CPU"));  // the peer's Vulkan0, not its CPU
  auto m = model::load(*path, {.devices = {{devs[0], 99}}});
  {
    llm_context ctx(*m, {.n_ctx = 64, .n_threads = 1});
    CHECK(greedy(ctx, stories_prompt, 8) == std::vector<int32_t>(stories_ref.begin(), stories_ref.begin() + 8));
  }
  m.reset();
  CHECK(WEXITSTATUS(peer.stop()) == 0);
}

TEST_CASE("`troupe peer` refuses a non-loopback address without a key", "[rpc][process]") {
  int err[2];
  REQUIRE(::pipe(err) == 0);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, err[1], 2);
  posix_spawn_file_actions_addclose(&fa, err[0]);
  // A documentation address (never this machine's): refused before any socket is opened.
  std::vector<std::string> args = {TROUPE_PEER_BIN, "peer", "--host", "192.0.2.1", "--port", "0"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  REQUIRE(posix_spawn(&pid, TROUPE_PEER_BIN, &fa, nullptr, argv.data(), environ) == 0);
  posix_spawn_file_actions_destroy(&fa);
  ::close(err[1]);
  std::string text;
  char buf[512];
  for (ssize_t n; (n = ::read(err[0], buf, sizeof buf)) > 0;) text.append(buf, static_cast<size_t>(n));
  ::close(err[0]);
  int st = 0;
  ::waitpid(pid, &st, 0);
  CHECK(WIFEXITED(st));
  CHECK(WEXITSTATUS(st) == 1);
  CHECK_THAT(text, Catch::Contains("--auth-key-file") && Catch::Contains("--insecure"));
}

TEST_CASE("a prompt pipelined over the CPU and a real `troupe peer`: logits bit-identical to one micro-batch at a time", "[rpc][llm][process][pipeline]") {
  const auto path = test::model_path("stories260K.gguf");
  if (!path) return;
  peer_process peer;
  const auto devs = rpc::add_peer("127.0.0.1:" + std::to_string(peer.port()));
  REQUIRE(devs.size() == 1);
  auto m = model::load(*path, {.devices = {{devs[0], 3}}});  // the last 3 layers and the output on the peer
  std::vector<int32_t> prompt(100);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((i * 7919 + 13) % m->hp().n_vocab);
  const auto logits_of = [&](uint32_t n_pipeline) {
    llm_context ctx(*m, {.n_ctx = 256, .n_ubatch = 16, .n_threads = 1, .n_pipeline = n_pipeline});
    batch b;
    for (size_t i = 0; i < prompt.size(); ++i) b.add(prompt[i], static_cast<int32_t>(i), 0, true);
    ctx.decode(b);
    CHECK(ctx.stats().n_pipelined == (n_pipeline > 1 ? 1u : 0u));
    std::vector<float> out;
    for (size_t i = 0; i < ctx.n_outputs(); ++i) {
      const auto l = ctx.logits(i);
      out.insert(out.end(), l.begin(), l.end());
    }
    // The next token after the prompt: the caches hold the same.
    b.clear();
    b.add(prompt[0], static_cast<int32_t>(prompt.size()), 0, true);
    ctx.decode(b);
    const auto l = ctx.logits(0);
    out.insert(out.end(), l.begin(), l.end());
    return out;
  };
  const auto serial = logits_of(1);
  const auto piped = logits_of(4);
  REQUIRE(serial.size() == 101 * m->hp().n_vocab);
  CHECK(piped.size() == serial.size());
  CHECK(std::equal(piped.begin(), piped.end(), serial.begin(), [](float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }));
}

namespace {

// Every output's logits of a prompt of `n` tokens decoded in micro-batches of `n_ubatch`, then the next
// token's: what the model's devices compute, as bits.
std::vector<float> prompt_logits(const model& m, int32_t n, uint32_t n_ubatch) {
  llm_context ctx(m, {.n_ctx = 512, .n_ubatch = n_ubatch, .n_threads = 1});
  batch b;
  for (int32_t i = 0; i < n; ++i) b.add(static_cast<int32_t>((i * 7919 + 13) % m.hp().n_vocab), i, 0, true);
  ctx.decode(b);
  std::vector<float> out;
  for (size_t i = 0; i < ctx.n_outputs(); ++i) {
    const auto l = ctx.logits(i);
    out.insert(out.end(), l.begin(), l.end());
  }
  b.clear();
  b.add(13, n, 0, true);
  ctx.decode(b);
  const auto l = ctx.logits(0);
  out.insert(out.end(), l.begin(), l.end());
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// A model with every layer on a real `troupe peer --device cpu` against the same file on this CPU: a peer's
// CPU keeps the CPU's KV layout and attention (protocol 2.1), so the logits are the same bits, whatever the
// prompt's length (a random-weight 1B model's greedy text flipped at 638 tokens when the peer's layers took
// the transposed V cache and the unfused attention of a GPU).
void check_cpu_peer_bits(const std::filesystem::path& path, int32_t n, uint32_t n_ubatch) {
  peer_process peer;
  const auto devs = rpc::add_peer("127.0.0.1:" + std::to_string(peer.port()));
  REQUIRE(devs.size() == 1);
  CHECK(devs[0]->cpu_kernels());
  auto remote = model::load(path, {.devices = {{devs[0], 99}}});
  auto local = model::load(path, {});
  const auto want = prompt_logits(*local, n, n_ubatch);
  REQUIRE(want.size() == static_cast<size_t>(n + 1) * local->hp().n_vocab);
  auto c = rpc::client_of(*devs[0]);
  c->reset_stats();
  CHECK(same_bits(prompt_logits(*remote, n, n_ubatch), want));
  CHECK(c->stats().graphs_sent > 0);
}

// Sequence groups as a ring over the CPU and a real `troupe peer` (its last `layers` layers and the output on
// the peer): the tokens of one batch per step, the bits of the groups one after another.
void check_ring_over_peer(const std::filesystem::path& path, int32_t layers, int n) {
  peer_process peer;
  const auto devs = rpc::add_peer("127.0.0.1:" + std::to_string(peer.port()));
  REQUIRE(devs.size() == 1);
  auto m = model::load(path, {.devices = {{devs[0], layers}}});
  test::check_ring(*m, n);
}

}  // namespace

TEST_CASE("stories260K: sequence groups as a ring over the CPU and a real `troupe peer` give the same tokens and bits", "[rpc][llm][process][pipeline][ring]") {
  const auto path = test::model_path("stories260K.gguf");
  if (!path) return;
  check_ring_over_peer(*path, 3, 16);
}

TEST_CASE("SmolLM2: sequence groups as a ring over the CPU and a real `troupe peer` give the same tokens and bits", "[rpc][llm][process][pipeline][ring][smollm2]") {
  const auto path = test::smollm2_path();
  if (!path) return;
  check_ring_over_peer(*path, 15, 8);
}

TEST_CASE("stories260K with every layer on a real `troupe peer --device cpu`: a prompt of several micro-batches gives this CPU's logits, bit for bit", "[rpc][llm][process][bits]") {
  const auto path = test::model_path("stories260K.gguf");
  if (!path) return;
  check_cpu_peer_bits(*path, 150, 64);
}

TEST_CASE("SmolLM2 with every layer on a real `troupe peer --device cpu`: a prompt of several micro-batches gives this CPU's logits, bit for bit", "[rpc][llm][process][bits][smollm2]") {
  const auto path = test::smollm2_path();
  if (!path) return;
  check_cpu_peer_bits(*path, 150, 64);
}

TEST_CASE("a peer of protocol 2.0 is not sent the CPU's attention (flash_attn, masked products) it cannot rebuild: its layers keep the transposed V cache", "[rpc][llm][version]") {
  const auto path = test::model_path("stories260K.gguf");
  if (!path) return;
  for (const rpc::version v : {rpc::version{2, 0, 0}, rpc::protocol_version}) {
    rpc::peer_server_options so;
    so.server_version = v;
    auto srv = rpc::testing::start_server(std::move(so));
    const auto devs = rpc::add_peer("127.0.0.1:" + std::to_string(srv->port()));
    REQUIRE(devs.size() == 1);
    const bool new_peer = v.minor >= 1;
    CHECK(devs[0]->cpu_kernels() == new_peer);
    auto m = model::load(*path, {.devices = {{devs[0], 99}}});
    llm_context ctx(*m, {.n_ctx = 256, .n_threads = 1});
    CHECK(ctx.kv().v_trans(0) == !new_peer);
    CHECK(greedy(ctx, stories_prompt, 16) == std::vector<int32_t>(stories_ref.begin(), stories_ref.begin() + 16));
    CHECK(srv->stats().error_replies == 0);
  }
}

TEST_CASE("a peer failing mid-pipeline fails the decode with its error, keeps the completed micro-batches, and the next decode works", "[rpc][llm][pipeline]") {
  const auto path = test::model_path("stories260K.gguf");
  if (!path) return;
  std::atomic<int> graphs{0}, fail_at{-1};
  rpc::peer_server_options so;
  so.make_backend = [&](device_i&) -> backend_ptr { return std::make_unique<test::failing_backend>(graphs, fail_at); };
  auto srv = rpc::testing::start_server(std::move(so));
  const auto devs = rpc::add_peer("127.0.0.1:" + std::to_string(srv->port()));
  REQUIRE(devs.size() == 1);
  auto m = model::load(*path, {.devices = {{devs[0], 3}}});
  const batch b = hundred_tokens(*m);
  // What a context that never fails gives, and how many graphs the peer computes per micro-batch.
  llm_context fresh(*m, {.n_ctx = 256, .n_ubatch = 16, .n_threads = 1, .n_pipeline = 1});
  fresh.decode(b);
  REQUIRE(graphs % 7 == 0);
  const int per_ubatch = graphs / 7;
  graphs = 0;
  // The peer fails micro-batch 2's first graph: micro-batches 0 and 1 completed, 2..6 did not.
  fail_at = 2 * per_ubatch + 1;
  llm_context ctx(*m, {.n_ctx = 256, .n_ubatch = 16, .n_threads = 1, .n_pipeline = 4});
  CHECK_THROWS_WITH(ctx.decode(b), Catch::Contains("injected failure of graph " + std::to_string(2 * per_ubatch + 1)));
  CHECK(ctx.kv().used_cells() == 32);
  CHECK(ctx.n_outputs() == 0);
  // The next decode works and gives what a context that never failed gives.
  ctx.kv().clear();
  ctx.decode(b);
  std::vector<float> again(ctx.logits(99).begin(), ctx.logits(99).end());
  CHECK(std::equal(again.begin(), again.end(), fresh.logits(99).begin()));
  CHECK(ctx.kv().used_cells() == 100);
}

TEST_CASE("a prompt pipelined over the CPU and a peer sends the next micro-batch's inputs and graph while the peer computes the one before: the same bits", "[rpc][llm][pipeline][queue]") {
  const auto path = test::model_path("stories260K.gguf");
  if (!path) return;
  // The peer's first graph (micro-batch 0's split) waits until the client has sent a second one: only a
  // client that sends before the first reply came lets it go (otherwise it waits 20 s and the test fails).
  std::shared_ptr<rpc::client> cl;
  std::atomic<bool> second_seen{false};
  std::atomic<int> graphs{1000};  // (counted from 0 for the pipelined decode only)
  struct holding final : backend_i {
    std::unique_ptr<cpu::cpu_backend> inner = cpu::make_cpu_backend({.n_threads = 1});
    std::function<void()> before_first;
    std::atomic<int>& count;
    explicit holding(std::atomic<int>& n) : count(n) {}
    std::string_view name() const override { return inner->name(); }
    device_i& device() const override { return inner->device(); }
    void graph_compute(graph& g) override {
      if (++count == 1 && before_first) before_first();
      inner->graph_compute(g);
    }
  };
  rpc::peer_server_options so;
  so.make_backend = [&](device_i&) -> backend_ptr {
    auto be = std::make_unique<holding>(graphs);
    be->before_first = [&] {
      second_seen = rpc::testing::wait_for([&] { return cl && cl->stats().graphs_sent >= 2; }, std::chrono::seconds(20));
    };
    return be;
  };
  auto srv = rpc::testing::start_server(std::move(so));
  const auto devs = rpc::add_peer("127.0.0.1:" + std::to_string(srv->port()));
  REQUIRE(devs.size() == 1);
  auto m = model::load(*path, {.devices = {{devs[0], 3}}});
  const batch b = hundred_tokens(*m);
  llm_context serial(*m, {.n_ctx = 256, .n_ubatch = 16, .n_threads = 1, .n_pipeline = 1});
  serial.decode(b);
  llm_context piped(*m, {.n_ctx = 256, .n_ubatch = 16, .n_threads = 1, .n_pipeline = 4});
  graphs = 0;
  cl = rpc::client_of(*devs[0]);
  cl->reset_stats();
  trace::clear();
  trace::enable(true);
  piped.decode(b);
  trace::enable(false);
  CHECK(second_seen);
  for (int i = 0; i < 100; ++i) {
    INFO("token " << i);
    REQUIRE(test::same_bits({piped.logits(i).begin(), piped.logits(i).end()}, {serial.logits(i).begin(), serial.logits(i).end()}));
  }
  // The trace shows it: micro-batch 1's graph went out ("submit", transfers) before micro-batch 0's split
  // on the peer ended.
  test::check_next_submitted_before_first_split_ended(trace::events(), devs[0]->name());
}

TEST_CASE("a peer behind a slow link (2 ms each way): pipelined and grouped decoding give the same bits, and a cut link fails the decode naming the peer", "[rpc][llm][pipeline][proxy]") {
  const auto path = test::model_path("stories260K.gguf");
  if (!path) return;
  auto srv = rpc::testing::start_server();
  test::tcp_proxy proxy({.target_port = srv->port(), .latency = std::chrono::milliseconds(2)});
  const std::string addr = "127.0.0.1:" + std::to_string(proxy.port());
  const auto devs = rpc::add_peer(addr);
  REQUIRE(devs.size() == 1);
  auto m = model::load(*path, {.devices = {{devs[0], 3}}});
  const llm::context_params cp{.n_ctx = 512, .n_ubatch = 16, .n_seq_max = 4, .n_threads = 1, .n_pipeline = 4};
  llm::context_params serial_cp = cp;
  serial_cp.n_pipeline = 1;
  llm_context ring(*m, cp), serial(*m, serial_cp);
  const auto r = test::generate_four(ring, 6, 2);
  const auto s = test::generate_four(serial, 6, 2);
  for (size_t q = 0; q < 4; ++q) {
    INFO("sequence " << q);
    CHECK(r.tokens[q] == s.tokens[q]);
    CHECK(test::same_bits(r.logits[q], s.logits[q]));
  }
  // A prompt of 4 micro-batches, pipelined through the slow link, then the link is cut: the decode fails
  // with an error naming the peer (the connection's end, not a timeout), and nothing stays in flight.
  ring.kv().clear();
  batch b;
  for (int32_t i = 0; i < 64; ++i) b.add(test::stories_prompt[static_cast<size_t>(i % 5)], i, 0, i == 63);
  ring.decode(b);
  CHECK(ring.stats().n_pipelined == 2);
  ring.kv().clear();
  proxy.cut();
  proxy.refuse(true);
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(ring.decode(b), Catch::Contains(addr));
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60));  // generous: the I/O timeout is 300 s
}
