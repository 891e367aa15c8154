// llm_context's private types, shared by llm_context.cpp (the context: building, placing and finishing
// micro-batches) and llm_pipeline.cpp (the pipeline that runs them in flight over several backends): a
// micro-batch (ubatch) and the pipeline's state. The pipeline's member functions are in llm_pipeline.cpp; its
// type is complete here because llm_context's constructor and destructor (llm_context.cpp) destroy the
// unique_ptr holding it. Not part of the public API.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "llm/graph.h"
#include "llm/llm_context.h"
#include "runtime/graph.h"

namespace troupe::llm {

namespace detail {

// Tensor slots one micro-batch's graph needs: about 40 a layer plus the inputs and the head.
inline size_t graph_tensors(const hparams& hp) { return static_cast<size_t>(hp.n_layer) * 48 + 64; }

}  // namespace detail

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

  // Defined in llm_pipeline.cpp, but for the one-line accessors below.
  explicit pipeline(llm_context& ctx);
  ~pipeline();
  void notify();

  uint64_t n_placed() const { return finished + fl.size(); }
  scheduler& sched_of(uint64_t k) { return c.slot(static_cast<size_t>(k % n_slots)); }
  flight& at(uint64_t k) { return fl[static_cast<size_t>(k - finished)]; }

  void submit(std::shared_ptr<job_state> j);
  bool runnable(uint64_t k, bool queued = false);
  void fail_at(uint64_t k, std::exception_ptr err);
  static constexpr size_t max_queued = 2;  // splits a queued worker keeps submitted (work_queued)
  void work_queued(int be);
  void work(int be);
  static void call(const std::shared_ptr<job_state>& j, std::vector<float> logits, std::exception_ptr err);
  void coordinate();
  void start_job(std::unique_lock<std::mutex>& lock, std::shared_ptr<job_state> j);
  void place_next(std::unique_lock<std::mutex>& lock);
  void finish_front(std::unique_lock<std::mutex>& lock);
  void fail_rest(std::unique_lock<std::mutex>& lock);
};

}  // namespace troupe::llm
