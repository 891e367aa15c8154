#include "net/cluster/cluster_engine.h"

#include <caf/io/middleman.hpp>
#include <nlohmann/json.hpp>

#include "actors/type_ids.h"
#include "net/cluster/coordinator.h"
#include "net/cluster/type_ids.h"
#include "runtime/error.h"
#include "runtime/log.h"

namespace troupe::cluster {

cluster_engine::cluster_engine(const actors::engine_config& rc, coordinator_settings cs) {
  const bool tls = cs.tls.any();
  if (tls) check_tls_files(cs.tls, {"cluster.tls_cert", "cluster.tls_key", "cluster.tls_ca"});
  check_listen_host(cs.host, !cs.key.empty());
  cfg_ = std::make_unique<caf::actor_system_config>();
  actors::add_message_types(*cfg_);
  add_message_types(*cfg_);
  cfg_->load<caf::io::middleman>();
  if (rc.caf_threads > 0) cfg_->set("scheduler.max-threads", rc.caf_threads);
  cfg_->set("logger.verbosity", caf::atom("quiet"));
  sys_ = std::make_unique<caf::actor_system>(*cfg_);
  eng_ = std::make_unique<troupe::engine>(*sys_, rc);
  coord_ = spawn_coordinator(*sys_, {.key = cs.key, .heartbeat = cs.heartbeat, .down_after = cs.down_after});
  try {
    if (tls) {
      tunnel_ = publish_coordinator_tls(*sys_, coord_, cs.host, cs.port, !cs.key.empty(), cs.tls);
      port_ = tunnel_->port();
    } else {
      port_ = publish_coordinator(*sys_, coord_, cs.host, cs.port, !cs.key.empty());
    }
  } catch (...) {
    caf::anon_send_exit(coord_, caf::exit_reason::user_shutdown);
    throw;
  }
  placer_ = std::make_unique<placer>(*sys_, coord_, *eng_,
                                     placer_params{.rpc_key = cs.key,
                                                   .rpc_tls_ca = cs.tls.ca,
                                                   .margin = cs.margin,
                                                   .coordinator_devices = cs.coordinator_devices,
                                                   .rebalance_on_join = cs.rebalance_on_join});
  TROUPE_LOG(info, "cluster coordinator on " << cs.host << ":" << port_ << " (nodes join with troupe node --join " << cs.host
                                             << ":" << port_ << "; key: " << (cs.key.empty() ? "none" : "shared")
                                             << (tls ? "; mutual TLS" : "") << ")");
}

cluster_engine::~cluster_engine() {
  stop_placing();
  tunnel_.reset();
  if (coord_) caf::anon_send_exit(coord_, caf::exit_reason::user_shutdown);
  eng_.reset();  // its shutdown, before the actor system goes
  sys_.reset();
}

void cluster_engine::stop_placing() {
  std::vector<std::thread> threads;
  {
    std::lock_guard l(mu_);
    stopping_ = true;  // (under the lock: keep_placed's watcher starts no thread after this)
    threads.swap(replacing_);
  }
  for (std::thread& t : threads) {
    if (t.joinable()) t.join();
  }
  std::unique_ptr<placer> gone;
  {
    std::lock_guard l(mu_);  // (status_json reads it under the lock)
    gone = std::move(placer_);
  }
  gone.reset();  // joins its watcher (a lost() callback in it sees its caller stopping)
}

placer& cluster_engine::placement() {
  if (!placer_) throw error("cluster: placing has stopped");
  return *placer_;
}

cluster_view cluster_engine::view() { return ask_view(*sys_, coord_); }

std::string cluster_engine::status_json() {
  nlohmann::json j = nlohmann::json::parse(cluster::status_json(*sys_, coord_));
  nlohmann::json models = nlohmann::json::array();
  std::vector<model_placement> ps;
  {
    std::lock_guard l(mu_);
    if (placer_) ps = placer_->placements();
  }
  for (const model_placement& m : ps) {
    nlohmann::json devices = nlohmann::json::array();
    for (const placed_device& d : m.devices) {
      nlohmann::json layers = nlohmann::json::array();
      if (d.n_layers > 0) layers = {d.first_layer, d.first_layer + d.n_layers - 1};
      devices.push_back({{"device", d.device}, {"node", d.node.empty() ? nlohmann::json(nullptr) : nlohmann::json(d.node)},
                         {"layers", layers}, {"output", d.output}});
    }
    models.push_back({{"name", m.model}, {"state", m.state}, {"devices", devices}});
  }
  j["models"] = models;
  return j.dump();
}

actors::model_info cluster_engine::load_model(const actors::model_settings& s) {
  if (s.placement != "cluster") return eng_->load_model(s);
  actors::model_settings placed = s;
  placed.devices = placement().place(s, true, [this] { return stopping_.load(); });
  placed.placement.clear();
  const actors::model_info info = eng_->load_model(placed);
  std::lock_guard l(mu_);
  placed_[s.name] = s;
  return info;
}

void cluster_engine::keep_placed() {
  placement().watch([this](const std::string& model, const std::string& why) {
    std::lock_guard l(mu_);
    if (stopping_ || !placed_.count(model)) return;
    // On a thread of its own: the watcher goes on watching the other models meanwhile.
    replacing_.emplace_back([this, model, why] { replace(model, why); });
  });
}

void cluster_engine::replace(const std::string& model, const std::string& why) {
  actors::model_settings s;
  {
    std::lock_guard l(mu_);
    s = placed_.at(model);
  }
  try {
    eng_->unload_model(model);
  } catch (const std::exception& e) {
    TROUPE_LOG(debug, "cluster: model '" << model << "': unloading before placing it again: " << e.what());
  }
  const auto t0 = std::chrono::steady_clock::now();
  while (!stopping_) {
    try {
      actors::model_settings placed = s;
      placed.devices = placement().place(s, false, [this] { return stopping_.load(); });
      placed.placement.clear();
      eng_->load_model(placed);
      ++recoveries_;
      TROUPE_LOG(info, "cluster: model '" << model << "' placed and loaded again after " << why << " ("
                                          << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() << " s)");
      return;
    } catch (const std::exception& e) {
      if (stopping_) return;
      TROUPE_LOG(warn, "cluster: model '" << model << "': placing it again: " << e.what() << "; retrying in 1 s");
      for (int i = 0; i < 10 && !stopping_; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
}

}  // namespace troupe::cluster
