// The supervisor's state and the pieces of its behaviour, one concern per file: supervisor_actor.cpp (the
// handlers and what it does when a watched actor terminates), supervisor_devices.cpp (device actors,
// allocator actors and the loader), supervisor_models.cpp (loading, stopping and reloading models),
// supervisor_peers.cpp (remote peers' states) and supervisor_shutdown.cpp (the shutdown, step by step).
// Internal to troupe_actors.
#pragma once

#include <caf/all.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "actors/engine_env.h"
#include "actors/supervisor_actor.h"

namespace troupe::actors::detail {

struct device_entry {
  device_actor actor;
  allocator_actor allocator;
  actor_status status;
};

struct model_entry {
  decoder_actor sched;
  std::set<session_actor> sessions;
  actor_status status;
  std::map<std::string, uint64_t> peer_epochs;  // peers holding its weights: the connection they are on
  std::string down_for_peer;                    // the peer it is marked down for ("": up, or down for another reason)
  model_settings settings;                      // as requested: what a reload repeats
};

// A model loaded again because a peer holding its weights reconnected (its buffers there went with the old
// connection). Listed in engine_status as its model, down, while it runs or after it failed (until the
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
  engine_env_ptr env;
  supervisor_params params;
  memory_accountant_actor accountant;
  loader_actor loader;
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

// ---- devices and the loader (supervisor_devices.cpp) ----

// Tells the actors that dispatch to devices which actor serves a device now.
void announce_device(supervisor_ptr self, const std::string& name);
// Spawns (or spawns again, after it terminated) the device actor of a device in st.devices and watches it.
void start_device(supervisor_ptr self, const std::string& name);
// A device the runtime serves from now on: its device actor and allocator actor. Throws error for a device
// the registry does not know.
void add_device(supervisor_ptr self, const std::string& name);
// Spawns (or spawns again) the loader actor, watches it and tells it every device actor.
void start_loader(supervisor_ptr self);
// Asks every device actor for its memory now, which it also sends the accountant (before its reply, so the
// accountant has it before anything this actor sends it after); `done` runs after.
void refresh_devices(supervisor_ptr self, std::function<void()> done);

// ---- models (supervisor_models.cpp) ----

// The devices a model's settings place anything on (layers and tensor overrides).
std::vector<std::string> devices_of(const model_settings& r);
// Checks r's devices, has the loader load the model and starts its scheduler; `done` gets the result.
void load_model(supervisor_ptr self, load_request r, std::function<void(caf::expected<model_info>)> done);
// Stops a model's sessions and scheduler and releases its context and weights; `done` runs afterwards.
void stop_model(supervisor_ptr self, const std::string& name, std::function<void()> done);
// Whether a model of st.reloads is being loaded again now.
bool reload_running(const supervisor_state& st);
// Loads a model of st.reloads again (it is not loaded now).
void run_reload(supervisor_ptr self, const std::string& name);

// ---- remote peers (supervisor_peers.cpp) ----

// The peer a device is on (its registry name among the peer's devices), or null.
const peer_entry* peer_of(const supervisor_state& st, const std::string& device);
// Watches a peer actor from now on: monitored, and subscribed to its state.
void watch_peer(supervisor_ptr self, const peer_actor& pa);
// A peer's new state (from the peer actor that sent it): its devices, and the models that use it.
void on_peer_update(supervisor_ptr self, const peer_status& ps);

// ---- shutdown (supervisor_shutdown.cpp) ----

// Stops everything in order once no reload is running (a model a running reload loads is given back at
// once): models, then every device's and allocator's buffers, then the final breakdown through rp; then
// every actor, and the supervisor terminates. st.shutting_down is set already.
void shut_down(supervisor_ptr self, caf::typed_response_promise<memory_breakdown> rp);

}  // namespace troupe::actors::detail
