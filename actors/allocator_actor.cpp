#include "actors/allocator_actor.h"

#include <caf/all.hpp>

#include <map>

#include "actors/errors.h"
#include "runtime/graph_allocator.h"
#include "runtime/memory.h"

namespace troupe::actors {

namespace {

struct owner_memory {
  uint64_t reserved = 0;                   // held by the owner's own scheduler
  std::unique_ptr<graph_allocator> galloc; // buffers this actor holds for the owner's graphs
  uint64_t planned = 0;                    // bytes of those buffers, as last reported
  uint64_t total() const { return reserved + planned; }
};

struct allocator_state {
  buffer_type_i* buft = nullptr;
  memory_accountant_actor accountant;
  std::map<std::string, owner_memory> owners;
  uint64_t n_reallocations = 0;
  static inline const char* name = "troupe.allocator";

  memory_event event(const std::string& owner, int64_t bytes) const {
    return {std::string(buft->name()), std::string(buft->device().name()), buft->is_host(),
            static_cast<uint8_t>(memory_kind::compute), bytes, owner};
  }

  ~allocator_state() {
    for (const auto& [owner, m] : owners) {
      if (m.total() > 0) caf::anon_send(accountant, record_atom_v, event(owner, -static_cast<int64_t>(m.total())));
    }
  }
};

using allocator_ptr = allocator_actor::stateful_pointer<allocator_state>;

void report(allocator_ptr self, const std::string& owner, int64_t delta) {
  if (delta != 0) self->send(self->state.accountant, record_atom_v, self->state.event(owner, delta));
}

allocator_actor::behavior_type allocator(allocator_ptr self, engine_env_ptr env, buffer_type_i* buft,
                                         memory_accountant_actor acct) {
  self->state.buft = buft;
  self->state.accountant = acct;
  return {
      [self](reserve_atom, const compute_reservation& r) -> int64_t {
        owner_memory& m = self->state.owners[r.owner];
        const int64_t delta = static_cast<int64_t>(r.bytes) - static_cast<int64_t>(m.reserved);
        m.reserved = r.bytes;
        report(self, r.owner, delta);
        return delta;
      },
      [self, env](plan_atom, const graph_plan& p) -> caf::result<uint64_t> {
        auto& st = self->state;
        const std::shared_ptr<graph> g = env->objects.get<graph>(p.graph);
        if (!g) return make_error(errc::not_found, "allocator " + std::string(st.buft->name()) + ": no graph " +
                                                       std::to_string(p.graph) + " in this process");
        owner_memory& m = st.owners[p.owner];
        if (!m.galloc) m.galloc = std::make_unique<graph_allocator>(std::vector<buffer_type_i*>{st.buft});
        try {
          if (m.galloc->alloc_graph(*g)) ++st.n_reallocations;
        } catch (const std::exception& e) {
          return error_from(e);
        }
        const uint64_t now = m.galloc->buffer_size(0);
        report(self, p.owner, static_cast<int64_t>(now) - static_cast<int64_t>(m.planned));
        m.planned = now;
        return now;
      },
      [self](release_atom, all_atom) -> uint64_t {
        auto& st = self->state;
        uint64_t n = 0;
        for (const auto& [o, m] : st.owners) {
          n += m.total();
          report(self, o, -static_cast<int64_t>(m.total()));
        }
        st.owners.clear();
        return n;
      },
      [self](release_atom, const std::string& owner) -> uint64_t {
        auto& st = self->state;
        const auto it = st.owners.find(owner);
        if (it == st.owners.end()) return 0;
        const uint64_t n = it->second.total();
        report(self, owner, -static_cast<int64_t>(n));
        st.owners.erase(it);
        return n;
      },
      [self](get_atom, usage_atom) {
        auto& st = self->state;
        allocator_usage u;
        u.buft = std::string(st.buft->name());
        for (const auto& [owner, m] : st.owners) {
          u.owners.push_back({owner, m.total()});
          u.total += m.total();
        }
        u.n_reallocations = st.n_reallocations;
        return u;
      },
  };
}

}  // namespace

allocator_actor spawn_allocator_actor(caf::actor_system& sys, engine_env_ptr env, const std::string& device,
                                      memory_accountant_actor accountant) {
  device_i* dev = registry::instance().find(device);
  if (dev == nullptr) throw error("allocator actor: no device named '" + device + "' is registered");
  return sys.spawn(allocator, std::move(env), &dev->buffer_type(), std::move(accountant));
}

}  // namespace troupe::actors
