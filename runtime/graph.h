// A compute graph: the nodes needed for some outputs, in an order where every source comes first.
//
//   graph g(2048);                  // node capacity
//   g.build_forward_expand(logits); // adds logits and everything it depends on
//   backend.graph_compute(g);       // nodes() in order; leafs() are the inputs and weights
//
// Nodes are tensors with an op (views included); leafs are tensors without one (op::none).
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "runtime/pointer_map.h"
#include "runtime/tensor.h"

namespace troupe {

class graph {
 public:
  explicit graph(size_t capacity = default_capacity);

  // Adds t and its not-yet-visited ancestors, sources before users. Throws capacity_error when the graph
  // would hold more nodes + leafs than its capacity; the graph is then left as it was.
  void build_forward_expand(tensor* t);

  // Appends t as the next node (or leaf, for op::none) without visiting its sources: for graphs whose order
  // is already known (the scheduler's splits). Throws capacity_error when full.
  void append(tensor* t);

  std::span<tensor* const> nodes() const { return nodes_; }
  std::span<tensor* const> leafs() const { return leafs_; }
  size_t n_nodes() const { return nodes_.size(); }
  size_t n_leafs() const { return leafs_.size(); }
  tensor* node(size_t i) const { return nodes_[i]; }

  static constexpr size_t default_capacity = 2048;

 private:
  size_t capacity_;
  std::vector<tensor*> nodes_;
  std::vector<tensor*> leafs_;
  pointer_map<const tensor*, bool> visited_;
};

}  // namespace troupe
