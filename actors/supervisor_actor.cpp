#include "actors/supervisor_actor.h"

#include <caf/all.hpp>

#include <algorithm>
#include <functional>
#include <utility>
#include <map>
#include <set>

#include "actors/allocator_actor.h"
#include "actors/device_actor.h"
#include "actors/errors.h"
#include "actors/fan_in.h"
#include "actors/loader_actor.h"
#include "actors/memory_accountant_actor.h"
#include "actors/scheduler_actor.h"
#include "runtime/log.h"

namespace troupe::actors {

namespace {

struct device_entry {
  device_actor actor;
  allocator_actor allocator;
  actor_status status;
};

struct model_entry {
  scheduler_actor sched;
  std::set<session_actor> sessions;
  actor_status status;
  std::map<std::string, uint64_t> peer_epochs;  // peers holding its weights: the connection they are on
  std::string down_for_peer;                    // the peer it is marked down for ("": up, or down for another reason)
  model_settings settings;                      // as requested: what a reload repeats
};

// A model loaded again because a peer holding its weights reconnected (its buffers there went with the old
// connection). Listed in runtime_status as its model, down, while it runs or after it failed (until the
// peer's next reconnect retries it, or the user loads or unloads the model).
struct reload_entry {
  model_settings settings;
  actor_status status;
  bool running = false;
};

struct peer_entry {
  peer_actor actor;
  peer_status status;
};

struct supervisor_state {
  runtime_env_ptr env;
  supervisor_params params;
  memory_accountant_actor accountant;
  loader_actor loader;
  scheduler_actor graphs;
  std::vector<std::string> device_order;
  std::map<std::string, device_entry> devices;
  std::map<std::string, allocator_actor> allocators;  // by buffer type name
  std::map<std::string, model_entry> models;
  std::map<std::string, reload_entry> reloads;
  std::vector<peer_entry> peers;
  actor_status loader_status{"loader"};
  uint64_t next_session = 1;
  bool shutting_down = false;
  std::function<void()> after_reloads;  // a shutdown waiting for running reloads to end
  static inline const char* name = "troupe.supervisor";
};

using supervisor_ptr = supervisor_actor::stateful_pointer<supervisor_state>;

// Tells the actors that dispatch to devices which actor serves a device now.
void announce_device(supervisor_ptr self, const std::string& name) {
  auto& st = self->state;
  const device_actor& dev = st.devices.at(name).actor;
  self->send(st.loader, device_atom_v, name, dev);
  self->send(st.graphs, device_atom_v, name, dev);
  for (auto& [m, e] : st.models) self->send(e.sched, device_atom_v, name, dev);
}

void start_device(supervisor_ptr self, const std::string& name) {
  auto& st = self->state;
  device_entry& e = st.devices[name];
  e.actor = spawn_device_actor(self->system(), st.env, name, st.accountant, {.n_threads = st.params.n_threads});
  self->monitor(e.actor);
  e.status.name = "device:" + name;
  e.status.up = true;
}

// A device the runtime serves from now on: its device actor and allocator actor.
void add_device(supervisor_ptr self, const std::string& name) {
  auto& st = self->state;
  device_i* dev = registry::instance().find(name);
  if (dev == nullptr) throw error("supervisor: no device named '" + name + "' is registered");
  st.device_order.push_back(name);
  start_device(self, name);
  device_entry& e = st.devices.at(name);
  e.allocator = spawn_allocator_actor(self->system(), st.env, name, st.accountant);
  self->monitor(e.allocator);
  st.allocators[std::string(dev->buffer_type().name())] = e.allocator;
}

void start_loader(supervisor_ptr self) {
  auto& st = self->state;
  st.loader = spawn_loader_actor(self->system(), st.env, st.accountant);
  self->monitor(st.loader);
  st.loader_status.up = true;
  for (auto& [name, e] : st.devices) self->send(st.loader, device_atom_v, name, e.actor);
}

scheduler_actor start_scheduler(supervisor_ptr self, const std::string& model) {
  auto& st = self->state;
  scheduler_actor s = spawn_scheduler_actor(self->system(), st.env, st.accountant,
                                            {.model = model,
                                             .allocators = st.allocators,
                                             .flush_delay = st.params.flush_delay,
                                             .dispatch_splits = st.params.dispatch_splits});
  self->monitor(s);
  for (auto& [name, e] : st.devices) self->send(s, device_atom_v, name, e.actor);
  return s;
}

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

// The peer a device is on (its registry name among the peer's devices), or null.
const peer_entry* peer_of(const supervisor_state& st, const std::string& device) {
  for (const peer_entry& p : st.peers) {
    if (std::find(p.status.devices.begin(), p.status.devices.end(), device) != p.status.devices.end()) return &p;
  }
  return nullptr;
}

void stop_model(supervisor_ptr self, const std::string& name, std::function<void()> done);

// The devices a model's settings place anything on (layers and tensor overrides).
std::vector<std::string> devices_of(const model_settings& r) {
  std::vector<std::string> out;
  for (const device_layers& d : r.devices) out.push_back(d.device);
  for (const tensor_override& o : r.overrides) out.push_back(o.device);
  return out;
}

// Checks r's devices, has the loader load the model and starts its scheduler; `done` gets the result.
void load_model(supervisor_ptr self, load_request r, std::function<void(caf::expected<model_info>)> done) {
  const model_settings& settings = r.model;
  auto& st = self->state;
  if (st.shutting_down) return done(make_error(errc::down, "the runtime is shutting down"));
  if (!st.loader_status.up) return done(make_error(errc::down, "the loader is down"));
  for (const std::string& name : devices_of(settings)) {
    const auto it = st.devices.find(name);
    if (it == st.devices.end()) return done(make_error(errc::not_found, "no device actor for device '" + name + "'"));
    if (!it->second.status.up) return done(make_error(errc::down, "device " + name + " is down"));
    if (const peer_entry* pe = peer_of(st, name); pe != nullptr && pe->status.state != "up") {
      return done(make_error(errc::down, "device " + name + " is on peer " + pe->status.name + " (" + pe->status.address +
                                             "), which is " + pe->status.state +
                                             (pe->status.last_error.empty() ? "" : ": " + pe->status.last_error)));
    }
  }
  self->request(st.loader, caf::infinite, load_atom_v, r)
      .then(
          [self, settings, done](const model_info& info) {
            auto& s = self->state;
            if (s.shutting_down) {
              // Loaded while the runtime began to stop: give the weights back before saying so.
              auto refuse = [done] { done(make_error(errc::down, "the runtime is shutting down")); };
              self->request(s.loader, caf::infinite, unload_atom_v, info.name)
                  .then([refuse](bool) { refuse(); }, [refuse](const caf::error&) { refuse(); });
              return;
            }
            model_entry& e = s.models[info.name];
            e.sched = start_scheduler(self, info.name);
            e.status.name = "model:" + info.name;
            e.status.up = true;
            e.settings = settings;
            for (const std::string& d : devices_of(settings)) {
              const peer_entry* pe = peer_of(s, d);
              if (pe == nullptr || e.peer_epochs.count(pe->status.name)) continue;
              e.peer_epochs[pe->status.name] = pe->status.epoch;
              self->send(pe->actor, attach_atom_v, info.name);
            }
            done(info);
          },
          [done](const caf::error& e) { done(e); });
}

bool reload_running(const supervisor_state& st) {
  return std::any_of(st.reloads.begin(), st.reloads.end(), [](const auto& kv) { return kv.second.running; });
}

// After a reload ended: a shutdown waiting for the running ones goes on when none is left.
void reload_ended(supervisor_ptr self) {
  auto& st = self->state;
  if (!reload_running(st) && st.after_reloads) std::exchange(st.after_reloads, nullptr)();
}

// Loads a model of st.reloads again (it is not loaded now).
void run_reload(supervisor_ptr self, const std::string& name) {
  auto& st = self->state;
  const auto it = st.reloads.find(name);
  if (it == st.reloads.end()) return;
  if (st.shutting_down) {
    it->second.running = false;
    reload_ended(self);
    return;
  }
  it->second.running = true;
  TROUPE_LOG(info, "supervisor: loading model " << name << " again (" << it->second.status.last_error << ")");
  load_model(self, load_request{it->second.settings, {}}, [self, name](caf::expected<model_info> r) {
    auto& s = self->state;
    const auto e = s.reloads.find(name);
    if (e != s.reloads.end()) {
      if (r) {
        TROUPE_LOG(info, "supervisor: model " << name << " is loaded again");
        s.reloads.erase(e);
      } else {
        e->second.running = false;
        e->second.status.last_error = "loading it again failed: " + describe(r.error());
        TROUPE_LOG(warn, "supervisor: model " << name << ": " << e->second.status.last_error);
      }
    }
    // A shutdown waits for running reloads (their weights must be given back before the final figures).
    reload_ended(self);
  });
}

void watch_peer(supervisor_ptr self, const peer_actor& pa) {
  self->state.peers.push_back({pa, {}});
  self->monitor(pa);
  self->request(pa, caf::infinite, subscribe_atom_v, peer_subscriber{self}).then([](bool) {}, [](const caf::error&) {});
}

// A peer's new state: models with weights on it are marked down while it is down. After it reconnects the
// old connection's buffers, their weights, are gone: with reload_on_reconnect the model is unloaded and
// loaded again by itself (its sessions end; new ones can be opened once it is up), otherwise it stays down
// until the user loads it again.
void on_peer_update(supervisor_ptr self, const peer_status& ps) {
  auto& st = self->state;
  std::vector<std::string> reloads;
  for (peer_entry& p : st.peers) {
    if (p.actor.address() != self->current_sender()) continue;
    p.status = ps;
  }
  // A peer that was not up when the runtime started (or serves more devices now): its devices get actors
  // now, so models loaded from here on can use them.
  if (ps.state == "up" && !st.shutting_down) {
    for (const std::string& d : ps.devices) {
      if (st.devices.count(d)) continue;
      try {
        add_device(self, d);
        announce_device(self, d);
        TROUPE_LOG(info, "supervisor: peer " << ps.name << " is up; its device " << d << " is available");
      } catch (const std::exception& e) {
        TROUPE_LOG(warn, "supervisor: device " << d << " of peer " << ps.name << ": " << e.what());
      }
    }
  }
  for (auto& [name, m] : st.models) {
    const auto it = m.peer_epochs.find(ps.name);
    if (it == m.peer_epochs.end()) continue;
    // Down for another reason (its scheduler failed): that stays the news.
    if (!m.status.up && m.down_for_peer != ps.name) continue;
    if (ps.state != "up") {
      if (!m.status.up) continue;  // already reported
      m.status.up = false;
      m.down_for_peer = ps.name;
      m.status.last_error = "needs peer " + ps.name + " (" + ps.address + "), which is " + ps.state +
                            (ps.last_error.empty() ? "" : ": " + ps.last_error);
    } else if (ps.epoch != it->second) {
      const std::string was = m.status.last_error;
      m.status.up = false;
      m.down_for_peer = ps.name;
      m.status.last_error = "needs peer " + ps.name + " (" + ps.address + "), which reconnected (connection " +
                            std::to_string(ps.epoch) + "): its weights there were lost with the old connection; " +
                            (st.params.reload_on_reconnect ? "loading it again" : "unload and load the model again");
      if (st.params.reload_on_reconnect) {
        reloads.push_back(name);
        continue;
      }
      if (m.status.last_error == was) continue;
    } else {
      continue;
    }
    TROUPE_LOG(warn, "supervisor: model " << name << " is down: " << m.status.last_error);
  }
  if (st.shutting_down) return;
  for (const std::string& name : reloads) {
    model_entry& m = st.models.at(name);
    st.reloads[name] = reload_entry{m.settings, m.status, true};
    stop_model(self, name, [self, name] { run_reload(self, name); });
  }
  // Reloads that failed earlier (the peer went away again meanwhile, say) are retried when it is back.
  if (ps.state == "up") {
    for (auto& [name, r] : st.reloads) {
      if (r.running) continue;
      const auto ds = devices_of(r.settings);
      if (std::any_of(ds.begin(), ds.end(), [&](const std::string& d) {
            return std::find(ps.devices.begin(), ps.devices.end(), d) != ps.devices.end();
          })) {
        run_reload(self, name);
      }
    }
  }
}

// Stops a model's sessions and scheduler and releases its context and weights; `done` runs afterwards.
void stop_model(supervisor_ptr self, const std::string& name, std::function<void()> done) {
  auto& st = self->state;
  const auto it = st.models.find(name);
  if (it == st.models.end()) {
    done();
    return;
  }
  for (const session_actor& s : it->second.sessions) self->send_exit(s, caf::exit_reason::user_shutdown);
  for (const peer_entry& p : st.peers) {
    if (it->second.peer_epochs.count(p.status.name)) self->send(p.actor, detach_atom_v, name);
  }
  scheduler_actor sched = it->second.sched;
  st.models.erase(it);
  auto unload = [self, name, sched, done] {
    self->send_exit(sched, caf::exit_reason::user_shutdown);
    self->request(self->state.loader, caf::infinite, unload_atom_v, name)
        .then([done](bool) { done(); },
              [done, name](const caf::error& e) {
                TROUPE_LOG(warn, "supervisor: unloading " << name << ": " << describe(e));
                done();
              });
  };
  self->request(sched, caf::infinite, release_atom_v).then([unload](bool) { unload(); }, [unload](const caf::error&) { unload(); });
}

// ---- shutdown, step by step ----

// Stops every model (stop_model); `done` runs when all have been released.
void stop_all_models(supervisor_ptr self, std::function<void()> done) {
  std::vector<std::string> names;
  for (const auto& [name, m] : self->state.models) names.push_back(name);
  fan_in join(names.size(), std::move(done));
  for (const std::string& name : names) stop_model(self, name, join);
}

// Frees every device actor's buffers and releases every allocator's compute memory; `done` runs after.
void free_all_buffers(supervisor_ptr self, std::function<void()> done) {
  auto& st = self->state;
  fan_in join(2 * st.devices.size(), std::move(done));
  for (auto& [n, e] : st.devices) {
    self->request(e.actor, caf::infinite, free_atom_v, all_atom_v).then([join](uint64_t) { join(); },
                                                                       [join](const caf::error&) { join(); });
    self->request(e.allocator, caf::infinite, release_atom_v, all_atom_v)
        .then([join](uint64_t) { join(); }, [join](const caf::error&) { join(); });
  }
}

void finish_shutdown_now(supervisor_ptr self, caf::typed_response_promise<memory_breakdown> rp);

// Asks every device actor for its memory now, which it also sends the accountant (before its reply, so the
// accountant has it before anything this actor sends it after); `done` runs after. A breakdown then shows
// what the drivers report free at the time it is asked for, as the seed's (which asks them as it prints).
void refresh_devices(supervisor_ptr self, std::function<void()> done) {
  auto& st = self->state;
  fan_in join(st.devices.size(), std::move(done));
  for (auto& [n, e] : st.devices) {
    self->request(e.actor, caf::infinite, memory_atom_v).then([join](const device_status&) { join(); },
                                                             [join](const caf::error&) { join(); });
  }
}

// Replies the final breakdown, stops every actor and terminates.
void finish_shutdown(supervisor_ptr self, caf::typed_response_promise<memory_breakdown> rp) {
  refresh_devices(self, [self, rp]() mutable { finish_shutdown_now(self, rp); });
}

void finish_shutdown_now(supervisor_ptr self, caf::typed_response_promise<memory_breakdown> rp) {
  self->request(self->state.accountant, caf::infinite, get_atom_v, breakdown_atom_v)
      .then(
          [self, rp](const memory_breakdown& b) mutable {
            rp.deliver(b);
            auto& st = self->state;
            for (auto& [n, e] : st.devices) {
              self->send_exit(e.actor, caf::exit_reason::user_shutdown);
              self->send_exit(e.allocator, caf::exit_reason::user_shutdown);
            }
            self->send_exit(st.loader, caf::exit_reason::user_shutdown);
            self->send_exit(st.graphs, caf::exit_reason::user_shutdown);
            self->send_exit(st.accountant, caf::exit_reason::user_shutdown);
            for (const peer_entry& pe : st.peers) self->send_exit(pe.actor, caf::exit_reason::user_shutdown);
            self->quit();
          },
          [self, rp](const caf::error& e) mutable {
            rp.deliver(e);
            self->quit();
          });
}

supervisor_actor::behavior_type supervisor(supervisor_ptr self, runtime_env_ptr env, supervisor_params p) {
  auto& init = self->state;
  init.env = env;
  init.params = std::move(p);
  init.accountant = spawn_memory_accountant(self->system());
  self->monitor(init.accountant);
  for (const std::string& name : init.params.devices) {
    if (!init.devices.count(name)) add_device(self, name);
  }
  init.graphs = spawn_scheduler_actor(self->system(), env, init.accountant, {.allocators = init.allocators});
  self->monitor(init.graphs);
  for (auto& [name, e] : init.devices) self->send(init.graphs, device_atom_v, name, e.actor);
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
        runtime_status s;
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
          d.schedulers.push_back(m.sched);
        }
        d.graphs = st.graphs;
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
        // Models being loaded again finish first (a model they load now is given back at once); then the
        // models, then every device's and allocator's buffers, then the final breakdown.
        auto stop_models = [self, rp]() mutable {
          stop_all_models(self, [self, rp]() mutable { free_all_buffers(self, [self, rp]() mutable { finish_shutdown(self, rp); }); });
        };
        if (reload_running(st)) {
          st.after_reloads = stop_models;
        } else {
          stop_models();
        }
        return rp;
      },
  };
}

}  // namespace

supervisor_actor spawn_supervisor(caf::actor_system& sys, runtime_env_ptr env, const supervisor_params& p) {
  for (const std::string& name : p.devices) {
    if (registry::instance().find(name) == nullptr) throw error("supervisor: no device named '" + name + "' is registered");
  }
  return sys.spawn(supervisor, std::move(env), p);
}

}  // namespace troupe::actors
