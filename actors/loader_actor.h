// The loader actor: opens a model, computes its placement and range mapping, and drives the range-mapped
// uploads of every target buffer type on the device actors that own them, all at once (each device actor
// reads its ranges and uploads on its own thread, so one device's disk reads overlap another's uploads),
// with progress messages and cancellation. The loaded model is published in the runtime's env and its
// weights reported to the memory accountant as "model" memory; unload reverses both.
//
//   load_request r{{.name = "m", .path = "m.gguf", .devices = {{"CPU1", 8}}}, my_listener};
//   self->request(loader, infinite, load_atom_v, r).then(
//       [](const model_info& i) { ... }, [](const caf::error& e) { ... });   // errc::cancelled, not_found...
//
// The settings are validated and resolved here (model_settings::resolved): bad ones are errc::bad_request.
//   caf::anon_send(loader, cancel_atom_v, std::string("m"));                // stops a running load
#pragma once

#include <caf/actor_system.hpp>

#include <string>

#include "actors/memory_accountant_actor.h"
#include "actors/engine_env.h"
#include "actors/type_ids.h"

namespace troupe::actors {

// The interface (using loader_actor = caf::typed_actor<...>) is in actors/handles.h.

loader_actor spawn_loader_actor(caf::actor_system& sys, engine_env_ptr env, memory_accountant_actor accountant);

}  // namespace troupe::actors
