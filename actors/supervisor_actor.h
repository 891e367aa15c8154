// The supervisor: builds a runtime's set of actors from its configuration (the memory accountant, one
// device actor and one allocator actor per device, the loader, and a scheduler per loaded model), hands
// out sessions, and watches them all. A device actor that terminates abnormally is restarted (up to
// max_restarts times, then marked down); a model whose scheduler fails is marked down. Requests for
// something down are errc::down errors; nothing waits forever.
//
//   supervisor_actor sup = spawn_supervisor(sys, {.devices = {"CPU", "CPU1"}});
//   self->request(sup, infinite, load_atom_v, load_request{{.name = "m", .path = p}, {}}).then(...);
//   self->request(sup, t, open_atom_v, session_request{"m"}).then([](session_actor s) { ... });
//   self->request(sup, t, shutdown_atom_v).then([](const memory_breakdown& final) { ... });  // all zero
#pragma once

#include <caf/actor_system.hpp>

#include <chrono>
#include <string>
#include <vector>

#include "actors/peer_actor.h"
#include "actors/engine_env.h"
#include "actors/session_actor.h"
#include "actors/type_ids.h"

namespace troupe::actors {

// The interface (using supervisor_actor = caf::typed_actor<...>) is in actors/handles.h.

struct supervisor_params {
  std::vector<std::string> devices = {"CPU"};  // registered devices to run device actors for
  int n_threads = 0;                           // device backends' CPU threads; 0: all
  uint32_t max_restarts = 3;                   // per device actor
  std::chrono::microseconds flush_delay{2000}; // decoders' longest wait for other sessions' steps
  bool dispatch_splits = true;                 // decoders run decode splits on the device actors' threads
  // Remote-peer actors whose devices models may use (their devices, once registered, can be in `devices`).
  // The supervisor watches them: a model with weights on a peer that goes down is marked down (naming the
  // peer), engine_status lists every peer; it stops them at shutdown.
  std::vector<peer_actor> peers;
  // A model whose weights were on a peer that reconnected (they went with the old connection) is loaded
  // again by itself; false: it stays down, saying so, until loaded again.
  bool reload_on_reconnect = true;
};

// Spawns the supervisor and its actors. Throws error for a device the registry does not have.
supervisor_actor spawn_supervisor(caf::actor_system& sys, engine_env_ptr env, const supervisor_params& p);

}  // namespace troupe::actors
