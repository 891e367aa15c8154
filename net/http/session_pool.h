// A model's sessions for the daemon's requests: its parallel slots (n_seq_max sessions, opened on first use
// and reused, so a session keeps its conversation's cached prefix), a bounded queue of requests waiting for
// one, and the lease a request holds its session by.
//
//   std::unique_ptr<lease> l = acquire(eng, ms, metrics, cfg.server, stopping);   // may wait; 503 when full
//   l->get().generate(...);
//   l->broken();                                   // its actor is gone: discard it instead of reusing it
//   // ~lease: the session goes back to the model's idle sessions
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
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
};

// One request's claim on a session of a model: returned to the model's idle sessions (or discarded when it
// failed) by the destructor.
class lease {
 public:
  lease(model_slots& ms, std::unique_ptr<session> s);
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
  bool broken_ = false;
};

// A free session of the model, waiting in the queue when there is none. Throws api_error 503 when the
// queue is full, the wait times out or the daemon stops.
std::unique_ptr<lease> acquire(engine& eng, model_slots& ms, daemon_metrics& mx, const server_config& sc,
                               const std::atomic<bool>& stopping);

}  // namespace troupe::http
