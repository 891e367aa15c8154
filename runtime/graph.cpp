#include "runtime/graph.h"

#include <algorithm>
#include <string>
#include <utility>

#include "runtime/error.h"

namespace troupe {

graph::graph(size_t capacity) : capacity_(capacity) {
  nodes_.reserve(capacity);
  visited_.reserve(std::min<size_t>(capacity, 4096));
}

void graph::append(tensor* t) {
  if (t == nullptr || visited_.count(t)) return;
  if (nodes_.size() + leafs_.size() >= capacity_) {
    throw capacity_error("graph: more than " + std::to_string(capacity_) + " tensors; while appending " + describe(*t));
  }
  visited_[t] = true;
  (t->op == op::none ? leafs_ : nodes_).push_back(t);
}

void graph::build_forward_expand(tensor* root) {
  if (root == nullptr || visited_.count(root)) return;
  // Iterative post-order depth-first walk: deep graphs (hundreds of layers) must not overflow the stack.
  // Each stack entry is (tensor, index of the next source to visit).
  std::vector<std::pair<tensor*, int>> stack;
  std::vector<const tensor*> added;  // visited by this call: forgotten again if it fails
  auto visit = [&](tensor* t) {
    visited_[t] = true;
    added.push_back(t);
    stack.emplace_back(t, 0);
  };
  const size_t n_nodes_before = nodes_.size();
  const size_t n_leafs_before = leafs_.size();
  visit(root);
  while (!stack.empty()) {
    auto& [t, next] = stack.back();
    if (next < max_src) {
      tensor* s = t->src[static_cast<size_t>(next++)];
      if (s != nullptr && !visited_.count(s)) visit(s);
      continue;
    }
    // A view's data belongs to its view_src, which must be placed before it.
    if (t->view_src != nullptr && !visited_.count(t->view_src)) {
      visit(t->view_src);
      continue;
    }
    if (nodes_.size() + leafs_.size() >= capacity_) {
      // Leave the graph as it was before this call.
      const std::string what = describe(*t);
      nodes_.resize(n_nodes_before);
      leafs_.resize(n_leafs_before);
      for (const tensor* a : added) visited_.erase(a);
      throw capacity_error("graph: more than " + std::to_string(capacity_) +
                           " tensors (raise the graph capacity); while adding " + what);
    }
    if (t->op == op::none) {
      leafs_.push_back(t);
    } else {
      nodes_.push_back(t);
    }
    stack.pop_back();
  }
}

}  // namespace troupe
