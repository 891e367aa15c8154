// A connection to one peer server: synchronous request/response with timeouts, plain C++ (the remote-peer
// actor wraps it; rpc_device.h builds the runtime's device interfaces on it).
//
//   rpc::client c({.host = "127.0.0.1", .port = 50052, .key = key});
//   c.connect();                                   // TCP (or TLS), greeting, hello with authentication
//   auto devs = c.devices();                       // what the peer serves
//   remote_buffer b = c.alloc_buffer(0, 1 << 20);
//   c.set_tensor(b, 0, data, n, false);
//   c.health_check(std::chrono::seconds(1));       // false when the peer is gone
//   c.reconnect();                                 // a new connection: buffers of the old one are lost
//
// Every failure throws backend_error naming the peer ("peer 127.0.0.1:50052: connection lost: ..."); nothing
// aborts. A lost connection marks the client disconnected; the next request that does not name a buffer
// reconnects once by itself (auto_reconnect), and requests naming a buffer of an earlier connection throw
// ("buffer lost when the connection dropped"): handles carry the connection's epoch, so a stale handle can
// never reach a buffer of the new connection. One request at a time per client (a mutex serialises them).
//
// A request that runs long on the peer (a big graph) is judged by the peer's progress: the peer sends
// progress frames while it works, and each restarts the reply's timeout (io_timeout), so a slow peer is not
// a dead one. Health probes and capability questions go on a control connection of the client's own, which
// the peer serves on a thread that never runs a graph: they are answered however long a graph runs, and a
// hung peer (stopped, deadlocked) fails them within their timeout.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "backends/rpc/client_options.h"
#include "backends/rpc/wire/protocol.h"
#include "runtime/backend.h"

namespace troupe::rpc {

struct client_stats {
  uint64_t bytes_sent = 0;        // frames, headers included
  uint64_t bytes_received = 0;
  uint64_t requests = 0;          // frames sent
  uint64_t round_trips = 0;       // requests that waited for a reply
  uint64_t cache_hits = 0;        // uploads the peer served from its cache
  uint64_t cache_misses = 0;
  uint64_t graphs_sent = 0;
  uint64_t graphs_recomputed = 0;
  uint64_t outputs_served = 0;    // get_tensor answered from a graph reply's outputs
  uint64_t polled_reads = 0;      // reads that busy polling answered (no sleep on the socket)
  uint64_t connects = 0;
  uint64_t progress_frames = 0;   // the peer's "still at it" frames read while waiting for a reply
  uint64_t op_questions = 0;      // supports_op questions asked on the control connection
};

// The peer answered with an error status.
class remote_error : public backend_error {
 public:
  remote_error(status st, const std::string& msg) : backend_error(msg), st_(st) {}
  status code() const { return st_; }

 private:
  status st_;
};

// A buffer on the peer: its handle on the connection (epoch) that allocated it.
struct remote_buffer {
  uint64_t epoch = 0;
  uint64_t handle = 0;
};

class client {
 public:
  explicit client(client_options opts);
  ~client();
  client(const client&) = delete;
  client& operator=(const client&) = delete;

  // Connects and says hello (version check, authentication). Throws backend_error.
  void connect();
  void close();
  bool connected() const;
  // A new connection (the old one's buffers are gone on the peer).
  void reconnect();
  // Whether the peer answers a cheap request (device_count) within timeout; never throws, never reconnects
  // this connection. While another request holds the connection or graphs are queued on it (a graph may
  // compute for long), asks on the control connection instead (connected first when needed, within the
  // same timeout), which the peer answers whatever it computes.
  bool health_check(std::chrono::milliseconds timeout);
  // Connects anew with the same options as a control connection (hello included), asks device_count and
  // closes: whether the peer answers within timeout. Independent of this client's connections; never throws.
  bool probe(std::chrono::milliseconds timeout);
  // Increments with every successful connect.
  uint64_t epoch() const;

  // ---- down (the remote-peer actor's switch) ----
  // Marks the peer down: a request in flight fails at once (its socket is shut down under it), every later
  // request throws backend_error("peer host:port is down: <reason>") without touching the network, waiting
  // for the connection or reconnecting by itself. connect()/reconnect() clear it when they succeed.
  // Thread-safe, never blocks.
  void mark_down(const std::string& reason);
  // Called (on the thread of the failed request) when an established connection is lost; the argument
  // says why. Must not block or call back into this client.
  void set_on_lost(std::function<void(const std::string&)> f);
  std::string address() const;  // "host:port"
  version server_version() const;

  // ---- commands ----
  std::vector<device_info> devices();
  remote_buffer alloc_buffer(uint32_t device, uint64_t size);
  uint64_t alignment(uint32_t device);
  uint64_t max_size(uint32_t device);
  device_memory memory(uint32_t device);
  uint64_t buffer_base(remote_buffer b);
  void free_buffer(remote_buffer b);
  void buffer_clear(remote_buffer b, uint8_t value);
  // No round trip: errors surface with the next reply. With cacheable (weights) and size >= hash_threshold,
  // the hash goes first and the bytes only when the peer's cache misses.
  void set_tensor(remote_buffer b, uint64_t offset, const void* data, uint64_t size, bool cacheable);
  void get_tensor(remote_buffer b, uint64_t offset, void* out, uint64_t size);
  void copy_tensor(remote_buffer src, uint64_t src_offset, remote_buffer dst, uint64_t dst_offset, uint64_t size);
  // A byte range of a buffer to read back with a graph's reply.
  struct output_request {
    remote_buffer buffer;
    uint64_t offset = 0;
    uint64_t size = 0;
  };
  // Runs a graph message (u32 entry count, entries) on a device; when it is byte-identical to the last one
  // sent to that device on this connection, asks the peer to run its copy again instead (graph_recompute).
  // The reply carries the bytes of `outputs` (up to 64 ranges, 64 MiB): get_tensor within them is answered
  // here, without a round trip and without waiting for another thread's request in flight, until a write
  // overlaps them, a graph writes their buffer (`written`: the handles of the buffers the graph writes;
  // none given: every buffer) or another command is sent. The copies of the last few replies are kept.
  void compute(uint32_t device, std::vector<uint8_t> graph, const std::vector<output_request>& outputs = {},
               const std::optional<std::vector<uint64_t>>& written = std::nullopt);
  // A graph sent without waiting for its reply.
  struct ticket {
    uint64_t epoch = 0;
    uint64_t id = 0;  // 0: computed already
  };
  // Sends a graph as compute() does (never as a graph_recompute) and returns once it is on its way; the
  // peer runs what it is sent in order, so the requests after it keep their order. Its reply (the outputs'
  // bytes, or its failure) is read by wait(), or by the next request that needs a reply of its own, which
  // reads the replies before its own. A frame too large for the socket to take while replies are
  // outstanding waits for them first. Plain TCP only: over TLS (can_queue() false) it computes at once.
  ticket submit(uint32_t device, std::vector<uint8_t> graph, const std::vector<output_request>& outputs = {},
                const std::optional<std::vector<uint64_t>>& written = std::nullopt);
  // Waits up to timeout for t's reply, returning false early when wake_fd (>= 0) becomes readable; true once
  // it has been read. Other threads' requests go on meanwhile. Throws the graph's failure (remote_error), or
  // backend_error when its connection dropped (or no reply came within io_timeout).
  bool wait(ticket t, std::chrono::microseconds timeout, int wake_fd = -1);
  bool can_queue() const;
  void init_tensor(const wire_tensor& t);
  uint64_t alloc_size(uint32_t device, const wire_tensor& t);
  // Whether the peer's device would compute the node a supports_op question describes (its sources as leafs,
  // then the node: rpc_device.h, op_question): the peer's own device answers. Asked on the control
  // connection, so it never waits behind a graph. Throws unavailable_error when the peer is down or does not
  // answer (within connect_timeout), remote_error when it refuses the question, both naming the peer and
  // the command.
  bool supports_op(uint32_t device, std::span<const uint8_t> question);

  client_stats stats() const;
  void reset_stats();

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace troupe::rpc
