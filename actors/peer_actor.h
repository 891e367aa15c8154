// The remote-peer actor, one per peer (a `troupe peer` server): connects and says hello through
// backends/rpc's client, registers the peer's devices ("RPC[host:port]#i"), checks the peer's health
// periodically, and when the peer drops, marks it down and reconnects with bounded, jittered exponential
// backoff.
//
//   peer_actor p = spawn_peer_actor(sys, {.name = "box", .host = "10.0.0.2", .port = 50052, .key = key});
//   self->request(p, t, get_atom_v, status_atom_v).then([](const peer_status& s) { ... });  // s.state "up"
//
// States: "connecting" (an attempt is in flight), "up" (health checks pass), "down" (the last attempt or
// health check failed; the next attempt is due in retry_in_ms), "parked" (told to stop trying, with the
// reason: no attempts until a check asks for one). Going down marks the client down
// (rpc::client::mark_down): a request in flight on the connection fails at once with a backend_error naming
// the peer, and every later use of its devices fails the same way without touching the network, until a
// reconnect succeeds (epoch + 1). Buffers of the old connection are gone with it (the peer freed them): a
// model whose weights were on the peer must be loaded again; the supervisor reports it (runtime_status).
//
// The actor itself never blocks: connection attempts, health checks and memory requests run on a detached
// helper actor, with timeouts; a health check that does not come back in time also counts as a failure,
// so a hung peer (not only a closed connection) is found and the requests waiting on it fail.
#pragma once

#include <caf/actor_system.hpp>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "actors/type_ids.h"

namespace troupe::actors {

struct peer_config;

// The interface (using peer_actor = caf::typed_actor<...>) is in actors/handles.h.

// Reconnect backoff: the wait before attempt n (n >= 1 failures so far) is initial * 2^(n-1), at most max,
// shortened by a random fraction of up to `jitter` (so peers that dropped together do not retry together).
struct backoff_params {
  std::chrono::milliseconds initial{200};
  std::chrono::milliseconds max{10000};
  double jitter = 0.5;  // in [0, 1]
};

// The wait before the next attempt after `failures` consecutive failures (>= 1), for a uniform u in [0, 1):
// within [(1 - jitter) * d, d] where d = min(max, initial * 2^(failures - 1)); never more than max.
std::chrono::milliseconds backoff_delay(const backoff_params& b, uint32_t failures, double u);

struct peer_params {
  std::string name;                                 // for status and messages; "" : the address
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  std::string key;                                  // the shared key itself; empty: none
  bool tls = false;
  std::string tls_ca;                               // CA file to verify the peer; empty: the system's
  bool tls_verify = true;                           // false: any certificate (tests only)
  std::chrono::milliseconds connect_timeout{3000};
  std::chrono::milliseconds io_timeout{300000};     // one request on the connection (bulk uploads too)
  std::chrono::microseconds busy_poll{250};         // rpc::client_options::busy_poll
  std::chrono::milliseconds health_interval{1000};  // between health checks while up
  std::chrono::milliseconds health_timeout{2000};   // a check not answered within this fails
  backoff_params backoff;
};

// The parameters of a configured [[peer]]: reads its key file (throws error naming the file and the peer).
peer_params to_peer_params(const peer_config& c);

// Spawns the actor, which starts connecting at once. Throws error when params has no port.
peer_actor spawn_peer_actor(caf::actor_system& sys, const peer_params& params);

}  // namespace troupe::actors
