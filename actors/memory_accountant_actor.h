// The memory-accounting actor: receives every allocation and release (buffer type, device, kind, owner),
// keeps the running totals in a memory_ledger, answers breakdown queries (the table and JSON of
// runtime/memory.h) and pushes the breakdown to subscribers after every change.
//
//   auto acct = spawn_memory_accountant(sys);
//   caf::anon_send(acct, record_atom_v, memory_event{"CPU1", "CPU1", false, 0, 4096, "model:m"});
//   self->request(acct, timeout, get_atom_v, breakdown_atom_v).then([](const memory_breakdown& b) { ... });
//
// A release larger than what was recorded is refused (counted in n_rejected) rather than wrapping around.
#pragma once

#include <caf/actor_system.hpp>

#include "actors/type_ids.h"

namespace troupe::actors {

// The interface (using memory_accountant_actor = caf::typed_actor<...>) is in actors/handles.h.

memory_accountant_actor spawn_memory_accountant(caf::actor_system& sys, size_t max_subscribers = 1024);

}  // namespace troupe::actors
