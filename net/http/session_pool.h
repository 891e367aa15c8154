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
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "actors/engine.h"
#include "net/http/daemon_config.h"
#include "net/http/metrics.h"

namespace troupe::http {

struct model_slots {
  actors::model_settings config;
  uint32_t slots = 1;
  std::atomic<bool> loaded{false};
  std::string unavailable;  // under m: why it is not loaded now, when it was (its placement was lost)
  actors::model_info info;
  int64_t created = 0;
  std::shared_ptr<const actors::loaded_model> model;

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
