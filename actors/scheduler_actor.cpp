#include "actors/scheduler_actor.h"

#include <caf/all.hpp>

#include <chrono>
#include <functional>
#include <map>
#include <set>

#include "actors/device_actor.h"
#include "actors/errors.h"
#include "runtime/llm/batch_decoder.h"
#include "runtime/llm/llm_context.h"
#include "runtime/log.h"
#include "runtime/memory.h"

namespace troupe::actors {

namespace {

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

memory_event event_for(buffer_type_i& bt, memory_kind kind, int64_t bytes, const std::string& owner) {
  return {std::string(bt.name()), std::string(bt.device().name()), bt.is_host(), static_cast<uint8_t>(kind), bytes, owner};
}

// Tells the allocator actors (or the accountant, for a buffer type without one) the context's compute
// memory per buffer type; `done` runs once every allocator asked has answered (at once when none was).
void report_compute(scheduler_ptr self, std::function<void()> done = {}) {
  auto& st = self->state;
  auto left = std::make_shared<size_t>(1);
  auto finish = [left, done] {
    if (--*left == 0 && done) done();
  };
  if (st.ctx) {
    scheduler& sched = st.ctx->sched();
    std::map<buffer_type_i*, uint64_t> now;
    for (int b = 0; b < sched.n_backends(); ++b) now[&sched.buffer_type(b)] += sched.compute_buffer_size(b);
    for (const auto& [bt, bytes] : now) {
      const std::string name(bt->name());
      uint64_t& reported = st.compute_reported[name];
      if (reported == bytes) continue;
      const auto it = st.params.allocators.find(name);
      if (it != st.params.allocators.end()) {
        ++*left;
        self->request(it->second, caf::infinite, reserve_atom_v, compute_reservation{st.owner(), bytes})
            .then([finish](int64_t) { finish(); },
                  [finish, name](const caf::error& e) {
                    TROUPE_LOG(warn, "scheduler: allocator " << name << " did not take a reservation: " << describe(e));
                    finish();
                  });
      } else {
        self->send(st.accountant, record_atom_v,
                   event_for(*bt, memory_kind::compute, static_cast<int64_t>(bytes) - static_cast<int64_t>(reported), st.owner()));
      }
      reported = bytes;
    }
  }
  finish();
}

// The loader checked the name; anything else is f16.
type kv_type(const std::string& name) {
  if (name == "f32") return type::f32;
  if (name == "q8_0") return type::q8_0;
  return type::f16;
}

// Runs one split of the context's decode graph on the thread of the device actor that owns its device, and
// waits for it (the scheduler actor is detached: blocking here holds no shared worker). A device without an
// actor (none in this runtime) computes here. A failure comes back with the exception's own type.
void run_split_on_device(scheduler_ptr self, int index, const scheduler::split& sp, const std::function<void()>& work) {
  auto& st = self->state;
  const std::string device(st.ctx->sched().backend(sp.backend).device().name());
  const auto dev = st.devices.find(device);
  if (dev == st.devices.end()) {
    work();
    return;
  }
  auto task = std::make_shared<split_task>();
  task->work = &work;
  task->device = device;
  const uint64_t id = st.env->objects.put(task);
  caf::error err;
  {
    caf::scoped_actor blocking{self->system()};
    blocking->request(dev->second, caf::infinite, compute_atom_v, split_ref{id, 0, static_cast<uint32_t>(index)})
        .receive([](const split_result&) {}, [&](caf::error& e) { err = std::move(e); });
  }
  st.env->objects.erase(id);
  if (task->failure) std::rethrow_exception(task->failure);
  if (err) throw backend_error("device actor " + device + ": " + describe(err));
}

void create_context(scheduler_ptr self) {
  auto& st = self->state;
  const load_request& r = st.model->request;
  st.ctx = std::make_unique<llm::llm_context>(
      *st.model->model, llm::context_params{.n_ctx = r.n_ctx, .n_batch = r.n_batch, .n_ubatch = r.n_ubatch,
                                            .n_seq_max = r.n_seq_max, .type_k = kv_type(r.kv_type),
                                            .type_v = kv_type(r.kv_type), .n_threads = r.n_threads});
  if (st.params.dispatch_splits) {
    st.ctx->sched().set_split_runner([self](int index, const scheduler::split& sp, const std::function<void()>& work) {
      run_split_on_device(self, index, sp, work);
    });
  }
  st.dec = std::make_unique<llm::batch_decoder>(*st.ctx);
  st.seqs.assign(st.ctx->params().n_seq_max, caf::actor_addr{});
  for (const auto& [bt, bytes] : st.ctx->kv().bytes_by_buft()) {
    self->send(st.accountant, record_atom_v, event_for(*bt, memory_kind::context, static_cast<int64_t>(bytes), st.owner()));
  }
}

// Releases the context's memory; replies through rp once every allocator has answered.
void release_context(scheduler_ptr self, caf::typed_response_promise<bool> rp) {
  auto& st = self->state;
  for (waiting_step& w : st.waiting) w.promise.deliver(make_error(errc::down, "the model's context was released"));
  st.waiting.clear();
  st.generating.clear();
  if (!st.ctx) {
    rp.deliver(true);
    return;
  }
  for (const auto& [bt, bytes] : st.ctx->kv().bytes_by_buft()) {
    self->send(st.accountant, record_atom_v, event_for(*bt, memory_kind::context, -static_cast<int64_t>(bytes), st.owner()));
  }
  std::vector<allocator_actor> asked;
  for (auto& [name, reported] : st.compute_reported) {
    if (reported == 0) continue;
    const auto it = st.params.allocators.find(name);
    if (it != st.params.allocators.end()) {
      asked.push_back(it->second);
    } else {
      scheduler& sched = st.ctx->sched();
      for (int b = 0; b < sched.n_backends(); ++b) {
        if (sched.buffer_type(b).name() == name) {
          self->send(st.accountant, record_atom_v,
                     event_for(sched.buffer_type(b), memory_kind::compute, -static_cast<int64_t>(reported), st.owner()));
          break;
        }
      }
    }
    reported = 0;
  }
  st.dec.reset();
  st.ctx.reset();
  st.seqs.clear();
  if (asked.empty()) {
    rp.deliver(true);
    return;
  }
  auto left = std::make_shared<size_t>(asked.size());
  for (const allocator_actor& a : asked) {
    self->request(a, caf::infinite, release_atom_v, st.owner())
        .then([rp, left](uint64_t) mutable { if (--*left == 0) rp.deliver(true); },
              [rp, left](const caf::error&) mutable { if (--*left == 0) rp.deliver(true); });
  }
}

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

void dispatch_split(scheduler_ptr self, uint64_t run_id, uint32_t mb, uint32_t split);

void split_done(scheduler_ptr self, uint64_t run_id) {
  auto& st = self->state;
  pipeline_run& r = st.runs.at(run_id);
  if (--r.outstanding > 0) return;
  r.result.seconds = std::chrono::duration<double>(clock_type::now() - r.t0).count();
  if (r.failure) {
    r.promise.deliver(r.failure);
  } else {
    r.promise.deliver(r.result);
  }
  st.runs.erase(run_id);
}

void dispatch_split(scheduler_ptr self, uint64_t run_id, uint32_t mb, uint32_t split) {
  auto& st = self->state;
  pipeline_run& r = st.runs.at(run_id);
  scheduler& sched = *r.job->microbatches[mb].sched;
  const std::string device(sched.backend(sched.splits()[split].backend).device().name());
  const auto dev = st.devices.find(device);
  ++r.outstanding;
  if (dev == st.devices.end()) {
    if (!r.failure) r.failure = make_error(errc::not_found, "pipeline: no device actor for " + device);
    split_done(self, run_id);
    return;
  }
  self->request(dev->second, caf::infinite, compute_atom_v, split_ref{r.job_id, mb, split})
      .then(
          [self, run_id, mb, split](const split_result& res) {
            pipeline_run& run = self->state.runs.at(run_id);
            run.result.busy_seconds += res.seconds;
            ++run.result.splits;
            const auto n = static_cast<uint32_t>(run.job->microbatches[mb].sched->n_splits());
            if (!run.failure && split + 1 < n) dispatch_split(self, run_id, mb, split + 1);
            split_done(self, run_id);
          },
          [self, run_id](const caf::error& e) {
            pipeline_run& run = self->state.runs.at(run_id);
            if (!run.failure) run.failure = e;
            split_done(self, run_id);
          });
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
      [self](attach_atom, const caf::actor& session) -> caf::result<int32_t> {
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
        const uint64_t id = st.next_run++;
        pipeline_run& run = st.runs[id];
        run.promise = self->make_response_promise<pipeline_result>();
        run.job = job;
        run.job_id = r.job;
        run.t0 = clock_type::now();
        run.result.microbatches = static_cast<uint32_t>(job->microbatches.size());
        auto rp = run.promise;
        run.outstanding = 1;  // held until every first split is out
        for (uint32_t mb = 0; mb < job->microbatches.size(); ++mb) {
          if (job->microbatches[mb].sched->n_splits() > 0) dispatch_split(self, id, mb, 0);
        }
        split_done(self, id);
        return rp;
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
      [self](device_atom, const std::string& name, const caf::actor& dev) {
        self->state.devices[name] = caf::actor_cast<device_actor>(dev);
      },
  };
}

}  // namespace

scheduler_actor spawn_scheduler_actor(caf::actor_system& sys, runtime_env_ptr env, memory_accountant_actor accountant,
                                      const scheduler_params& p) {
  return sys.spawn<caf::detached>(scheduler_fn, std::move(env), std::move(accountant), p);
}

}  // namespace troupe::actors
