// The remote-peer actor, one per peer (a `troupe peer` server): connects and says hello through
// backends/rpc's client, registers the peer's devices ("RPC[host:port]#i"), checks the peer's health
// periodically, and when the peer drops, marks it down and reconnects with bounded, jittered exponential
// backoff.
//
//   peer_params pp;                                    // actors/engine_config.h
//   pp.name = "box"; pp.host = "10.0.0.2"; pp.port = 50052; pp.key = key;
//   peer_actor p = spawn_peer_actor(sys, pp);
//   self->request(p, t, get_atom_v, status_atom_v).then([](const peer_status& s) { ... });  // s.state "up"
//
// States: "connecting" (an attempt is in flight), "up" (health checks pass), "down" (the last attempt or
// health check failed; the next attempt is due in retry_in_ms), "parked" (told to stop trying, with the
// reason: no attempts until a check asks for one). Going down marks the client down
// (rpc::client::mark_down): a request in flight on the connection fails at once with a backend_error naming
// the peer, and every later use of its devices fails the same way without touching the network, until a
// reconnect succeeds (epoch + 1). Buffers of the old connection are gone with it (the peer freed them): a
// model whose weights were on the peer must be loaded again; the supervisor reports it (engine_status).
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

// The interface (using peer_actor = caf::typed_actor<...>) is in actors/handles.h.

// Declared with the runtime's configuration (actors/engine_config.h): a peer's settings, its backoff.
struct peer_params;
struct backoff_params;

// The wait before the next attempt after `failures` consecutive failures (>= 1) with backoff b, for a uniform
// u in [0, 1): within [(1 - jitter) * d, d] where d = min(max, initial * 2^(failures - 1)); never more than
// max.
std::chrono::milliseconds backoff_delay(const backoff_params& b, uint32_t failures, double u);

// Spawns the actor, which starts connecting at once. Throws error when params has no port.
peer_actor spawn_peer_actor(caf::actor_system& sys, const peer_params& params);

}  // namespace troupe::actors
