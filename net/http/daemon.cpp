#include "net/http/daemon.h"

#include <algorithm>
#include <chrono>
#include <set>
#include <thread>

#include "net/http/detail/daemon_internals.h"
#include "net/http/session_pool.h"
#include "llm/offload.h"
#include "runtime/log.h"

namespace troupe::http {

using detail::clock_type;

daemon::daemon(engine& eng, daemon_config cfg) : eng_(eng), cfg_(std::move(cfg)) {
  // models_dir's files beside the tables (troupe serve has added them already, to apply its flags: then none
  // is new).
  for (actors::model_settings& m : models_in_dir(cfg_)) cfg_.engine.models.push_back(std::move(m));
  for (const actors::model_settings& m : cfg_.engine.models) {
    auto ms = std::make_unique<model_slots>();
    ms->config = m;
    ms->slots = std::max<uint32_t>(1, m.n_seq_max);
    models_.push_back(std::move(ms));
  }
  const server_config& sv = cfg_.server;
  uint32_t threads = sv.http_threads;
  if (threads == 0) {
    // Every session and every queue place has a thread to wait and write on.
    uint32_t slots = 0;
    for (const auto& ms : models_) slots += ms->slots;
    threads = slots + sv.queue_limit + 4;
  }
  front::options o;
  static_cast<front::listen_options&>(o) = sv;  // host, port, connection limits and timeouts
  o.worker_threads = threads;
  o.counters = &metrics_.connections;
  front::handlers h;
  h.handle = [this](const front::request& req, front::response& res) { handle(req, res); };
  h.error = [this](const front::request& req, int status, const std::string& message) { return front_error(req, status, message); };
  h.heavy = [](const front::request& req) {
    return req.path == "/v1/chat/completions" || req.path == "/v1/completions" || req.path == "/v1/embeddings";
  };
  h.log = [this](const front::request& req, int status, double seconds) { access_log(req, status, seconds); };
  svr_ = std::make_unique<front::listener>(std::move(o), std::move(h));
  init_on_demand();
  reaper_ = std::thread([this] { reap_idle_models(); });
}

daemon::~daemon() {
  stop();
  finish_stop();
}

int daemon::bind() {
  port_ = svr_->bind();
  return port_;
}

void daemon::serve() {
  svr_->run();
  finish_stop();
}

actors::model_settings daemon::placed(const actors::model_settings& s, bool first) {
  if (s.placement == "auto") {
    actors::model_settings out = s;
    // Over the runtime's devices (every device the machine has when it names none).
    for (const auto& [device, layers] : llm::offload_layers({.devices = cfg_.engine.devices, .fit = true, .fit_ctx = s.n_ctx}, s.path)) {
      out.devices.push_back({device, layers});
    }
    out.placement.clear();
    return out;
  }
  if (s.placement != "cluster") return s;
  if (!placement_) throw error("model '" + s.name + "': placement = \"cluster\" needs a [cluster] table");
  actors::model_settings out = s;
  out.devices = placement_(s, first);
  out.placement.clear();  // (the engine loads it where it was placed)
  return out;
}

void daemon::replace_model(const std::string& name, const std::string& why) {
  const auto it = std::find_if(models_.begin(), models_.end(), [&](const auto& m) { return m->config.name == name; });
  if (it == models_.end()) return;
  model_slots& ms = **it;
  {
    std::lock_guard l(ms.m);
    ms.unavailable = why + "; it is being placed again";
    ms.at = model_slots::phase::loading;
  }
  ms.loaded.store(false);
  try {
    eng_.unload_model(name);
  } catch (const std::exception& e) {
    TROUPE_LOG(debug, "model '" << name << "': unloading before placing it again: " << e.what());
  }
  const auto t0 = std::chrono::steady_clock::now();
  while (!stopping_.load()) {
    try {
      actors::model_info info = eng_.load_model(placed(ms.config, false));
      std::shared_ptr<const actors::loaded_model> model = eng_.env()->model(name);
      {
        std::lock_guard l(ms.m);  // readers that hold the model copy it under the lock (daemon::model_of)
        ms.info = std::move(info);
        ms.model = std::move(model);
        ms.unavailable.clear();
        ms.at = model_slots::phase::loaded;
        ++ms.loads;
      }
      ms.loaded.store(true);
      ms.cv.notify_all();
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      metrics_.recovered(s);
      TROUPE_LOG(info, "model '" << name << "' placed and loaded again after " << why << " (" << s << " s)");
      return;
    } catch (const std::exception& e) {
      {
        std::lock_guard l(ms.m);
        ms.unavailable = why + "; placing it again failed: " + e.what();
      }
      TROUPE_LOG(warn, "model '" << name << "': placing it again: " << e.what() << "; retrying in 1 s");
      for (int i = 0; i < 10 && !stopping_.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
}

void daemon::load_models() {
  for (auto& ms : models_) {
    if (stopping_.load()) return;
    if (ms->on_demand) continue;  // (loaded by the first request that names it)
    std::unique_lock manage(load_mutex_);
    {
      std::lock_guard l(ms->m);
      if (ms->at != model_slots::phase::unloaded) continue;
      ms->at = model_slots::phase::loading;
    }
    actors::model_info info;
    try {
      info = eng_.load_model(placed(ms->config, true));
    } catch (...) {
      {
        std::lock_guard l(ms->m);
        ms->at = model_slots::phase::unloaded;
      }
      ms->cv.notify_all();
      throw;
    }
    std::shared_ptr<const actors::loaded_model> model = eng_.env()->model(ms->config.name);
    {
      std::lock_guard l(ms->m);
      ms->info = std::move(info);
      ms->model = std::move(model);
      ms->created = detail::unix_now();
      ms->at = model_slots::phase::loaded;
      ms->last_used = std::chrono::steady_clock::now();
      ms->expires = ms->keep_alive_ms < 0 ? std::chrono::steady_clock::time_point::max()
                                          : ms->last_used + std::chrono::milliseconds(ms->keep_alive_ms);
      ++ms->loads;
    }
    ms->loaded.store(true);
    ms->cv.notify_all();
    TROUPE_LOG(info, "model '" << ms->config.name << "' loaded: " << ms->info.arch << ", " << ms->info.n_params
                               << " parameters, " << ms->slots << " parallel sessions of "
                               << ms->model->settings.n_ctx_seq << " tokens, chat template "
                               << ms->info.chat_template << " (" << ms->info.load_seconds << " s)");
  }
  ready_.store(true);
}

std::vector<model_gauges> daemon::gauges() const {
  // Loaded and not down now (a model whose peer is gone, or that is being loaded again, is not serving).
  std::set<std::string> down;
  try {
    for (const actors::actor_status& a : eng_.status().actors) {
      if (!a.up && a.name.rfind("model:", 0) == 0) down.insert(a.name.substr(6));
    }
  } catch (const std::exception&) {
    // the runtime is stopping: what was loaded is what is reported
  }
  std::vector<model_gauges> out;
  for (const auto& ms : models_) {
    std::lock_guard l(ms->m);
    // A model that loads on demand and is not loaded now is ready to serve (its first request loads it),
    // unless its last load failed.
    std::string state = !ms->unavailable.empty()                     ? "unavailable"
                        : ms->at == model_slots::phase::loaded       ? "loaded"
                        : ms->at == model_slots::phase::loading      ? "loading"
                        : ms->at == model_slots::phase::unloading    ? "unloading"
                        : ms->loads > 0 || ms->on_demand             ? "unloaded"
                                                                     : "loading";  // (at start, before its turn)
    const bool loadable = ms->unavailable.empty() && (ms->on_demand || ms->loads > 0) && ms->load_error.empty() && ready_.load();
    const bool ready = state == "loaded" ? !down.count(ms->config.name) : loadable && state != "loading";
    out.push_back({ms->config.name, ready, ms->busy, static_cast<uint32_t>(ms->idle.size()), ms->slots, std::move(state), ms->loads,
                   ms->unloads});
  }
  return out;
}

void daemon::stop() {
  std::lock_guard l(stop_mutex_);
  if (stopping_.exchange(true)) return;
  for (auto& ms : models_) {
    std::lock_guard g(ms->m);  // no waiter is between its check of stopping_ and its wait
    ms->cv.notify_all();
  }
  {
    std::lock_guard g(reaper_mutex_);
    reaper_cv_.notify_all();
  }
  // Until serve() has returned: stop the listener (again: a stop() before the listener started running
  // would otherwise be lost), and once in-flight answers are done or the grace period is over, cancel
  // what is still answering.
  watchdog_ = std::thread([this, grace = cfg_.server.shutdown_grace_s] {
    const auto until = clock_type::now() + std::chrono::seconds(grace);
    bool cancelled = false;
    for (;;) {
      svr_->stop();
      {
        std::lock_guard g(stop_mutex_);
        if (stopped_) return;
        if (!cancelled && (metrics_.in_flight.load() == 0 || clock_type::now() >= until)) {
          cancelled = true;
          cancel_all_.store(true);
          for (auto& ms : models_) {
            std::lock_guard g2(ms->m);
            for (session* s : ms->active) s->cancel();
          }
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
}

void daemon::finish_stop() {
  std::thread watchdog;
  bool first = false;
  {
    std::lock_guard l(stop_mutex_);
    first = !stopped_;
    stopped_ = true;
    watchdog.swap(watchdog_);
  }
  if (watchdog.joinable()) watchdog.join();
  if (!first) return;
  if (reaper_.joinable()) reaper_.join();  // (stopping_ is set: it has ended or ends at its next look)
  // No request is in flight any more (the server's workers have ended): close every session.
  for (auto& ms : models_) {
    std::vector<std::unique_ptr<session>> idle;
    {
      std::lock_guard l(ms->m);
      idle.swap(ms->idle);
      ms->open -= static_cast<uint32_t>(idle.size());
    }
    idle.clear();
  }
}

}  // namespace troupe::http
