#include "net/cluster/node.h"

#include <caf/all.hpp>

#include <algorithm>
#include <atomic>
#include <memory>

#include "actors/errors.h"
#include "net/cluster/coordinator.h"

namespace troupe::cluster {

using actors::errc;
using actors::make_error;

namespace {

constexpr auto request_timeout = std::chrono::seconds(10);

struct node_state {
  node_params params;
  join_accept accepted;
  std::chrono::milliseconds every{1000};
  static inline const char* name = "cluster node";
};

caf::behavior node(caf::stateful_actor<node_state>* self, coordinator_actor coord, node_params p) {
  self->state.params = std::move(p);
  self->monitor(coord);
  self->set_down_handler([self](const caf::down_msg& m) {
    self->quit(make_error(errc::down, "the coordinator went away" + (m.reason ? ": " + to_string(m.reason) : std::string())));
  });
  self->request(coord, request_timeout, challenge_atom_v)
      .then(
          [self, coord](const join_challenge& c) {
            if (c.nonce.size() != 32) {
              self->quit(make_error(errc::bad_request, "cluster: the coordinator's challenge is malformed"));
              return;
            }
            const node_params& np = self->state.params;
            join_request r;
            r.inventory = np.inventory;
            r.nonce = fresh_nonce();
            if (!np.key.empty()) r.proof = node_proof(np.key, c.nonce, r.nonce, np.inventory.name);
            self->request(coord, request_timeout, join_atom_v, r)
                .then(
                    [self, mine = r.nonce, theirs = c.nonce](const join_accept& a) {
                      auto& st = self->state;
                      if (!st.params.key.empty() && !same_proof(a.proof, coordinator_proof(st.params.key, mine, theirs))) {
                        self->quit(make_error(errc::refused, "cluster: the coordinator did not prove that it knows the key"));
                        return;
                      }
                      st.accepted = a;
                      st.every = std::chrono::milliseconds(std::clamp<uint32_t>(a.heartbeat_ms, 10, 60000));
                      if (st.params.on_joined) st.params.on_joined(a);
                      self->send(self, heartbeat_atom_v);
                    },
                    [self](const caf::error& e) { self->quit(e); });
          },
          [self](const caf::error& e) { self->quit(e); });
  return {
      [self, coord](heartbeat_atom) {
        auto& st = self->state;
        node_heartbeat h;
        h.node_id = st.accepted.node_id;
        h.epoch = st.accepted.epoch;
        h.devices = st.params.refresh ? st.params.refresh() : st.params.inventory.devices;
        self->send(coord, heartbeat_atom_v, std::move(h));
        self->delayed_send(self, st.every, heartbeat_atom_v);
      },
  };
}

}  // namespace

join_outcome run_node(caf::actor_system& sys, const coordinator_actor& coord, node_params p,
                      const std::function<bool()>& stop) {
  auto joined = std::make_shared<std::atomic<bool>>(false);
  auto user = p.on_joined;
  p.on_joined = [joined, user](const join_accept& a) {
    joined->store(true);
    if (user) user(a);
  };
  caf::scoped_actor self{sys};
  auto n = self->spawn(node, coord, std::move(p));
  self->monitor(n);
  join_outcome out;
  for (bool done = false; !done;) {
    self->receive([&](const caf::down_msg& m) {
                    done = true;
                    out.joined = joined->load();
                    out.refused = m.reason.category() == actors::error_category &&
                                  (m.reason.code() == static_cast<uint8_t>(errc::refused) ||
                                   m.reason.code() == static_cast<uint8_t>(errc::bad_request));
                    out.why = actors::describe(m.reason);
                  },
                  caf::after(std::chrono::milliseconds(100)) >> [&] {
                    if (stop && stop()) {
                      self->send_exit(n, caf::exit_reason::user_shutdown);
                    }
                  });
  }
  return out;
}

}  // namespace troupe::cluster
