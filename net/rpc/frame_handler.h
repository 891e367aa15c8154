// One client connection's state and its frame handler: the part of the peer server that reads no socket.
//
//   session s(cfg);                                   // per connection
//   send(s.greeting());
//   for (each frame) { reply r = s.handle(code, payload); if (r.send) send(r); if (r.close) break; }
//   // destroying the session frees every buffer the client allocated
//
// Every field of every frame is validated here (validate.h); a bad frame gets an error reply, or the
// connection is closed when the framing itself cannot be trusted (unknown command, no hello, oversized
// payload). set_tensor has no reply: when it fails, the next reply of the connection carries the error.
// The fuzzer (net/rpc/fuzz_rpc.cpp) drives exactly this class.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "net/rpc/cache.h"
#include "backends/rpc/wire/protocol.h"
#include "backends/rpc/wire/validate.h"
#include "runtime/backend.h"

namespace troupe::rpc {

// Counters over all connections of a server (tests and logs read them).
struct peer_server_stats {
  std::atomic<uint64_t> connections{0};        // open now
  std::atomic<uint64_t> connections_total{0};
  std::atomic<uint64_t> buffers{0};            // live buffers
  std::atomic<uint64_t> buffer_bytes{0};       // bytes in live buffers
  std::atomic<uint64_t> frames{0};
  std::atomic<uint64_t> error_replies{0};
  std::atomic<uint64_t> cache_hits{0};
  std::atomic<uint64_t> cache_misses{0};
  std::atomic<uint64_t> cache_stores{0};
  std::atomic<uint64_t> bytes_received{0};
  std::atomic<uint64_t> bytes_sent{0};
  std::atomic<uint64_t> polled_reads{0};       // requests that arrived while the connection polled (busy_poll)
  std::atomic<uint64_t> debug_lines{0};        // command lines formatted (frame_handler_config::debug)
  std::atomic<uint64_t> control_connections{0}; // hellos with the control flag
  std::atomic<uint64_t> op_questions{0};       // supports_op answered
  std::atomic<uint64_t> progress_frames{0};    // sent while a command ran long
};

struct frame_handler_config {
  std::vector<device_i*> devices;                        // served devices, by index
  std::function<backend_ptr(device_i&)> make_backend;    // null: device.init_backend()
  std::string key;                                       // shared key; empty: no authentication
  const tensor_cache* cache = nullptr;                   // null: set_tensor_hash always misses
  uint64_t max_buffer_size = 0;                          // bytes in one buffer; 0: the device's max_size
  uint64_t max_connection_bytes = 0;                     // bytes in all buffers of a connection; 0: no limit
  uint32_t max_buffers = 65536;                          // buffers per connection
  bool debug = false;                                    // log every command (TROUPE_RPC_DEBUG)
  version server_version = protocol_version;
  peer_server_stats* stats = nullptr;                         // null: not counted
  // Tests only: every graph_compute / graph_recompute sleeps this long first, on the thread that runs it (a
  // slow graph whatever the machine; `troupe peer --test-graph-delay-ms`).
  std::chrono::milliseconds graph_delay{0};
};

struct reply {
  status st = status::ok;
  std::vector<uint8_t> body;      // the payload, or an error message
  std::span<const uint8_t> tail;  // more payload borrowed from a buffer (get_tensor), valid until the next frame
  bool send = true;               // false: no reply (set_tensor)
  bool close = false;             // close the connection after this reply
  uint64_t size() const { return body.size() + tail.size(); }
};

class frame_handler {
 public:
  explicit frame_handler(const frame_handler_config& cfg, std::string peer = "local");
  ~frame_handler();
  frame_handler(const frame_handler&) = delete;
  frame_handler& operator=(const frame_handler&) = delete;

  // The payload of the greeting frame (status ok) sent on connect.
  std::vector<uint8_t> greeting() const;
  // Handles one whole frame.
  reply handle(uint8_t code, std::span<const uint8_t> payload);
  // Checks a frame header before its payload is read (or allocated): an error reply that closes the
  // connection for an unknown command, an oversized payload, or a command before hello; empty when fine.
  std::optional<reply> check_header(uint8_t code, uint64_t size) const;

  // set_tensor without holding its bytes in memory first: the connection reads the 20-byte prefix, asks
  // where the data goes, receives it there (or into staging memory for a non-host buffer), then calls
  // end_set_tensor. begin_set_tensor throws protocol_error for a bad prefix; the connection must then close,
  // since the bytes that follow cannot be skipped safely.
  struct set_target {
    buffer_i* buf = nullptr;
    uint64_t offset = 0;
    uint64_t size = 0;
    uint32_t flags = 0;
    uint8_t* host = nullptr;  // receive the bytes here; null: stage them and pass them to end_set_tensor
  };
  set_target begin_set_tensor(std::span<const uint8_t> prefix, uint64_t data_size);
  void end_set_tensor(const set_target& t, std::span<const uint8_t> staged);
  // The debug line of a set_tensor (streamed: its bytes read by the connection, not in a frame), when
  // debugging (frame_handler_config::debug and the logger at debug level; nothing is formatted otherwise).
  void debug_set_tensor(std::span<const uint8_t> prefix, uint64_t data_size, bool streamed);
  // Whether frames may be streamed (hello done, nothing pending that closes the connection).
  bool ready() const { return hello_done_; }
  // Whether the hello asked for a control connection (hello_control): only the commands control_command()
  // names are served; the server runs it on its control thread.
  bool control() const { return control_; }

  const std::string& peer() const { return peer_; }

 private:
  struct buffer_entry {
    buffer_ptr buf;
    uint32_t device = 0;
  };

  reply dispatch(command c, std::span<const uint8_t> payload);
  reply hello(std::span<const uint8_t> payload);
  reply device_count(reader& r);
  reply alloc_buffer(reader& r);
  reply free_buffer(reader& r);
  reply buffer_clear(reader& r);
  reply set_tensor_hash(reader& r);
  reply get_tensor(reader& r);
  reply copy_tensor(reader& r);
  reply graph_compute(reader& r);
  reply graph_recompute(reader& r);
  reply init_tensor(reader& r);
  reply get_alloc_size(reader& r);
  reply supports_op(reader& r);

  // Byte ranges whose contents a graph reply carries back (the graph's outputs, read right after it ran).
  struct output_range {
    buffer_i* buf = nullptr;
    uint64_t offset = 0;
    uint64_t size = 0;
  };
  std::vector<output_range> read_outputs(reader& r, const char* what);
  reply outputs_reply(const std::vector<output_range>& outs);

  uint32_t device_index(reader& r);
  buffer_entry& lookup(uint64_t handle);
  backend_i& backend_for(uint32_t device);
  void write_bytes(buffer_i& buf, uint64_t offset, const uint8_t* data, uint64_t size);
  void read_bytes(buffer_i& buf, uint64_t offset, uint8_t* out, uint64_t size);
  void count(std::atomic<uint64_t> peer_server_stats::*field, int64_t delta);
  bool debugging() const;
  void debug_line(const std::string& line);
  // "alloc_buffer device 0, size 4096 -> handle 3, remote_ptr 0x300000000": a command's arguments (from its
  // payload) and result (from its reply).
  std::string describe(command c, std::span<const uint8_t> payload, const reply& r) const;

  const frame_handler_config& cfg_;
  std::string peer_;
  nonce server_nonce_{};
  bool hello_done_ = false;
  bool control_ = false;
  std::optional<std::string> pending_error_;  // a failed set_tensor, reported by the next reply
  std::unordered_map<uint64_t, buffer_entry> buffers_;
  uint64_t next_handle_ = 1;
  uint64_t bytes_ = 0;
  std::vector<backend_ptr> backends_;                  // per device, made on first use
  std::map<uint32_t, decoded_graph> last_graph_;       // per device, for graph_recompute
};

}  // namespace troupe::rpc
