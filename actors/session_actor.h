// The session actor, one per conversation: tokenizes the prompt (or applies the model's chat template to
// the messages), schedules decode steps on the model's scheduler actor, samples each next token, streams
// the text to the request's subscriber as it comes, and replies the whole answer. The tokens a turn leaves
// in the cache are reused by the next turn that starts with them. cancel ends the current answer: its
// requester gets errc::cancelled at once, and other sessions of the model continue.
//
//   session_actor s = ...;   // supervisor: (open_atom, session_request{"m"})
//   self->request(s, infinite, generate_atom_v, generate_request{.prompt = "Once", .subscriber = me}).then(
//       [](const generate_reply& r) { ... }, [](const caf::error& e) { ... });
//   // `me` receives (token_atom, token_event) for every piece of text
#pragma once

#include <caf/actor_system.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include <memory>
#include <vector>

#include "actors/runtime_env.h"
#include "actors/scheduler_actor.h"
#include "actors/type_ids.h"

namespace troupe::actors {

using session_actor = caf::typed_actor<
    // One answer; pieces of text go to request.subscriber as (token_atom, token_event).
    caf::replies_to<generate_atom, generate_request>::with<generate_reply>,
    // Ends the current answer now (its requester gets errc::cancelled).
    caf::reacts_to<cancel_atom>,
    // Forgets the conversation (its cached tokens).
    caf::replies_to<reset_atom>::with<bool>,
    // Leaves the model and terminates.
    caf::replies_to<close_atom>::with<bool>,
    // The session's sequence on the model's scheduler (from the supervisor, before the handle is handed out).
    caf::reacts_to<attach_atom, int32_t>>;

// The prompt tokens of a request on a model, as the session decodes them (chat: through the model's
// template). Throws troupe::error for text the tokenizer refuses.
std::vector<llm::token_id> prompt_tokens(const loaded_model& m, const generate_request& r);
// The cells one session of the model may use (prompt and answer together).
uint32_t session_context(const loaded_model& m);

// A session on the model's scheduler; it serves requests once it got its sequence (attach_atom).
session_actor spawn_session_actor(caf::actor_system& sys, std::shared_ptr<const loaded_model> model,
                                  scheduler_actor scheduler, uint64_t id);

}  // namespace troupe::actors
