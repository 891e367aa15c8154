// The backend scheduler: runs one graph over several backends.
//
//   scheduler sched({{gpu_backend}, {cpu_backend}});   // priority order; the last one is the host (CPU)
//   sched.reserve(worst_case_graph);                  // splits it and reserves compute memory per backend
//   for (each batch) {
//     graph g = build(batch);
//     sched.alloc_graph(g);                           // assign, split, copy-in planning, allocation
//     tensor_set(*inp_tokens, ...);                   // inputs can be set once allocated
//     sched.graph_compute(g);
//   }
//
// Assignment, per node: a user pin wins; else the backend holding a weight the node reads, if it supports
// the op; else its neighbours' backend (non-host backends spread first, then the host), if it supports the
// op; else the first backend that supports it. Views go where their source's memory is. Inputs without
// memory go to the host (last) backend.
//
// Contiguous runs of nodes on one backend form splits. A source a split reads from another backend's
// compute memory, or from a buffer its backend cannot use, is copied into a tensor of the split's backend
// first (the node's source pointer is redirected to the copy; alloc_graph restores the originals before it
// re-splits, so a graph may be allocated again). Compute memory of every backend comes from one
// graph_allocator over their buffer types (chunked, see graph_allocator.h).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

#include "runtime/backend.h"
#include "runtime/context.h"
#include "runtime/graph.h"
#include "runtime/graph_allocator.h"
#include "runtime/pointer_map.h"

namespace troupe {

struct sched_backend {
  backend_i* backend = nullptr;
  buffer_type_i* buft = nullptr;  // compute memory; null: the backend's device's default buffer type
};

class scheduler {
 public:
  struct split {
    int backend = -1;
    std::vector<tensor*> nodes;
    std::vector<std::pair<tensor*, tensor*>> inputs;  // (source elsewhere, copy on this backend)
  };

  explicit scheduler(std::vector<sched_backend> backends, size_t graph_capacity = 8192);
  ~scheduler();
  scheduler(const scheduler&) = delete;
  scheduler& operator=(const scheduler&) = delete;

  int n_backends() const { return static_cast<int>(backends_.size()); }
  backend_i& backend(int i) const { return *backends_[static_cast<size_t>(i)].backend; }
  buffer_type_i& buffer_type(int i) const { return *backends_[static_cast<size_t>(i)].buft; }

  // Pins t to backend i for the next alloc_graph (cleared by reset()).
  void set_tensor_backend(const tensor* t, int i);
  // The backend of t after alloc_graph, or -1.
  int tensor_backend(const tensor* t) const;

  // Splits g and makes every backend's compute memory large enough for it (no tensor placed).
  void reserve(graph& g);
  // Assigns, splits and places g (inputs included). Grows compute memory when g needs more than reserved.
  void alloc_graph(graph& g);
  // Runs the splits of the last alloc_graph in order, copying split inputs in first. g must be the graph
  // given to alloc_graph. When a backend throws, g's sources are restored and its splits forgotten before
  // the exception leaves (the caller may destroy g while unwinding); computing g again allocates it again.
  // alloc_graph and reserve do the same when they throw.
  void graph_compute(graph& g);
  // Forgets pins and restores the sources of the last graph.
  void reset();

  // Who runs each split in graph_compute. The runner gets the split's index, the split and the work (copy
  // the split's inputs in, compute its nodes, synchronize its backend) and must have run the work, or
  // thrown, when it returns; it may run the work on another thread (the actor layer hands it to the
  // thread of the device actor that owns the split's device). Splits still run one after another, in
  // order. Empty (the default): graph_compute runs them on the calling thread.
  using split_runner = std::function<void(int index, const split& sp, const std::function<void()>& work)>;
  void set_split_runner(split_runner runner) { runner_ = std::move(runner); }
  const split_runner& runner() const { return runner_; }
  // Runs split i as graph_compute would, through the split runner when one is set, for callers that run the
  // splits of several graphs at once (llm_context's pipeline) and have seen the splits before it complete.
  // queue: for a backend that queues graphs, the work ends once the split's inputs and graph are on their way
  // (the caller finishes it with the backend's finish_oldest, then trace_finished(i, since): its span on the device's track).
  void dispatch_split(int i, bool queue = false);
  void trace_finished(int i, std::chrono::steady_clock::time_point since) const;
  // The micro-batch id (and sequence group, -1: none) the trace's split spans carry (runtime/trace.h;
  // llm_context sets them per graph).
  void set_trace_id(int64_t id, int64_t group = -1) {
    trace_id_ = id;
    trace_group_ = group;
  }

  const std::vector<split>& splits() const { return splits_; }
  // What the last graph computed ran where, kept after reset() (which forgets the splits): per split, its
  // backend and the ops of its nodes that compute (views excluded), in order.
  struct split_record {
    int backend = -1;
    std::vector<op> ops;
  };
  const std::vector<split_record>& last_run() const { return last_run_; }
  int n_splits() const { return static_cast<int>(splits_.size()); }
  int n_copies() const;
  // Bytes of compute memory reserved for backend i.
  size_t compute_buffer_size(int i) const;
  const graph_allocator& allocator() const { return *galloc_; }

 private:
  void restore_sources();
  void record_run();
  // Drops the last graph's state (its nodes' sources restored, splits forgotten) after a failure.
  void forget_graph();
  // Copies sp's inputs in (first synchronizing the backends they come from, with sync_sources) and computes
  // its nodes, or submits them (submit: graph_submit).
  void run_split(const split& sp, bool sync_sources = true, bool submit = false);
  void run_and_synchronize(const split& sp);  // run_split, then its backend's synchronize
  void run_through_runner(int i);              // split i's run_and_synchronize handed to runner_
  // Split i of the allocated graph; throws error naming `who` without one, or for i out of range.
  const split& split_at(int i, const char* who) const;
  void assign(const graph& g);
  // Memory that exists outside this scheduler's compute buffers (weights, caches, caller-placed inputs).
  bool is_external(const tensor& t) const;
  int backend_of_buffer(const tensor& t) const;
  bool supports(int b, const tensor& t) const;
  void build_splits(graph& g);
  void plan(graph& g, bool place);

  std::vector<sched_backend> backends_;
  std::vector<split_record> last_run_;
  size_t graph_capacity_;
  std::unique_ptr<graph_allocator> galloc_;
  pointer_map<const tensor*, int> pins_;
  pointer_map<const tensor*, int> assigned_;
  std::vector<split> splits_;
  std::unique_ptr<context> copies_ctx_;                       // copy tensors of the current splits
  std::vector<std::pair<tensor*, std::array<tensor*, max_src>>> original_srcs_;
  const graph* current_ = nullptr;
  split_runner runner_;
  int64_t trace_id_ = 0;
  int64_t trace_group_ = -1;
};

}  // namespace troupe
