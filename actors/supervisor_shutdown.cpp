#include <caf/all.hpp>

#include <string>
#include <utility>
#include <vector>

#include "actors/detail/supervisor_state.h"
#include "actors/fan_in.h"

namespace troupe::actors::detail {

namespace {

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
            self->send_exit(st.accountant, caf::exit_reason::user_shutdown);
            for (const peer_entry& pe : st.peers) self->send_exit(pe.actor, caf::exit_reason::user_shutdown);
            self->quit();
          },
          [self, rp](const caf::error& e) mutable {
            rp.deliver(e);
            self->quit();
          });
}

// Replies the final breakdown, stops every actor and terminates.
void finish_shutdown(supervisor_ptr self, caf::typed_response_promise<memory_breakdown> rp) {
  refresh_devices(self, [self, rp]() mutable { finish_shutdown_now(self, rp); });
}

}  // namespace

void shut_down(supervisor_ptr self, caf::typed_response_promise<memory_breakdown> rp) {
  // Models being loaded again finish first (a model they load now is given back at once); then the
  // models, then every device's and allocator's buffers, then the final breakdown.
  auto stop_models = [self, rp]() mutable {
    stop_all_models(self, [self, rp]() mutable { free_all_buffers(self, [self, rp]() mutable { finish_shutdown(self, rp); }); });
  };
  if (reload_running(self->state)) {
    self->state.after_reloads = stop_models;
  } else {
    stop_models();
  }
}

}  // namespace troupe::actors::detail
