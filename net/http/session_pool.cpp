#include "net/http/session_pool.h"

#include <algorithm>
#include <chrono>
#include <string>

#include "net/http/openai.h"

namespace troupe::http {

lease::lease(model_slots& ms, std::unique_ptr<session> s) : ms_(ms), s_(std::move(s)) {
  std::lock_guard l(ms_.m);
  ms_.active.push_back(s_.get());
}

lease::~lease() {
  std::unique_ptr<session> discard;
  {
    std::lock_guard l(ms_.m);
    ms_.active.erase(std::remove(ms_.active.begin(), ms_.active.end(), s_.get()), ms_.active.end());
    --ms_.busy;
    if (broken_) {
      --ms_.open;
      discard = std::move(s_);
    } else {
      ms_.idle.push_back(std::move(s_));
    }
  }
  ms_.cv.notify_one();
  discard.reset();  // closes it (a round trip) outside the lock
}

void lease::replace(std::unique_ptr<session> fresh) {
  std::unique_ptr<session> old;
  {
    std::lock_guard l(ms_.m);
    std::replace(ms_.active.begin(), ms_.active.end(), s_.get(), fresh.get());
    old = std::move(s_);
    s_ = std::move(fresh);
  }
  old.reset();
}

std::unique_ptr<lease> acquire(engine& eng, model_slots& ms, daemon_metrics& mx, const server_config& sc,
                               const std::atomic<bool>& stopping) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(sc.queue_timeout_s);
  std::unique_lock l(ms.m);
  bool queued = false;
  const auto leave_queue = [&] {
    if (queued) mx.queue_depth.fetch_sub(1);
    queued = false;
  };
  for (;;) {
    if (stopping.load()) {
      leave_queue();
      throw api_error(503, "unavailable_error", "the server is shutting down");
    }
    if (!ms.idle.empty()) {
      std::unique_ptr<session> s = std::move(ms.idle.back());
      ms.idle.pop_back();
      ++ms.busy;
      leave_queue();
      l.unlock();
      return std::make_unique<lease>(ms, std::move(s));
    }
    if (ms.open < ms.slots) {
      ++ms.open;
      ++ms.busy;
      leave_queue();
      l.unlock();
      try {
        auto s = std::make_unique<session>(eng.open_session(ms.config.name));
        return std::make_unique<lease>(ms, std::move(s));
      } catch (const std::exception& e) {
        {
          std::lock_guard g(ms.m);
          --ms.open;
          --ms.busy;
        }
        ms.cv.notify_one();
        throw api_error(503, "unavailable_error", "model '" + ms.config.name + "': cannot open a session: " + e.what());
      }
    }
    if (!queued) {
      int64_t d = mx.queue_depth.load();
      do {
        if (d >= static_cast<int64_t>(sc.queue_limit)) {
          throw api_error(503, "unavailable_error",
                          "the request queue is full (" + std::to_string(sc.queue_limit) + " waiting); retry later");
        }
      } while (!mx.queue_depth.compare_exchange_weak(d, d + 1));
      queued = true;
    }
    if (ms.cv.wait_until(l, deadline) == std::cv_status::timeout && ms.idle.empty() && ms.open >= ms.slots) {
      leave_queue();
      throw api_error(503, "unavailable_error",
                      "no session of model '" + ms.config.name + "' became free within " +
                          std::to_string(sc.queue_timeout_s) + " s; retry later");
    }
  }
}

}  // namespace troupe::http
