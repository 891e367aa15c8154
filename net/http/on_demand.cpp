// Models loaded on demand (daemon.h): a request for a model that is not loaded loads it, after unloading
// the least recently used idle models whose room it needs; idle models unload after their keep_alive.
//
// One load or unload at a time (load_mutex_): the budget is checked against what the engine's memory
// accountant reports now, so two loads never count the same free room. A request for a loaded model takes
// none of this: it holds the model (model_use) under the model's own lock, and nothing here waits on a
// request except a load that needs the room of a model that is answering, which waits until it is idle.
#include <algorithm>
#include <chrono>
#include <map>
#include <set>
#include <thread>

#include "actors/errors.h"
#include "llm/fit.h"
#include "llm/model.h"
#include "net/http/daemon.h"
#include "net/http/detail/daemon_internals.h"
#include "net/http/session_pool.h"
#include "runtime/backend.h"
#include "runtime/log.h"

namespace troupe::http {

namespace {

using steady = std::chrono::steady_clock;
using device_bytes = std::map<std::string, uint64_t>;

std::string mib(uint64_t bytes) {
  const uint64_t tenths = (bytes * 10 + (uint64_t{1} << 19)) >> 20;
  return std::to_string(tenths / 10) + "." + std::to_string(tenths % 10) + " MiB";
}

// The bytes a model needs on each device, from its file: the layers each device holds (placement terms:
// the devices take the last layers in order, the CPU the rest), their KV cache, the output layer with the
// last device when the devices take more than n_layer, a compute share on each, the token embedding in host
// memory. `floor` gets the same without the compute shares (what it needs at the least).
device_bytes estimate_need(const actors::model_settings& s, device_bytes& floor) {
  const auto m = llm::model::open(s.path);
  const llm::layer_costs c = llm::estimate_costs(*m, {.n_ctx = s.n_ctx, .n_ubatch = s.n_ubatch, .kv_type = s.kv_cache_type()});
  const size_t n_layer = c.weights.size();
  device_bytes need;
  floor.clear();
  int taken = 0;
  for (const actors::device_layers& d : s.devices) taken += std::max(d.layers, 0);
  const bool output_on_device = !s.devices.empty() && static_cast<size_t>(taken) > n_layer;
  size_t first = n_layer - std::min<size_t>(n_layer, static_cast<size_t>(std::min<int>(taken, static_cast<int>(n_layer))));
  // The CPU's layers [0, first).
  for (size_t il = 0; il < first; ++il) floor["CPU"] += c.layer(il);
  floor["CPU"] += c.host + (output_on_device ? 0 : c.output);
  for (const actors::device_layers& d : s.devices) {
    const size_t n = std::min<size_t>(n_layer - first, static_cast<size_t>(std::max(d.layers, 0)));
    for (size_t il = first; il < first + n; ++il) floor[d.device] += c.layer(il);
    first += n;
  }
  if (output_on_device) floor[s.devices.back().device] += c.output;
  for (const auto& [device, bytes] : floor) need[device] = bytes + c.compute;
  return need;
}

}  // namespace

std::vector<std::pair<std::string, uint64_t>> daemon::memory_by_device() {
  device_bytes used;
  for (const actors::buft_usage& u : eng_.memory().entries) used[u.device] += u.model + u.context + u.compute;
  return {used.begin(), used.end()};
}

std::optional<uint64_t> daemon::budget_of(const std::string& device, uint64_t used_now) const {
  // A configured figure for the device, else the one for every device ("*"), else what the device has free
  // now beside what the models hold on it.
  std::optional<uint64_t> any;
  for (const auto& [name, budget_mib] : cfg_.server.memory_budget_mib) {
    if (name == device && budget_mib > 0) return budget_mib << 20;
    if (name == "*" && budget_mib > 0) any = budget_mib << 20;
  }
  if (any) return any;
  if (device_i* d = registry::instance().find(device)) return used_now + d->memory().free;
  return std::nullopt;  // (a device this process cannot ask: no limit is known)
}

void daemon::init_on_demand() {
  for (size_t i = 0; i < models_.size(); ++i) {
    model_slots& ms = *models_[i];
    const actors::model_settings& s = ms.config;
    ms.pinned = s.placement == "cluster";
    ms.on_demand = s.load == "on_demand" || (s.load.empty() && i > 0 && !ms.pinned);
    if (s.keep_alive_ms != actors::model_settings::keep_alive_default) {
      ms.keep_alive_ms = s.keep_alive_ms;
    } else {
      ms.keep_alive_ms = ms.on_demand ? 5 * 60 * 1000 : -1;  // ollama's five minutes; a model loaded at start stays
    }
  }
}

model_use daemon::use_model(const std::string& name) {
  model_slots* found = find_model(name);
  if (found == nullptr) {
    throw api_error(404, "invalid_request_error", "the model '" + name + "' does not exist", "model", "model_not_found");
  }
  model_slots& ms = *found;
  const auto deadline = steady::now() + std::chrono::seconds(cfg_.server.load_timeout_s);
  // A request that waits for a load counts in the request queue (server.queue_limit): waiters cannot take
  // every worker thread from the requests of loaded models.
  bool queued = false;
  struct leave_queue {
    bool& queued;
    daemon_metrics& mx;
    ~leave_queue() {
      if (queued) mx.queue_depth.fetch_sub(1);
    }
  } leaving{queued, metrics_};
  std::unique_lock l(ms.m);
  for (;;) {
    if (stopping_.load()) throw api_error(503, "unavailable_error", "the server is shutting down");
    if (ms.at == model_slots::phase::loaded && ms.model && ms.unavailable.empty()) {
      ++ms.users;
      ms.last_used = steady::now();
      ms.expires = steady::time_point::max();  // (in use: not idle)
      return model_use(ms);
    }
    // Not loaded: a model loaded at start waits for the start-up (or for its placement again) as before; one
    // that can load on demand (or was unloaded since the start) is loaded by this request, or by the one
    // that asked first while this one waits.
    const bool can_load = ms.unavailable.empty() && (ms.on_demand || (ready_.load() && ms.loads > 0 && !ms.pinned));
    if (ms.at == model_slots::phase::unloaded && can_load) {
      ms.at = model_slots::phase::loading;
      l.unlock();
      std::string failed;
      int status = 503;
      bool lasting = true;  // a failure the next try would meet too (not a timeout, busy models or a shutdown)
      try {
        load_on_demand(ms, deadline);
      } catch (const api_error& e) {
        failed = e.what();
        status = e.status();
        lasting = status != 503;
      } catch (const std::exception& e) {
        failed = e.what();
      }
      l.lock();
      if (!failed.empty()) {
        ms.at = model_slots::phase::unloaded;
        if (lasting) ms.load_error = failed;
        ms.last_failure = failed;
        ++ms.failed_loads;
        ms.cv.notify_all();
        TROUPE_LOG(warn, "model '" << ms.config.name << "': loading on demand failed: " << failed);
        throw api_error(status, "unavailable_error", "the model '" + name + "' could not be loaded: " + failed);
      }
      return model_use(ms);  // (load_on_demand counted this request's use: nothing unloads it before it is taken)
    }
    if (!can_load) {  // (being loaded at start or placed again: 503 at once, as before there was on-demand loading)
      throw api_error(503, "unavailable_error",
                      "the model '" + name + "' is " + (ms.unavailable.empty() ? std::string("still loading") : "unavailable: " + ms.unavailable));
    }
    // Loading or unloading (by another request, the reaper or the start-up): wait for it, in the queue.
    if (!queued) {
      int64_t depth = metrics_.queue_depth.load();
      do {
        if (depth >= static_cast<int64_t>(cfg_.server.queue_limit)) {
          throw api_error(503, "unavailable_error",
                          "the request queue is full (" + std::to_string(cfg_.server.queue_limit) + " waiting); retry later");
        }
      } while (!metrics_.queue_depth.compare_exchange_weak(depth, depth + 1));
      queued = true;
    }
    const uint64_t failures = ms.failed_loads;
    if (ms.cv.wait_until(l, deadline) == std::cv_status::timeout && ms.at != model_slots::phase::loaded) {
      throw api_error(503, "unavailable_error",
                      "the model '" + name + "' is still loading after " + std::to_string(cfg_.server.load_timeout_s) + " s");
    }
    // The load this request waited for failed: its error, rather than one more try per waiter.
    if (ms.failed_loads != failures && ms.at == model_slots::phase::unloaded) {
      throw api_error(503, "unavailable_error", "the model '" + name + "' could not be loaded: " + ms.last_failure);
    }
  }
}

void daemon::load_on_demand(model_slots& ms, steady::time_point deadline) {
  std::unique_lock manage(load_mutex_, std::defer_lock);
  while (!manage.try_lock_until(std::min(deadline, steady::now() + std::chrono::milliseconds(100)))) {
    if (stopping_.load()) throw api_error(503, "unavailable_error", "the server is shutting down");
    if (steady::now() >= deadline) {
      throw api_error(503, "unavailable_error", "the model '" + ms.config.name + "' waited " + std::to_string(cfg_.server.load_timeout_s) +
                                                    " s for the loads before it");
    }
  }
  const actors::model_settings settings = placed(ms.config, ms.loads == 0);
  device_bytes floor;
  device_bytes need;
  {
    std::lock_guard l(ms.m);
    for (const auto& [device, bytes] : ms.footprint) need[device] = bytes;
  }
  if (need.empty()) {
    need = estimate_need(settings, floor);
  } else {
    floor = need;  // measured: what it held, compute included
  }
  // Room on every device it needs: idle models unload, least recently used first, until it fits. A model
  // that does not fit even alone is refused with the figures.
  std::set<std::string> at_least;  // devices where nothing more can go: the model's least (no compute share) must fit
  for (bool waited = false;; waited = true) {
    const device_bytes used = [&] {
      const auto v = memory_by_device();
      return device_bytes(v.begin(), v.end());
    }();
    std::string short_on;  // the first device it does not fit on
    uint64_t over = 0;
    for (const auto& [device, bytes] : need) {
      const uint64_t u = used.count(device) ? used.at(device) : 0;
      const std::optional<uint64_t> budget = budget_of(device, u);
      if (!budget) continue;
      const uint64_t least = floor.count(device) ? floor.at(device) : bytes;
      if (least > *budget) {
        throw api_error(507, "insufficient_storage",
                        "the model '" + ms.config.name + "' needs " + mib(least) + " on " + device + " (weights and KV cache for " +
                            std::to_string(settings.n_ctx) + " cells), more than its memory budget of " + mib(*budget) +
                            " even with no other model loaded");
      }
      const uint64_t wanted = at_least.count(device) ? least : bytes;
      if (u + wanted > *budget && over == 0) {
        short_on = device;
        over = u + wanted - *budget;
      }
    }
    if (over == 0) break;
    // The least recently used idle model that holds memory on that device.
    model_slots* victim = nullptr;
    bool busy_candidate = false;
    for (const auto& other : models_) {
      if (other.get() == &ms) continue;
      std::lock_guard l(other->m);
      if (other->at != model_slots::phase::loaded || other->pinned || !other->model) continue;
      const auto& devs = other->model->settings.devices;
      const bool on_device = short_on == "CPU" || std::any_of(devs.begin(), devs.end(), [&](const auto& d) { return d.device == short_on; });
      if (!on_device) continue;
      if (other->users > 0 || other->busy > 0 || !other->waiters.empty()) {
        busy_candidate = true;
        continue;
      }
      if (victim == nullptr || other->last_used < victim->last_used) victim = other.get();
    }
    if (victim != nullptr) {
      if (unload_idle(*victim, "to make room for '" + ms.config.name + "' (" + mib(over) + " short on " + short_on + ")")) continue;
      busy_candidate = true;  // it was taken meanwhile
    }
    const uint64_t u = used.count(short_on) ? used.at(short_on) : 0;
    const std::string figures = "needs " + mib(need.at(short_on)) + " on " + short_on + ", where models hold " + mib(u) + " of a budget of " +
                                mib(budget_of(short_on, u).value_or(0));
    if (!busy_candidate) {
      // Nothing more can go (what is left is pinned or not a model's): load it if its least fits, else refuse.
      const uint64_t least = floor.count(short_on) ? floor.at(short_on) : need.at(short_on);
      if (!at_least.count(short_on) && u + least <= budget_of(short_on, u).value_or(UINT64_MAX)) {
        at_least.insert(short_on);  // and the other devices are looked at again
        continue;
      }
      throw api_error(507, "insufficient_storage", "the model '" + ms.config.name + "' " + figures + ", and no idle model is left to unload");
    }
    if (steady::now() >= deadline || stopping_.load()) {
      throw api_error(503, "unavailable_error", "the model '" + ms.config.name + "' " + figures + "; the models using it stayed busy");
    }
    if (!waited) TROUPE_LOG(info, "model '" << ms.config.name << "' " << figures << ": waiting for a model to be idle");
    // The answering models go idle without this lock; look again shortly.
    manage.unlock();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    manage.lock();
  }
  const auto t0 = steady::now();
  actors::model_info info = eng_.load_model(settings);
  std::shared_ptr<const actors::loaded_model> model = eng_.env()->model(ms.config.name);
  {
    std::lock_guard l(ms.m);
    ms.info = std::move(info);
    ms.model = std::move(model);
    ms.created = detail::unix_now();
    ms.load_error.clear();
    ms.at = model_slots::phase::loaded;
    ms.last_used = steady::now();
    ms.expires = steady::time_point::max();
    ++ms.users;  // the request that loads it (use_model)
    ++ms.loads;
  }
  ms.loaded.store(true);
  ms.cv.notify_all();
  TROUPE_LOG(info, "model '" << ms.config.name << "' loaded on demand: " << ms.info.arch << ", " << ms.info.n_params << " parameters ("
                             << std::chrono::duration<double>(steady::now() - t0).count() << " s)");
}

bool daemon::unload_idle(model_slots& ms, const std::string& why, bool only_expired) {
  // Under load_mutex_. Only a model nothing holds: no request uses it, no session answers on it (and, for the
  // reaper, one whose keep_alive has run out: checked under the same lock as the rest).
  std::vector<std::unique_ptr<session>> idle;
  {
    std::lock_guard l(ms.m);
    if (ms.at != model_slots::phase::loaded || ms.pinned || ms.users > 0 || ms.busy > 0 || !ms.waiters.empty()) return false;
    if (only_expired && ms.expires > steady::now()) return false;
    ms.at = model_slots::phase::unloading;
    ms.loaded.store(false);
    idle.swap(ms.idle);
    ms.open -= static_cast<uint32_t>(idle.size());
  }
  idle.clear();  // the sessions close first: their sequences go with the model
  const auto measured = [this] {
    try {
      return memory_by_device();
    } catch (const std::exception& e) {
      TROUPE_LOG(debug, "on-demand: the memory breakdown: " << e.what());
      return std::vector<std::pair<std::string, uint64_t>>{};
    }
  };
  const auto before = measured();
  std::string failed;
  try {
    eng_.unload_model(ms.config.name);
  } catch (const actors::request_error& e) {
    // Not loaded in the engine (gone already): unloaded all the same. Anything else (the supervisor is loading
    // it again, say): it stays loaded.
    if (!e.is(actors::errc::not_found)) failed = e.what();
  } catch (const std::exception& e) {
    failed = e.what();
  }
  if (!failed.empty()) {
    {
      std::lock_guard l(ms.m);
      ms.at = model_slots::phase::loaded;
      ms.loaded.store(ms.model != nullptr);
    }
    ms.cv.notify_all();
    TROUPE_LOG(warn, "model '" << ms.config.name << "': unloading " << why << " failed: " << failed << "; it stays loaded");
    return false;
  }
  const auto after = measured();
  std::vector<std::pair<std::string, uint64_t>> freed;
  uint64_t total = 0;
  for (const auto& [device, bytes] : before) {
    const auto at = std::find_if(after.begin(), after.end(), [&](const auto& x) { return x.first == device; });
    const uint64_t left = at == after.end() ? 0 : at->second;
    if (bytes > left && !after.empty()) {
      freed.emplace_back(device, bytes - left);
      total += bytes - left;
    }
  }
  {
    std::lock_guard l(ms.m);
    if (!freed.empty()) ms.footprint = freed;
    ms.model.reset();
    ms.at = model_slots::phase::unloaded;
    ms.expires = steady::time_point::max();
    ++ms.unloads;
  }
  ms.cv.notify_all();
  TROUPE_LOG(info, "model '" << ms.config.name << "' unloaded " << why << ": " << mib(total) << " given back");
  return true;
}

bool daemon::unload_now(const std::string& name) {
  model_slots* ms = find_model(name);
  if (ms == nullptr) return false;
  std::lock_guard manage(load_mutex_);
  for (int attempt = 0; attempt < 2; ++attempt) {  // (twice: the last request using it may end in between)
    if (unload_idle(*ms, "(asked with keep_alive 0)")) return true;
    // In use: it unloads when the requests using it end (decided under its lock, so that the last of them
    // cannot end in between unseen).
    std::lock_guard l(ms->m);
    if (ms->at != model_slots::phase::loaded) return false;
    if (ms->users > 0 || ms->busy > 0 || !ms->waiters.empty()) {
      ms->next_keep_alive_ms = 0;
      return false;
    }
    if (ms->pinned) return false;
  }
  return false;
}

void daemon::reap_idle_models() {
  // Every model whose keep_alive ran out since its last use unloads; the wait is until the next look (250 ms,
  // so a use's new keep_alive is seen soon enough). A load or unload under way is not waited for (the
  // shutdown must not wait behind a load): the model is looked at again on the next round.
  std::unique_lock l(reaper_mutex_);
  while (!stopping_.load()) {
    try {
      const auto now = steady::now();
      std::vector<model_slots*> due;
      for (const auto& ms : models_) {
        std::lock_guard g(ms->m);
        if (ms->at == model_slots::phase::loaded && !ms->pinned && ms->users == 0 && ms->expires <= now) due.push_back(ms.get());
      }
      for (model_slots* ms : due) {
        std::unique_lock manage(load_mutex_, std::try_to_lock);
        if (!manage.owns_lock()) break;
        int64_t keep = 0;
        {
          std::lock_guard g(ms->m);
          keep = ms->keep_alive_ms;
        }
        unload_idle(*ms, "after " + std::to_string(keep) + " ms idle (keep_alive)", true);
      }
    } catch (const std::exception& e) {
      TROUPE_LOG(warn, "on-demand: unloading idle models: " << e.what());
    }
    reaper_cv_.wait_for(l, std::chrono::milliseconds(250));
  }
}

}  // namespace troupe::http
