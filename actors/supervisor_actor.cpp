#include "actors/supervisor_actor.h"

#include <caf/all.hpp>

#include <memory>
#include <string>
#include <utility>

#include "actors/detail/supervisor_state.h"
#include "actors/errors.h"
#include "actors/memory_accountant_actor.h"
#include "actors/session_actor.h"
#include "runtime/error.h"
#include "runtime/log.h"

namespace troupe::actors {
namespace detail {

namespace {

// A watched actor terminated: a device actor or the loader is started again (up to max_restarts), a peer
// actor's peer is down, a model whose scheduler terminated is marked down, a session is forgotten.
void on_down(supervisor_ptr self, const caf::down_msg& dm) {
  auto& st = self->state;
  if (st.shutting_down) return;
  const std::string why = caf::to_string(dm.reason);
  for (auto& [name, e] : st.devices) {
    if (e.actor.address() != dm.source) continue;
    e.status.last_error = why;
    if (e.status.restarts >= st.params.max_restarts) {
      e.status.up = false;
      TROUPE_LOG(warn, "supervisor: device actor " << name << " is down (" << why << "), not restarted again");
      return;
    }
    ++e.status.restarts;
    TROUPE_LOG(warn, "supervisor: device actor " << name << " terminated (" << why << "), restarting");
    try {
      start_device(self, name);
      announce_device(self, name);
    } catch (const std::exception& ex) {
      e.status.up = false;
      e.status.last_error = ex.what();
    }
    return;
  }
  if (st.loader.address() == dm.source) {
    st.loader_status.last_error = why;
    if (st.loader_status.restarts >= st.params.max_restarts) {
      st.loader_status.up = false;
      return;
    }
    ++st.loader_status.restarts;
    start_loader(self);
    return;
  }
  for (peer_entry& p : st.peers) {
    if (p.actor.address() != dm.source) continue;
    p.status.state = "down";
    p.status.last_error = "its peer actor terminated (" + why + ")";
    return;
  }
  for (auto& [name, m] : st.models) {
    if (m.sched.address() == dm.source) {
      m.status.up = false;
      m.status.last_error = why;
      m.down_for_peer.clear();
      TROUPE_LOG(warn, "supervisor: the scheduler of model " << name << " terminated (" << why << "); model marked down");
      return;
    }
    for (auto it = m.sessions.begin(); it != m.sessions.end(); ++it) {
      if (it->address() == dm.source) {
        m.sessions.erase(it);
        return;
      }
    }
  }
}

supervisor_actor::behavior_type supervisor(supervisor_ptr self, engine_env_ptr env, supervisor_params p) {
  auto& init = self->state;
  init.env = env;
  init.params = std::move(p);
  init.accountant = spawn_memory_accountant(self->system());
  self->monitor(init.accountant);
  for (const std::string& name : init.params.devices) {
    if (!init.devices.count(name)) add_device(self, name);
  }
  start_loader(self);
  for (const peer_actor& pa : init.params.peers) watch_peer(self, pa);
  self->set_down_handler([self](const caf::down_msg& dm) { on_down(self, dm); });

  return {
      [self](load_atom, const load_request& r) -> caf::result<model_info> {
        auto& st = self->state;
        if (const auto it = st.reloads.find(r.model.name); it != st.reloads.end()) {
          if (it->second.running) return make_error(errc::busy, "model " + r.model.name + " is being loaded again right now");
          st.reloads.erase(it);  // the user's load replaces the failed reload
        }
        auto rp = self->make_response_promise<model_info>();
        load_model(self, r, [rp](caf::expected<model_info> info) mutable {
          if (info) {
            rp.deliver(*info);
          } else {
            rp.deliver(info.error());
          }
        });
        return rp;
      },
      [self](unload_atom, const std::string& name) -> caf::result<bool> {
        auto& st = self->state;
        if (const auto it = st.reloads.find(name); it != st.reloads.end()) {
          if (it->second.running) return make_error(errc::busy, "model " + name + " is being loaded again right now");
          st.reloads.erase(it);
          return true;
        }
        if (!st.models.count(name)) return false;
        auto rp = self->make_response_promise<bool>();
        stop_model(self, name, [rp]() mutable { rp.deliver(true); });
        return rp;
      },
      [self](open_atom, const session_request& r) -> caf::result<session_actor> {
        auto& st = self->state;
        const auto it = st.models.find(r.model);
        if (it == st.models.end()) {
          if (const auto re = st.reloads.find(r.model); re != st.reloads.end()) {
            return make_error(errc::down, "model " + r.model + " is down: " + re->second.status.last_error);
          }
          return make_error(errc::not_found, "no model named '" + r.model + "' is loaded");
        }
        if (!it->second.status.up) return make_error(errc::down, "model " + r.model + " is down: " + it->second.status.last_error);
        std::shared_ptr<const loaded_model> m = st.env->model(r.model);
        if (!m) return make_error(errc::not_found, "model " + r.model + " has no weights");
        const session_actor s = spawn_session_actor(self->system(), m, it->second.sched, st.next_session++);
        auto rp = self->make_response_promise<session_actor>();
        const std::string model = r.model;
        self->request(it->second.sched, caf::infinite, attach_atom_v, s)
            .then(
                [self, rp, s, model](int32_t seq) mutable {
                  self->send(s, attach_atom_v, seq);
                  const auto m2 = self->state.models.find(model);
                  if (m2 != self->state.models.end()) {
                    m2->second.sessions.insert(s);
                    self->monitor(s);
                  }
                  rp.deliver(s);
                },
                [self, rp, s](const caf::error& e) mutable {
                  self->send_exit(s, caf::exit_reason::user_shutdown);
                  rp.deliver(e);
                });
        return rp;
      },
      [self](get_atom, breakdown_atom) -> caf::result<memory_breakdown> {
        auto rp = self->make_response_promise<memory_breakdown>();
        refresh_devices(self, [self, rp]() mutable {
          self->request(self->state.accountant, caf::infinite, get_atom_v, breakdown_atom_v)
              .then([rp](const memory_breakdown& b) mutable { rp.deliver(b); },
                    [rp](const caf::error& e) mutable { rp.deliver(e); });
        });
        return rp;
      },
      [self](get_atom, status_atom) {
        auto& st = self->state;
        engine_status s;
        for (const std::string& name : st.device_order) s.actors.push_back(st.devices.at(name).status);
        s.actors.push_back(st.loader_status);
        for (const auto& [name, m] : st.models) {
          s.actors.push_back(m.status);
          s.models.push_back(name);
        }
        for (const auto& [name, r] : st.reloads) {
          if (!st.models.count(name)) s.actors.push_back(r.status);
        }
        for (const peer_entry& pe : st.peers) s.peers.push_back(pe.status);
        return s;
      },
      [self](get_atom, directory_atom) {
        auto& st = self->state;
        actor_directory d;
        d.accountant = st.accountant;
        d.loader = st.loader;
        for (const std::string& name : st.device_order) {
          d.device_names.push_back(name);
          d.devices.push_back(st.devices.at(name).actor);
          d.allocators.push_back(st.devices.at(name).allocator);
        }
        for (const auto& [name, m] : st.models) {
          d.model_names.push_back(name);
          d.decoders.push_back(m.sched);
        }
        for (const peer_entry& pe : st.peers) {
          d.peer_names.push_back(pe.status.name);
          d.peers.push_back(pe.actor);
        }
        return d;
      },
      [self](cancel_atom, const std::string& name) { self->send(self->state.loader, cancel_atom_v, name); },
      [self](update_atom, const peer_status& ps) { on_peer_update(self, ps); },
      [self](connect_atom, const peer_actor& pa) {
        for (const peer_entry& known : self->state.peers) {
          if (known.actor == pa) return false;
        }
        watch_peer(self, pa);
        return true;
      },
      [self](shutdown_atom) -> caf::result<memory_breakdown> {
        auto& st = self->state;
        if (st.shutting_down) return make_error(errc::down, "already shutting down");
        st.shutting_down = true;
        auto rp = self->make_response_promise<memory_breakdown>();
        shut_down(self, rp);
        return rp;
      },
  };
}

}  // namespace

}  // namespace detail

supervisor_actor spawn_supervisor(caf::actor_system& sys, engine_env_ptr env, const supervisor_params& p) {
  for (const std::string& name : p.devices) {
    if (registry::instance().find(name) == nullptr) throw error("supervisor: no device named '" + name + "' is registered");
  }
  return sys.spawn(detail::supervisor, std::move(env), p);
}

}  // namespace troupe::actors
