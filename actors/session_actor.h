// The session actor, one per conversation: tokenizes the prompt (or applies the model's chat template to
// the messages), schedules decode steps on the model's decoder actor, samples each next token, streams
// the text to the request's subscriber as it comes, and replies the whole answer. The tokens a turn leaves
// in the cache are reused by the next turn that starts with them. cancel ends the current answer: its
// requester gets errc::cancelled at once, and other sessions of the model continue. embed checks token ids
// and hands them to the model's decoder actor, which computes their embedding and answers the requester.
//
//   session_actor s = ...;   // supervisor: (open_atom, session_request{"m"})
//   self->request(s, infinite, generate_atom_v, generate_request{.prompt = "Once", .subscriber = me}).then(
//       [](const generate_reply& r) { ... }, [](const caf::error& e) { ... });
//   // `me` receives (token_atom, token_event) for every piece of text
#pragma once

#include <caf/actor_system.hpp>

#include <memory>
#include <vector>

#include "actors/engine_env.h"
#include "actors/type_ids.h"

namespace troupe::actors {

// The interface (using session_actor = caf::typed_actor<...>) is in actors/handles.h.

// The prompt tokens of a request on a model, as the session decodes them (chat: through the model's
// template). Throws troupe::error for text the tokenizer refuses.
std::vector<llm::token_id> prompt_tokens(const loaded_model& m, const generate_request& r);

// A session on the model's scheduler; it serves requests once it got its sequence (attach_atom).
session_actor spawn_session_actor(caf::actor_system& sys, std::shared_ptr<const loaded_model> model,
                                  decoder_actor scheduler, uint64_t id);

}  // namespace troupe::actors
