// The loader actor: opens a model, computes its placement and range mapping, and drives the range-mapped
// uploads of every target buffer type on the device actors that own them, all at once (each device actor
// reads its ranges and uploads on its own thread, so one device's disk reads overlap another's uploads),
// with progress messages and cancellation. The loaded model is published in the runtime's env and its
// weights reported to the memory accountant as "model" memory; unload reverses both.
//
//   self->request(loader, infinite, load_atom_v, load_request{.name = "m", .path = "m.gguf",
//                 .devices = {{"CPU1", 8}}, .progress = my_actor}).then(
//       [](const model_info& i) { ... }, [](const caf::error& e) { ... });   // errc::cancelled, not_found...
//   caf::anon_send(loader, cancel_atom_v, std::string("m"));                // stops a running load
#pragma once

#include <caf/actor_system.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include <string>

#include "actors/memory_accountant_actor.h"
#include "actors/runtime_env.h"
#include "actors/type_ids.h"

namespace troupe::actors {

using loader_actor = caf::typed_actor<
    // Loads a model; progress goes to request.progress as (progress_atom, load_progress).
    caf::replies_to<load_atom, load_request>::with<model_info>,
    // Releases a loaded model's weights (the caller has stopped its users); replies whether it existed.
    caf::replies_to<unload_atom, std::string>::with<bool>,
    // Cancels a running load of that name (its requester gets errc::cancelled).
    caf::reacts_to<cancel_atom, std::string>,
    // The device actor serving a device (again, after a restart).
    caf::reacts_to<device_atom, std::string, caf::actor>>;

loader_actor spawn_loader_actor(caf::actor_system& sys, runtime_env_ptr env, memory_accountant_actor accountant);

}  // namespace troupe::actors
