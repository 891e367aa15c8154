// The cluster's coordinator actor: nodes join it over CAF's middleman (a shared-key challenge-response),
// send their inventory and heartbeats, and are marked down after down_after without a heartbeat or as soon
// as their connection drops (a CAF monitor on the node's actor). A node is known by its name: a join under
// a known name (a restart, a rejoin) keeps its id and gets the next epoch.
//
//   coordinator_actor c = spawn_coordinator(sys, {.key = key, .heartbeat = 1s, .down_after = 3s});
//   uint16_t port = publish_coordinator(sys, c, "0.0.0.0", 7070, true);   // throws error
//   self->request(c, 5s, get_atom_v, status_atom_v).then([](const cluster_view& v) { ... });
//
// Until a node has joined, its actor may only ask for a challenge and join: heartbeats from anyone else
// are dropped. Nothing a node sends is trusted: a join whose inventory is malformed (a name, an address, a
// device kind, too many devices) is refused with an error naming the field.
#pragma once

#include <caf/actor_system.hpp>

#include <chrono>
#include <cstdint>
#include <string>

#include "net/cluster/messages.h"

namespace troupe::cluster {

struct coordinator_params {
  std::string key;                              // the shared key; empty: none (publish allows loopback only)
  std::chrono::milliseconds heartbeat{1000};    // what nodes are told to send at
  std::chrono::milliseconds down_after{3000};   // a node without a heartbeat this long is down
};

coordinator_actor spawn_coordinator(caf::actor_system& sys, coordinator_params p);

// Publishes c on host:port through the middleman (port 0: any; returns the one bound); behind TLS:
// publish_coordinator_tls (net/cluster/tls.h). Throws error when the host is not loopback and has_key is
// false (check_listen_host), or when publishing fails (naming the address).
uint16_t publish_coordinator(caf::actor_system& sys, const coordinator_actor& c, const std::string& host, uint16_t port,
                             bool has_key);
void check_listen_host(const std::string& host, bool has_key);

// The coordinator's view, asked from this process (at most 5 s). Throws error when it does not answer.
cluster_view ask_view(caf::actor_system& sys, const coordinator_actor& c);

// The coordinator's view as JSON (GET /v1/cluster): {"nodes": [{"id", "name", "state", "epoch", "joins",
// "rpc_address", "heartbeats", "since_heartbeat_ms", "down_reason", "devices": [{"name", "description",
// "kind", "memory_total", "memory_free", "max_buffer"}]}]}. Asks c (at most 5 s); throws error when it
// does not answer.
std::string status_json(caf::actor_system& sys, const coordinator_actor& c);

// The checks a join's inventory passes (exposed for tests): an empty string when valid, else the field and
// what is wrong with it ("inventory.devices[1].kind 'tpu' is not one of cpu, gpu, igpu, accel").
std::string check_inventory(const node_inventory& inv);

// The proofs of the join (backends/rpc/wire/auth.h's keyed_proof, labelled for the cluster).
std::vector<uint8_t> node_proof(const std::string& key, const std::vector<uint8_t>& coordinator_nonce,
                                const std::vector<uint8_t>& node_nonce, const std::string& name);
std::vector<uint8_t> coordinator_proof(const std::string& key, const std::vector<uint8_t>& node_nonce,
                                       const std::vector<uint8_t>& coordinator_nonce);
std::vector<uint8_t> fresh_nonce();
// Whether two proofs are the same HMAC (constant time; a proof of the wrong size is never the same).
bool same_proof(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b);

}  // namespace troupe::cluster
