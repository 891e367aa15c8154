// The scheduler actor's state and the pieces of its behaviour, one concern per file:
// scheduler_actor.cpp (the handlers and decode batching), scheduler_context.cpp (the model context: its
// creation, memory reports and release, decode splits on device actors) and scheduler_pipeline.cpp
// (in-process pipeline jobs). Internal to troupe_actors.
#pragma once

#include <caf/all.hpp>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "actors/errors.h"
#include "actors/scheduler_actor.h"
#include "runtime/llm/batch_decoder.h"
#include "runtime/llm/llm_context.h"

namespace troupe::actors::detail {

using clock_type = std::chrono::steady_clock;

struct waiting_step {
  decode_step step;
  caf::typed_response_promise<step_logits> promise;
};

// A pipeline job being run: the next split of each micro-batch goes out when its previous one is done.
struct pipeline_run {
  caf::typed_response_promise<pipeline_result> promise;
  std::shared_ptr<pipeline_job> job;
  uint64_t job_id = 0;
  size_t outstanding = 0;
  pipeline_result result;
  caf::error failure;
  clock_type::time_point t0;
};

struct scheduler_state {
  runtime_env_ptr env;
  memory_accountant_actor accountant;
  scheduler_params params;
  std::shared_ptr<const loaded_model> model;
  std::unique_ptr<llm::llm_context> ctx;
  std::unique_ptr<llm::batch_decoder> dec;
  std::vector<caf::actor_addr> seqs;  // the session attached to each sequence (empty: free)
  std::set<int32_t> generating;       // sequences whose next step the next batch waits for
  std::vector<waiting_step> waiting;
  bool flush_scheduled = false;
  std::map<std::string, device_actor> devices;
  std::map<std::string, uint64_t> compute_reported;  // by buffer type name
  std::map<uint64_t, pipeline_run> runs;
  uint64_t next_run = 1;
  static inline const char* name = "troupe.scheduler";

  std::string owner() const { return "context:" + params.model; }

  ~scheduler_state() {
    for (waiting_step& w : waiting) w.promise.deliver(make_error(errc::down, "scheduler of " + params.model + " terminated"));
    for (auto& [id, r] : runs) r.promise.deliver(make_error(errc::down, "scheduler terminated during a pipeline job"));
  }
};

using scheduler_ptr = scheduler_actor::stateful_pointer<scheduler_state>;

// ---- the model context (scheduler_context.cpp) ----

// Creates the model's context (KV cache, compute memory) and reports its KV memory. Throws what the
// context throws.
void create_context(scheduler_ptr self);
// Tells the allocator actors (or the accountant, for a buffer type without one) the context's compute
// memory per buffer type; `done` runs once every allocator asked has answered (at once when none was).
void report_compute(scheduler_ptr self, std::function<void()> done = {});
// Releases the context's memory; replies through rp once every allocator has answered.
void release_context(scheduler_ptr self, caf::typed_response_promise<bool> rp);

// ---- pipeline jobs (scheduler_pipeline.cpp) ----

// Starts running an in-process pipeline job; its reply goes to the returned promise.
caf::typed_response_promise<pipeline_result> start_pipeline(scheduler_ptr self, uint64_t job_id,
                                                             std::shared_ptr<pipeline_job> job);

}  // namespace troupe::actors::detail
