// A node's side of the cluster: joins the coordinator (answering its challenge with the shared key and
// checking the coordinator's proof in turn), then sends heartbeats with its devices' memory at the rate the
// coordinator asked for, until the coordinator goes away or the node is stopped. `troupe node` runs one
// join after another (tools/troupe/node.cpp); its devices are served by its net/rpc peer server, whose
// address is in the inventory.
//
//   auto coord = sys.middleman().remote_actor<coordinator_actor>("10.0.0.1", 7070);
//   join_outcome o = run_node(sys, *coord, {.key = key, .inventory = inv}, [&] { return stopping; });
#pragma once

#include <caf/actor_system.hpp>

#include <functional>
#include <string>
#include <vector>

#include "net/cluster/messages.h"

namespace troupe::cluster {

struct node_params {
  std::string key;  // the shared key; empty: none (the coordinator must not require one)
  node_inventory inventory;
  // The devices' memory now, for each heartbeat (empty: the inventory's figures).
  std::function<std::vector<node_device>()> refresh;
  std::function<void(const join_accept&)> on_joined;  // (on an actor's thread)
};

struct join_outcome {
  bool joined = false;   // the join was accepted (then `why` says how the membership ended)
  bool refused = false;  // the coordinator refused it (a wrong key, a bad inventory): trying again will not help
  std::string why;
};

// Joins and keeps the membership until the coordinator's actor goes (its connection dropped), it refuses
// the join, or stop() returns true (checked every 100 ms). Blocks the calling thread.
join_outcome run_node(caf::actor_system& sys, const coordinator_actor& coord, node_params p,
                      const std::function<bool()>& stop);

}  // namespace troupe::cluster
