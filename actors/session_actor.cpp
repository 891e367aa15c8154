#include "actors/session_actor.h"

#include <caf/all.hpp>

#include <algorithm>

#include "actors/errors.h"
#include "llm/sequence.h"

namespace troupe::actors {

namespace {

struct session_state {
  std::shared_ptr<const loaded_model> model;
  decoder_actor sched;
  int32_t seq = -1;
  uint64_t id = 0;
  std::vector<llm::token_id> cached;        // tokens the sequence holds from earlier turns
  std::unique_ptr<llm::sequence> current;   // the answer in progress
  size_t logprobs_sent = 0;                  // of current's logprobs, those already in token events
  caf::typed_response_promise<generate_reply> promise;
  token_subscriber subscriber;
  bool cancelled = false;
  static inline const char* name = "troupe.session";

  caf::error cancelled_error() const { return make_error(errc::cancelled, "session " + std::to_string(id) + ": answer cancelled"); }

  ~session_state() {
    // Terminated mid-answer (shut down, killed): the requester gets an error, never a hang.
    if (current) {
      promise.deliver(cancelled ? cancelled_error() : make_error(errc::down, "session " + std::to_string(id) + " terminated"));
    }
  }
};

using session_ptr = session_actor::stateful_pointer<session_state>;

// The answer is over (done, failed or cancelled): the cache keeps what the sequence decoded.
void end_answer(session_ptr self) {
  auto& st = self->state;
  if (st.current) st.cached = st.current->cached();
  st.current.reset();
  st.subscriber = nullptr;
  st.cancelled = false;
  self->send(st.sched, end_atom_v, st.seq);
}

void send_step(session_ptr self) {
  auto& st = self->state;
  const llm::sequence_step& step = st.current->pending();
  self->request(st.sched, caf::infinite, step_atom_v, decode_step{st.seq, step.keep, step.tokens, step.shift_at, step.shift_n})
      .then(
          [self](step_logits& l) {
            auto& s = self->state;
            if (!s.current) return;
            if (s.cancelled) {  // the step in flight is back: the session is free, the requester hears so
              s.promise.deliver(s.cancelled_error());
              end_answer(self);
              return;
            }
            s.current->reused(l.reused);
            llm::sequence_output out;
            try {
              out = s.current->advance(l.logits);
            } catch (const std::exception& e) {
              s.promise.deliver(error_from(e));
              end_answer(self);
              return;
            }
            if (!out.piece.empty() && s.subscriber) {
              token_event ev{s.id, out.piece, out.token, {}};
              const auto& lps = s.current->result().logprobs;
              if (s.logprobs_sent < lps.size()) {
                ev.logprobs.assign(lps.begin() + static_cast<std::ptrdiff_t>(s.logprobs_sent), lps.end());
                s.logprobs_sent = lps.size();
              }
              caf::anon_send(s.subscriber, token_atom_v, std::move(ev));
            }
            if (!out.done) {
              send_step(self);
              return;
            }
            generate_reply reply{s.current->result(), s.id};
            end_answer(self);
            s.promise.deliver(std::move(reply));
          },
          [self](const caf::error& e) {
            auto& s = self->state;
            if (!s.current) return;
            s.promise.deliver(s.cancelled ? s.cancelled_error() : e);
            end_answer(self);
          });
}

session_actor::behavior_type session(session_ptr self, std::shared_ptr<const loaded_model> model, decoder_actor sched,
                                     uint64_t id) {
  auto& init = self->state;
  init.model = std::move(model);
  init.sched = std::move(sched);
  init.id = id;
  return {
      [self](generate_atom, const generate_request& r) -> caf::result<generate_reply> {
        auto& st = self->state;
        if (st.current) return make_error(errc::busy, "session " + std::to_string(st.id) + " is already answering");
        if (st.seq < 0) return make_error(errc::down, "session " + std::to_string(st.id) + " has no sequence");
        try {
          const std::vector<llm::token_id> prompt = prompt_tokens(*st.model, r);
          st.current = std::make_unique<llm::sequence>(*st.model->vocab, st.cached, prompt, r.params,
                                                       st.model->settings.n_ctx_seq);
        } catch (const std::exception& e) {
          st.current.reset();
          return error_from(e);
        }
        st.subscriber = r.subscriber;
        st.cancelled = false;
        st.logprobs_sent = 0;
        st.promise = self->make_response_promise<generate_reply>();
        send_step(self);
        return st.promise;
      },
      [self](cancel_atom) {
        auto& st = self->state;
        if (!st.current || st.cancelled) return;
        st.cancelled = true;
        st.current->cancel();
        // The requester hears of it when the step in flight comes back (end_answer then): until then the
        // session is still answering, and a requester told earlier would hand it to the next request, which
        // would find it busy. The scheduler stops waiting for this sequence's next step now.
        self->send(st.sched, end_atom_v, st.seq);
      },
      [self](reset_atom) -> caf::result<bool> {
        auto& st = self->state;
        if (st.current) return make_error(errc::busy, "session " + std::to_string(st.id) + " is answering");
        st.cached.clear();
        return true;
      },
      [self](close_atom) -> caf::result<bool> {
        auto& st = self->state;
        if (st.current && !st.cancelled) {
          st.cancelled = true;
          st.promise.deliver(make_error(errc::cancelled, "session " + std::to_string(st.id) + " closed"));
        }
        auto rp = self->make_response_promise<bool>();
        self->request(st.sched, caf::infinite, detach_atom_v, st.seq)
            .then([self, rp](bool) mutable {
                    rp.deliver(true);
                    self->quit();
                  },
                  [self, rp](const caf::error&) mutable {
                    rp.deliver(true);
                    self->quit();
                  });
        return rp;
      },
      [self](attach_atom, int32_t seq) { self->state.seq = seq; },
      [self](get_atom, prefix_atom) -> caf::result<session_prefix> {
        auto& st = self->state;
        if (st.current) return make_error(errc::busy, "session " + std::to_string(st.id) + " is answering");
        return session_prefix{st.model->settings.name, st.seq, st.cached};
      },
      [self](share_atom, const session_prefix& p) -> caf::result<bool> {
        auto& st = self->state;
        if (st.current) return make_error(errc::busy, "session " + std::to_string(st.id) + " is answering");
        if (p.model != st.model->settings.name) {
          return make_error(errc::bad_request, "session " + std::to_string(st.id) + " is on model " + st.model->settings.name +
                                                   ", the prefix is on " + p.model);
        }
        auto rp = self->make_response_promise<bool>();
        const std::vector<int32_t> tokens = p.tokens;
        self->request(st.sched, caf::infinite, share_atom_v, p.seq, st.seq, static_cast<int32_t>(p.tokens.size()))
            .then([self, rp, tokens](bool) mutable {
                    self->state.cached = tokens;
                    rp.deliver(true);
                  },
                  [rp](caf::error& e) mutable { rp.deliver(std::move(e)); });
        return rp;
      },
      [self](embed_atom, embed_request& r) -> caf::result<embed_reply> {
        auto& st = self->state;
        const std::string who = "session " + std::to_string(st.id);
        if (st.seq < 0) return make_error(errc::down, who + " has no sequence");
        if (r.tokens.empty()) return make_error(errc::bad_request, who + ": nothing to embed");
        const int32_t n = st.model->vocab->n_tokens();
        for (size_t i = 0; i < r.tokens.size(); ++i) {
          if (r.tokens[i] < 0 || r.tokens[i] >= n) {
            return make_error(errc::bad_request, "token " + std::to_string(i) + " is " + std::to_string(r.tokens[i]) +
                                                     ", outside the vocabulary (0.." + std::to_string(n - 1) + ")");
          }
        }
        if (r.tokens.size() > st.model->settings.embedding_cells()) {
          return make_error(errc::capacity, who + ": " + std::to_string(r.tokens.size()) + " tokens to embed; at most " +
                                                std::to_string(st.model->settings.embedding_cells()));
        }
        // The decoder actor answers the requester; this session's sequence and cache take no part.
        return self->delegate(st.sched, embed_atom_v, std::move(r));
      },
  };
}

}  // namespace

std::vector<llm::token_id> prompt_tokens(const loaded_model& m, const generate_request& r) {
  if (!r.chat && !r.prompt_ids.empty()) {
    const int32_t n = m.vocab->n_tokens();
    for (size_t i = 0; i < r.prompt_ids.size(); ++i) {
      if (r.prompt_ids[i] < 0 || r.prompt_ids[i] >= n) {
        throw troupe::error("prompt token " + std::to_string(i) + " is " + std::to_string(r.prompt_ids[i]) +
                    ", outside the vocabulary (0.." + std::to_string(n - 1) + ")");
      }
    }
    return r.prompt_ids;
  }
  if (!r.chat) return m.vocab->tokenize(r.prompt, true);
  if (r.messages.empty()) return llm::chat_tokens(*m.vocab, r.prompt);  // rendered by the caller
  std::vector<llm::chat_message> chat;
  for (const chat_message& c : r.messages) chat.push_back({c.role, c.content});
  return llm::chat_tokens(*m.vocab, m.chat->apply(chat, true));
}

session_actor spawn_session_actor(caf::actor_system& sys, std::shared_ptr<const loaded_model> model,
                                  decoder_actor scheduler, uint64_t id) {
  return sys.spawn(session, std::move(model), std::move(scheduler), id);
}

}  // namespace troupe::actors
