#include "actors/scheduler_actor.h"

#include <caf/all.hpp>

#include "actors/detail/scheduler_state.h"

namespace troupe::actors {
namespace detail {

namespace {

void run_batch(scheduler_ptr self) {
  auto& st = self->state;
  std::vector<waiting_step> batch = std::move(st.waiting);
  st.waiting.clear();
  if (batch.empty()) return;
  if (!st.dec) {
    for (waiting_step& w : batch) w.promise.deliver(make_error(errc::down, "the model has no context"));
    return;
  }
  std::vector<llm::seq_step> steps;
  steps.reserve(batch.size());
  for (const waiting_step& w : batch) steps.push_back({w.step.seq, w.step.keep, w.step.tokens});
  std::vector<std::vector<float>> logits;
  try {
    logits = st.dec->decode(steps);
  } catch (const std::exception& e) {
    const caf::error err = error_from(e);
    for (waiting_step& w : batch) w.promise.deliver(err);
    return;
  }
  const auto n = static_cast<uint32_t>(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    batch[i].promise.deliver(step_logits{batch[i].step.seq, std::move(logits[i]), n});
  }
  report_compute(self);  // the compute buffers grow when a graph needs more than reserved
}

// Decodes now when every generating sequence has its step waiting; otherwise waits at most flush_delay.
void try_batch(scheduler_ptr self) {
  auto& st = self->state;
  if (st.waiting.empty()) return;
  std::set<int32_t> have;
  for (const waiting_step& w : st.waiting) have.insert(w.step.seq);
  bool all = true;
  for (int32_t s : st.generating) all = all && have.count(s) > 0;
  if (all) {
    run_batch(self);
  } else if (!st.flush_scheduled) {
    st.flush_scheduled = true;
    self->delayed_send(self, st.params.flush_delay, flush_atom_v);
  }
}

void drop_sequence(scheduler_ptr self, int32_t seq) {
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
  if (st.dec) st.dec->forget(seq);
  if (seq >= 0 && static_cast<size_t>(seq) < st.seqs.size()) st.seqs[static_cast<size_t>(seq)] = caf::actor_addr{};
  try_batch(self);
}

scheduler_actor::behavior_type scheduler_fn(scheduler_ptr self, runtime_env_ptr env, memory_accountant_actor acct,
                                            scheduler_params p) {
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
        int32_t seq = -1;
        for (size_t i = 0; i < st.seqs.size() && seq < 0; ++i) {
          if (!st.seqs[i]) seq = static_cast<int32_t>(i);
        }
        if (seq < 0) {
          return make_error(errc::busy, "model " + st.params.model + ": all " + std::to_string(st.seqs.size()) +
                                            " sequences are in use (raise n_seq_max)");
        }
        st.dec->forget(seq);
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
        auto rp = self->make_response_promise<step_logits>();
        st.generating.insert(s.seq);
        st.waiting.push_back({std::move(s), rp});
        try_batch(self);
        return rp;
      },
      [self](end_atom, int32_t seq) {
        self->state.generating.erase(seq);
        try_batch(self);
      },
      [self](flush_atom) {
        self->state.flush_scheduled = false;
        run_batch(self);
      },
      [self](pipeline_atom, const pipeline_ref& r) -> caf::result<pipeline_result> {
        auto& st = self->state;
        std::shared_ptr<pipeline_job> job = st.env->objects.get<pipeline_job>(r.job);
        if (!job) return make_error(errc::not_found, "no pipeline job " + std::to_string(r.job) + " in this process");
        return start_pipeline(self, r.job, std::move(job));
      },
      [self](get_atom, stats_atom) {
        auto& st = self->state;
        sched_stats s;
        s.model = st.params.model;
        if (st.dec) {
          const llm::batch_decoder_stats& d = st.dec->stats();
          s.n_batches = d.n_decodes;
          s.n_steps = d.n_steps;
          s.n_tokens = d.n_tokens;
          s.max_steps = d.max_steps;
          s.kv_bytes = st.ctx->kv().bytes();
          s.compute_bytes = st.ctx->compute_bytes();
        }
        for (const caf::actor_addr& a : st.seqs) s.n_sessions += a ? 1 : 0;
        return s;
      },
      [self](release_atom) -> caf::result<bool> {
        auto rp = self->make_response_promise<bool>();
        release_context(self, rp);
        return rp;
      },
      [self](device_atom, const std::string& name, const device_actor& dev) { self->state.devices[name] = dev; },
  };
}

}  // namespace
}  // namespace detail

scheduler_actor spawn_scheduler_actor(caf::actor_system& sys, runtime_env_ptr env, memory_accountant_actor accountant,
                                      const scheduler_params& p) {
  return sys.spawn<caf::detached>(detail::scheduler_fn, std::move(env), std::move(accountant), p);
}

}  // namespace troupe::actors
