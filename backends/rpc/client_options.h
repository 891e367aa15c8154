// How this runtime reaches a `troupe peer`: the settings of one client connection (rpc::client_options, the
// one declaration every reader of peer settings builds on: the [[peer]] table's actors::peer_params extends
// it) and the parsing of a peer's address, "host:port" or "[v6 address]:port", shared by every place that
// reads one (the [[peer]] address, rpc::add_peer's endpoint, troupe node's --join, a cluster node's RPC
// address).
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>

#include "backends/rpc/wire/protocol.h"

namespace troupe::rpc {

struct client_options {
  std::string name;                                   // in messages, before the address ("peer box-2 (host:port): ...")
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  std::string key;                                    // shared key; empty: none
  bool tls = false;
  std::filesystem::path tls_ca_file;                  // CA certificates to verify the peer; empty: system's
  bool tls_verify = true;                             // false: accept any certificate (tests only)
  bool debug = debug_from_env();                      // debug lines: connect, hello, alloc, close (TROUPE_RPC_DEBUG)
  std::chrono::milliseconds connect_timeout{5000};
  std::chrono::milliseconds io_timeout{300000};       // one request, bulk transfers included
  // How long a read polls the socket before sleeping on it (plain TCP; see backends/rpc/wire/busy_poll.h): a reply
  // that comes within it costs no wake-up. Covers a small model's decode step; 0: never poll.
  std::chrono::microseconds busy_poll{250};
  bool auto_reconnect = true;
  uint64_t hash_threshold = rpc::hash_threshold;      // cacheable uploads from this size go by hash first
  version client_version = protocol_version;          // tests: pretend another version
  // A control connection (the hello's control flag): the peer serves it on a thread that never runs a graph,
  // for health probes and capability questions only (no buffers, no graphs). A client makes one of its own
  // when it needs one (health_check while busy, supports_op); set here only by that client and by tests.
  bool control = false;
};

// An address split into host and port. The brackets of "[v6 address]:port" are not part of host.
struct endpoint {
  enum class fault {
    none,
    form,   // no host, or no ":port" after it (or a "[v6" without its "]:")
    port,   // what follows the colon is not decimal digits
    range,  // it is, but 0 or over 65535
  };
  std::string host;
  uint16_t port = 0;
  fault error = fault::none;  // each reader words its own message from it
  std::string port_text;      // what follows the colon (for those messages)
};

// Splits "host:port" or "[v6 address]:port" (the last colon separates the port of an unbracketed address).
// Never throws: what is wrong is in the result's `error`.
endpoint split_endpoint(std::string_view address);

// Splits "host:port" ("[::1]:50052" for IPv6). Throws error ("rpc: endpoint '...' ...") when it is not of
// that form.
std::pair<std::string, uint16_t> parse_endpoint(const std::string& address);

}  // namespace troupe::rpc
