// The allocator actor, one per buffer type: the owner of record of compute memory. It plans chunked
// compute memory for the in-process graphs it is given (graph_allocator over its buffer type: up to 16
// chunks of at most the type's max_size), owns the resulting buffers per owner and re-reserves (grows them)
// when a graph needs more; compute memory that a synchronous scheduler holds (an llm_context's) is
// reported to it as reservations. Every allocation and release goes to the memory accountant as compute.
//
//   allocator_actor a = spawn_allocator_actor(sys, env, "CPU1", acct);
//   self->request(a, t, reserve_atom_v, compute_reservation{"context:m", bytes});   // replies the change
//   self->request(a, t, release_atom_v, std::string("context:m"));                  // replies bytes released
#pragma once

#include <caf/actor_system.hpp>

#include <string>

#include "actors/memory_accountant_actor.h"
#include "actors/engine_env.h"
#include "actors/type_ids.h"

namespace troupe::actors {

// The interface (using allocator_actor = caf::typed_actor<...>) is in actors/handles.h.

// The allocator for the default buffer type of `device`. Throws error when the registry has no such device.
allocator_actor spawn_allocator_actor(caf::actor_system& sys, engine_env_ptr env, const std::string& device,
                                      memory_accountant_actor accountant);

}  // namespace troupe::actors
