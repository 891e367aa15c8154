// An engine that coordinates a cluster, for `troupe serve` with a [cluster] table and for a host service
// that embeds troupe: the engine's actor system has CAF's middleman and the cluster's message types, the
// coordinator actor is published on host:port (behind mutual TLS with tls files), and models with
// placement = "cluster" are placed over the nodes' devices by free memory (net/cluster/placer.h).
//
//   cluster::cluster_engine ce(runtime_cfg, {.host = "0.0.0.0", .port = 7070, .key = key});
//   ce.keep_placed();                       // models loaded by ce.load_model move when a node they use is lost
//   ce.load_model(settings);                // placement = "cluster": waits for min_nodes nodes, places, loads
//   session s = ce.engine().open_session("llama");
//
// The daemon does its own re-placement (its models answer 503 meanwhile): it calls placement().watch()
// instead of keep_placed(). Destruction stops placing, closes the cluster port, then the engine.
#pragma once

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "actors/engine.h"
#include "net/cluster/messages.h"
#include "net/cluster/placer.h"
#include "net/cluster/tls.h"

namespace troupe::cluster {

struct coordinator_settings {
  std::string host = "127.0.0.1";             // anything but loopback needs a key
  uint16_t port = 7070;                       // 0: any free port (port() says which)
  std::string key;                            // the shared key itself; empty: none (loopback only)
  tls_files tls;                              // all three: the cluster port over mutual TLS
  std::chrono::milliseconds heartbeat{1000};
  std::chrono::milliseconds down_after{3000};
  bool coordinator_devices = true;            // placed models use this engine's own devices too
  uint64_t margin = uint64_t{512} << 20;      // placement leaves this free on each device
  bool rebalance_on_join = false;
};

class cluster_engine {
 public:
  // Throws error for settings it cannot use (the TLS files, a host without a key, a port it cannot bind).
  cluster_engine(const actors::engine_config& rc, coordinator_settings cs);
  ~cluster_engine();
  cluster_engine(const cluster_engine&) = delete;
  cluster_engine& operator=(const cluster_engine&) = delete;

  troupe::engine& engine() { return *eng_; }
  placer& placement();  // throws error after stop_placing
  uint16_t port() const { return port_; }  // the cluster port nodes join
  cluster_view view();                      // the nodes now
  // GET /v1/cluster's body: {"nodes": [...] (cluster::status_json), "models": [{"name", "state": "placed" or
  // "placing", "devices": [{"device", "node" (null: this engine's own), "layers": [first, last] ([]: none),
  // "output": true when it holds the output layer}]}]}.
  std::string status_json();

  // s as loaded: placement = "cluster" is placed first (the first time: waiting for s.min_nodes nodes),
  // anything else is loaded as engine::load_model does. Remembered for keep_placed.
  actors::model_info load_model(const actors::model_settings& s);
  // From now on a model that load_model placed and that loses a node (or, with rebalance_on_join, sees one
  // join) is unloaded and placed and loaded again by the engine itself, retried every second until it fits
  // (its sessions end; new ones fail with errc::down or not_found meanwhile). recoveries() counts them.
  void keep_placed();
  uint64_t recoveries() const { return recoveries_.load(); }
  // Ends placing: a placement waiting for nodes gives up, re-placements in progress end, the placer's
  // watcher is joined (so a lost() callback given to placement().watch() is not called after it returns).
  // Called by the destructor; the daemon calls it before its HTTP side goes.
  void stop_placing();

 private:
  void replace(const std::string& model, const std::string& why);

  std::unique_ptr<caf::actor_system_config> cfg_;
  std::unique_ptr<caf::actor_system> sys_;
  std::unique_ptr<troupe::engine> eng_;
  coordinator_actor coord_;
  std::unique_ptr<tls_tunnel> tunnel_;
  std::unique_ptr<placer> placer_;
  uint16_t port_ = 0;
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> recoveries_{0};
  std::mutex mu_;
  std::map<std::string, actors::model_settings> placed_;  // models load_model placed, as given
  std::vector<std::thread> replacing_;                    // re-placements (joined by stop_placing)
};

}  // namespace troupe::cluster
