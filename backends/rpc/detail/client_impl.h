// The state of an rpc::client and its pieces, one concern per file: the connection's lifecycle (connect,
// hello, close, down, reconnect, health checks: client_connection.cpp), frames on the byte stream (sending,
// holding small frames back, replies, graph outputs: client_frames.cpp) and the commands
// (rpc_client.cpp). The byte stream itself is client_transport.h; when to poll for a recompute reply is
// latency_estimator.h. Internal to troupe_backend_rpc.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <exception>
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
  std::string who;              // in messages: addr, or "name (host:port)"
  mutable std::mutex mu;        // one request at a time
  client_transport io;
  std::atomic<bool> up{false};  // connected (the transport is open)
  bool established = false;     // hello done: losing the connection now is news for on_lost
  std::atomic<uint64_t> epoch{0};
  version server_ver;
  client_stats st;
  std::map<uint32_t, std::vector<uint8_t>> last_graph;  // per device: the last graph the peer holds
  latency_estimator recompute_latency;                  // per device: graph_recompute's reply times
  std::chrono::steady_clock::time_point heard{};        // the last progress frame (under mu)

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

  // ---- the control connection (client_control.cpp) ----

  // A client of its own with the control flag, made on first use (health checks while this connection is
  // busy, supports_op); dropped when this connection is made anew or marked down, so that the next use
  // connects to the peer as it is then.
  std::mutex control_mu;
  std::shared_ptr<client> control;
  std::atomic<uint64_t> op_questions{0};
  std::shared_ptr<client> control_client();
  void drop_control(bool interrupt);
  // device_count on the control connection (connecting it first when needed), all within timeout.
  bool control_ping(std::chrono::milliseconds timeout);
  // A fresh control connection, device_count, closed (client::probe).
  static bool probe_once(const client_options& o, std::chrono::milliseconds timeout);

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
  // The outputs to read back with a graph's reply, as the request carries them (those past the limits are
  // left out: get_tensor asks for them).
  struct output_list {
    std::vector<uint8_t> wire;
    std::vector<output_request> ranges;
    uint64_t bytes = 0;
  };
  output_list list_outputs(const std::vector<output_request>& outputs) const;
  // The output copies a graph changes: those in the buffers it writes (none named: all).
  void drop_written(const std::optional<std::vector<uint64_t>>& written);
  // A request and its whole reply (at most max_reply bytes).
  std::vector<uint8_t> call(command c, std::span<const uint8_t> payload, uint64_t max_reply);
  // A graph reply carries its outputs' bytes: they answer get_tensor until something may have changed
  // them. Kept for the last few replies (a pipeline's slots each read theirs after the next slot's graph
  // went out); a write drops the copies it overlaps, a graph those in the buffers it writes, anything
  // else all of them. Under outputs_mu, not mu: get_tensor is answered from them while another thread's
  // request is in flight.
  // The outputs asked for travel after a reply header of n bytes (they must add up to `expected`). For a
  // queued graph's reply, `drops_from` is where its graph stood in drop_log: what was dropped since is
  // not kept.
  void receive_outputs(uint64_t n, uint64_t expected, const std::vector<output_request>& ranges,
                       std::optional<size_t> drops_from = std::nullopt);
  bool from_outputs(remote_buffer b, uint64_t offset, void* out, uint64_t size);
  void drop_outputs_where(std::function<bool(const output_request&)> drops);  // (and logs it while queued)
  void drop_outputs();
  void drop_outputs(uint64_t handle, uint64_t offset, uint64_t size);  // those overlapping the range
  void drop_outputs_in(const std::vector<uint64_t>& handles);         // those in these buffers

  struct output_copy {
    output_request range;
    std::vector<uint8_t> bytes;
  };
  std::mutex outputs_mu;
  std::vector<output_copy> outputs;  // of the last graph replies, oldest first
  uint64_t outputs_served = 0;       // under outputs_mu
  static constexpr size_t max_output_copies = 256;
  static constexpr uint64_t max_output_copy_bytes = uint64_t{64} << 20;

  // ---- graphs queued (client::submit): sent, replies not read yet ----
  struct queued_graph {
    uint64_t id = 0;
    std::vector<output_request> outputs;
    uint64_t out_bytes = 0;
    size_t drops_from = 0;  // drop_log's size when it was sent
    std::chrono::steady_clock::time_point sent;
  };
  std::deque<queued_graph> queued;  // oldest first; replies come in this order
  uint64_t next_ticket = 1;
  std::map<uint64_t, std::exception_ptr> ticket_failures;  // replies read that failed, until waited for
  // The output copies dropped while graphs are queued (a queued reply's outputs arrive after drops that
  // came after its graph, and must not outlive them); cleared when the queue empties.
  std::vector<std::function<bool(const output_request&)>> drop_log;
  std::string closing_reason;  // why the connection closes (fail()), for the queued graphs' tickets
  // The wake fds of the threads in wait() that sleep on the socket unlocked: a reply read by another thread
  // (a request draining the queue) wakes them.
  std::vector<int> sleepers;
  void wake_sleepers() const;

  // The first ticket whose reply has not been read.
  uint64_t first_unread() const { return queued.empty() ? next_ticket : queued.front().id; }
  // Reads the oldest queued graph's reply (a failure goes to ticket_failures). With progress_only_ok, a
  // progress frame that comes first is read and nothing more (wait() must not block until the reply).
  void read_queued(bool progress_only_ok = false);
  // Reads every queued graph's reply (before a reply of another request, or a write too large to queue).
  void drain_queued();
  // The header of the next reply (no queued reply may come first): what read_ok reads after drain_queued.
  // Progress frames before it are read and skipped, each restarting the timeout (each read has its own).
  frame_header read_header(std::optional<poll_window> window = std::nullopt);
  // The next frame's header as it comes (a progress frame included).
  frame_header read_any_header(std::optional<poll_window> window);
  // Reads a progress frame's payload and notes that the peer is at work.
  void take_progress(const frame_header& h);
  // A frame of `bytes` may be written while replies are outstanding only if the socket takes it without the
  // peer reading (the peer may be blocked writing a reply this side is not reading yet).
  bool fits_while_queued(uint64_t bytes) const { return bytes <= io.send_buffer() / 4; }

  static constexpr size_t max_held = 256u << 10;
  std::vector<uint8_t> held;  // frames not sent yet (see hold_frame)
};

}  // namespace troupe::rpc
