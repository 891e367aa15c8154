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
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include "actors/type_ids.h"

namespace troupe::actors {

using memory_accountant_actor = caf::typed_actor<
    // Records an allocation (bytes > 0) or a release (bytes < 0).
    caf::reacts_to<record_atom, memory_event>,
    // A device's current memory (total, free): the device rows of the table.
    caf::reacts_to<device_atom, device_status>,
    // The breakdown now.
    caf::replies_to<get_atom, breakdown_atom>::with<memory_breakdown>,
    // The subscriber gets (update_atom, memory_breakdown) now and after every change, until it unsubscribes
    // or terminates; false when max_subscribers are subscribed already.
    caf::replies_to<subscribe_atom, caf::actor>::with<bool>,
    // Stops updates to a subscriber.
    caf::reacts_to<unsubscribe_atom, caf::actor>>;

memory_accountant_actor spawn_memory_accountant(caf::actor_system& sys, size_t max_subscribers = 1024);

}  // namespace troupe::actors
