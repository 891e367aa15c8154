// The cluster's control-plane messages (net/cluster): what a node tells the coordinator when it joins and in
// its heartbeats, and the cluster as the coordinator sees it. They cross CAF's middleman between processes,
// so each has inspect() and is registered (net/cluster/type_ids.h); tests/net/test_cluster.cpp sends every
// one of them between processes. Tensors never travel this way: a node's devices are reached over net/rpc,
// at the address its inventory gives.
#pragma once

#include <caf/meta/type_name.hpp>
#include <caf/typed_actor.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "actors/atoms.h"

CAF_ADD_ATOM(troupe_cluster, troupe::cluster, challenge_atom, "challenge")
CAF_ADD_ATOM(troupe_cluster, troupe::cluster, join_atom, "join")
CAF_ADD_ATOM(troupe_cluster, troupe::cluster, heartbeat_atom, "heartbeat")

namespace troupe::cluster {

using actors::check_atom;
using actors::check_atom_v;
using actors::get_atom;
using actors::get_atom_v;
using actors::status_atom;
using actors::status_atom_v;
using actors::subscribe_atom;
using actors::subscribe_atom_v;
using actors::update_atom;
using actors::update_atom_v;

// One device a node serves over net/rpc, as its registry sees it.
struct node_device {
  std::string name;         // the device's name on the node ("CPU", "Vulkan0"): its index on the node's peer server
  std::string description;  // "AMD EPYC 9654", "NVIDIA H200"
  std::string kind;         // "cpu", "gpu", "igpu" or "accel"
  uint64_t memory_total = 0;
  uint64_t memory_free = 0;
  uint64_t max_buffer = 0;  // the largest single buffer it allocates
  friend bool operator==(const node_device&, const node_device&) = default;
};

// What a node brings: its name (unique in the cluster), the address of its net/rpc peer server (and whether it
// speaks TLS), its devices.
struct node_inventory {
  std::string name;
  std::string rpc_host;
  uint16_t rpc_port = 0;
  std::vector<node_device> devices;
  bool rpc_tls = false;
  friend bool operator==(const node_inventory&, const node_inventory&) = default;
};

// Coordinator -> node: a fresh nonce to prove the shared key against.
struct join_challenge {
  std::vector<uint8_t> nonce;
};

// Node -> coordinator: its inventory, its own nonce and proof = HMAC(key, "troupe-cluster node" | coordinator
// nonce | node nonce | name); the proof is empty when the node has no key.
struct join_request {
  node_inventory inventory;
  std::vector<uint8_t> nonce;
  std::vector<uint8_t> proof;
};

// Coordinator -> node: its id (the same for every join under one name), the epoch of this join (one more
// than the last), how often to send heartbeats, and the coordinator's proof = HMAC(key, "troupe-cluster
// coordinator" | node nonce | coordinator nonce), empty without a key.
struct join_accept {
  uint64_t node_id = 0;
  uint64_t epoch = 0;
  uint32_t heartbeat_ms = 0;
  std::vector<uint8_t> proof;
};

// Node -> coordinator, every heartbeat_ms: still here, and its devices' memory now.
struct node_heartbeat {
  uint64_t node_id = 0;
  uint64_t epoch = 0;
  std::vector<node_device> devices;
};

// A node as the coordinator sees it.
struct node_entry {
  uint64_t id = 0;
  std::string name;
  std::string state;        // "up" or "down"
  uint64_t epoch = 0;       // of its last join
  uint64_t joins = 0;       // how many times it joined
  std::string rpc_address;  // "host:port"
  bool rpc_tls = false;     // its RPC server wants TLS
  std::vector<node_device> devices;
  uint64_t heartbeats = 0;          // received in this epoch
  uint64_t since_heartbeat_ms = 0;  // up: time since the last one (or since it joined)
  std::string down_reason;          // down: why ("no heartbeat for 3000 ms", "connection lost: ...")
  friend bool operator==(const node_entry&, const node_entry&) = default;
};

struct cluster_view {
  std::vector<node_entry> nodes;  // by id
  friend bool operator==(const cluster_view&, const cluster_view&) = default;
};

// Receives (update_atom, cluster_view) whenever a node joins, goes down or changes inventory.
using cluster_subscriber = caf::typed_actor<caf::reacts_to<update_atom, cluster_view>>;

using coordinator_actor = caf::typed_actor<
    // The join: a challenge for the sender, then its request against that challenge. A refused join is an
    // error naming the reason (a wrong key, a field of the inventory); the coordinator monitors an accepted
    // node's actor (its connection dropping marks it down).
    caf::replies_to<challenge_atom>::with<join_challenge>,
    caf::replies_to<join_atom, join_request>::with<join_accept>,
    // From the node actor that joined, in its epoch; anything else is ignored.
    caf::reacts_to<heartbeat_atom, node_heartbeat>,
    // The nodes; with a key, only for this process and joined nodes (others: errc::refused).
    caf::replies_to<get_atom, status_atom>::with<cluster_view>,
    caf::replies_to<subscribe_atom, cluster_subscriber>::with<bool>,
    // Internal: the periodic check for nodes without heartbeats.
    caf::reacts_to<check_atom>>;

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, node_device& x) {
  return f(caf::meta::type_name("node_device"), x.name, x.description, x.kind, x.memory_total, x.memory_free, x.max_buffer);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, node_inventory& x) {
  return f(caf::meta::type_name("node_inventory"), x.name, x.rpc_host, x.rpc_port, x.rpc_tls, x.devices);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, join_challenge& x) {
  return f(caf::meta::type_name("join_challenge"), x.nonce);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, join_request& x) {
  return f(caf::meta::type_name("join_request"), x.inventory, x.nonce, x.proof);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, join_accept& x) {
  return f(caf::meta::type_name("join_accept"), x.node_id, x.epoch, x.heartbeat_ms, x.proof);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, node_heartbeat& x) {
  return f(caf::meta::type_name("node_heartbeat"), x.node_id, x.epoch, x.devices);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, node_entry& x) {
  return f(caf::meta::type_name("node_entry"), x.id, x.name, x.state, x.epoch, x.joins, x.rpc_address, x.rpc_tls, x.devices,
           x.heartbeats, x.since_heartbeat_ms, x.down_reason);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, cluster_view& x) {
  return f(caf::meta::type_name("cluster_view"), x.nodes);
}

}  // namespace troupe::cluster
