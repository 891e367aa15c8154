#include <caf/all.hpp>

#include <algorithm>
#include <exception>
#include <string>
#include <vector>

#include "actors/detail/supervisor_state.h"
#include "runtime/log.h"

namespace troupe::actors::detail {

const peer_entry* peer_of(const supervisor_state& st, const std::string& device) {
  for (const peer_entry& p : st.peers) {
    if (std::find(p.status.devices.begin(), p.status.devices.end(), device) != p.status.devices.end()) return &p;
  }
  return nullptr;
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

}  // namespace troupe::actors::detail
