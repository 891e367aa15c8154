#include "actors/decoder_actor.h"

#include <caf/all.hpp>

#include <algorithm>
#include <exception>
#include <iterator>
#include <optional>

#include "actors/detail/decoder_state.h"
#include "llm/embedding.h"
#include "runtime/log.h"

namespace troupe::actors {
namespace detail {

namespace {

caf::error error_of(const std::exception_ptr& p) {
  try {
    std::rethrow_exception(p);
  } catch (const std::exception& e) {
    return error_from(e);
  } catch (...) {
    return make_error(errc::failed, "decode failed with an exception of unknown type");
  }
}

// Decodes in the context's pipeline at most this many at once: on a model over several devices, two
// sequence groups (each device works on one group's step while another device works on the other's); on
// one device, one (a step waits and joins the next batch rather than splitting it).
size_t max_jobs(const decoder_state& st) { return st.ctx && st.ctx->pipelines() ? 2 : 1; }

// Submits steps as one decode to the context's pipeline; its completion comes back as (decoded_atom, id).
void submit_job(decoder_ptr self, std::vector<waiting_step> steps) {
  auto& st = self->state;
  const uint64_t id = st.next_job++;
  decode_job& job = st.jobs[id];
  job.steps = std::move(steps);
  job.outcome = std::make_shared<decode_outcome>();
  for (int64_t g = 0;; ++g) {  // the lowest group id no other job in flight has (a trace's ring rows)
    bool taken = false;
    for (const auto& [other, j] : st.jobs) taken = taken || (other != id && j.group == g);
    if (!taken) {
      job.group = g;
      break;
    }
  }
  st.max_in_flight = std::max(st.max_in_flight, static_cast<uint32_t>(st.jobs.size()));
  std::vector<llm::seq_step> seq_steps;
  seq_steps.reserve(job.steps.size());
  for (const waiting_step& w : job.steps) {
    seq_steps.push_back({w.step.seq, w.step.keep, w.step.tokens, w.step.shift_at, w.step.shift_n});
  }
  st.dec->submit(
      std::move(seq_steps),
      [me = self->address(), id, outcome = job.outcome](std::vector<std::vector<float>> logits, std::exception_ptr e) {
        outcome->logits = std::move(logits);
        outcome->error = e;
        if (auto h = caf::actor_cast<decoder_actor>(me)) caf::anon_send(h, decoded_atom_v, id);
      },
      job.group);
}

// A prompt part shorter than this is not split off (the rest waits for the next decode whole).
constexpr size_t min_part = 64;

// Prompt tokens one decode takes (chunked prefill): n_batch, times n_pipeline on a model over several
// devices (so that one part still fills the pipeline with micro-batches).
size_t decode_budget(const decoder_state& st) {
  const llm::context_params& p = st.ctx->params();
  return static_cast<size_t>(std::max<uint32_t>(p.n_batch, 1)) * (st.ctx->pipelines() ? std::max<uint32_t>(p.n_pipeline, 1) : 1);
}

// The next decode: the waiting steps, shortest first (the sequences' next tokens, then prompts by what is
// left of them: the mean time to a first token is lowest when the shortest prompts finish first), within
// decode_budget tokens. A prompt that does not fit has its first part decoded now and its rest waits, so a
// step that arrives meanwhile waits for one part of a long prompt, not for all of it. A step whose
// sequence has a part in flight waits for it.
void run_batch(decoder_ptr self) {
  auto& st = self->state;
  if (st.waiting.empty()) return;
  if (!st.dec) {
    for (waiting_step& w : st.waiting) w.promise.deliver(make_error(errc::down, "the model has no context"));
    st.waiting.clear();
    return;
  }
  const size_t most = max_jobs(st);
  if (st.jobs.size() >= most) return;  // the next completion tries again
  std::vector<waiting_step> ready, later;
  for (waiting_step& w : st.waiting) (st.in_flight(w.step.seq) ? later : ready).push_back(std::move(w));
  st.waiting.clear();
  std::stable_sort(ready.begin(), ready.end(), [](const waiting_step& a, const waiting_step& b) {
    return a.step.tokens.size() < b.step.tokens.size();
  });
  const size_t budget = decode_budget(st);
  std::vector<waiting_step> batch;
  size_t used = 0;
  for (waiting_step& w : ready) {
    const size_t n = w.step.tokens.size();
    if (n == 1 || used + n <= budget) {
      used += n;
      batch.push_back(std::move(w));
      continue;
    }
    const size_t room = budget > used ? budget - used : 0;
    if (room >= std::min(min_part, budget) && room > 0 && n - room >= 1) {
      waiting_step part;
      part.step.seq = w.step.seq;
      part.step.keep = w.step.keep;
      part.step.tokens.assign(w.step.tokens.begin(), w.step.tokens.begin() + static_cast<std::ptrdiff_t>(room));
      part.step.shift_at = w.step.shift_at;  // a shift goes before the first part
      part.step.shift_n = w.step.shift_n;
      w.step.shift_n = 0;
      w.step.shift_at = 0;
      part.partial = true;
      part.retried = w.retried;
      w.step.keep += static_cast<int32_t>(room);
      w.step.tokens.erase(w.step.tokens.begin(), w.step.tokens.begin() + static_cast<std::ptrdiff_t>(room));
      used += room;
      batch.push_back(std::move(part));
    }
    later.push_back(std::move(w));
  }
  st.waiting = std::move(later);
  if (batch.empty()) return;
  // Nothing in flight on a model over several devices: two groups, so that both devices work at once.
  const size_t n_groups = st.jobs.empty() && most >= 2 && batch.size() >= 2 ? 2 : 1;
  const size_t per = (batch.size() + n_groups - 1) / n_groups;
  for (size_t begin = 0; begin < batch.size(); begin += per) {
    const size_t end = std::min(batch.size(), begin + per);
    submit_job(self, {std::make_move_iterator(batch.begin() + static_cast<std::ptrdiff_t>(begin)),
                      std::make_move_iterator(batch.begin() + static_cast<std::ptrdiff_t>(end))});
  }
}

// Decodes now when every generating sequence without a step in flight has its step waiting; otherwise
// waits at most flush_delay.
void try_batch(decoder_ptr self) {
  auto& st = self->state;
  if (st.waiting.empty()) return;
  std::set<int32_t> have;
  for (const waiting_step& w : st.waiting) have.insert(w.step.seq);
  bool all = true;
  for (int32_t s : st.generating) all = all && (have.count(s) > 0 || st.in_flight(s));
  if (all) {
    run_batch(self);
  } else if (!st.flush_scheduled) {
    st.flush_scheduled = true;
    self->delayed_send(self, st.params.flush_delay, flush_atom_v);
  }
}

void release_deferred(decoder_ptr self, int32_t leader);

// Whether a step of seq is waiting, deferred or in flight.
bool has_step(const decoder_state& st, int32_t seq) {
  if (st.in_flight(seq)) return true;
  for (const waiting_step& w : st.waiting) {
    if (w.step.seq == seq) return true;
  }
  for (const auto& [leader, w] : st.deferred) {
    if (w.step.seq == seq) return true;
  }
  return false;
}

// A sequence whose answer ended (end_atom came while a step of it was still here) is idle once its last
// step is done.
void maybe_idle(decoder_ptr self, int32_t seq) {
  auto& st = self->state;
  if (st.prefixes && st.generating.count(seq) == 0 && seq >= 0 && static_cast<size_t>(seq) < st.seqs.size() &&
      st.seqs[static_cast<size_t>(seq)] && !has_step(st, seq)) {
    st.prefixes->set_idle(seq, true);
  }
}

// After a job: the steps of `ended` are answered, so the steps deferred behind them are planned and their
// sequences may be idle; then the release that waited for the jobs, or the next batch.
void after_steps(decoder_ptr self, const std::vector<int32_t>& ended) {
  auto& st = self->state;
  for (const int32_t seq : ended) {
    release_deferred(self, seq);
    maybe_idle(self, seq);
  }
  if (st.jobs.empty() && !st.release_waiters.empty()) {
    std::vector<caf::typed_response_promise<bool>> waiters = std::move(st.release_waiters);
    st.release_waiters.clear();
    release_context(self, waiters.front());
    for (size_t i = 1; i < waiters.size(); ++i) waiters[i].deliver(true);
    return;
  }
  try_batch(self);
}

// The rest of seq's prompt step, waiting while its first part was decoded; taken out of `waiting`.
std::optional<waiting_step> take_rest(decoder_state& st, int32_t seq) {
  for (auto it = st.waiting.begin(); it != st.waiting.end(); ++it) {
    if (it->step.seq == seq) {
      waiting_step w = std::move(*it);
      st.waiting.erase(it);
      return w;
    }
  }
  return std::nullopt;
}

// A decode in the pipeline completed: its steps get their logits (or its error), and the next batch may go.
// A prompt's first part (partial) delivers nothing: its rest waits, and has the promise.
void job_done(decoder_ptr self, uint64_t id) {
  auto& st = self->state;
  const auto it = st.jobs.find(id);
  if (it == st.jobs.end()) return;
  decode_job job = std::move(it->second);
  st.jobs.erase(it);
  bool missing = false;
  std::string why;
  if (job.outcome->error) {
    try {
      std::rethrow_exception(job.outcome->error);
    } catch (const llm::missing_positions_error& e) {
      missing = true;
      why = e.what();
    } catch (...) {
    }
  }
  const caf::error err = job.outcome->error ? error_of(job.outcome->error) : caf::error{};
  // A share or restore planned for a step found no room in the cache (kept conversations it would have
  // evicted were pinned by later steps' shares): nothing was decoded, so the steps go again once, each
  // decoding its whole prompt.
  if (missing && st.prefixes && st.dec) {
    const bool releasing = !st.release_waiters.empty();
    std::vector<int32_t> ended;  // steps that fail here: their followers are released below
    for (waiting_step& w : job.steps) {
      const int32_t seq = w.step.seq;
      if (w.partial) {
        std::optional<waiting_step> rest = take_rest(st, seq);
        if (!rest) continue;  // detached meanwhile
        w.promise = std::move(rest->promise);
        w.retried = w.retried || rest->retried;
        w.partial = false;
      }
      const bool held = seq >= 0 && static_cast<size_t>(seq) < st.seqs.size() && st.seqs[static_cast<size_t>(seq)];
      const std::vector<llm::token_id> whole = held ? st.prefixes->tokens_of(seq) : std::vector<llm::token_id>{};
      if (whole.empty() || w.retried || releasing) {
        // Detached meanwhile, a prompt the index does not know (after an earlier failure), a second failure,
        // or the context is being released: this step fails alone, the others go again.
        st.prefixes->step_done(seq, false);
        w.promise.deliver(releasing ? make_error(errc::down, "model " + st.params.model + ": the context is being released")
                          : held   ? err
                                   : make_error(errc::cancelled, "sequence " + std::to_string(seq) + " detached"));
        ended.push_back(seq);
        continue;
      }
      TROUPE_LOG(info, "prefix reuse: model " << st.params.model << ", sequence " << seq
                                                << ": the cells planned for its step were not there (" << why << "); decoding its whole prompt of " << whole.size() << " tokens");
      st.prefixes->retry_plain(seq);
      st.dec->submit_forget(seq);
      w.step.keep = 0;
      w.step.tokens.assign(whole.begin(), whole.end());
      w.step.shift_at = 0;  // the whole (shifted) sequence from position 0
      w.step.shift_n = 0;
      w.reused = 0;
      w.retried = true;
      st.waiting.push_back(std::move(w));
    }
    after_steps(self, ended);
    return;
  }
  const bool ok = !job.outcome->error;
  for (size_t i = 0; i < job.steps.size(); ++i) {
    waiting_step& w = job.steps[i];
    if (w.partial) {
      if (ok) continue;
      std::optional<waiting_step> rest = take_rest(st, w.step.seq);  // the rest fails with its first part
      if (!rest) continue;
      w.promise = std::move(rest->promise);
      w.partial = false;
    }
    if (st.prefixes) st.prefixes->step_done(w.step.seq, ok);
    if (!ok) {
      w.promise.deliver(err);
    } else {
      w.promise.deliver(step_logits{w.step.seq, std::move(job.outcome->logits[i]),
                                    static_cast<uint32_t>(job.steps.size()), w.reused});
    }
  }
  report_compute(self);  // the compute buffers grow when a graph needs more than reserved
  report_prompt_cache(self);
  std::vector<int32_t> ended;
  for (const waiting_step& w : job.steps) {
    if (!w.partial) ended.push_back(w.step.seq);
  }
  after_steps(self, ended);
}

// Prompt positions a step must gain by waiting for another sequence's step in progress (leader_for).
constexpr size_t min_shared_gain = 64;

// A step goes into the next batch: the positions its sequence drops are kept in the pool first, and the
// longest decoded prefix of its prompt that any sequence (or the host-RAM prompt cache) holds is shared in
// (or written back) instead of decoded.
void accept_step(decoder_ptr self, decode_step s, caf::typed_response_promise<step_logits> rp) {
  auto& st = self->state;
  int32_t reused = 0;
  if (st.prefixes && st.dec) {
    llm::prefix_index::step_plan plan;
    try {
      if (s.shift_n > 0) {
        // The shift goes first, as an edit of its own, so that a share planned below lands on its result.
        st.prefixes->shifted(s.seq, s.shift_at, s.shift_n);
        st.dec->submit_shift(s.seq, s.shift_at, s.shift_n);
        s.shift_at = 0;
        s.shift_n = 0;
      }
      plan = st.prefixes->plan_step(s.seq, s.keep, s.tokens);
    } catch (const std::exception& e) {
      rp.deliver(error_from(e));
      return;
    }
    llm::prefix_index* ix = st.prefixes.get();
    if (plan.keep_into >= 0) {
      st.dec->submit_share(s.seq, plan.keep_into, plan.kept, [ix, r = plan.keep_into] { ix->unpin(r); });
    }
    if (plan.donor >= 0) st.dec->submit_share(plan.donor, s.seq, plan.n, [ix, d = plan.donor] { ix->unpin(d); });
    if (plan.restore) {
      // No room to write it back: the index stops offering seq's positions to others at once.
      st.dec->submit_restore(s.seq, plan.restore, plan.restore_saved, plan.n, [ix, seq = s.seq] { ix->retry_plain(seq); });
    }
    if (plan.keep_into >= 0) {
      TROUPE_LOG(debug, "prefix reuse: sequence " << s.seq << " keeps its " << plan.kept << " positions in sequence " << plan.keep_into);
    }
    if (s.tokens.size() > 1) {
      TROUPE_LOG(debug, "prefix reuse: model " << st.params.model << ", sequence " << s.seq << ": a step of "
                                               << s.tokens.size() << " tokens after " << s.keep << " decodes "
                                               << plan.tokens.size() << " after " << plan.keep
                                               << (plan.donor >= 0 ? " (shared from sequence " + std::to_string(plan.donor) + ")"
                                                   : plan.restore ? std::string(" (restored from host memory)") : std::string()));
    }
    s.keep = plan.keep;
    s.tokens = std::move(plan.tokens);
    reused = plan.reused;
  }
  st.generating.insert(s.seq);
  st.waiting.push_back({std::move(s), rp, reused});
  try_batch(self);
}

// The deferred steps whose leader is `leader` (-1: every one) are planned now.
void release_deferred(decoder_ptr self, int32_t leader) {
  auto& st = self->state;
  std::vector<waiting_step> go;
  for (size_t i = 0; i < st.deferred.size();) {
    if (leader < 0 || st.deferred[i].first == leader) {
      go.push_back(std::move(st.deferred[i].second));
      st.deferred.erase(st.deferred.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      ++i;
    }
  }
  for (waiting_step& w : go) accept_step(self, std::move(w.step), std::move(w.promise));
}

// Forgets seq's cache positions in the pipeline's order, keeping them in the pool first (as a kept
// conversation, llm/prefix_index.h) when they are worth it.
void forget_sequence(decoder_ptr self, int32_t seq) {
  auto& st = self->state;
  if (!st.dec) return;
  if (st.prefixes) {
    const auto [kept, n] = st.prefixes->forget(seq);
    if (kept >= 0) st.dec->submit_share(seq, kept, n, [p = st.prefixes.get(), kept = kept] { p->unpin(kept); });
  }
  st.dec->submit_forget(seq);
}

void drop_sequence(decoder_ptr self, int32_t seq) {
  auto& st = self->state;
  st.generating.erase(seq);
  std::vector<waiting_step> keep;
  for (waiting_step& w : st.waiting) {
    if (w.step.seq == seq) {
      w.promise.deliver(make_error(errc::cancelled, "sequence " + std::to_string(seq) + " detached"));
    } else {
      keep.push_back(std::move(w));
    }
  }
  st.waiting = std::move(keep);
  for (size_t i = 0; i < st.deferred.size();) {
    if (st.deferred[i].second.step.seq == seq) {
      st.deferred[i].second.promise.deliver(make_error(errc::cancelled, "sequence " + std::to_string(seq) + " detached"));
      st.deferred.erase(st.deferred.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      ++i;
    }
  }
  release_deferred(self, seq);
  forget_sequence(self, seq);  // after the decodes before it (a step of seq in flight completes)
  if (seq >= 0 && static_cast<size_t>(seq) < st.seqs.size()) st.seqs[static_cast<size_t>(seq)] = caf::actor_addr{};
  try_batch(self);
}

decoder_actor::behavior_type decoder_fn(decoder_ptr self, engine_env_ptr env, memory_accountant_actor acct,
                                            decoder_params p) {
  auto& init = self->state;
  init.env = env;
  init.accountant = acct;
  init.params = std::move(p);
  if (!init.params.model.empty()) init.model = env->model(init.params.model);
  self->set_down_handler([self](const caf::down_msg& dm) {
    auto& st = self->state;
    for (size_t i = 0; i < st.seqs.size(); ++i) {
      if (st.seqs[i] && st.seqs[i] == dm.source) drop_sequence(self, static_cast<int32_t>(i));
    }
  });
  return {
      [self](attach_atom, const session_actor& session) -> caf::result<int32_t> {
        auto& st = self->state;
        if (!st.model) return make_error(errc::bad_request, "this scheduler serves no model");
        bool created = false;
        if (!st.ctx) {
          try {
            create_context(self);
          } catch (const std::exception& e) {
            st.ctx.reset();
            st.dec.reset();
            return error_from(e);
          }
          created = true;
        }
        int32_t seq = -1;  // a free one whose last session's step is not in flight any more
        for (size_t i = 0; i < st.seqs.size() && seq < 0; ++i) {
          if (!st.seqs[i] && !st.in_flight(static_cast<int32_t>(i))) seq = static_cast<int32_t>(i);
        }
        if (seq < 0) {
          return make_error(errc::busy, "model " + st.params.model + ": all " + std::to_string(st.seqs.size()) +
                                            " sequences are in use (raise n_seq_max)");
        }
        forget_sequence(self, seq);
        st.seqs[static_cast<size_t>(seq)] = session.address();
        if (session) self->monitor(session);
        if (!created) return seq;
        // Reply once the compute memory is on record, so the breakdown the caller asks for next has it.
        auto rp = self->make_response_promise<int32_t>();
        report_compute(self, [rp, seq]() mutable { rp.deliver(seq); });
        return rp;
      },
      [self](detach_atom, int32_t seq) -> bool {
        auto& st = self->state;
        if (seq < 0 || static_cast<size_t>(seq) >= st.seqs.size() || !st.seqs[static_cast<size_t>(seq)]) return false;
        drop_sequence(self, seq);
        return true;
      },
      [self](share_atom, int32_t src, int32_t dst, int32_t n) -> caf::result<bool> {
        auto& st = self->state;
        if (!st.dec) return make_error(errc::down, "model " + st.params.model + " has no context");
        const auto held = [&](int32_t s) { return s >= 0 && static_cast<size_t>(s) < st.seqs.size() && st.seqs[static_cast<size_t>(s)]; };
        if (!held(src) || !held(dst) || src == dst || n < 0) {
          return make_error(errc::bad_request, "share: sequences " + std::to_string(src) + " -> " + std::to_string(dst) + " are not both held");
        }
        if (caf::actor_cast<caf::actor_addr>(self->current_sender()) != st.seqs[static_cast<size_t>(dst)]) {
          return make_error(errc::bad_request, "share into sequence " + std::to_string(dst) + " from an actor that does not hold it");
        }
        if (st.in_flight(dst) || st.generating.count(dst) != 0) {
          return make_error(errc::busy, "sequence " + std::to_string(dst) + " is decoding");
        }
        if (st.prefixes) st.prefixes->shared(src, dst, n);
        st.dec->submit_share(src, dst, n);
        return true;
      },
      [self](step_atom, decode_step& s) -> caf::result<step_logits> {
        auto& st = self->state;
        if (!st.dec) return make_error(errc::down, "model " + st.params.model + " has no context");
        if (s.seq < 0 || static_cast<size_t>(s.seq) >= st.seqs.size() || !st.seqs[static_cast<size_t>(s.seq)]) {
          return make_error(errc::bad_request, "step on sequence " + std::to_string(s.seq) + ", which no session holds");
        }
        if (caf::actor_cast<caf::actor_addr>(self->current_sender()) != st.seqs[static_cast<size_t>(s.seq)]) {
          return make_error(errc::bad_request, "step on sequence " + std::to_string(s.seq) + " from an actor that does not hold it");
        }
        for (const waiting_step& w : st.waiting) {
          if (w.step.seq == s.seq) return make_error(errc::busy, "sequence " + std::to_string(s.seq) + " has a step waiting");
        }
        if (st.in_flight(s.seq)) {
          return make_error(errc::busy, "sequence " + std::to_string(s.seq) + " has a step being decoded");
        }
        if (!st.release_waiters.empty()) return make_error(errc::down, "model " + st.params.model + ": the context is being released");
        auto rp = self->make_response_promise<step_logits>();
        if (st.prefixes) st.prefixes->set_idle(s.seq, false);
        // Several clients behind one new long prefix: a step whose prompt's start another sequence is
        // decoding now waits for it and then shares it, instead of decoding the same positions beside it.
        if (st.prefixes) {
          const int32_t leader = st.prefixes->leader_for(s.seq, s.keep, s.tokens, min_shared_gain);
          if (leader >= 0) {
            st.deferred.push_back({leader, waiting_step{std::move(s), rp, 0}});
            return rp;
          }
        }
        accept_step(self, std::move(s), rp);
        return rp;
      },
      [self](embed_atom, const embed_request& r) -> caf::result<embed_reply> {
        auto& st = self->state;
        if (!st.model) return make_error(errc::bad_request, "this scheduler serves no model");
        // Without the model's context (released: this actor terminates next) no embeddings context is made,
        // so none outlives the release on the memory record.
        if (!st.dec) return make_error(errc::down, "model " + st.params.model + " has no context");
        if (!st.release_waiters.empty()) return make_error(errc::down, "model " + st.params.model + ": the context is being released");
        embed_reply out;
        try {
          if (!st.embed_ctx) create_embed_context(self);
          out.embedding = llm::embed(*st.embed_ctx, r.tokens);  // on this thread: the model's decodes wait meanwhile
        } catch (const std::exception& e) {
          report_compute(self);  // a context made for this request is on record all the same
          return error_from(e);
        }
        // Replies once the compute memory (grown for a long input) is on record, as attach does.
        auto rp = self->make_response_promise<embed_reply>();
        report_compute(self, [rp, out = std::move(out)]() mutable { rp.deliver(std::move(out)); });
        return rp;
      },
      [self](end_atom, int32_t seq) {
        auto& st = self->state;
        st.generating.erase(seq);
        // Between answers its cells may go when the pool needs them (the index remembers its tokens); not
        // while a step of it is still here (a cancelled answer: job_done marks it then), and only for the
        // session that holds it.
        if (st.prefixes && seq >= 0 && static_cast<size_t>(seq) < st.seqs.size() &&
            st.seqs[static_cast<size_t>(seq)] == caf::actor_cast<caf::actor_addr>(self->current_sender()) && !has_step(st, seq)) {
          st.prefixes->set_idle(seq, true);
        }
        try_batch(self);
      },
      [self](flush_atom) {
        self->state.flush_scheduled = false;
        run_batch(self);
      },
      [self](get_atom, stats_atom) {
        auto& st = self->state;
        decoder_stats s;
        s.model = st.params.model;
        if (st.dec) {
          const llm::batch_decoder_stats& d = st.dec->stats();
          s.n_batches = d.n_decodes;
          s.n_steps = d.n_steps;
          s.n_tokens = d.n_tokens;
          s.max_steps = d.max_steps;
          s.kv_bytes = st.ctx->kv().bytes();
          const llm::kv_cache::occupancy_counts occ = st.ctx->kv().occupancy();
          s.kv_cells = st.ctx->kv().size();
          s.kv_cells_used = occ.used;
          s.kv_cells_shared = occ.shared;
          s.compute_bytes = st.ctx->compute_bytes();
        }
        if (st.prefixes) {
          const llm::prefix_index_stats px = st.prefixes->stats();
          s.reused_tokens = px.reused_tokens;
          s.kept_conversations = px.kept_conversations;
          s.kept_evictions = px.evictions;
          s.kept_now = px.kept_now;
          s.kept_tokens_now = px.kept_tokens_now;
          s.restored_tokens = px.restored_tokens;
          s.saved_conversations = px.saved_conversations;
          s.host_entries = px.host_entries;
          s.host_bytes = px.host_bytes;
          s.idle_evictions = px.idle_evictions;
        }
        for (const caf::actor_addr& a : st.seqs) s.n_sessions += a ? 1 : 0;
        for (size_t i = 0; i < st.seqs.size(); ++i) {
          const auto seq = static_cast<int32_t>(i);
          slot_status slot;
          slot.id = seq;
          slot.attached = static_cast<bool>(st.seqs[i]);
          bool deferred = false;
          for (const auto& [leader, w] : st.deferred) deferred = deferred || w.step.seq == seq;
          slot.is_processing = st.generating.count(seq) > 0 || st.in_flight(seq) || deferred;
          slot.n_tokens = st.prefixes ? static_cast<uint32_t>(st.prefixes->tokens_of(seq).size()) : 0;
          s.slots.push_back(slot);
        }
        s.n_in_flight = static_cast<uint32_t>(st.jobs.size());
        s.max_in_flight = st.max_in_flight;
        return s;
      },
      [self](release_atom) -> caf::result<bool> {
        auto rp = self->make_response_promise<bool>();
        release_context(self, rp);
        return rp;
      },
      [self](device_atom, const std::string& name, const device_actor& dev) { self->state.devices[name] = dev; },
      [self](compute_atom, const decode_split& d) { relay_split(self, d); },
      [self](decoded_atom, uint64_t id) { job_done(self, id); },
  };
}

}  // namespace
}  // namespace detail

decoder_actor spawn_decoder_actor(caf::actor_system& sys, engine_env_ptr env, memory_accountant_actor accountant,
                                      const decoder_params& p) {
  return sys.spawn<caf::detached>(detail::decoder_fn, std::move(env), std::move(accountant), p);
}

}  // namespace troupe::actors
