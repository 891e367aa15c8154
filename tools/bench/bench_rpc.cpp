// Remote-peer benchmarks: bulk transfers against a raw Asio socket, and generation with every layer on a
// loopback peer against the local CPU.
//
//   ./build/tools/bench/bench_rpc [--benchmark_filter=...]
//
// - transfer/raw_{set,get}/N and transfer/rpc_{set,get}/N: N bytes over loopback. raw: a blocking Asio socket
//   and a server thread that reads the bytes into memory and acknowledges with one byte (set), or writes
//   them (get); the floor any protocol pays. rpc: client::set_tensor followed by a one-round-trip request
//   (so the bytes have arrived), and client::get_tensor, against a peer server in this process.
// - ping/raw, ping/raw_poll and ping/rpc: one small request and its reply. raw sleeps on the socket for the
//   reply (and the server for the request); raw_poll busy-polls both ends (the floor for rpc, whose client
//   and server poll for a short window before sleeping: backends/rpc/wire/busy_poll.h).
// - generate/model:M/rpc:R/host1:H: 32 tokens decoded one at a time after a 5-token prompt (M: 0 stories260K
//   from ../shared/models, 1 SmolLM2-135M from models/, scripts/fetch-model), every layer on the CPU (R = 0)
//   or on a loopback peer's CPU (R = 1), with the same thread count (2) for the layers; H = 1 gives this
//   process's CPU backend (the token embeddings only) one thread. tok_per_s; for rpc, round_trips_per_token,
//   graphs_sent_per_token (the rest are graph_recompute) and polled_per_token (reads of this client that
//   busy polling answered, without sleeping on the socket). Peer and client share this machine's cores,
//   so the ratio is a lower bound for a peer on another machine.
#include <benchmark/benchmark.h>

#include <asio.hpp>

#include <filesystem>
#include <memory>
#include <thread>

#include "backends/cpu/cpu_backend.h"
#include "backends/rpc/rpc.h"
#include "backends/rpc/wire/busy_poll.h"
#include "net/rpc/peer_server.h"
#include "llm/llm_context.h"

using namespace troupe;
using asio::ip::tcp;

namespace {

constexpr int bench_threads = 2;

// ---- the raw baseline ----

// Reads exactly n bytes; with poll, by polling the non-blocking socket (yielding between attempts) for up
// to 2 ms before sleeping on it: the floor for a request/reply protocol that busy-polls (backends/rpc/wire/busy_poll.h).
void raw_read(tcp::socket& s, void* p, size_t n, bool poll) {
  auto* dst = static_cast<uint8_t*>(p);
  size_t done = 0;
  if (poll) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(2);
    std::error_code ec;
    rpc::busy_poll(until, [&] {
      done += s.read_some(asio::buffer(dst + done, n - done), ec);
      return done == n || (ec && ec != asio::error::would_block && ec != asio::error::try_again);
    });
    if (ec && ec != asio::error::would_block && ec != asio::error::try_again) throw std::system_error(ec);
    if (done == n) return;
    s.non_blocking(false);
  }
  asio::read(s, asio::buffer(dst + done, n - done));
  if (poll) s.non_blocking(true);
}

class raw_server {
 public:
  explicit raw_server(bool poll = false)
      : acceptor_(ioc_, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0)), buf_(size_t{64} << 20), poll_(poll) {
    port_ = acceptor_.local_endpoint().port();
    thread_ = std::thread([this] { serve(); });
  }
  uint16_t port() const { return port_; }

 private:
  void serve() {
    for (;;) {
      tcp::socket s(ioc_);
      acceptor_.accept(s);
      s.set_option(tcp::no_delay(true));
      s.non_blocking(poll_);
      try {
        for (;;) {
          uint8_t hdr[9];
          raw_read(s, hdr, sizeof hdr, poll_);
          uint64_t n = 0;
          for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(hdr[1 + i]) << (8 * i);
          const uint8_t ack = 0;
          if (hdr[0] == 1) {
            raw_read(s, buf_.data(), n, poll_);
            asio::write(s, asio::buffer(&ack, 1));
          } else if (hdr[0] == 2) {
            asio::write(s, asio::buffer(buf_.data(), n));
          } else {
            asio::write(s, asio::buffer(&ack, 1));
          }
        }
      } catch (const std::exception&) {
      }
    }
  }

  asio::io_context ioc_;
  tcp::acceptor acceptor_;
  std::vector<uint8_t> buf_;
  bool poll_;
  uint16_t port_ = 0;
  std::thread thread_;
};

struct raw_client {
  raw_client(uint16_t port, bool poll = false) : s(ioc), poll(poll) {
    s.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), port));
    s.set_option(tcp::no_delay(true));
    s.non_blocking(poll);
  }
  void header(uint8_t code, uint64_t n, std::vector<asio::const_buffer>& out, uint8_t* hdr) {
    hdr[0] = code;
    for (int i = 0; i < 8; ++i) hdr[1 + i] = static_cast<uint8_t>(n >> (8 * i));
    out.push_back(asio::buffer(hdr, 9));
  }
  void set(const uint8_t* p, uint64_t n) {
    uint8_t hdr[9];
    std::vector<asio::const_buffer> bufs;
    header(1, n, bufs, hdr);
    bufs.push_back(asio::buffer(p, n));
    asio::write(s, bufs);
    uint8_t ack;
    asio::read(s, asio::buffer(&ack, 1));
  }
  void get(uint8_t* p, uint64_t n) {
    uint8_t hdr[9];
    std::vector<asio::const_buffer> bufs;
    header(2, n, bufs, hdr);
    asio::write(s, bufs);
    asio::read(s, asio::buffer(p, n));
  }
  void ping() {
    uint8_t hdr[9];
    std::vector<asio::const_buffer> bufs;
    header(3, 0, bufs, hdr);
    asio::write(s, bufs);
    uint8_t ack;
    raw_read(s, &ack, 1, poll);
  }
  asio::io_context ioc;
  tcp::socket s;
  bool poll;
};

raw_client& raw() {
  static auto* srv = new raw_server();
  static auto* c = new raw_client(srv->port());
  return *c;
}

raw_client& raw_polled() {
  static auto* srv = new raw_server(true);
  static auto* c = new raw_client(srv->port(), true);
  return *c;
}

// ---- the peer ----

rpc::peer_server& peer() {
  static auto* srv = [] {
    rpc::peer_server_options o;
    o.host = "127.0.0.1";
    o.devices = {&cpu::cpu_device()};
    o.make_backend = [](device_i&) -> backend_ptr { return cpu::make_cpu_backend({.n_threads = bench_threads}); };
    auto* s = new rpc::peer_server(o);
    s->start();
    return s;
  }();
  return *srv;
}

device_i& remote_device() {
  static device_i* dev = rpc::add_peer("127.0.0.1:" + std::to_string(peer().port())).at(0);
  return *dev;
}

rpc::client& rpc_client() { return *rpc::client_of(remote_device()); }

rpc::remote_buffer& rpc_buffer() {
  static rpc::remote_buffer b = rpc_client().alloc_buffer(0, size_t{64} << 20);
  return b;
}

const std::vector<uint8_t>& payload() {
  static std::vector<uint8_t> v = [] {
    std::vector<uint8_t> x(size_t{64} << 20);
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<uint8_t>(i * 131);
    return x;
  }();
  return v;
}

void BM_raw_set(benchmark::State& state) {
  const auto n = static_cast<uint64_t>(state.range(0));
  raw_client& c = raw();
  for (auto _ : state) c.set(payload().data(), n);
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * n));
}

void BM_rpc_set(benchmark::State& state) {
  const auto n = static_cast<uint64_t>(state.range(0));
  rpc::client& c = rpc_client();
  const rpc::remote_buffer b = rpc_buffer();
  for (auto _ : state) {
    c.set_tensor(b, 0, payload().data(), n, false);
    c.buffer_base(b);  // one round trip: the bytes have arrived
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * n));
}

void BM_raw_get(benchmark::State& state) {
  const auto n = static_cast<uint64_t>(state.range(0));
  std::vector<uint8_t> out(n);
  raw_client& c = raw();
  for (auto _ : state) c.get(out.data(), n);
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * n));
}

void BM_rpc_get(benchmark::State& state) {
  const auto n = static_cast<uint64_t>(state.range(0));
  std::vector<uint8_t> out(n);
  rpc::client& c = rpc_client();
  const rpc::remote_buffer b = rpc_buffer();
  for (auto _ : state) c.get_tensor(b, 0, out.data(), n);
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * n));
}

void BM_raw_ping(benchmark::State& state) {
  raw_client& c = raw();
  for (auto _ : state) c.ping();
}

void BM_raw_poll_ping(benchmark::State& state) {
  raw_client& c = raw_polled();
  for (auto _ : state) c.ping();
}

void BM_rpc_ping(benchmark::State& state) {
  rpc::client& c = rpc_client();
  const rpc::remote_buffer b = rpc_buffer();
  for (auto _ : state) benchmark::DoNotOptimize(c.buffer_base(b));
}

// ---- generation ----

std::filesystem::path model_file(int which) {
  return which == 0 ? std::filesystem::path(TROUPE_TEST_MODEL_DIR) / "stories260K.gguf"
                    : std::filesystem::path(TROUPE_FETCHED_MODEL_DIR) / "SmolLM2-135M-Instruct.Q4_1.gguf";
}

void BM_generate(benchmark::State& state) {
  const int which = static_cast<int>(state.range(0));
  const bool remote = state.range(1) != 0;
  const auto path = model_file(which);
  if (!std::filesystem::exists(path)) {
    state.SkipWithError(("model " + path.string() + " is missing").c_str());
    return;
  }
  llm::model_params mp;
  if (remote) mp.devices = {{&remote_device(), 999}};
  auto m = llm::model::load(path, mp);
  // With every layer on the peer, this process's CPU only looks up the token embeddings: one thread.
  llm::llm_context ctx(*m, {.n_ctx = 256, .n_threads = remote && state.range(2) ? 1 : bench_threads});
  const std::vector<int32_t> prompt = {1, 403, 407, 261, 378};
  constexpr int n_gen = 32;
  uint64_t round_trips = 0, tokens = 0, graphs_sent = 0, polled = 0;
  for (auto _ : state) {
    ctx.kv().clear();
    llm::batch b;
    for (size_t i = 0; i < prompt.size(); ++i) b.add(prompt[i], static_cast<int32_t>(i), 0, i + 1 == prompt.size());
    ctx.decode(b);
    if (remote) rpc_client().reset_stats();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n_gen; ++i) {
      const auto l = ctx.logits(0);
      const auto t = static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
      b.clear();
      b.add(t, static_cast<int32_t>(prompt.size()) + i, 0, true);
      ctx.decode(b);
    }
    state.SetIterationTime(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    if (remote) {
      round_trips += rpc_client().stats().round_trips;
      graphs_sent += rpc_client().stats().graphs_sent;
      polled += rpc_client().stats().polled_reads;
    }
    tokens += n_gen;
  }
  state.counters["tok_per_s"] = benchmark::Counter(static_cast<double>(tokens), benchmark::Counter::kIsRate);
  if (remote) {
    state.counters["round_trips_per_token"] = static_cast<double>(round_trips) / static_cast<double>(tokens);
    state.counters["graphs_sent_per_token"] = static_cast<double>(graphs_sent) / static_cast<double>(tokens);
    state.counters["polled_per_token"] = static_cast<double>(polled) / static_cast<double>(tokens);
  }
}

}  // namespace

#define TRANSFER_SIZES Arg(64 << 10)->Arg(1 << 20)->Arg(16 << 20)->Arg(64 << 20)
BENCHMARK(BM_raw_set)->Name("transfer/raw_set")->TRANSFER_SIZES->UseRealTime();
BENCHMARK(BM_rpc_set)->Name("transfer/rpc_set")->TRANSFER_SIZES->UseRealTime();
BENCHMARK(BM_raw_get)->Name("transfer/raw_get")->TRANSFER_SIZES->UseRealTime();
BENCHMARK(BM_rpc_get)->Name("transfer/rpc_get")->TRANSFER_SIZES->UseRealTime();
BENCHMARK(BM_raw_ping)->Name("ping/raw")->UseRealTime();
BENCHMARK(BM_raw_poll_ping)->Name("ping/raw_poll")->UseRealTime();
BENCHMARK(BM_rpc_ping)->Name("ping/rpc")->UseRealTime();
BENCHMARK(BM_generate)
    ->Name("generate")
    ->ArgNames({"model", "rpc", "host1"})
    ->Args({0, 0, 0})
    ->Args({0, 1, 0})
    ->Args({0, 1, 1})
    ->Args({1, 0, 0})
    ->Args({1, 1, 0})
    ->Args({1, 1, 1})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
