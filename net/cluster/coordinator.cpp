#include "net/cluster/coordinator.h"

#include <caf/all.hpp>
#include <caf/io/middleman.hpp>

#include <algorithm>
#include <cctype>
#include <map>
#include <nlohmann/json.hpp>

#include "actors/errors.h"
#include "backends/rpc/wire/auth.h"
#include "net/rpc/peer_server.h"
#include "runtime/error.h"
#include "runtime/log.h"

namespace troupe::cluster {

using actors::errc;
using actors::make_error;

namespace {

constexpr size_t max_devices = 64;
constexpr size_t max_pending_challenges = 1024;
constexpr size_t nonce_bytes = 32;

std::span<const uint8_t> bytes_of(const std::string& s) { return {reinterpret_cast<const uint8_t*>(s.data()), s.size()}; }

std::vector<uint8_t> to_vector(const rpc::mac& m) { return {m.begin(), m.end()}; }

bool valid_name(const std::string& s) {
  return !s.empty() && s.size() <= 64 && std::all_of(s.begin(), s.end(), [](unsigned char c) {
    return std::isalnum(c) || c == '-' || c == '_' || c == '.';
  });
}

std::string check_device(const node_device& d, const std::string& field) {
  if (d.name.empty() || d.name.size() > 128) return field + ".name must have 1 to 128 characters";
  if (d.description.size() > 1024) return field + ".description is longer than 1024 characters";
  if (d.kind != "cpu" && d.kind != "gpu" && d.kind != "igpu" && d.kind != "accel") {
    return field + ".kind '" + d.kind.substr(0, 32) + "' is not one of cpu, gpu, igpu, accel";
  }
  if (d.memory_free > d.memory_total) return field + ".memory_free is more than its memory_total";
  return {};
}

struct node_rec {
  uint64_t id = 0;
  node_inventory inventory;
  uint64_t epoch = 0;       // of its membership: one more at every join and every return from down
  uint64_t join_epoch = 0;  // the epoch its last join was given (its heartbeats carry it)
  uint64_t joins = 0;
  bool up = false;
  caf::actor_addr actor;
  std::chrono::steady_clock::time_point last_beat;
  uint64_t heartbeats = 0;
  std::string down_reason;
};

struct coordinator_state {
  coordinator_params params;
  std::map<caf::actor_addr, std::vector<uint8_t>> challenges;  // asked, not answered yet
  std::map<std::string, node_rec> nodes;                       // by name
  uint64_t next_id = 1;
  std::vector<cluster_subscriber> subscribers;
  static inline const char* name = "cluster coordinator";
};

using coordinator_ptr = coordinator_actor::stateful_pointer<coordinator_state>;

cluster_view view_of(const coordinator_state& st) {
  cluster_view v;
  const auto now = std::chrono::steady_clock::now();
  for (const auto& [name, n] : st.nodes) {
    node_entry e;
    e.id = n.id;
    e.name = name;
    e.state = n.up ? "up" : "down";
    e.epoch = n.epoch;
    e.joins = n.joins;
    e.rpc_address = n.inventory.rpc_host + ":" + std::to_string(n.inventory.rpc_port);
    e.rpc_tls = n.inventory.rpc_tls;
    e.devices = n.inventory.devices;
    e.heartbeats = n.heartbeats;
    if (n.up) e.since_heartbeat_ms = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(now - n.last_beat).count());
    e.down_reason = n.down_reason;
    v.nodes.push_back(std::move(e));
  }
  std::sort(v.nodes.begin(), v.nodes.end(), [](const node_entry& a, const node_entry& b) { return a.id < b.id; });
  return v;
}

void publish_view(coordinator_ptr self) {
  const cluster_view v = view_of(self->state);
  for (const auto& s : self->state.subscribers) self->send(s, update_atom_v, v);
}

void mark_down(coordinator_ptr self, node_rec& n, const std::string& why) {
  if (!n.up) return;
  n.up = false;
  n.down_reason = why;
  TROUPE_LOG(warn, "cluster: node '" << n.inventory.name << "' (id " << n.id << ", epoch " << n.epoch << ") is down: " << why);
  publish_view(self);
}

node_rec* by_actor(coordinator_state& st, const caf::actor_addr& a) {
  for (auto& [name, n] : st.nodes) {
    if (n.actor == a) return &n;
  }
  return nullptr;
}

// With a key, the cluster's state (its nodes' addresses and devices) goes only to this process and to
// nodes that joined; without one (loopback only) to anyone who can connect.
bool may_see(coordinator_ptr self) {
  if (self->state.params.key.empty()) return true;
  const auto& from = self->current_sender();
  if (!from || from->node() == self->node()) return true;  // (anonymous messages are this process's own)
  const node_rec* n = by_actor(self->state, caf::actor_cast<caf::actor_addr>(from));
  return n != nullptr && n->up;
}

coordinator_actor::behavior_type coordinator(coordinator_ptr self, coordinator_params p) {
  self->state.params = std::move(p);
  self->set_down_handler([self](const caf::down_msg& m) {
    if (node_rec* n = by_actor(self->state, m.source)) {
      mark_down(self, *n, "connection lost" + (m.reason ? ": " + to_string(m.reason) : std::string()));
    }
    self->state.challenges.erase(m.source);
  });
  self->delayed_send(self, self->state.params.heartbeat, check_atom_v);
  return {
      [self](challenge_atom) -> caf::result<join_challenge> {
        const auto from = caf::actor_cast<caf::actor_addr>(self->current_sender());
        if (!from) return make_error(errc::bad_request, "cluster: a join needs a sending actor");
        auto& pending = self->state.challenges;
        if (pending.size() >= max_pending_challenges) pending.erase(pending.begin());
        join_challenge c{fresh_nonce()};
        pending[from] = c.nonce;
        return c;
      },
      [self](join_atom, const join_request& r) -> caf::result<join_accept> {
        auto& st = self->state;
        const auto from = caf::actor_cast<caf::actor_addr>(self->current_sender());
        const auto ch = st.challenges.find(from);
        if (!from || ch == st.challenges.end()) {
          return make_error(errc::bad_request, "cluster: join refused: no challenge was asked for first");
        }
        const std::vector<uint8_t> challenge = ch->second;
        st.challenges.erase(ch);
        const std::string shown = valid_name(r.inventory.name) ? r.inventory.name : "(invalid name)";
        if (const std::string bad = check_inventory(r.inventory); !bad.empty()) {
          TROUPE_LOG(warn, "cluster: refused a join of node " << shown << ": " << bad);
          return make_error(errc::bad_request, "cluster: join refused: " + bad);
        }
        if (r.nonce.size() != nonce_bytes) {
          return make_error(errc::bad_request, "cluster: join refused: nonce of " + std::to_string(r.nonce.size()) +
                                                   " bytes, expected " + std::to_string(nonce_bytes));
        }
        if (!st.params.key.empty()) {
          if (!same_proof(r.proof, node_proof(st.params.key, challenge, r.nonce, r.inventory.name))) {
            TROUPE_LOG(warn, "cluster: refused a join of node '" << shown << "': "
                                 << (r.proof.empty() ? "it gave no key" : "wrong key"));
            return make_error(errc::refused, "cluster: join refused: the node does not know the cluster's key");
          }
        }
        node_rec& n = st.nodes[r.inventory.name];
        if (n.id == 0) n.id = st.next_id++;
        if (n.up && n.actor != from) {
          self->demonitor(n.actor);  // the old process is gone (or going): this join replaces it
        }
        n.inventory = r.inventory;
        n.epoch += 1;
        n.join_epoch = n.epoch;
        n.joins += 1;
        n.up = true;
        n.actor = from;
        n.last_beat = std::chrono::steady_clock::now();
        n.heartbeats = 0;
        n.down_reason.clear();
        self->monitor(from);
        TROUPE_LOG(info, "cluster: node '" << n.inventory.name << "' joined (id " << n.id << ", epoch " << n.epoch << ", "
                                           << n.inventory.devices.size() << " device(s), rpc "
                                           << n.inventory.rpc_host << ":" << n.inventory.rpc_port << ")");
        publish_view(self);
        join_accept a;
        a.node_id = n.id;
        a.epoch = n.epoch;
        a.heartbeat_ms = static_cast<uint32_t>(st.params.heartbeat.count());
        if (!st.params.key.empty()) a.proof = coordinator_proof(st.params.key, r.nonce, challenge);
        return a;
      },
      [self](heartbeat_atom, const node_heartbeat& h) {
        node_rec* n = by_actor(self->state, caf::actor_cast<caf::actor_addr>(self->current_sender()));
        if (n == nullptr || n->id != h.node_id || n->join_epoch != h.epoch) return;  // not from a joined node
        if (!n->up) {
          // Silent for too long (stopped, a stalled link) and back, on the same connection: up again, in a new
          // epoch (what was placed on it is gone from the coordinator's plans), never left lingering as down.
          n->up = true;
          n->epoch += 1;
          n->heartbeats = 0;
          TROUPE_LOG(info, "cluster: node '" << n->inventory.name << "' is back after \"" << n->down_reason << "\" (id "
                                             << n->id << ", epoch " << n->epoch << ")");
          n->down_reason.clear();
          publish_view(self);
        }
        n->last_beat = std::chrono::steady_clock::now();
        n->heartbeats += 1;
        // Memory figures for the devices it joined with (same names, same order); anything else is ignored.
        if (h.devices.size() != n->inventory.devices.size()) return;
        for (size_t i = 0; i < h.devices.size(); ++i) {
          if (h.devices[i].name != n->inventory.devices[i].name ||
              !check_device(h.devices[i], "heartbeat.devices[" + std::to_string(i) + "]").empty()) {
            return;
          }
        }
        for (size_t i = 0; i < h.devices.size(); ++i) {
          n->inventory.devices[i].memory_free = h.devices[i].memory_free;
          n->inventory.devices[i].memory_total = h.devices[i].memory_total;
        }
      },
      [self](get_atom, status_atom) -> caf::result<cluster_view> {
        if (!may_see(self)) return make_error(errc::refused, "cluster: the cluster's state is for its nodes and its own process");
        return view_of(self->state);
      },
      [self](subscribe_atom, cluster_subscriber s) -> caf::result<bool> {
        if (!may_see(self)) return make_error(errc::refused, "cluster: the cluster's state is for its nodes and its own process");
        self->state.subscribers.push_back(s);
        self->send(s, update_atom_v, view_of(self->state));
        return true;
      },
      [self](check_atom) {
        const auto now = std::chrono::steady_clock::now();
        for (auto& [name, n] : self->state.nodes) {
          const auto silent = std::chrono::duration_cast<std::chrono::milliseconds>(now - n.last_beat);
          if (n.up && silent > self->state.params.down_after) {
            mark_down(self, n, "no heartbeat for " + std::to_string(silent.count()) + " ms");
          }
        }
        self->delayed_send(self, self->state.params.heartbeat, check_atom_v);
      },
  };
}

}  // namespace

std::string check_inventory(const node_inventory& inv) {
  if (!valid_name(inv.name)) return "inventory.name must have 1 to 64 letters, digits, '-', '_' or '.'";
  if (inv.rpc_host.empty() || inv.rpc_host.size() > 255) return "inventory.rpc_host must have 1 to 255 characters";
  if (inv.rpc_port == 0) return "inventory.rpc_port must not be 0";
  if (inv.devices.empty()) return "inventory.devices is empty: the node serves nothing";
  if (inv.devices.size() > max_devices) return "inventory.devices has " + std::to_string(inv.devices.size()) + " entries (at most 64)";
  for (size_t i = 0; i < inv.devices.size(); ++i) {
    if (std::string bad = check_device(inv.devices[i], "inventory.devices[" + std::to_string(i) + "]"); !bad.empty()) return bad;
  }
  return {};
}

cluster_view ask_view(caf::actor_system& sys, const coordinator_actor& c) {
  caf::scoped_actor self{sys};
  cluster_view v;
  std::string failure;
  self->request(c, std::chrono::seconds(5), get_atom_v, status_atom_v)
      .receive([&](const cluster_view& got) { v = got; }, [&](const caf::error& e) { failure = actors::describe(e); });
  if (!failure.empty()) throw error("cluster: the coordinator did not answer: " + failure);
  return v;
}

std::string status_json(caf::actor_system& sys, const coordinator_actor& c) {
  const cluster_view v = ask_view(sys, c);
  nlohmann::json nodes = nlohmann::json::array();
  for (const node_entry& n : v.nodes) {
    nlohmann::json devices = nlohmann::json::array();
    for (const node_device& d : n.devices) {
      devices.push_back({{"name", d.name}, {"description", d.description}, {"kind", d.kind}, {"memory_total", d.memory_total},
                         {"memory_free", d.memory_free}, {"max_buffer", d.max_buffer}});
    }
    nodes.push_back({{"id", n.id}, {"name", n.name}, {"state", n.state}, {"epoch", n.epoch}, {"joins", n.joins},
                     {"rpc_address", n.rpc_address}, {"rpc_tls", n.rpc_tls}, {"heartbeats", n.heartbeats},
                     {"since_heartbeat_ms", n.since_heartbeat_ms}, {"down_reason", n.down_reason}, {"devices", devices}});
  }
  return nlohmann::json{{"nodes", nodes}}.dump();
}

bool same_proof(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  rpc::mac x{}, y{};
  if (a.size() != x.size() || b.size() != y.size()) return false;
  std::copy(a.begin(), a.end(), x.begin());
  std::copy(b.begin(), b.end(), y.begin());
  return rpc::equal_macs(x, y);
}

std::vector<uint8_t> fresh_nonce() {
  const rpc::nonce n = rpc::random_nonce();
  return {n.begin(), n.end()};
}

std::vector<uint8_t> node_proof(const std::string& key, const std::vector<uint8_t>& coordinator_nonce,
                                const std::vector<uint8_t>& node_nonce, const std::string& name) {
  return to_vector(rpc::keyed_proof(key, "troupe-cluster node", {coordinator_nonce, node_nonce, bytes_of(name)}));
}

std::vector<uint8_t> coordinator_proof(const std::string& key, const std::vector<uint8_t>& node_nonce,
                                       const std::vector<uint8_t>& coordinator_nonce) {
  return to_vector(rpc::keyed_proof(key, "troupe-cluster coordinator", {node_nonce, coordinator_nonce}));
}

coordinator_actor spawn_coordinator(caf::actor_system& sys, coordinator_params p) {
  if (p.heartbeat.count() <= 0 || p.down_after <= p.heartbeat) {
    throw error("cluster: down_after (" + std::to_string(p.down_after.count()) + " ms) must be more than heartbeat (" +
                std::to_string(p.heartbeat.count()) + " ms), which must be positive");
  }
  return sys.spawn(coordinator, std::move(p));
}

void check_listen_host(const std::string& host, bool has_key) {
  if (!has_key && !rpc::is_loopback_host(host)) {
    throw error("cluster: refusing to listen on " + host + " without a key: anyone who can reach it could join. "
                "Set the [cluster] key_file (or listen on 127.0.0.1)");
  }
}

uint16_t publish_coordinator(caf::actor_system& sys, const coordinator_actor& c, const std::string& host, uint16_t port,
                             bool has_key) {
  check_listen_host(host, has_key);
  auto bound = sys.middleman().publish(c, port, host.c_str(), true);
  if (!bound) throw error("cluster: cannot listen on " + host + ":" + std::to_string(port) + ": " + sys.render(bound.error()));
  return *bound;
}

}  // namespace troupe::cluster
