// The graph allocator: plans and places the compute memory of a graph over one or more buffer types.
//
//   graph_allocator galloc({&cpu.buffer_type()});
//   galloc.reserve(worst_case_graph);     // measure once; allocates each chunk's buffer
//   for (each batch) {
//     graph g = build(batch);
//     galloc.alloc_graph(g);              // places every node; grows buffers only if g needs more
//     backend.graph_compute(g);
//   }
//
// Every node gets memory when first needed and gives it back after its last consumer. Ops that allow it
// (add, sub, mul, div, scale, silu, gelu, rope, rms_norm, soft_max: can_inplace() in graph_allocator.cpp;
// of the norms only rms_norm) reuse a parent's memory in place when that parent has no
// other pending consumer, is not a graph output and has no live views (the node then uses the parent's
// placement, as ggml does: see allocate()). Views
// take no memory. Tensors that already have memory elsewhere (weights, caller-placed inputs) are left alone.
// Graph outputs are never freed during planning, so their memory survives until the next alloc_graph.
//
// Memory of one buffer type is a virtual buffer of up to 16 chunks planned by dyn_allocator; each chunk
// becomes one real buffer of the type, so no single allocation exceeds the type's max_size except for a
// tensor that is itself larger (a chunk of its own) or the 16th chunk, which may grow: the buffer type then
// either allocates it or throws backend_error naming the type and size.
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

#include "runtime/backend.h"
#include "runtime/dyn_allocator.h"
#include "runtime/graph.h"
#include "runtime/pointer_map.h"

namespace troupe {

class graph_allocator {
 public:
  // Which buffer type (an index into the list given to the constructor) holds a tensor's memory.
  using assign_fn = std::function<int(const tensor&)>;

  explicit graph_allocator(std::vector<buffer_type_i*> bufts);
  ~graph_allocator();
  graph_allocator(const graph_allocator&) = delete;
  graph_allocator& operator=(const graph_allocator&) = delete;

  // Default: every tensor in buffer type 0.
  void set_assignment(assign_fn f) { assign_ = std::move(f); }

  // Plans g and makes every buffer at least as large as g needs (g's tensors are not placed).
  void reserve(const graph& g);
  // Plans g and places its tensors; grows (re-allocates) the buffers of a buffer type when g needs more
  // than they have. Returns true when any buffer was allocated.
  bool alloc_graph(graph& g);

  size_t n_bufts() const { return bufts_.size(); }
  buffer_type_i& buft(int id) const { return *bufts_[static_cast<size_t>(id)]; }
  // Bytes of all chunk buffers of a buffer type (0 for a buffer type listed again: an entry repeating an
  // earlier one's shares its planner and chunks, counted at the first).
  size_t buffer_size(int buft_id) const;
  int n_chunks(int buft_id) const;
  buffer_i* chunk_buffer(int buft_id, int chunk) const;
  // How many times buffers were (re)allocated, over the allocator's life.
  size_t n_reallocations() const { return n_reallocations_; }
  // Whether this allocator placed t (t lives in one of its chunk buffers).
  bool owns(const tensor& t) const;

  // The plan of the last reserve/alloc_graph, for tests: where each tensor went.
  struct placement {
    int buft_id = -1;
    dyn_allocator::address addr;
    size_t size = 0;
  };
  const pointer_map<const tensor*, placement>& last_plan() const { return plan_; }

 private:
  struct node_state {
    int n_children = 0;
    int n_views = 0;
    bool allocated = false;  // planned by us (or in place over a parent)
    placement where;
  };

  void plan(const graph& g);
  void allocate(tensor& t, int buft_id);
  void release(tensor& t);
  void take_over(const tensor& t, node_state& s, node_state& owner);
  bool is_external(const tensor& t) const;
  int buft_of(const tensor& t) const;
  bool ensure_buffers();
  void place(graph& g);

  std::vector<buffer_type_i*> bufts_;
  std::vector<size_t> slot_;  // per entry: the first entry of the same buffer type (its planner and chunks)
  std::vector<dyn_allocator> dyn_;
  std::vector<std::vector<buffer_ptr>> buffers_;  // [buft][chunk]
  assign_fn assign_;
  pointer_map<const tensor*, node_state> state_;  // reserved for the graph's tensors: references stay valid
  pointer_map<const tensor*, placement> plan_;
  pointer_map<const tensor*, const buffer_i*> placed_;  // what the last alloc_graph placed, and where
  size_t n_reallocations_ = 0;
};

}  // namespace troupe
