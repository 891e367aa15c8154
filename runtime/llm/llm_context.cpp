#include "runtime/llm/llm_context.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <cstring>
#include <string>

#include "runtime/error.h"
#include "runtime/graph.h"
#include "runtime/llm/graph.h"
#include "runtime/trace.h"

namespace troupe::llm {

namespace {

// Tensor slots one micro-batch's graph needs: about 40 a layer plus the inputs and the head.
size_t graph_tensors(const hparams& hp) { return static_cast<size_t>(hp.n_layer) * 48 + 64; }

troupe::context_params graph_ctx_params(const hparams& hp) {
  return troupe::context_params{.max_tensors = graph_tensors(hp), .no_alloc = true};
}

}  // namespace

struct llm_context::ubatch {
  std::unique_ptr<troupe::context> ctx;  // the graph's tensors
  std::unique_ptr<graph_builder> gb;
  std::unique_ptr<graph> g;
  tensor* logits = nullptr;
  std::vector<uint32_t> cells;
  std::vector<int32_t> pos, seq;
  size_t n_out = 0;      // rows of logits wanted
  size_t out_at = 0;     // where they go in logits_ (in rows)
  bool discard = false;  // no logits wanted: the graph's one row is dropped
  int64_t id = -1;       // the trace's micro-batch id
  int64_t group = -1;
};

llm_context::llm_context(const model& m, const context_params& p) : m_(m), params_(p) {
  if (params_.n_ctx == 0) params_.n_ctx = std::min<uint32_t>(m.hp().n_ctx_train, 4096);
  if (params_.n_ubatch == 0 || params_.n_batch == 0) throw error("llm context: n_batch and n_ubatch must be positive");
  params_.n_ubatch = std::min(params_.n_ubatch, params_.n_batch);
  kv_ = std::make_unique<kv_cache>(m, kv_cache_params{.n_ctx = params_.n_ctx, .type_k = params_.type_k,
                                                       .type_v = params_.type_v, .n_seq_max = params_.n_seq_max});
  params_.n_ctx = kv_->size();
  params_.n_ubatch = std::min(params_.n_ubatch, params_.n_ctx);
  cpu_ = cpu::make_cpu_backend({.n_threads = params_.n_threads});
  // Devices other than the host that hold weights (layers placed on a GPU or a remote peer) get a backend
  // each, ahead of the CPU in the scheduler's priority order.
  std::vector<sched_backend> backends;
  auto add_device = [&](buffer_type_i* bt) {
    if (bt == nullptr || bt->is_host()) return;
    device_i& dev = bt->device();
    for (const auto& be : device_backends_) {
      if (&be->device() == &dev) return;
    }
    device_backends_.push_back(dev.init_backend());
    backends.push_back({device_backends_.back().get(), nullptr});
  };
  for (const auto& l : m.layers()) add_device(l.buft);
  for (const auto& [bt, bytes] : m.weight_bytes()) add_device(bt);
  backends.push_back({cpu_.get(), nullptr});
  backend_list_ = backends;
  sched_ = std::make_unique<scheduler>(std::move(backends), graph_tensors(m.hp()) * 2);
  reserve(*sched_);
}

llm_context::~llm_context() = default;

void llm_context::set_n_threads(int n) { cpu_->set_n_threads(n); }

std::map<buffer_type_i*, size_t> llm_context::compute_bytes_by_buft() const {
  std::lock_guard lock(mem_mu_);
  std::map<buffer_type_i*, size_t> out;
  for (int b = 0; b < sched_->n_backends(); ++b) out[&sched_->buffer_type(b)] += sched_->compute_buffer_size(b);
  for (const auto& s : slots_) {
    for (int b = 0; b < s->n_backends(); ++b) out[&s->buffer_type(b)] += s->compute_buffer_size(b);
  }
  return out;
}

size_t llm_context::compute_bytes() const {
  std::lock_guard lock(mem_mu_);
  size_t n = 0;
  for (int b = 0; b < sched_->n_backends(); ++b) n += sched_->compute_buffer_size(b);
  for (const auto& s : slots_) {
    for (int b = 0; b < s->n_backends(); ++b) n += s->compute_buffer_size(b);
  }
  return n;
}

void llm_context::account(memory_ledger& ledger, int sign) const {
  auto key = [](buffer_type_i& bt) {
    return buffer_type_key{std::string(bt.name()), std::string(bt.device().name()), bt.is_host()};
  };
  for (const auto& [bt, bytes] : kv_->bytes_by_buft()) ledger.add(key(*bt), memory_kind::context, sign * static_cast<int64_t>(bytes));
  std::lock_guard lock(mem_mu_);
  for (int b = 0; b < sched_->n_backends(); ++b) {
    ledger.add(key(sched_->buffer_type(b)), memory_kind::compute, sign * static_cast<int64_t>(sched_->compute_buffer_size(b)));
  }
  for (const auto& s : slots_) {
    for (int b = 0; b < s->n_backends(); ++b) {
      ledger.add(key(s->buffer_type(b)), memory_kind::compute, sign * static_cast<int64_t>(s->compute_buffer_size(b)));
    }
  }
}

void llm_context::reserve(scheduler& s) {
  // The worst case: a full micro-batch attending to the whole cache, with the logits a decode asks for (one
  // row per sequence, unless told more): [n_vocab, n_ubatch] floats would be most of the compute memory
  // (96 MiB for a 49k vocabulary and 512 tokens, 512 MiB for 262k) for batches that output one row.
  const uint32_t rows = params_.n_outputs_reserved > 0 ? params_.n_outputs_reserved : std::max(1u, params_.n_seq_max);
  troupe::context ctx(graph_ctx_params(m_.hp()));
  graph_builder b(ctx, m_, *kv_, {.n_tokens = params_.n_ubatch, .n_kv = kv_->size(), .n_outputs = std::min(rows, params_.n_ubatch), .embeddings = params_.embeddings});
  tensor* logits = build_graph(b);
  graph g(graph_tensors(m_.hp()) * 2);
  g.build_forward_expand(logits);
  s.reserve(g);
}

std::span<const float> llm_context::logits(size_t i) const {
  if (i >= n_outputs_) {
    throw error("llm context: logits of output " + std::to_string(i) + " requested, the last decode produced " +
                std::to_string(n_outputs_));
  }
  const size_t n_vocab = row_width();
  return {logits_.data() + i * n_vocab, n_vocab};
}

void llm_context::validate(const batch& b, bool limit) const {
  const size_t n = b.size();
  if (n == 0) throw error("llm context: empty batch");
  if (b.pos.size() != n || b.seq.size() != n || b.logits.size() != n) {
    throw error("llm context: batch fields disagree in length");
  }
  if (limit && n > params_.n_batch) {
    throw error("llm context: batch of " + std::to_string(n) + " tokens exceeds n_batch " + std::to_string(params_.n_batch));
  }
  const uint32_t n_vocab = m_.hp().n_vocab;
  for (size_t i = 0; i < n; ++i) {
    if (b.tokens[i] < 0 || static_cast<uint32_t>(b.tokens[i]) >= n_vocab) {
      throw error("llm context: token id " + std::to_string(b.tokens[i]) + " at batch index " + std::to_string(i) +
                  " is outside the vocabulary (" + std::to_string(n_vocab) + " tokens)");
    }
    if (b.seq[i] < 0 || static_cast<uint32_t>(b.seq[i]) >= params_.n_seq_max) {
      throw error("llm context: sequence id " + std::to_string(b.seq[i]) + " at batch index " + std::to_string(i) +
                  " outside 0.." + std::to_string(params_.n_seq_max - 1));
    }
    if (b.pos[i] < 0) throw error("llm context: negative position at batch index " + std::to_string(i));
  }
  if (n > kv_->size() - kv_->used_cells()) {
    throw capacity_error("llm context: " + std::to_string(n) + " tokens do not fit the context (" +
                         std::to_string(kv_->used_cells()) + " of " + std::to_string(kv_->size()) + " cells in use)");
  }
}

void llm_context::decode(const batch& b) {
  const auto t0 = std::chrono::steady_clock::now();
  validate(b);
  const size_t n = b.size();
  const uint32_t n_vocab = row_width();
  logits_.assign(b.n_outputs() * n_vocab, 0.0f);
  n_outputs_ = 0;
  if (n > params_.n_ubatch && pipelines()) {
    decode_pipelined(b);
  } else {
    for (size_t begin = 0; begin < n; begin += params_.n_ubatch) {
      ubatch u;
      try {
        prepare(u, *sched_, b, begin, std::min(n, begin + params_.n_ubatch));
        u.out_at = n_outputs_;
        sched_->graph_compute(*u.g);
      } catch (...) {
        kv_->release(u.cells);  // the cache keeps the micro-batches that completed (found cells are free)
        sched_->reset();        // nothing may point into u's graph once it is gone
        throw;
      }
      n_outputs_ += u.discard ? 0 : u.n_out;
      finish(u, *sched_);
    }
  }
  stats_.n_tokens += n;
  stats_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}


// Builds and places micro-batch [begin, end) in scheduler s and sets its inputs; its cells are committed
// to the cache (the next micro-batch's mask sees them). Nothing is computed.
void llm_context::prepare(ubatch& u, scheduler& s, const batch& b, size_t begin, size_t end, int64_t group) {
  const hparams& hp = m_.hp();
  const auto n_tokens = static_cast<uint32_t>(end - begin);
  u.id = static_cast<int64_t>(next_ubatch_id_++);
  u.group = group;
  // The scheduler's track of the trace: building, placing and setting up each micro-batch's graph.
  trace::span placing("scheduler", "place", {{"ubatch", u.id}, {"group", group}, {"tokens", static_cast<int64_t>(n_tokens)}});
  u.pos.assign(b.pos.begin() + static_cast<std::ptrdiff_t>(begin), b.pos.begin() + static_cast<std::ptrdiff_t>(end));
  u.seq.assign(b.seq.begin() + static_cast<std::ptrdiff_t>(begin), b.seq.begin() + static_cast<std::ptrdiff_t>(end));
  std::vector<int32_t> out_ids;
  for (size_t i = begin; i < end; ++i) {
    if (b.logits[i]) out_ids.push_back(static_cast<int32_t>(i - begin));
  }
  // The graph always produces at least one row; a micro-batch without requested logits discards it.
  u.discard = out_ids.empty();
  if (u.discard) out_ids.push_back(static_cast<int32_t>(n_tokens - 1));
  u.n_out = out_ids.size();

  u.cells = kv_->find_slots(n_tokens);
  const uint32_t n_kv = kv_->n_kv(u.cells);

  u.ctx = std::make_unique<troupe::context>(graph_ctx_params(hp));
  u.gb = std::make_unique<graph_builder>(*u.ctx, m_, *kv_,
                                         graph_shape{.n_tokens = n_tokens, .n_kv = n_kv, .n_outputs = static_cast<uint32_t>(out_ids.size()), .embeddings = params_.embeddings});
  graph_builder& gb = *u.gb;
  u.logits = build_graph(gb);
  u.g = std::make_unique<graph>(graph_tensors(hp) * 2);
  u.g->build_forward_expand(u.logits);
  {
    std::lock_guard lock(mem_mu_);  // may grow the compute memory
    s.alloc_graph(*u.g);
  }
  s.set_trace_id(u.id, group);

  // Inputs.
  tensor_set(*gb.in.tokens, b.tokens.data() + begin, 0, n_tokens * sizeof(int32_t));
  tensor_set(*gb.in.pos, u.pos.data(), 0, n_tokens * sizeof(int32_t));
  std::vector<float> mask(static_cast<size_t>(n_kv) * n_tokens);
  kv_->fill_mask(mask.data(), n_kv, n_tokens, u.pos, u.seq, u.cells, 0);
  tensor_set(*gb.in.mask, mask.data(), 0, mask.size() * sizeof(float));
  if (gb.in.mask_swa != nullptr) {
    kv_->fill_mask(mask.data(), n_kv, n_tokens, u.pos, u.seq, u.cells, hp.n_swa);
    tensor_set(*gb.in.mask_swa, mask.data(), 0, mask.size() * sizeof(float));
  }
  std::vector<int64_t> k_idx(u.cells.begin(), u.cells.end());
  tensor_set(*gb.in.k_idx, k_idx.data(), 0, k_idx.size() * sizeof(int64_t));
  if (gb.in.v_idx != gb.in.k_idx) {
    const int64_t n_embd_v = hp.n_embd_v_gqa();
    std::vector<int64_t> v_idx(static_cast<size_t>(n_embd_v) * n_tokens);
    for (uint32_t t = 0; t < n_tokens; ++t) {
      for (int64_t d = 0; d < n_embd_v; ++d) v_idx[t * n_embd_v + d] = d * kv_->size() + u.cells[t];
    }
    tensor_set(*gb.in.v_idx, v_idx.data(), 0, v_idx.size() * sizeof(int64_t));
  }
  tensor_set(*gb.in.out_ids, out_ids.data(), 0, out_ids.size() * sizeof(int32_t));
  if (gb.in.attn_temp != nullptr) {
    std::vector<float> temp(n_tokens);
    for (uint32_t t = 0; t < n_tokens; ++t) temp[t] = hp.attn_temp(u.pos[t]);
    tensor_set(*gb.in.attn_temp, temp.data(), 0, temp.size() * sizeof(float));
  }
  kv_->commit(u.cells, u.pos, u.seq);
}

// After micro-batch u computed in s: its logits into dst (rows of n_vocab; null: logits_ at u.out_at), s
// ready for the next graph.
void llm_context::finish(ubatch& u, scheduler& s, float* dst) {
  trace::span finishing("scheduler", "finish", {{"ubatch", u.id}, {"group", u.group}});
  if (!u.discard) {
    const size_t n_vocab = row_width();
    if (dst == nullptr) dst = logits_.data() + u.out_at * n_vocab;
    tensor_get(*u.logits, dst, 0, u.n_out * n_vocab * sizeof(float));
  }
  stats_.n_graphs += 1;
  s.reset();
  u = ubatch{};
}

bool llm_context::pipelines() const { return params_.n_pipeline > 1 && sched_->n_backends() > 1; }

// The pipeline. Item k (the k-th micro-batch placed, counting from the context's first job) uses pipeline
// slot k % n_slots (slot 0 is sched_): it is placed only once item k - n_slots has been finished. Split j of
// item k runs once split j - 1 of k and split j of item k - 1 have completed (so every device runs its splits
// in placement order and each layer's cache writes happen in that order); an item whose splits fall on other
// backends than the one before's waits for that one to complete. Under mu: everything but the ubatches,
// which only the coordinator touches (a worker reads an item's split counts, never its graph).
struct llm_context::pipeline {
  struct job_state {
    std::function<void()> start;
    batch b;
    job_done done;
    int64_t group = -1;
    std::vector<float> logits;
    size_t items_left = 0;  // micro-batches not finished
  };
  struct flight {
    std::shared_ptr<job_state> job;
    size_t out_at = 0;  // its first logits row in the job's
    ubatch u;
    bool running = false;
    int done = 0;                    // splits completed
    std::vector<int> split_backend;  // per split
    bool complete() const { return done >= static_cast<int>(split_backend.size()); }
  };

  llm_context& c;
  size_t n_slots = 1;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::shared_ptr<job_state>> jobs;  // submitted, not started
  std::deque<flight> fl;                        // placed and not finished: item k is fl[k - finished]
  uint64_t finished = 0;
  uint64_t failed = UINT64_MAX;  // the first item that failed; the ones before it still complete
  std::exception_ptr failure;
  bool stop = false, workers_stop = false;
  // The coordinator's: the started job whose micro-batches are being placed, and where it is.
  std::shared_ptr<job_state> cur;
  size_t cur_begin = 0, cur_out = 0;
  std::thread coordinator;
  std::vector<std::thread> workers;
  std::vector<int> wake_fds;  // per backend: the eventfd its queue's worker also waits on (-1: none)

  explicit pipeline(llm_context& ctx) : c(ctx) {
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

  ~pipeline() {
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
  void notify() {
    cv.notify_all();
    for (int fd : wake_fds) {
      if (fd < 0) continue;
      const uint64_t one = 1;
      [[maybe_unused]] const auto n = ::write(fd, &one, sizeof one);
    }
  }

  uint64_t n_placed() const { return finished + fl.size(); }
  scheduler& sched_of(uint64_t k) { return c.slot(static_cast<size_t>(k % n_slots)); }
  flight& at(uint64_t k) { return fl[static_cast<size_t>(k - finished)]; }

  void submit(std::shared_ptr<job_state> j) {
    {
      std::lock_guard lock(mu);
      jobs.push_back(std::move(j));
    }
    notify();
  }

  // With queued: item k - 1 having its split on the same queue (submitted, running) is enough, the device
  // runs what it is sent in order.
  bool runnable(uint64_t k, bool queued = false) {
    flight& f = at(k);
    if (f.running || f.complete()) return false;
    if (k == finished) return true;
    const flight& p = at(k - 1);
    if (p.split_backend != f.split_backend) return p.complete();
    return p.done > f.done || (queued && p.done == f.done && p.running);
  }

  // The record of an error of item k (the first one wins: the items before it still complete).
  void fail_at(uint64_t k, std::exception_ptr err) {
    if (k < failed) {
      failed = k;
      failure = std::move(err);
    }
  }

  // The worker of a backend that queues graphs (a remote peer): a split's inputs and graph go out as soon as
  // the split before it has completed, while the device still runs the earlier item's split (up to
  // max_queued submitted), so the transfer hides behind that compute; then its finish is awaited, and any
  // split that became ready meanwhile (wake_fds) goes out before waiting on.
  static constexpr size_t max_queued = 2;
  void work_queued(int be) {
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

  void work(int be) {
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

  static void call(const std::shared_ptr<job_state>& j, std::vector<float> logits, std::exception_ptr err) {
    if (!j->done) return;
    try {
      j->done(std::move(logits), err);
    } catch (...) {  // a callback's own failure is its caller's business; the pipeline carries on
    }
  }

  void coordinate() {
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

  void start_job(std::unique_lock<std::mutex>& lock, std::shared_ptr<job_state> j) {
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

  void place_next(std::unique_lock<std::mutex>& lock) {
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

  void finish_front(std::unique_lock<std::mutex>& lock) {
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
  void fail_rest(std::unique_lock<std::mutex>& lock) {
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
};

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
