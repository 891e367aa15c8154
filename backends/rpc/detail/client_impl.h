// The state of an rpc::client and its pieces, one concern per file: the connection's lifecycle (connect,
// hello, close, down, reconnect, health checks: client_connection.cpp), frames on the byte stream (sending,
// holding small frames back, replies, graph outputs: client_frames.cpp) and the commands
// (rpc_client.cpp). The byte stream itself is client_transport.h; when to poll for a recompute reply is
// latency_estimator.h. Internal to troupe_backend_rpc.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "backends/rpc/client_transport.h"
#include "backends/rpc/latency_estimator.h"
#include "backends/rpc/rpc_client.h"

namespace troupe::rpc {

struct client::impl {
  client_options opts;
  client_options initial_opts;  // as constructed (probe connections use these; opts.io_timeout varies)
  std::string addr;             // "host:port"
  mutable std::mutex mu;        // one request at a time
  client_transport io;
  std::atomic<bool> up{false};  // connected (the transport is open)
  bool established = false;     // hello done: losing the connection now is news for on_lost
  std::atomic<uint64_t> epoch{0};
  version server_ver;
  client_stats st;
  std::map<uint32_t, std::vector<uint8_t>> last_graph;  // per device: the last graph the peer holds
  latency_estimator recompute_latency;                  // per device: graph_recompute's reply times

  // Down (mark_down): every request fails at once, without waiting for the mutex or reconnecting.
  std::atomic<bool> down{false};
  mutable std::mutex down_mu;  // down_reason, on_lost
  std::string down_reason;
  std::function<void(const std::string&)> on_lost;

  // ---- the connection (client_connection.cpp) ----

  void throw_if_down() const;
  // The lock for one request: fails fast while the peer is marked down (before and after waiting).
  std::unique_lock<std::mutex> enter();
  // Closes the connection (telling on_lost when it was established) and throws backend_error naming the peer.
  [[noreturn]] void fail(const std::string& what);
  // Tells the owner (the remote-peer actor) that an established connection was lost.
  void notify_lost(const std::string& why);
  void close_locked();
  // A new connection: transport, greeting, hello (version and authentication).
  void connect_locked();
  void handshake_locked();
  // Connected, or reconnected when allowed (auto_reconnect); otherwise throws.
  void ensure_up(bool may_reconnect);
  // b belongs to the current connection.
  void check(remote_buffer b) const;

  // ---- frames (client_frames.cpp) ----

  // The transport's operations; a transport_error fails the request (fail()).
  void write_all(std::span<const asio::const_buffer> bufs, uint64_t total);
  void read_exact(void* p, size_t n, std::optional<poll_window> window = std::nullopt);
  // Sends a frame now, after any frames held back.
  void send_frame(command c, std::span<const uint8_t> a, std::span<const uint8_t> b = {}, std::span<const uint8_t> d = {});
  // A frame without a reply, small enough to hold back until the next frame that is sent at once.
  void hold_frame(command c, std::span<const uint8_t> a, std::span<const uint8_t> b);
  // Reads a reply header: its payload size. An error status's message is read and thrown (remote_error)
  // unless throw_on_error is false (the status then goes to out_status).
  uint64_t read_ok(command c, bool throw_on_error = true, status* out_status = nullptr,
                   std::optional<poll_window> window = std::nullopt);
  // A request and its whole reply (at most max_reply bytes).
  std::vector<uint8_t> call(command c, std::span<const uint8_t> payload, uint64_t max_reply);
  // A graph reply carries its outputs' bytes: they answer get_tensor until something may have changed
  // them. Kept for the last few replies (a pipeline's slots each read theirs after the next slot's graph
  // went out); a write drops the copies it overlaps, a graph those in the buffers it writes, anything
  // else all of them. Under outputs_mu, not mu: get_tensor is answered from them while another thread's
  // request is in flight.
  void receive_outputs(uint64_t n, uint64_t expected);
  bool from_outputs(remote_buffer b, uint64_t offset, void* out, uint64_t size);
  void drop_outputs();
  void drop_outputs(uint64_t handle, uint64_t offset, uint64_t size);  // those overlapping the range
  void drop_outputs_in(const std::vector<uint64_t>& handles);         // those in these buffers

  struct output_copy {
    output_request range;
    std::vector<uint8_t> bytes;
  };
  std::vector<output_request> pending_outputs;  // asked with the graph in flight
  std::mutex outputs_mu;
  std::vector<output_copy> outputs;  // of the last graph replies, oldest first
  uint64_t outputs_served = 0;       // under outputs_mu
  static constexpr size_t max_output_copies = 256;
  static constexpr uint64_t max_output_copy_bytes = uint64_t{64} << 20;

  static constexpr size_t max_held = 256u << 10;
  std::vector<uint8_t> held;  // frames not sent yet (see hold_frame)
};

}  // namespace troupe::rpc
