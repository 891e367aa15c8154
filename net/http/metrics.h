// The daemon's counters and gauges, rendered as Prometheus text (GET /metrics):
//
//   troupe_requests_total{endpoint="chat",status="200"}   requests answered, by endpoint and HTTP status
//   troupe_requests_cancelled_total                         answers cut short (client gone, shutdown)
//   troupe_prompt_tokens_total / troupe_generated_tokens_total
//   troupe_prompt_tokens_cached_total / troupe_prompt_tokens_computed_total
//                                                           prompt tokens reused from the KV cache / decoded
//   troupe_prefix_reused_tokens_total{model}, troupe_kept_conversations{model},
//   troupe_kept_tokens{model}, troupe_kept_evictions_total{model}
//                                                           prefix reuse across sessions (llm/prefix_index.h)
//   troupe_prompt_cache_restored_tokens_total{model}, troupe_prompt_cache_bytes{model},
//   troupe_prompt_cache_entries{model}                      the host-RAM prompt cache
//   troupe_generation_seconds_total                         time spent generating (all answers together)
//   troupe_tokens_per_second                                generated tokens over the last 10 s / 10
//   troupe_request_duration_seconds{quantile="0.5"|"0.99"}  over the last 1024 completion requests
//   troupe_requests_in_flight, troupe_queue_depth
//   troupe_http_connections, troupe_http_connections_total, troupe_http_connections_rejected_total,
//   troupe_http_timeouts_total                              the front's connections (net/http/front.h)
//   troupe_sessions{model,state="busy"|"idle"}, troupe_model_ready{model}
//   troupe_model_loaded{model}, troupe_model_loads_total{model}, troupe_model_unloads_total{model}
//                                                           on-demand loading (daemon.h)
//   troupe_memory_bytes{buft,device,kind}                   the memory breakdown
//   troupe_decode_batches_total{model}, troupe_decode_steps_total{model}, troupe_decode_batch_max{model}
//                                                           the decoders' batching: session steps decoded,
//                                                           in how many batches, most steps in one
//
// All methods are thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "actors/messages.h"
#include "net/http/front.h"

namespace troupe::http {

struct model_gauges {
  std::string model;
  bool ready = false;
  uint32_t busy = 0;
  uint32_t idle = 0;
  uint32_t slots = 0;
  std::string state;   // "loaded", "loading", "unloading", "unloaded" (on demand) or "unavailable"
  uint64_t loads = 0;  // times loaded, at start or on demand
  uint64_t unloads = 0;
};

class daemon_metrics {
 public:
  using clock = std::chrono::steady_clock;

  void request_done(const std::string& endpoint, int status, double seconds);
  // An answer's prompt tokens (of which `cached` came from the KV cache, not decoded) and generated tokens.
  void tokens(uint64_t prompt, uint64_t cached, uint64_t generated, double gen_seconds);
  void cancelled() { cancelled_.fetch_add(1, std::memory_order_relaxed); }
  // A model placed and loaded again after it lost its placement (a cluster node went down), in `seconds`.
  void recovered(double seconds) {
    std::lock_guard l(mutex_);
    ++recoveries_;
    last_recovery_s_ = seconds;
  }

  std::atomic<int64_t> in_flight{0};
  std::atomic<int64_t> queue_depth{0};
  front::connection_counters connections;

  uint64_t n_requests(const std::string& endpoint, int status) const;

  std::string render(const std::vector<model_gauges>& models, const actors::memory_breakdown& memory,
                     const std::vector<actors::decoder_stats>& decoders = {}) const;

 private:
  mutable std::mutex mutex_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  std::deque<double> durations_;                          // completion requests, newest last
  std::deque<std::pair<clock::time_point, uint64_t>> recent_;  // generated tokens per finished answer
  uint64_t prompt_tokens_ = 0, prompt_cached_ = 0, generated_tokens_ = 0;
  double gen_seconds_ = 0;
  std::atomic<uint64_t> cancelled_{0};
  uint64_t recoveries_ = 0;
  double last_recovery_s_ = 0;
};

}  // namespace troupe::http
