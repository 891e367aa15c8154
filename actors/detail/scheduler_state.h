// The scheduler actor's state and the pieces of its behaviour, one concern per file:
// scheduler_actor.cpp (the handlers and decode batching), scheduler_context.cpp (the model context: its
// creation, memory reports and release, decode splits on device actors) and scheduler_pipeline.cpp
// (in-process pipeline jobs). Internal to troupe_actors.
#pragma once

#include <caf/all.hpp>

#include <chrono>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "actors/errors.h"
#include "actors/runtime_env.h"
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

// A decode submitted to the context's pipeline: its steps' promises, and the outcome the pipeline's thread
// leaves before it sends (decoded_atom, id).
struct decode_outcome {
  std::vector<std::vector<float>> logits;
  std::exception_ptr error;
};
struct decode_job {
  std::vector<waiting_step> steps;
  std::shared_ptr<decode_outcome> outcome;
  int64_t group = 0;
};

// The decode splits the context's pipeline threads have handed over and wait for; closed when the
// scheduler terminates (the ones no device actor has begun fail, so those threads stop waiting).
struct split_relay {
  std::mutex mu;
  bool closed = false;
  std::set<std::shared_ptr<split_task>> pending;

  void close() {
    std::lock_guard lock(mu);
    closed = true;
    for (const auto& t : pending) t->fail("the model's scheduler terminated");
  }
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
  std::map<uint64_t, decode_job> jobs;  // in the context's pipeline
  uint64_t next_job = 1;
  uint32_t max_in_flight = 0;
  std::vector<caf::typed_response_promise<bool>> release_waiters;  // a release waits for the jobs
  std::shared_ptr<split_relay> relay = std::make_shared<split_relay>();
  bool flush_scheduled = false;
  std::map<std::string, device_actor> devices;
  std::map<std::string, uint64_t> compute_reported;  // by buffer type name
  std::map<uint64_t, pipeline_run> runs;
  uint64_t next_run = 1;
  static inline const char* name = "troupe.scheduler";

  std::string owner() const { return "context:" + params.model; }
  // Whether a step of seq is in one of the jobs in the pipeline.
  bool in_flight(int32_t seq) const {
    for (const auto& [id, j] : jobs) {
      for (const waiting_step& w : j.steps) {
        if (w.step.seq == seq) return true;
      }
    }
    return false;
  }

  ~scheduler_state() {
    // The pipeline's threads stop waiting for device actors, the context (and its pipeline) goes before
    // the decoder its jobs call back into, and every promise gets an answer.
    relay->close();
    ctx.reset();
    const caf::error down = make_error(errc::down, "scheduler of " + params.model + " terminated");
    for (waiting_step& w : waiting) w.promise.deliver(down);
    for (auto& [id, j] : jobs) {
      for (waiting_step& w : j.steps) w.promise.deliver(down);
    }
    for (auto& rp : release_waiters) rp.deliver(true);
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
// Releases the context's memory; replies through rp once every allocator has answered. Waits for the decodes
// in the pipeline first.
void release_context(scheduler_ptr self, caf::typed_response_promise<bool> rp);
// Hands a decode split from the context's pipeline thread on to its device's actor (scheduler_context.cpp).
void relay_split(scheduler_ptr self, const decode_split& d);

// ---- pipeline jobs (scheduler_pipeline.cpp) ----

// Starts running an in-process pipeline job; its reply goes to the returned promise.
caf::typed_response_promise<pipeline_result> start_pipeline(scheduler_ptr self, uint64_t job_id,
                                                             std::shared_ptr<pipeline_job> job);

}  // namespace troupe::actors::detail
