#include <caf/all.hpp>

#include "actors/detail/scheduler_state.h"

namespace troupe::actors::detail {

namespace {

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

}  // namespace

caf::typed_response_promise<pipeline_result> start_pipeline(scheduler_ptr self, uint64_t job_id,
                                                             std::shared_ptr<pipeline_job> job) {
  auto& st = self->state;
  const uint64_t id = st.next_run++;
  pipeline_run& run = st.runs[id];
  run.promise = self->make_response_promise<pipeline_result>();
  run.job = job;
  run.job_id = job_id;
  run.t0 = clock_type::now();
  run.result.microbatches = static_cast<uint32_t>(job->microbatches.size());
  auto rp = run.promise;
  run.outstanding = 1;  // held until every first split is out
  for (uint32_t mb = 0; mb < job->microbatches.size(); ++mb) {
    if (job->microbatches[mb].sched->n_splits() > 0) dispatch_split(self, id, mb, 0);
  }
  split_done(self, id);
  return rp;
}

}  // namespace troupe::actors::detail
