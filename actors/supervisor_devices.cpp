#include <caf/all.hpp>

#include <string>
#include <utility>

#include "actors/allocator_actor.h"
#include "actors/detail/supervisor_state.h"
#include "actors/device_actor.h"
#include "actors/fan_in.h"
#include "actors/loader_actor.h"
#include "runtime/error.h"

namespace troupe::actors::detail {

void announce_device(supervisor_ptr self, const std::string& name) {
  auto& st = self->state;
  const device_actor& dev = st.devices.at(name).actor;
  self->send(st.loader, device_atom_v, name, dev);
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

// A breakdown asked for after this shows what the drivers report free at the time it is asked for.
void refresh_devices(supervisor_ptr self, std::function<void()> done) {
  auto& st = self->state;
  fan_in join(st.devices.size(), std::move(done));
  for (auto& [n, e] : st.devices) {
    self->request(e.actor, caf::infinite, memory_atom_v).then([join](const device_status&) { join(); },
                                                             [join](const caf::error&) { join(); });
  }
}

}  // namespace troupe::actors::detail
