// The peer server: serves this machine's devices to troupe clients over TCP (optionally TLS).
//
//   rpc::peer_server srv({.host = "127.0.0.1", .port = 0, .devices = {&cpu::cpu_device()}});
//   srv.start();                       // io threads in the background; srv.port() is the bound port
//   ...                                // clients: rpc::add_peer("127.0.0.1:" + std::to_string(srv.port()))
//   srv.stop();                        // closes every connection, frees every client's buffers
//
// Threads: a control thread accepts every connection and serves its greeting and hello, then the control
// connections (hello_control: health probes, capability questions) for their whole life, and it never runs a
// graph, so the peer answers a probe however long a graph runs. A plain TCP data connection is then handed
// to one of the io threads (one io_context each, so a request never changes threads), where it runs as a
// coroutine on its own strand and owns its buffers (freed when it disconnects); a graph being computed
// occupies its connection's io thread, and while a command runs longer than progress_interval the control
// thread sends the client progress frames. A TLS data connection's stream stays on the control thread and
// its commands run on a pool of io_threads threads (its progress frames are sent between them). Binding to
// an address that is not loopback needs a shared key unless `insecure` is set. The command-line front end is
// `troupe peer` (tools/troupe/peer.cpp).
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backends/rpc/wire/protocol.h"
#include "net/rpc/frame_handler.h"
#include "runtime/backend.h"

namespace troupe::rpc {

struct peer_server_options {
  std::string host = "127.0.0.1";                     // address (or host name) to bind
  uint16_t port = 0;                                  // 0: an ephemeral port (see peer_server::port())
  std::vector<device_i*> devices;                     // served devices, by index (at least one)
  std::function<backend_ptr(device_i&)> make_backend; // null: device.init_backend()
  std::string key;                                    // shared key; empty: no authentication
  bool insecure = false;                              // allow a non-loopback address without a key
  std::filesystem::path cache_dir;                    // empty: no weight cache
  std::filesystem::path tls_cert;                     // PEM certificate chain; with tls_key: TLS
  std::filesystem::path tls_key;                      // PEM private key
  int io_threads = 2;                                 // threads running data connections (graphs run on them)
  // How long a connection that is alone on its io thread polls its socket for the next request before
  // sleeping on it (plain TCP; see busy_poll.h): covers the client's host work between two decode steps,
  // so the next step costs no wake-up. 0: never poll.
  std::chrono::microseconds busy_poll{2000};
  std::chrono::milliseconds hello_timeout{10000};     // a connection must say hello within this
  uint32_t max_connections = 64;                      // more are closed at once
  uint64_t max_buffer_size = 0;                       // bytes per buffer; 0: the device's max_size
  uint64_t max_connection_bytes = 0;                  // bytes per connection; 0: no limit
  uint32_t max_buffers = 65536;                       // buffers per connection
  // While a command runs longer than this, the client gets a progress frame this often (it restarts the
  // client's timeout for the reply).
  std::chrono::milliseconds progress_interval{500};
  version server_version = protocol_version;          // tests: pretend another version
  std::chrono::milliseconds graph_delay{0};           // tests: each graph sleeps this long first (a slow graph)
  bool debug = debug_from_env();                      // a debug line per command (TROUPE_RPC_DEBUG / GGML_RPC_DEBUG)
};

class peer_server {
 public:
  // Binds and listens. Throws error naming the address when it cannot, or when a non-loopback address has
  // neither a key nor `insecure`.
  explicit peer_server(peer_server_options opts);
  ~peer_server();
  peer_server(const peer_server&) = delete;
  peer_server& operator=(const peer_server&) = delete;

  // Starts the io threads (returns at once).
  void start();
  // Closes the listener and every connection (their buffers are freed) and joins the threads. Idempotent.
  void stop();

  uint16_t port() const;
  std::string address() const;  // "host:port"
  bool tls() const;
  const peer_server_stats& stats() const;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

// Whether every address `host` resolves to is a loopback address. Throws error when it does not resolve.
bool is_loopback_host(const std::string& host);

}  // namespace troupe::rpc
