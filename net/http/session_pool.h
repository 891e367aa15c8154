// A model's sessions for the daemon's requests: its parallel slots (n_seq_max sessions, opened on first use
// and reused), a bounded queue of requests waiting for one, and the lease a request holds its session by.
//
// Admission control over the model's one KV pool (n_ctx cells shared by its sessions): a request reserves the
// cells its prompt and answer may take (its prompt plus max_tokens, answer_cells), and is admitted once a
// session is free and the reservations of the requests answering leave it room. Until then it waits in the
// queue, first come first served (a request goes before an earlier one only while that one has no room);
// the largest request that waits has its room held for it, so that short requests cannot starve it.
// Cells shared between sequences (prefix reuse) are counted once per request: the reservations never exceed
// the pool, so an admitted request always finds its cells (kept conversations and cached prompts give theirs
// up first).
//
//   uint32_t cells = n_prompt + answer_cells(settings, n_prompt, max_tokens_given, max_tokens);
//   std::unique_ptr<lease> l = acquire(eng, ms, metrics, cfg.server, stopping, cells);   // may wait; 503 when full
//   l->get().generate(...);
//   l->broken();                                   // its actor is gone: discard it instead of reusing it
//   // ~lease: the session goes back to the model's idle sessions
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "actors/engine.h"
#include "net/http/daemon_config.h"
#include "net/http/metrics.h"

namespace troupe::http {

struct model_slots {
  // Where the model is in its life (under m): net/http/daemon.h's on-demand loading moves it on.
  enum class phase : uint8_t { unloaded, loading, loaded, unloading };

  actors::model_settings config;
  uint32_t slots = 1;
  std::atomic<bool> loaded{false};  // phase == loaded, read without the lock
  std::string unavailable;  // under m: why it is not loaded now, when it was (its placement was lost)
  actors::model_info info;
  int64_t created = 0;
  std::shared_ptr<const actors::loaded_model> model;

  // On-demand loading (under m): the phase, the requests that hold the model loaded (model_use), the last
  // use, when an idle model unloads (keep_alive after its last use; max: never), and why the last load
  // failed. The daemon resolves on_demand and keep_alive_ms from the settings' load and keep_alive.
  phase at = phase::unloaded;
  bool on_demand = false;
  bool pinned = false;           // placement = "cluster": never unloaded for room or idleness
  int64_t keep_alive_ms = -1;    // -1: for ever
  uint32_t users = 0;
  int64_t next_keep_alive_ms = actors::model_settings::keep_alive_default;  // the next idle time, once (ollama's
                                                                              // keep_alive 0 while in use)
  std::chrono::steady_clock::time_point last_used{};
  std::chrono::steady_clock::time_point expires = std::chrono::steady_clock::time_point::max();
  std::string load_error;        // the last load's lasting failure (too large, a bad file); cleared by a load
  std::string last_failure;      // the last load's failure of any kind, for the requests that waited for it
  uint64_t failed_loads = 0;
  uint64_t loads = 0;            // times loaded (on demand or at start)
  uint64_t unloads = 0;          // times unloaded (idle, or for another model's room)
  // What the model held on each device when it was last unloaded (measured); empty: never unloaded yet
  // (an estimate from its file is used).
  std::vector<std::pair<std::string, uint64_t>> footprint;

  mutable std::mutex m;
  std::condition_variable cv;
  std::vector<std::unique_ptr<session>> idle;
  std::vector<session*> active;  // sessions answering now (cancelled at the end of a shutdown's grace)
  uint32_t open = 0;             // sessions that exist (idle + busy + being opened)
  uint32_t busy = 0;
  uint64_t reserved = 0;         // KV cells the answering requests reserved
  uint64_t held = 0;             // cells held for the largest request waiting for room (0: none waits)
  uint64_t holder = 0;           // that request's ticket
  uint64_t tickets = 0;
  std::deque<std::pair<uint64_t, uint32_t>> waiters;  // the queue in arrival order: ticket, cells
};

// A request's hold on a loaded model (daemon::use_model): while any is held the model is not unloaded, for
// room or for idleness. The last one released starts the model's keep_alive (or the request's own,
// keep_alive(ms), as ollama's requests give it).
class model_use {
 public:
  model_use() = default;
  // Under ms.m, with ms.users counted for it.
  explicit model_use(model_slots& ms) : ms_(&ms), model_(ms.model) {}
  model_use(model_use&& o) noexcept
      : ms_(std::exchange(o.ms_, nullptr)), model_(std::move(o.model_)), keep_alive_ms_(o.keep_alive_ms_) {}
  model_use& operator=(model_use&& o) noexcept;
  model_use(const model_use&) = delete;
  model_use& operator=(const model_use&) = delete;
  ~model_use() { release(); }
  void keep_alive(int64_t ms) { keep_alive_ms_ = ms; }
  void release();
  model_slots& slots() const { return *ms_; }
  const std::shared_ptr<const actors::loaded_model>& model() const { return model_; }

 private:
  model_slots* ms_ = nullptr;
  std::shared_ptr<const actors::loaded_model> model_;
  int64_t keep_alive_ms_ = actors::model_settings::keep_alive_default;  // default: the model's
};

// The answer tokens a request reserves: max_tokens when given, else as many as one of n_seq_max equal
// shares of the pool leaves after the prompt (llama-server's slot context), at least 256; never past the
// session's limit (n_ctx_seq). The request's answer ends there (finish_reason "length").
uint32_t answer_cells(const actors::model_settings& s, uint32_t n_prompt, bool max_tokens_given, int32_t max_tokens);

// One request's claim on a session of a model: returned to the model's idle sessions (or discarded when it
// failed) by the destructor.
class lease {
 public:
  lease(model_slots& ms, std::unique_ptr<session> s, uint32_t cells = 0);
  ~lease();
  lease(const lease&) = delete;
  lease& operator=(const lease&) = delete;
  session& get() { return *s_; }
  const std::string& model() const { return ms_.config.name; }
  void broken() { broken_ = true; }
  // Swaps in a fresh session for one that stopped working (its model was loaded again, say); the old one
  // is closed outside the lock.
  void replace(std::unique_ptr<session> fresh);

 private:
  model_slots& ms_;
  std::unique_ptr<session> s_;
  uint32_t cells_ = 0;  // reserved in ms_.reserved
  bool broken_ = false;
};

// A free session of the model and `cells` of its KV pool, waiting in the queue while there is no session or
// no room. Throws api_error 503 when the queue is full, the wait times out or the daemon stops, and 400
// when `cells` exceed the pool (nothing could ever make room).
std::unique_ptr<lease> acquire(engine& eng, model_slots& ms, daemon_metrics& mx, const server_config& sc,
                               const std::atomic<bool>& stopping, uint32_t cells = 0);

}  // namespace troupe::http
