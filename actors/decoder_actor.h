// The decoder actor, one per loaded model context: owns the model's llm_context (KV cache with one
// sequence per session, compute memory), created when the first session attaches, and decodes the
// sessions' steps in batches: a step that arrives while others are being decoded waits, and the next
// batch takes every waiting step (each on its own sequence), so sessions that generate at the same time
// share each pass over the weights. It waits for every generating session's next step (or flush_delay) so
// that sessions stay in step with each other. It also computes embeddings (embed_atom, delegated by a
// session) on an embeddings context of its own, made on the first one and released with the model's
// context; each runs on this actor's thread, so the model's next decode batch waits for it.
//
//   decoder_actor s = spawn_decoder_actor(sys, env, "m", acct, allocators);
//   self->request(s, t, attach_atom_v, session_handle).then([](int32_t seq) { ... });
//   self->request(s, t, step_atom_v, decode_step{seq, keep, tokens}).then([](const step_logits& l) { ... });
//   caf::anon_send(s, end_atom_v, seq);        // the session's answer is over: don't wait for its steps
#pragma once

#include <caf/actor_system.hpp>

#include <chrono>
#include <map>
#include <string>

#include "actors/allocator_actor.h"
#include "actors/memory_accountant_actor.h"
#include "actors/engine_env.h"
#include "actors/type_ids.h"

namespace troupe::actors {

// The interface (using decoder_actor = caf::typed_actor<...>) is in actors/handles.h.

struct decoder_params {
  std::string model;  // name of a loaded model in env
  std::map<std::string, allocator_actor> allocators;  // by buffer type name: where compute memory is reported
  std::chrono::microseconds flush_delay{2000};        // longest wait for the other sessions' steps
  // Each split of a decode graph runs on the thread of the device actor that owns its device (the
  // scheduler waits for it); false: every split runs on the scheduler's own thread.
  bool dispatch_splits = true;
};

decoder_actor spawn_decoder_actor(caf::actor_system& sys, engine_env_ptr env, memory_accountant_actor accountant,
                                      const decoder_params& p);

}  // namespace troupe::actors
