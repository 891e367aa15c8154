// Models with placement = "cluster", for the coordinating daemon: their layers placed over the cluster's
// nodes by free memory (llm/fit.h), each node's RPC server made one of the engine's peers (named
// after the node, so a request that fails while it is down names it), and placed again on the devices left
// when a node they use goes down.
//
//   cluster::placer pl(sys, coordinator, eng, {.rpc_key = key});
//   auto devices = pl.place(settings, true, stop);                 // waits for min_nodes nodes up
//   pl.watch([&](const std::string& model, const std::string& why) { d.replace_model(model, why); });
#pragma once

#include <caf/actor_system.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "actors/engine.h"
#include "net/cluster/messages.h"

namespace troupe::cluster {

struct placer_params {
  std::string rpc_key;                        // the nodes' RPC servers' key (the cluster's by default)
  std::string rpc_tls_ca;                     // CA file for the nodes whose RPC is TLS; empty: the system's
  uint64_t margin = uint64_t{512} << 20;      // each device keeps this much free
  bool coordinator_devices = false;           // the daemon's own devices take layers too
  bool rebalance_on_join = false;             // a node that joins (or is back) moves every placed model onto
                                              // the nodes up then; false: only models that lost a node move
  std::chrono::milliseconds poll{100};        // how often the cluster's state is read
};

// Where a placed model's layers are: per device, its node ("" for the coordinator's own devices) and its
// range of layers (the output layer goes with the last device when it is offloaded).
struct placed_device {
  std::string device;
  std::string node;
  uint32_t first_layer = 0;
  uint32_t n_layers = 0;     // repeating layers from first_layer
  bool output = false;       // the output layer too
};
struct model_placement {
  std::string model;
  std::string state;         // "placed", or "placing" (it lost a node and is being placed again)
  std::vector<placed_device> devices;
};

class placer {
 public:
  placer(caf::actor_system& sys, coordinator_actor c, engine& eng, placer_params p);
  ~placer();
  placer(const placer&) = delete;
  placer& operator=(const placer&) = delete;

  // The devices for s's layers: waits until at least s.min_nodes nodes are up (first: the first placement;
  // after a loss one node is enough), or stop() (then throws error), connects their RPC servers as peers,
  // and fits the layers over their devices (and the daemon's, with coordinator_devices). Throws error when the
  // model does not fit (naming the shortfall) or a node's RPC server does not answer.
  std::vector<actors::device_layers> place(const actors::model_settings& s, bool first, const std::function<bool()>& stop);

  // Watches, on a thread of its own, the nodes each placed model uses: when one goes down or comes back in
  // another epoch (or, with rebalance_on_join, when a node it does not use comes up), calls lost(model, why)
  // once (why names the node). The model is watched again once placed.
  void watch(std::function<void(const std::string& model, const std::string& why)> lost);

  cluster_view view();  // the coordinator's, now
  std::vector<model_placement> placements();  // the models it placed, by name

 private:
  struct use {
    std::string node;
    uint64_t epoch = 0;
  };
  void watch_loop();

  caf::actor_system& sys_;
  coordinator_actor coord_;
  engine& eng_;
  placer_params p_;
  std::mutex mu_;
  std::map<std::string, std::vector<use>> placed_;  // model -> the nodes (and their epochs) it uses
  std::map<std::string, model_placement> layout_;   // model -> where its layers are (or "placing")
  std::map<std::string, std::string> peers_;        // RPC addresses the engine has as live peers -> node name
  std::map<std::string, uint64_t> seen_up_;          // the nodes up at the last look, by name: their epochs
  std::function<void(const std::string&, const std::string&)> lost_;
  std::atomic<bool> stop_{false};
  std::thread watcher_;
};

}  // namespace troupe::cluster
