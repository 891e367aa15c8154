#include "net/cluster/placer.h"

#include <caf/all.hpp>

#include <tuple>

#include "actors/errors.h"
#include "backends/rpc/rpc.h"
#include "net/cluster/coordinator.h"
#include "runtime/error.h"
#include "llm/fit.h"
#include "llm/model.h"
#include "runtime/log.h"

namespace troupe::cluster {

placer::placer(caf::actor_system& sys, coordinator_actor c, engine& eng, placer_params p)
    : sys_(sys), coord_(std::move(c)), eng_(eng), p_(std::move(p)) {}

placer::~placer() {
  stop_ = true;
  if (watcher_.joinable()) watcher_.join();
}

cluster_view placer::view() { return ask_view(sys_, coord_); }

std::vector<actors::device_layers> placer::place(const actors::model_settings& s, bool first,
                                                 const std::function<bool()>& stop) {
  const uint32_t need = first ? s.min_nodes : 1;
  std::vector<node_entry> up;
  bool said = false;
  for (;;) {
    up.clear();
    for (const node_entry& n : view().nodes) {
      if (n.state == "up") up.push_back(n);
    }
    if (up.size() >= need) break;
    if (!said) {
      TROUPE_LOG(info, "cluster: model '" << s.name << "' waits for " << need << " node(s) up (" << up.size() << " now)");
      said = true;
    }
    if ((stop && stop()) || stop_) throw error("cluster: model '" + s.name + "': stopped while waiting for nodes");
    std::this_thread::sleep_for(p_.poll);
  }
  // The candidates: every device of every node that is up (its RPC server as a peer named after the node),
  // then the daemon's own devices.
  std::vector<llm::fit_device> devices;
  std::map<std::string, use> node_of;  // device -> node
  for (const node_entry& n : up) {
    actors::peer_params pp;
    pp.name = n.name;
    std::tie(pp.host, pp.port) = rpc::parse_endpoint(n.rpc_address);
    pp.key = p_.rpc_key;
    pp.tls = n.rpc_tls;
    pp.tls_ca_file = p_.rpc_tls_ca;
    pp.health_interval = std::chrono::milliseconds(250);
    pp.health_timeout = std::chrono::milliseconds(1000);
    // A new peer, or the one the engine has at that address asked to connect now (it was parked when the
    // node went away, or it reconnects to a node that restarted there).
    const std::vector<std::string> names = eng_.add_peer(pp);
    {
      std::lock_guard l(mu_);
      peers_[n.rpc_address] = n.name;
    }
    for (size_t i = 0; i < names.size() && i < n.devices.size(); ++i) {
      devices.push_back({names[i], n.devices[i].memory_free});
      node_of[names[i]] = {n.name, n.epoch};
    }
  }
  if (p_.coordinator_devices) {
    for (device_i* d : registry::instance().devices()) {
      if (rpc::client_of(*d)) continue;  // a peer's (a node's above, or one gone)
      devices.push_back({std::string(d->name()), d->memory().free});
    }
  }
  const auto model = llm::model::open(s.path);
  const llm::layer_costs costs = llm::estimate_costs(*model, {.n_ctx = s.n_ctx, .n_ubatch = s.n_ubatch, .kv_type = s.kv_cache_type()});
  const llm::fit_plan plan = llm::fit_layers(costs, devices, p_.margin);
  std::vector<actors::device_layers> out;
  std::vector<use> uses;
  std::string said_plan;
  // Devices take the last layers (loader/placement.h): the first device's range starts n_layer - (their
  // total, capped at n_layer); the output goes with the last one when the total is more than n_layer.
  const auto n_layer = static_cast<int64_t>(costs.weights.size());
  int64_t total = 0;
  for (const auto& dl : plan.layers) total += dl.second;
  int64_t next = n_layer - std::min(total, n_layer);
  model_placement layout{s.name, "placed", {}};
  for (size_t i = 0; i < plan.layers.size(); ++i) {
    const auto& [name, k] = plan.layers[i];
    out.push_back({name, k});
    const auto it = node_of.find(name);
    if (it != node_of.end()) uses.push_back(it->second);
    const int64_t n = std::min<int64_t>(k, n_layer - next);
    layout.devices.push_back({name, it != node_of.end() ? it->second.node : std::string(), static_cast<uint32_t>(next),
                              static_cast<uint32_t>(n), i + 1 == plan.layers.size() && total > n_layer});
    next += n;
    said_plan += (i ? ", " : "") + name + (it != node_of.end() ? " (node " + it->second.node + ")" : std::string()) + " " +
                 std::to_string(k) + " layer(s)";
  }
  TROUPE_LOG(info, "cluster: model '" << s.name << "' placed by free memory: " << said_plan);
  std::lock_guard l(mu_);
  placed_[s.name] = uses;
  layout_[s.name] = std::move(layout);
  return out;
}

std::vector<model_placement> placer::placements() {
  std::lock_guard l(mu_);
  std::vector<model_placement> out;
  for (const auto& [name, m] : layout_) out.push_back(m);
  return out;
}

void placer::watch(std::function<void(const std::string&, const std::string&)> lost) {
  {
    std::lock_guard l(mu_);
    lost_ = std::move(lost);
  }
  watcher_ = std::thread([this] { watch_loop(); });
}

void placer::watch_loop() {
  while (!stop_) {
    std::this_thread::sleep_for(p_.poll);
    cluster_view v;
    try {
      v = view();
    } catch (const std::exception& e) {
      TROUPE_LOG(warn, e.what());
      continue;
    }
    std::vector<std::pair<std::string, std::string>> losses;
    std::vector<std::pair<std::string, std::string>> parks;  // peers to stop: address, why
    {
      std::lock_guard l(mu_);
      for (auto it = placed_.begin(); it != placed_.end();) {
        std::string why;
        for (const use& u : it->second) {
          const auto n = std::find_if(v.nodes.begin(), v.nodes.end(), [&](const node_entry& e) { return e.name == u.node; });
          if (n == v.nodes.end() || n->state != "up") {
            why = "node '" + u.node + "' is down" + (n != v.nodes.end() && !n->down_reason.empty() ? " (" + n->down_reason + ")" : "");
          } else if (n->epoch != u.epoch) {
            why = "node '" + u.node + "' came back in epoch " + std::to_string(n->epoch);
          }
          if (!why.empty()) break;
        }
        if (why.empty() && p_.rebalance_on_join) {
          for (const node_entry& n : v.nodes) {
            const auto seen = seen_up_.find(n.name);
            const bool used = std::any_of(it->second.begin(), it->second.end(), [&](const use& u) { return u.node == n.name; });
            if (n.state == "up" && !used && (seen == seen_up_.end() || seen->second != n.epoch) && !seen_up_.empty()) {
              why = "node '" + n.name + "' joined (rebalance = \"on_join\")";
              break;
            }
          }
        }
        if (why.empty()) {
          ++it;
          continue;
        }
        losses.emplace_back(it->first, why);
        layout_[it->first] = {it->first, "placing", {}};
        it = placed_.erase(it);  // watched again once placed again
      }
      seen_up_.clear();
      for (const node_entry& n : v.nodes) {
        if (n.state == "up") seen_up_[n.name] = n.epoch;
      }
      // The peer of a node that is down, or that is up at another address now, stops trying its old address
      // (a placement that uses the node again asks it to connect).
      for (auto it = peers_.begin(); it != peers_.end();) {
        const auto n = std::find_if(v.nodes.begin(), v.nodes.end(), [&](const node_entry& e) { return e.name == it->second; });
        std::string why;
        if (n == v.nodes.end() || n->state != "up") {
          why = "node '" + it->second + "' is down";
        } else if (n->rpc_address != it->first) {
          why = "node '" + it->second + "' is at " + n->rpc_address + " now";
        }
        if (why.empty()) {
          ++it;
          continue;
        }
        parks.emplace_back(it->first, why);
        it = peers_.erase(it);
      }
    }
    for (const auto& [address, why] : parks) {
      try {
        eng_.park_peer(address, why);
      } catch (const std::exception& e) {
        TROUPE_LOG(warn, "cluster: cannot park the peer at " << address << ": " << e.what());
      }
    }
    for (const auto& [model, why] : losses) {
      TROUPE_LOG(warn, "cluster: model '" << model << "' lost its placement: " << why << "; placing it again");
      if (lost_) lost_(model, why);
    }
  }
}

}  // namespace troupe::cluster
