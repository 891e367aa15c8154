// The RPC debug switch (TROUPE_RPC_DEBUG, or llama.cpp's GGML_RPC_DEBUG; peer_server_options::debug): one debug line
// per command the server received, with its arguments and result, streamed uploads included, and the
// client's connect / hello / alloc / close; nothing formatted when the switch is off.
#include <catch2/catch.hpp>

#include <algorithm>
#include <mutex>
#include <regex>
#include <string>
#include <vector>

#include "backends/rpc/rpc_client.h"
#include "runtime/log.h"
#include "tests/net/test_server.h"

using namespace troupe;
using namespace troupe::rpc;
using namespace std::chrono_literals;

namespace {

// Captures every message at every level while alive; the logger's level and sink are restored after.
struct captured_log {
  std::mutex mu;
  std::vector<std::pair<log_level, std::string>> lines;
  log_level saved = get_log_level();
  captured_log() {
    set_log_level(log_level::debug);
    set_log_sink([this](log_level l, std::string_view m) {
      std::lock_guard lock(mu);
      lines.emplace_back(l, std::string(m));
    });
  }
  ~captured_log() {
    set_log_sink({});
    set_log_level(saved);
  }
  std::vector<std::string> matching(const std::string& pattern) {
    std::lock_guard lock(mu);
    std::vector<std::string> out;
    const std::regex re(pattern);
    for (const auto& [l, m] : lines) {
      if (l == log_level::debug && std::regex_search(m, re)) out.push_back(m);
    }
    return out;
  }
};

// The server's lines for commands: "rpc 127.0.0.1:P: <command> ...".
const std::string command_line =
    "^rpc 127\\.0\\.0\\.1:[0-9]+: (hello|device_count|alloc_buffer|get_alignment|get_max_size|buffer_get_base|free_buffer|"
    "buffer_clear|set_tensor|set_tensor_hash|get_tensor|copy_tensor|graph_compute|graph_recompute|get_device_memory|"
    "init_tensor|get_alloc_size) ";

// A client session that touches most commands: queries, buffers, a small and a streamed upload, reads, a
// failed allocation; its request count.
uint64_t exercise(uint16_t port, bool debug) {
  client_options co{.host = "127.0.0.1", .port = port, .io_timeout = 20s};
  co.debug = debug;
  client c(co);
  c.connect();
  (void)c.devices();
  (void)c.alignment(0);
  (void)c.max_size(0);
  (void)c.memory(0);
  const remote_buffer b = c.alloc_buffer(0, 3u << 20);
  (void)c.buffer_base(b);
  std::vector<uint8_t> bytes(3u << 20, 5);
  c.set_tensor(b, 0, bytes.data(), 4096, false);             // in one frame
  c.set_tensor(b, 4096, bytes.data(), 2u << 20, false);      // streamed (over 1 MiB)
  std::vector<uint8_t> back(4096);
  c.get_tensor(b, 4096, back.data(), back.size());
  CHECK(back == std::vector<uint8_t>(4096, 5));
  c.buffer_clear(b, 0);
  c.copy_tensor(b, 0, b, 8192, 1024);
  CHECK_THROWS(c.alloc_buffer(0, uint64_t{1} << 62));        // refused by the peer
  c.free_buffer(b);
  return c.stats().requests;
}

}  // namespace

TEST_CASE("with the RPC debug switch the server logs every command it received, streamed uploads included, with arguments and results", "[rpc][debug]") {
  captured_log log;
  peer_server_options o;
  o.debug = true;
  auto srv = testing::start_server(std::move(o));
  const uint64_t requests = exercise(srv->port(), true);
  // Every request was answered or (set_tensor) read before the next one's reply, except possibly the last.
  REQUIRE(testing::wait_for([&] { return srv->stats().debug_lines == requests; }));
  const auto lines = log.matching(command_line);
  INFO([&] {
    std::string all;
    for (const auto& l : lines) all += l + "\n";
    return all;
  }());
  CHECK(lines.size() == requests);
  CHECK(srv->stats().debug_lines == requests);
  const std::string server = "^rpc 127\\.0\\.0\\.1:[0-9]+: ";
  // The arguments and results llama.cpp's rpc-server lines carry.
  CHECK(log.matching(server + "hello client [0-9]+\\.[0-9]+\\.[0-9]+ -> ok, server").size() == 1);
  CHECK(log.matching(server + "device_count -> 1 devices").size() == 1);
  CHECK(log.matching(server + "alloc_buffer device 0, size 3145728 -> handle [0-9]+, remote_ptr 0x[0-9a-f]+").size() == 1);
  CHECK(log.matching(server + "alloc_buffer device 0, size 4611686018427387904 -> failed: ").size() == 1);
  CHECK(log.matching(server + "set_tensor handle [0-9]+, offset 0, size 4096$").size() == 1);
  CHECK(log.matching(server + "set_tensor handle [0-9]+, offset 4096, size 2097152 \\(streamed\\)").size() == 1);
  CHECK(log.matching(server + "get_tensor handle [0-9]+, offset 4096, size 4096 -> ok, 4096 bytes back").size() == 1);
  CHECK(log.matching(server + "copy_tensor handle [0-9]+ offset 0 -> handle [0-9]+ offset 8192, size 1024 -> ok").size() == 1);
  CHECK(log.matching(server + "get_device_memory device 0 -> free [0-9]+, total [0-9]+").size() == 1);
  CHECK(log.matching(server + "free_buffer handle [0-9]+ -> ok").size() == 1);
  // The client's side: connect, hello with the versions, the allocations with their results, the close.
  CHECK(log.matching("^rpc client 127\\.0\\.0\\.1:[0-9]+: connected$").size() == 1);
  CHECK(log.matching("^rpc client 127\\.0\\.0\\.1:[0-9]+: hello client [0-9.]+ -> ok, server [0-9.]+$").size() == 1);
  CHECK(log.matching("^rpc client 127\\.0\\.0\\.1:[0-9]+: alloc_buffer device 0, size 3145728 -> handle [0-9]+, remote_ptr 0x").size() == 1);
  CHECK(log.matching("^rpc client 127\\.0\\.0\\.1:[0-9]+: alloc_buffer device 0, size 4611686018427387904 -> failed: ").size() == 1);
  CHECK(log.matching("^rpc client 127\\.0\\.0\\.1:[0-9]+: close$").size() == 1);
  // A refused allocation is the client's to report: at debug on the server, not a warning.
  std::lock_guard lock(log.mu);
  CHECK(std::none_of(log.lines.begin(), log.lines.end(), [](const auto& l) { return l.first >= log_level::warn; }));
}

TEST_CASE("without the RPC debug switch the server formats no command line, and a malformed request stays a warning", "[rpc][debug]") {
  captured_log log;  // everything at debug level reaches the sink: a formatted line would show
  peer_server_options o;
  o.debug = false;
  auto srv = testing::start_server(std::move(o));
  const uint64_t requests = exercise(srv->port(), false);
  CHECK(requests > 10);
  CHECK(srv->stats().debug_lines == 0);
  CHECK(log.matching(command_line).empty());
  CHECK(log.matching("^rpc client ").empty());
  // The refused allocation: at debug (the client reports it), never above.
  CHECK(log.matching("^rpc 127\\.0\\.0\\.1:[0-9]+: alloc_buffer: ").size() == 1);
}
