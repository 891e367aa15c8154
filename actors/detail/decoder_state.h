// The decoder actor's state and the pieces of its behaviour, one concern per file:
// decoder_actor.cpp (the handlers and decode batching) and decoder_context.cpp (the model context and the
// embeddings context: their creation, memory reports and release, decode splits on device actors). Internal
// to troupe_actors.
#pragma once

#include <caf/all.hpp>

#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "actors/errors.h"
#include "actors/engine_env.h"
#include "actors/decoder_actor.h"
#include "llm/batch_decoder.h"
#include "llm/llm_context.h"
#include "llm/prefix_index.h"

namespace troupe::actors::detail {

struct waiting_step {
  decode_step step;
  caf::typed_response_promise<step_logits> promise;
  int32_t reused = 0;  // prompt positions taken from another sequence (prefix_index::step_plan::reused)
  // The first part of a longer prompt step, decoded ahead of the rest (chunked prefill, run_batch): no
  // promise, nothing to deliver; the rest waits in `waiting` with the promise.
  bool partial = false;
  bool retried = false;  // already went again after a missing_positions_error
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

struct decoder_state {
  engine_env_ptr env;
  memory_accountant_actor accountant;
  decoder_params params;
  std::shared_ptr<const loaded_model> model;
  std::unique_ptr<llm::llm_context> ctx;
  std::unique_ptr<llm::batch_decoder> dec;
  // Prefix reuse across sequences: what each sequence holds, and the conversations kept in the pool. The
  // pipeline's thread evicts through it (set_evictor), so it goes after ctx (reset first, below).
  std::unique_ptr<llm::prefix_index> prefixes;
  uint64_t prompt_cache_reported = 0;  // host bytes of saved conversations on the memory record
  std::vector<caf::actor_addr> seqs;  // the session attached to each sequence (empty: free)
  std::set<int32_t> generating;       // sequences whose next step the next batch waits for
  std::vector<waiting_step> waiting;
  // Steps held until the step of another sequence (the first value) that decodes their prompt's start is
  // done: then planned, sharing it (prefix_index::leader_for).
  std::vector<std::pair<int32_t, waiting_step>> deferred;
  std::map<uint64_t, decode_job> jobs;  // in the context's pipeline
  uint64_t next_job = 1;
  uint32_t max_in_flight = 0;
  std::vector<caf::typed_response_promise<bool>> release_waiters;  // a release waits for the jobs
  std::shared_ptr<split_relay> relay = std::make_shared<split_relay>();
  bool flush_scheduled = false;
  std::map<std::string, device_actor> devices;
  std::map<std::string, uint64_t> compute_reported;  // by buffer type name
  // The embeddings context (embed_atom), made by the first embedding, and its compute memory on record.
  std::unique_ptr<llm::llm_context> embed_ctx;
  std::map<std::string, uint64_t> embed_compute_reported;  // by buffer type name
  static inline const char* name = "troupe.scheduler";

  std::string owner() const { return "context:" + params.model; }
  std::string prompt_cache_owner() const { return "prompt-cache:" + params.model; }
  std::string embed_owner() const { return "embeddings:" + params.model; }
  // Whether a step of seq is in one of the jobs in the pipeline.
  bool in_flight(int32_t seq) const {
    for (const auto& [id, j] : jobs) {
      for (const waiting_step& w : j.steps) {
        if (w.step.seq == seq) return true;
      }
    }
    return false;
  }

  ~decoder_state() {
    // The pipeline's threads stop waiting for device actors, the context (and its pipeline) goes before
    // the decoder its jobs call back into, and every promise gets an answer.
    relay->close();
    ctx.reset();
    const caf::error down = make_error(errc::down, "scheduler of " + params.model + " terminated");
    for (waiting_step& w : waiting) w.promise.deliver(down);
    for (auto& [leader, w] : deferred) w.promise.deliver(down);
    for (auto& [id, j] : jobs) {
      for (waiting_step& w : j.steps) w.promise.deliver(down);
    }
    for (auto& rp : release_waiters) rp.deliver(true);
  }
};

using decoder_ptr = decoder_actor::stateful_pointer<decoder_state>;

// ---- the model context (decoder_context.cpp) ----

// Creates the model's context (KV cache, compute memory) and reports its KV memory. Throws what the
// context throws.
void create_context(decoder_ptr self);
// Creates the model's embeddings context (model_settings::embedding_cells, one sequence, embeddings = true) and reports its
// KV memory under embed_owner(). It has no split runner: llm::embed runs its splits on this actor's thread,
// where a split handed over to the actor would wait for itself. Throws what the context throws.
void create_embed_context(decoder_ptr self);
// Tells the allocator actors (or the accountant, for a buffer type without one) the compute memory per
// buffer type of both contexts; `done` runs once every allocator asked has answered (at once when none was).
void report_compute(decoder_ptr self, std::function<void()> done = {});
// Puts the host bytes of the conversations prefix reuse saved (prefix_index::store) on the memory record, as
// their own buffer type ("Host (prompt cache)", context memory); all of them when `release`.
void report_prompt_cache(decoder_ptr self, bool release = false);
// Releases both contexts' memory; replies through rp once every allocator has answered. Waits for the
// decodes in the pipeline first.
void release_context(decoder_ptr self, caf::typed_response_promise<bool> rp);
// Hands a decode split from the context's pipeline thread on to its device's actor (decoder_context.cpp).
void relay_split(decoder_ptr self, const decode_split& d);

}  // namespace troupe::actors::detail
