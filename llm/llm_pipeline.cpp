// The micro-batch pipeline of llm_context (struct llm_context::pipeline, declared in
// llm/detail/llm_pipeline.h): a coordinator thread that starts jobs and places, finishes or fails their
// micro-batches, and a worker thread per backend that runs their splits in order (a backend that queues
// graphs keeps up to max_queued splits submitted); with the context's entry points that go through it:
// submit(), the pipelined decode() and decode_ring().
//
// Separate from llm_context.cpp, which builds, places and finishes one micro-batch (prepare, finish) and
// decodes without threads: this file is the scheduling across threads and pipeline slots on top of that.
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

#include "llm/detail/llm_pipeline.h"
#include "llm/llm_context.h"
#include "runtime/error.h"

namespace troupe::llm {

using detail::graph_tensors;

llm_context::pipeline::pipeline(llm_context& ctx) : c(ctx) {
  n_slots = c.pipelines() ? c.params_.n_pipeline : 1;
  {
    std::lock_guard lock(c.mem_mu_);
    while (c.slots_.size() + 1 < n_slots) {
      c.slots_.push_back(std::make_unique<scheduler>(c.backend_list_, graph_tensors(c.m_.hp()) * 2));
      c.reserve(*c.slots_.back());
    }
  }
  for (auto& s : c.slots_) s->set_split_runner(c.sched_->runner());  // the actor layer's device threads
  wake_fds.assign(static_cast<size_t>(c.sched_->n_backends()), -1);
  for (int be = 0; be < c.sched_->n_backends(); ++be) {
    if (n_slots > 1 && c.sched_->backend(be).queues_graphs()) {
      wake_fds[static_cast<size_t>(be)] = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    }
    if (wake_fds[static_cast<size_t>(be)] >= 0) {
      workers.emplace_back([this, be] { work_queued(be); });
    } else {
      workers.emplace_back([this, be] { work(be); });
    }
  }
  coordinator = std::thread([this] { coordinate(); });
}

llm_context::pipeline::~pipeline() {
  {
    std::lock_guard lock(mu);
    stop = true;
  }
  notify();
  coordinator.join();
  {
    std::lock_guard lock(mu);
    workers_stop = true;
  }
  notify();
  for (std::thread& t : workers) t.join();
  for (int fd : wake_fds) {
    if (fd >= 0) ::close(fd);
  }
}

// Wakes the workers: those waiting on the pipeline's state, and those waiting on their device's queue.
void llm_context::pipeline::notify() {
  cv.notify_all();
  for (int fd : wake_fds) {
    if (fd < 0) continue;
    const uint64_t one = 1;
    [[maybe_unused]] const auto n = ::write(fd, &one, sizeof one);
  }
}

void llm_context::pipeline::submit(std::shared_ptr<job_state> j) {
  {
    std::lock_guard lock(mu);
    jobs.push_back(std::move(j));
  }
  notify();
}

// With queued: item k - 1 having its split on the same queue (submitted, running) is enough, the device
// runs what it is sent in order.
bool llm_context::pipeline::runnable(uint64_t k, bool queued) {
  flight& f = at(k);
  if (f.running || f.complete()) return false;
  if (k == finished) return true;
  const flight& p = at(k - 1);
  if (p.split_backend != f.split_backend) return p.complete();
  return p.done > f.done || (queued && p.done == f.done && p.running);
}

// The record of an error of item k (the first one wins: the items before it still complete).
void llm_context::pipeline::fail_at(uint64_t k, std::exception_ptr err) {
  if (k < failed) {
    failed = k;
    failure = std::move(err);
  }
}

// The worker of a backend that queues graphs (a remote peer): a split's inputs and graph go out as soon as
// the split before it has completed, while the device still runs the earlier item's split (up to
// max_queued submitted), so the transfer hides behind that compute; then its finish is awaited, and any
// split that became ready meanwhile (wake_fds) goes out before waiting on.
void llm_context::pipeline::work_queued(int be) {
  backend_i& device = c.sched_->backend(be);
  const int wake = wake_fds[static_cast<size_t>(be)];
  struct sent_split {
    uint64_t item;
    int split;
    std::chrono::steady_clock::time_point at;
  };
  std::deque<sent_split> sent;
  std::chrono::steady_clock::time_point last_finish{};  // the device starts a split once it is sent and the one before finished
  std::unique_lock lock(mu);
  for (;;) {
    uint64_t pick = UINT64_MAX;
    for (uint64_t k = finished; sent.size() < max_queued && k < n_placed() && k < failed && pick == UINT64_MAX; ++k) {
      if (runnable(k, true) && at(k).split_backend[static_cast<size_t>(at(k).done)] == be) pick = k;
    }
    if (pick != UINT64_MAX) {
      at(pick).running = true;
      const int split = at(pick).done;
      scheduler& s = sched_of(pick);
      lock.unlock();
      const auto t0 = std::chrono::steady_clock::now();
      std::exception_ptr err;
      try {
        s.dispatch_split(split, true);
      } catch (...) {
        err = std::current_exception();
      }
      lock.lock();
      if (err) {
        at(pick).running = false;
        fail_at(pick, err);
        notify();
      } else {
        sent.push_back({pick, split, t0});
      }
      continue;
    }
    if (!sent.empty()) {
      const sent_split oldest = sent.front();
      uint64_t drained = 0;  // wakes before now are of states this scan saw
      [[maybe_unused]] const auto n = ::read(wake, &drained, sizeof drained);
      lock.unlock();
      bool done = true;
      std::exception_ptr err;
      try {
        done = device.finish_oldest(std::chrono::milliseconds(100), wake);
        if (done) {
          sched_of(oldest.item).trace_finished(oldest.split, std::max(oldest.at, last_finish));
          last_finish = std::chrono::steady_clock::now();
        }
      } catch (...) {
        err = std::current_exception();
      }
      lock.lock();
      if (!done) continue;
      sent.pop_front();
      at(oldest.item).running = false;
      if (err) {
        fail_at(oldest.item, err);
      } else {
        ++at(oldest.item).done;
      }
      notify();
      continue;
    }
    if (workers_stop) return;
    cv.wait(lock);
  }
}

void llm_context::pipeline::work(int be) {
  std::unique_lock lock(mu);
  for (;;) {
    uint64_t pick = UINT64_MAX;
    for (uint64_t k = finished; k < n_placed() && k < failed && pick == UINT64_MAX; ++k) {
      if (runnable(k) && at(k).split_backend[static_cast<size_t>(at(k).done)] == be) pick = k;
    }
    if (pick == UINT64_MAX) {
      if (workers_stop) return;
      cv.wait(lock);
      continue;
    }
    at(pick).running = true;
    const int split = at(pick).done;
    scheduler& s = sched_of(pick);
    lock.unlock();
    std::exception_ptr err;
    try {
      s.dispatch_split(split);
    } catch (...) {
      err = std::current_exception();
    }
    lock.lock();
    at(pick).running = false;
    if (err) {
      fail_at(pick, err);
    } else {
      ++at(pick).done;
    }
    notify();
  }
}

void llm_context::pipeline::call(const std::shared_ptr<job_state>& j, std::vector<float> logits,
                                 std::exception_ptr err) {
  if (!j->done) return;
  try {
    j->done(std::move(logits), err);
  } catch (...) {  // a callback's own failure is its caller's business; the pipeline carries on
  }
}

void llm_context::pipeline::coordinate() {
  std::unique_lock lock(mu);
  for (;;) {
    if (failure) {
      bool settled = finished >= failed;  // the items before the failed one are finished
      for (const flight& f : fl) settled = settled && !f.running;
      if (settled) {
        fail_rest(lock);
        continue;
      }
    }
    if (!fl.empty() && finished < failed && fl.front().complete()) {
      finish_front(lock);
      continue;
    }
    if (!failure && fl.size() < n_slots) {
      if (cur) {
        place_next(lock);
        continue;
      }
      if (!jobs.empty()) {
        std::shared_ptr<job_state> j = std::move(jobs.front());
        jobs.pop_front();
        if (stop) {  // the context is going: jobs that have not started fail
          lock.unlock();
          call(j, {}, std::make_exception_ptr(error("llm context: destroyed before the job started")));
          lock.lock();
        } else {
          start_job(lock, std::move(j));
        }
        continue;
      }
    }
    if (stop && jobs.empty() && fl.empty() && !cur) return;
    cv.wait(lock);
  }
}

void llm_context::pipeline::start_job(std::unique_lock<std::mutex>& lock, std::shared_ptr<job_state> j) {
  lock.unlock();
  std::exception_ptr err;
  try {
    if (j->start) j->start();
    if (j->b.size() > 0) c.validate(j->b, false);
  } catch (...) {
    err = std::current_exception();
  }
  if (err || j->b.size() == 0) {
    call(j, {}, err);
    lock.lock();
    return;
  }
  j->logits.assign(j->b.n_outputs() * c.row_width(), 0.0f);
  j->items_left = (j->b.size() + c.params_.n_ubatch - 1) / c.params_.n_ubatch;
  lock.lock();
  cur = std::move(j);
  cur_begin = 0;
  cur_out = 0;
}

void llm_context::pipeline::place_next(std::unique_lock<std::mutex>& lock) {
  const uint64_t k = n_placed();
  scheduler& s = sched_of(k);
  const size_t end = std::min(cur->b.size(), cur_begin + c.params_.n_ubatch);
  lock.unlock();
  ubatch u;
  std::exception_ptr err;
  try {
    c.prepare(u, s, cur->b, cur_begin, end, cur->group);
  } catch (...) {
    err = std::current_exception();
    if (!u.cells.empty()) c.kv_->release(u.cells);
    s.reset();  // nothing may point into u's graph once it is gone
  }
  lock.lock();
  if (err) {  // nothing from this one on starts
    fail_at(k, err);
    return;
  }
  flight f;
  f.job = cur;
  f.out_at = cur_out;
  f.u = std::move(u);
  for (const scheduler::split& sp : s.splits()) f.split_backend.push_back(sp.backend);
  fl.push_back(std::move(f));
  cur_out += cur->b.n_outputs(cur_begin, end);
  cur_begin = end;
  if (cur_begin >= cur->b.size()) cur.reset();
  notify();
}

void llm_context::pipeline::finish_front(std::unique_lock<std::mutex>& lock) {
  flight& f = fl.front();
  const uint64_t k = finished;
  std::shared_ptr<job_state> j = f.job;
  lock.unlock();
  std::exception_ptr err;
  try {
    c.finish(f.u, sched_of(k), j->logits.data() + f.out_at * c.row_width());
  } catch (...) {
    err = std::current_exception();
  }
  lock.lock();
  if (err) {
    f.done = -1;  // not kept: failed with the rest
    fail_at(k, err);
    return;
  }
  fl.pop_front();
  ++finished;
  if (--j->items_left == 0 && j != cur) {
    lock.unlock();
    call(j, std::move(j->logits), nullptr);
    lock.lock();
  }
}

// After a failure, once the items before the failed one are finished and none is running: the others
// give their cells back (the cache keeps what completed), every slot they used forgets its graph, and
// their jobs (and the one being placed) fail with the error. The pipeline is empty again after.
void llm_context::pipeline::fail_rest(std::unique_lock<std::mutex>& lock) {
  std::vector<std::shared_ptr<job_state>> failed_jobs;
  auto add = [&](const std::shared_ptr<job_state>& j) {
    if (j && std::find(failed_jobs.begin(), failed_jobs.end(), j) == failed_jobs.end()) failed_jobs.push_back(j);
  };
  for (uint64_t k = finished; k < n_placed(); ++k) {
    flight& f = at(k);
    if (!f.u.cells.empty()) c.kv_->release(f.u.cells);
    sched_of(k).reset();
    f.u = ubatch{};
    add(f.job);
  }
  add(cur);
  cur.reset();
  finished = n_placed();
  fl.clear();
  const std::exception_ptr err = failure;
  failure = nullptr;
  failed = UINT64_MAX;
  lock.unlock();
  for (const auto& j : failed_jobs) call(j, {}, err);
  lock.lock();
}

llm_context::pipeline& llm_context::pipe() {
  if (!pipe_) pipe_ = std::make_unique<pipeline>(*this);
  return *pipe_;
}

scheduler& llm_context::slot(size_t i) { return i == 0 ? *sched_ : *slots_[i - 1]; }

size_t llm_context::n_pipeline_slots() const {
  std::lock_guard lock(mem_mu_);
  return slots_.size();
}

void llm_context::submit(std::function<void()> start, batch b, job_done done, int64_t group) {
  auto j = std::make_shared<pipeline::job_state>();
  j->start = std::move(start);
  j->b = std::move(b);
  j->done = std::move(done);
  j->group = group;
  pipe().submit(std::move(j));
}

namespace {

// One job's outcome, waited for on the calling thread.
struct job_wait {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::vector<float> logits;
  std::exception_ptr error;

  llm_context::job_done callback() {
    return [this](std::vector<float> l, std::exception_ptr e) {
      std::lock_guard lock(mu);
      logits = std::move(l);
      error = e;
      done = true;
      cv.notify_all();
    };
  }
  void wait() {
    std::unique_lock lock(mu);
    cv.wait(lock, [this] { return done; });
    if (error) std::rethrow_exception(error);
  }
};

}  // namespace

void llm_context::decode_pipelined(const batch& b) {
  job_wait w;
  submit({}, b, w.callback());
  stats_.n_pipelined += 1;
  w.wait();
  logits_ = std::move(w.logits);
  n_outputs_ = b.n_outputs();
}

void llm_context::decode_ring(std::vector<batch> first, const ring_step& next) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<batch> cur = std::move(first);
  const size_t n_vocab = row_width();
  n_outputs_ = 0;
  if (!pipelines() || cur.size() < 2) {  // one after another (decode checks each step)
    for (bool any = true; any;) {
      any = false;
      for (size_t g = 0; g < cur.size(); ++g) {
        if (cur[g].size() == 0) continue;
        decode(cur[g]);
        batch nb;
        const std::span<const float> l(logits_.data(), n_outputs_ * n_vocab);
        cur[g] = next(g, l, nb) ? std::move(nb) : batch{};
        any = any || cur[g].size() > 0;
      }
    }
    return;
  }
  // Each group's step is a job; its completion (on the pipeline's coordinator) asks for the next.
  std::mutex mu;
  std::condition_variable cv;
  size_t active = 0;
  std::exception_ptr failure;
  std::function<void(size_t)> launch = [&](size_t g) {
    {
      std::lock_guard lock(mu);
      ++active;
    }
    submit({}, cur[g], [&, g](std::vector<float> l, std::exception_ptr e) {
      bool again = false;
      if (!e) {
        try {
          stats_.n_tokens += cur[g].size();
          batch nb;
          {
            std::lock_guard lock(mu);
            again = !failure;
          }
          again = again && next(g, l, nb) && nb.size() > 0;
          if (again) cur[g] = std::move(nb);
        } catch (...) {
          e = std::current_exception();
          again = false;
        }
      }
      if (again) launch(g);
      std::lock_guard lock(mu);
      if (e && !failure) failure = e;
      --active;
      cv.notify_all();
    }, static_cast<int64_t>(g));
  };
  stats_.n_pipelined += 1;
  for (size_t g = 0; g < cur.size(); ++g) {
    if (cur[g].size() > 0) launch(g);
  }
  {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return active == 0; });
  }
  stats_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (failure) std::rethrow_exception(failure);
}

}  // namespace troupe::llm
