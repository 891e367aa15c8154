// The supervisor: builds a runtime's set of actors from its configuration (the memory accountant, one
// device actor and one allocator actor per device, the loader, a scheduler for pipeline jobs, and a
// scheduler per loaded model), hands out sessions, and watches them all. A device actor that terminates
// abnormally is restarted (up to max_restarts times, then marked down); a model whose scheduler fails is
// marked down. Requests for something down are errc::down errors; nothing waits forever.
//
//   supervisor_actor sup = spawn_supervisor(sys, {.devices = {"CPU", "CPU1"}});
//   self->request(sup, infinite, load_atom_v, load_request{.name = "m", .path = p}).then(...);
//   self->request(sup, t, open_atom_v, session_request{"m"}).then([](session_actor s) { ... });
//   self->request(sup, t, shutdown_atom_v).then([](const memory_breakdown& final) { ... });  // all zero
#pragma once

#include <caf/actor_system.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include <chrono>
#include <string>
#include <vector>

#include "actors/peer_actor.h"
#include "actors/runtime_env.h"
#include "actors/session_actor.h"
#include "actors/type_ids.h"

namespace troupe::actors {

using supervisor_actor = caf::typed_actor<
    // Loads a model (loader actor), then starts its scheduler.
    caf::replies_to<load_atom, load_request>::with<model_info>,
    // Stops a model's scheduler and sessions and releases its memory; replies whether it was loaded.
    caf::replies_to<unload_atom, std::string>::with<bool>,
    // A new session on a loaded model.
    caf::replies_to<open_atom, session_request>::with<session_actor>,
    // The memory breakdown.
    caf::replies_to<get_atom, breakdown_atom>::with<memory_breakdown>,
    // Every supervised actor and whether it is up.
    caf::replies_to<get_atom, status_atom>::with<runtime_status>,
    // The handles of the runtime's actors.
    caf::replies_to<get_atom, directory_atom>::with<actor_directory>,
    // Cancels a running load.
    caf::reacts_to<cancel_atom, std::string>,
    // A peer actor's new state (the supervisor subscribes to every peer it is given).
    caf::reacts_to<update_atom, peer_status>,
    // Stops every session, scheduler and model, frees every buffer, and replies the final breakdown
    // (all zero); the supervisor and its actors then terminate.
    caf::replies_to<shutdown_atom>::with<memory_breakdown>>;

struct supervisor_params {
  std::vector<std::string> devices = {"CPU"};  // registered devices to run device actors for
  int n_threads = 0;                           // device backends' CPU threads; 0: all
  uint32_t max_restarts = 3;                   // per device actor
  std::chrono::microseconds flush_delay{2000}; // schedulers' longest wait for other sessions' steps
  bool dispatch_splits = true;                 // schedulers run decode splits on the device actors' threads
  // Remote-peer actors whose devices models may use (their devices, once registered, can be in `devices`).
  // The supervisor watches them: a model with weights on a peer that goes down is marked down (naming the
  // peer), runtime_status lists every peer; it stops them at shutdown.
  std::vector<peer_actor> peers;
  // A model whose weights were on a peer that reconnected (they went with the old connection) is loaded
  // again by itself; false: it stays down, saying so, until loaded again.
  bool reload_on_reconnect = true;
};

// Spawns the supervisor and its actors. Throws error for a device the registry does not have.
supervisor_actor spawn_supervisor(caf::actor_system& sys, runtime_env_ptr env, const supervisor_params& p);

}  // namespace troupe::actors
