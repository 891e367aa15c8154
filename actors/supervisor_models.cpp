#include <caf/all.hpp>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "actors/detail/supervisor_state.h"
#include "actors/errors.h"
#include "actors/decoder_actor.h"
#include "runtime/log.h"

namespace troupe::actors::detail {

namespace {

// The decoder actor of a model the loader has loaded: watched, and told every device actor.
decoder_actor start_decoder(supervisor_ptr self, const std::string& model) {
  auto& st = self->state;
  decoder_actor s = spawn_decoder_actor(self->system(), st.env, st.accountant,
                                            {.model = model,
                                             .allocators = st.allocators,
                                             .flush_delay = st.params.flush_delay,
                                             .dispatch_splits = st.params.dispatch_splits});
  self->monitor(s);
  for (auto& [name, e] : st.devices) self->send(s, device_atom_v, name, e.actor);
  return s;
}

// After a reload ended: a shutdown waiting for the running ones goes on when none is left.
void reload_ended(supervisor_ptr self) {
  auto& st = self->state;
  if (!reload_running(st) && st.after_reloads) std::exchange(st.after_reloads, nullptr)();
}

}  // namespace

std::vector<std::string> devices_of(const model_settings& r) {
  std::vector<std::string> out;
  for (const device_layers& d : r.devices) out.push_back(d.device);
  for (const tensor_override& o : r.overrides) out.push_back(o.device);
  return out;
}

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
            e.sched = start_decoder(self, info.name);
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
  decoder_actor sched = it->second.sched;
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

bool reload_running(const supervisor_state& st) {
  return std::any_of(st.reloads.begin(), st.reloads.end(), [](const auto& kv) { return kv.second.running; });
}

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

}  // namespace troupe::actors::detail
