#include "net/http/session_pool.h"

#include <algorithm>
#include <chrono>
#include <string>

#include "net/http/openai.h"

namespace troupe::http {

uint32_t answer_cells(const actors::model_settings& s, uint32_t n_prompt, bool max_tokens_given, int32_t max_tokens) {
  const uint32_t limit = s.n_ctx_seq > n_prompt ? s.n_ctx_seq - n_prompt : 0;
  if (max_tokens_given) return std::min(limit, static_cast<uint32_t>(std::max(max_tokens, 0)));
  const uint32_t share = s.n_ctx / std::max<uint32_t>(s.n_seq_max, 1);
  return std::min(limit, std::max<uint32_t>(256, share > n_prompt ? share - n_prompt : 0));
}

model_use& model_use::operator=(model_use&& o) noexcept {
  if (this != &o) {
    release();
    ms_ = std::exchange(o.ms_, nullptr);
    model_ = std::move(o.model_);
    keep_alive_ms_ = o.keep_alive_ms_;
  }
  return *this;
}

void model_use::release() {
  if (ms_ == nullptr) return;
  {
    std::lock_guard l(ms_->m);
    const auto now = std::chrono::steady_clock::now();
    ms_->last_used = now;
    int64_t keep = keep_alive_ms_ == actors::model_settings::keep_alive_default ? ms_->keep_alive_ms : keep_alive_ms_;
    const bool last = --ms_->users == 0;
    if (last && ms_->next_keep_alive_ms != actors::model_settings::keep_alive_default) {
      keep = std::exchange(ms_->next_keep_alive_ms, actors::model_settings::keep_alive_default);
    }
    if (last || keep_alive_ms_ != actors::model_settings::keep_alive_default) {
      // The model's idle time runs from its last use (a request's own keep_alive sets it, as ollama's do).
      ms_->expires = keep < 0 ? std::chrono::steady_clock::time_point::max() : now + std::chrono::milliseconds(keep);
    }
  }
  ms_->cv.notify_all();  // the reaper and a load waiting for room look again
  ms_ = nullptr;
}

lease::lease(model_slots& ms, std::unique_ptr<session> s, uint32_t cells) : ms_(ms), s_(std::move(s)), cells_(cells) {
  std::lock_guard l(ms_.m);
  ms_.active.push_back(s_.get());
}

lease::~lease() {
  std::unique_ptr<session> discard;
  {
    std::lock_guard l(ms_.m);
    ms_.active.erase(std::remove(ms_.active.begin(), ms_.active.end(), s_.get()), ms_.active.end());
    --ms_.busy;
    ms_.reserved -= cells_;
    if (broken_) {
      --ms_.open;
      discard = std::move(s_);
    } else {
      ms_.idle.push_back(std::move(s_));
    }
  }
  ms_.cv.notify_all();  // the room may admit a request other than the next one
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
                               const std::atomic<bool>& stopping, uint32_t cells) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(sc.queue_timeout_s);
  const uint64_t pool = [&] {
    std::lock_guard l(ms.m);
    return ms.model ? ms.model->settings.n_ctx : ms.config.n_ctx;
  }();
  if (cells > pool) {
    throw api_error(400, "invalid_request_error",
                    "the request needs " + std::to_string(cells) + " KV cells (prompt and max_tokens); the model '" +
                        ms.config.name + "' has " + std::to_string(pool) + " in all",
                    "max_tokens", "context_length_exceeded");
  }
  std::unique_lock l(ms.m);
  bool queued = false;
  const uint64_t me = ++ms.tickets;
  const auto holding = [&] { return ms.held > 0 && ms.holder == me; };
  const auto leave_queue = [&] {
    if (queued) {
      mx.queue_depth.fetch_sub(1);
      const auto at = std::find_if(ms.waiters.begin(), ms.waiters.end(), [&](const auto& w) { return w.first == me; });
      if (at != ms.waiters.end()) ms.waiters.erase(at);
      ms.cv.notify_all();  // the next one in line may go
    }
    queued = false;
    if (holding()) {
      ms.held = 0;
      ms.cv.notify_all();  // the requests that left room for this one
    }
  };
  // Room for a request of c cells (ticket t): beside the answering requests' and the room held for a larger one.
  const auto room_for = [&](uint64_t t, uint32_t c) { return ms.reserved + c + (ms.held > 0 && ms.holder == t ? 0 : ms.held) <= pool; };
  const auto room = [&] { return room_for(me, cells); };
  // First come, first served: a request goes only when no one that waits before it could go now.
  const auto my_turn = [&] {
    for (const auto& [t, c] : ms.waiters) {
      if (t == me) return true;
      if (room_for(t, c)) return false;
    }
    return true;
  };
  for (;;) {
    if (stopping.load()) {
      leave_queue();
      throw api_error(503, "unavailable_error", "the server is shutting down");
    }
    const bool fits = room() && my_turn();
    if (!room() && cells > ms.held) {
      ms.held = cells;  // the largest waiting request's room (a smaller holder gives it up)
      ms.holder = me;
    }
    if (fits && !ms.idle.empty()) {
      std::unique_ptr<session> s = std::move(ms.idle.back());
      ms.idle.pop_back();
      ++ms.busy;
      ms.reserved += cells;
      leave_queue();
      l.unlock();
      return std::make_unique<lease>(ms, std::move(s), cells);
    }
    if (fits && ms.open < ms.slots) {
      ++ms.open;
      ++ms.busy;
      ms.reserved += cells;
      leave_queue();
      l.unlock();
      try {
        auto s = std::make_unique<session>(eng.open_session(ms.config.name));
        return std::make_unique<lease>(ms, std::move(s), cells);
      } catch (const std::exception& e) {
        {
          std::lock_guard g(ms.m);
          --ms.open;
          --ms.busy;
          ms.reserved -= cells;
        }
        ms.cv.notify_all();
        throw api_error(503, "unavailable_error", "model '" + ms.config.name + "': cannot open a session: " + e.what());
      }
    }
    if (!queued) {
      int64_t d = mx.queue_depth.load();
      do {
        if (d >= static_cast<int64_t>(sc.queue_limit)) {
          leave_queue();
          throw api_error(503, "unavailable_error",
                          "the request queue is full (" + std::to_string(sc.queue_limit) + " waiting); retry later");
        }
      } while (!mx.queue_depth.compare_exchange_weak(d, d + 1));
      queued = true;
      ms.waiters.emplace_back(me, cells);
    }
    if (ms.cv.wait_until(l, deadline) == std::cv_status::timeout) {
      const bool session_free = !ms.idle.empty() || ms.open < ms.slots;
      if (!session_free || !room() || !my_turn()) {  // (an earlier request's turn: this one's time is up)
        const std::string why =
            session_free ? "room for its " + std::to_string(cells) + " KV cells (" + std::to_string(ms.reserved) + " of " +
                               std::to_string(pool) + " reserved by the answers in progress)"
                         : "no session of model '" + ms.config.name + "' became free";
        leave_queue();
        throw api_error(503, "unavailable_error", why + " within " + std::to_string(sc.queue_timeout_s) + " s; retry later");
      }
    }
  }
}

}  // namespace troupe::http
