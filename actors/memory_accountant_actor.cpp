#include "actors/memory_accountant_actor.h"

#include <caf/all.hpp>

#include <algorithm>
#include <map>
#include <vector>

#include "runtime/log.h"
#include "runtime/memory.h"

namespace troupe::actors {

namespace {

struct accountant_state {
  memory_ledger ledger;
  std::map<std::string, device_status> devices;  // by name
  std::vector<breakdown_subscriber> subscribers;
  uint64_t n_events = 0;
  uint64_t n_rejected = 0;
  static inline const char* name = "troupe.memory_accountant";

  memory_breakdown breakdown() const {
    memory_breakdown b;
    std::vector<device_memory_info> rows;
    for (const auto& [n, d] : devices) {
      if (!d.host) rows.push_back({d.name, d.description, d.total, d.free});
    }
    b.table = format_memory_table(ledger, rows);
    b.json = format_memory_json(ledger, rows);
    for (const auto& [key, u] : ledger.entries()) {
      b.entries.push_back({key.buft, key.device, key.is_host, u.model, u.context, u.compute});
      b.model += u.model;
      b.context += u.context;
      b.compute += u.compute;
    }
    b.n_events = n_events;
    b.n_rejected = n_rejected;
    return b;
  }
};

using accountant_ptr = memory_accountant_actor::stateful_pointer<accountant_state>;

void push(accountant_ptr self) {
  if (self->state.subscribers.empty()) return;
  const memory_breakdown b = self->state.breakdown();
  for (const breakdown_subscriber& s : self->state.subscribers) caf::anon_send(s, update_atom_v, b);
}

// (CAF 0.17 dereferences a null argument tuple for actors spawned without arguments, which UBSan reports:
// every troupe actor takes at least one.)
memory_accountant_actor::behavior_type accountant(accountant_ptr self, size_t max_subscribers) {
  self->set_down_handler([self](const caf::down_msg& dm) {
    auto& subs = self->state.subscribers;
    subs.erase(std::remove_if(subs.begin(), subs.end(), [&](const breakdown_subscriber& a) { return a.address() == dm.source; }),
               subs.end());
  });
  return {
      [self](record_atom, const memory_event& e) {
        if (e.kind > static_cast<uint8_t>(memory_kind::compute)) {
          ++self->state.n_rejected;
          TROUPE_LOG(warn, "memory accountant: event with unknown kind " << int(e.kind) << " from " << e.owner);
          return;
        }
        try {
          self->state.ledger.add({e.buft, e.device, e.is_host}, static_cast<memory_kind>(e.kind), e.bytes);
          ++self->state.n_events;
        } catch (const std::exception& ex) {
          ++self->state.n_rejected;
          TROUPE_LOG(warn, "memory accountant: " << ex.what() << " (owner " << e.owner << ")");
          return;
        }
        push(self);
      },
      [self](device_atom, const device_status& d) {
        self->state.devices[d.name] = d;
        push(self);
      },
      [self](get_atom, breakdown_atom) { return self->state.breakdown(); },
      [self, max_subscribers](subscribe_atom, const breakdown_subscriber& s) {
        if (!s || self->state.subscribers.size() >= max_subscribers) return false;
        self->monitor(s);
        self->state.subscribers.push_back(s);
        caf::anon_send(s, update_atom_v, self->state.breakdown());
        return true;
      },
      [self](unsubscribe_atom, const breakdown_subscriber& s) {
        auto& subs = self->state.subscribers;
        subs.erase(std::remove(subs.begin(), subs.end(), s), subs.end());
      },
  };
}

}  // namespace

memory_accountant_actor spawn_memory_accountant(caf::actor_system& sys, size_t max_subscribers) {
  return sys.spawn(accountant, max_subscribers);
}

}  // namespace troupe::actors
