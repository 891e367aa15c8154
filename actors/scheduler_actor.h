// The scheduler actor, one per loaded model context: owns the model's llm_context (KV cache with one
// sequence per session, compute memory), created when the first session attaches, and decodes the
// sessions' steps in batches: a step that arrives while others are being decoded waits, and the next
// batch takes every waiting step (each on its own sequence), so sessions that generate at the same time
// share each pass over the weights. It waits for every generating session's next step (or flush_delay) so
// that sessions stay in step with each other.
//
// It also runs in-process pipeline jobs: micro-batches whose graphs a synchronous scheduler has split; it
// dispatches each split to the device actor owning its backend, in order per micro-batch, so one
// micro-batch's copies and compute on one device overlap another's on the next device.
//
//   scheduler_actor s = spawn_scheduler_actor(sys, env, "m", acct, allocators);
//   self->request(s, t, attach_atom_v, session_handle).then([](int32_t seq) { ... });
//   self->request(s, t, step_atom_v, decode_step{seq, keep, tokens}).then([](const step_logits& l) { ... });
//   caf::anon_send(s, end_atom_v, seq);        // the session's answer is over: don't wait for its steps
#pragma once

#include <caf/actor_system.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include <chrono>
#include <map>
#include <string>

#include "actors/allocator_actor.h"
#include "actors/memory_accountant_actor.h"
#include "actors/runtime_env.h"
#include "actors/type_ids.h"

namespace troupe::actors {

using scheduler_actor = caf::typed_actor<
    // A session joins the model: its sequence id (the context is created on the first attach).
    caf::replies_to<attach_atom, caf::actor>::with<int32_t>,
    // A session leaves: its sequence's cache is cleared and the id freed.
    caf::replies_to<detach_atom, int32_t>::with<bool>,
    // Decodes a step, batched with the other waiting steps; replies the logits of its last token.
    caf::replies_to<step_atom, decode_step>::with<step_logits>,
    // The session on this sequence has no further step for now (its answer ended or was cancelled).
    caf::reacts_to<end_atom, int32_t>,
    // Decodes the waiting steps now (sent to itself after flush_delay).
    caf::reacts_to<flush_atom>,
    // Runs an in-process pipeline job (local_registry id) over the device actors.
    caf::replies_to<pipeline_atom, pipeline_ref>::with<pipeline_result>,
    // Batching and memory figures.
    caf::replies_to<get_atom, stats_atom>::with<sched_stats>,
    // Frees the context (KV cache, compute memory) and reports the release; attached sessions are dropped.
    caf::replies_to<release_atom>::with<bool>,
    // The device actor serving a device (for pipeline jobs).
    caf::reacts_to<device_atom, std::string, caf::actor>>;

struct scheduler_params {
  std::string model;  // name of a loaded model in env; empty: a scheduler for pipeline jobs only
  std::map<std::string, allocator_actor> allocators;  // by buffer type name: where compute memory is reported
  std::chrono::microseconds flush_delay{2000};        // longest wait for the other sessions' steps
  // Each split of a decode graph runs on the thread of the device actor that owns its device (the
  // scheduler waits for it); false: every split runs on the scheduler's own thread.
  bool dispatch_splits = true;
};

scheduler_actor spawn_scheduler_actor(caf::actor_system& sys, runtime_env_ptr env, memory_accountant_actor accountant,
                                      const scheduler_params& p);

}  // namespace troupe::actors
