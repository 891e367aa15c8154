#include "runtime/sched.h"

#include <string>

#include "runtime/error.h"
#include "runtime/log.h"
#include "runtime/ops.h"
#include "runtime/trace.h"

namespace troupe {

scheduler::scheduler(std::vector<sched_backend> backends, size_t graph_capacity)
    : backends_(std::move(backends)), graph_capacity_(graph_capacity) {
  if (backends_.empty()) throw backend_error("scheduler: no backends");
  std::vector<buffer_type_i*> bufts;
  for (auto& b : backends_) {
    if (b.backend == nullptr) throw backend_error("scheduler: null backend");
    if (b.buft == nullptr) b.buft = &b.backend->device().buffer_type();
    bufts.push_back(b.buft);
  }
  galloc_ = std::make_unique<graph_allocator>(std::move(bufts));
  galloc_->set_assignment([this](const tensor& t) {
    const auto it = assigned_.find(&t);
    return it == assigned_.end() ? n_backends() - 1 : it->second;
  });
}

scheduler::~scheduler() { restore_sources(); }

void scheduler::set_tensor_backend(const tensor* t, int i) {
  if (i < 0 || i >= n_backends()) {
    throw backend_error("scheduler: backend index " + std::to_string(i) + " out of range (" +
                        std::to_string(n_backends()) + " backends)");
  }
  pins_[t] = i;
}

int scheduler::tensor_backend(const tensor* t) const {
  const auto it = assigned_.find(t);
  return it == assigned_.end() ? -1 : it->second;
}

void scheduler::reset() {
  restore_sources();
  pins_.clear();
  assigned_.clear();
  splits_.clear();
  current_ = nullptr;
}

void scheduler::restore_sources() {
  for (auto& [node, srcs] : original_srcs_) node->src = srcs;
  original_srcs_.clear();
}

bool scheduler::supports(int b, const tensor& t) const { return backend(b).supports_op(t); }

bool scheduler::is_external(const tensor& t) const { return t.buffer != nullptr && !galloc_->owns(t); }

int scheduler::backend_of_buffer(const tensor& t) const {
  const tensor& owner = t.view_src ? *t.view_src : t;
  if (!is_external(owner)) return -1;
  // The backend whose own buffer type this is, else the first that can use it.
  for (int b = 0; b < n_backends(); ++b) {
    if (&buffer_type(b) == &owner.buffer->type()) return b;
  }
  for (int b = 0; b < n_backends(); ++b) {
    if (backend(b).supports_buft(owner.buffer->type())) return b;
  }
  throw backend_error("scheduler: no backend can use buffer type " + std::string(owner.buffer->type().name()) +
                      " of tensor " + describe(t));
}

void scheduler::assign(const graph& g) {
  assigned_.clear();
  const int host = n_backends() - 1;
  auto set = [&](const tensor* t, int b) { assigned_[t] = b; };

  // 1. Fixed places: pins, memory that already exists, inputs, weights' users.
  for (tensor* leaf : g.leafs()) {
    if (auto it = pins_.find(leaf); it != pins_.end()) {
      set(leaf, it->second);
    } else if (int b = backend_of_buffer(*leaf); b >= 0) {
      set(leaf, b);
    } else if (leaf->flags & flag_input) {
      set(leaf, host);
    }
  }
  for (tensor* node : g.nodes()) {
    if (auto it = pins_.find(node); it != pins_.end()) {
      set(node, it->second);
      continue;
    }
    if (int b = backend_of_buffer(*node); b >= 0) {  // views of placed tensors, caller-placed nodes
      set(node, b);
      continue;
    }
    if (node->view_src != nullptr) {
      if (auto it = assigned_.find(node->view_src); it != assigned_.end()) {
        set(node, it->second);
        continue;
      }
    }
    for (tensor* s : node->src) {
      if (s == nullptr || !is_external(*s) || !(s->flags & flag_weight || s->buffer->usage() == buffer_usage::weights)) continue;
      const int b = backend_of_buffer(*s);
      if (b >= 0 && supports(b, *node)) {
        set(node, b);
        break;
      }
    }
  }

  // 2. Spread to neighbours: first the non-host backends (down, then up), then any backend.
  const auto nodes = g.nodes();
  const int n = static_cast<int>(nodes.size());
  auto expand = [&](bool down, bool include_host) {
    int cur = -1;
    for (int k = 0; k < n; ++k) {
      tensor* node = nodes[static_cast<size_t>(down ? k : n - 1 - k)];
      auto it = assigned_.find(node);
      if (it != assigned_.end()) {
        cur = (it->second == host && !include_host) ? -1 : it->second;
        continue;
      }
      if (cur >= 0 && supports(cur, *node)) set(node, cur);
      else cur = -1;
    }
  };
  expand(true, false);
  expand(false, false);
  expand(true, true);
  expand(false, true);

  // 3. The rest: the first backend that supports the op; and check every assignment.
  for (tensor* node : nodes) {
    auto it = assigned_.find(node);
    if (it != assigned_.end() && (node->view_src != nullptr || supports(it->second, *node))) continue;
    if (it != assigned_.end() && pins_.count(node)) {
      throw backend_error("scheduler: node " + describe(*node) + " (op " + std::string(op_name(node->op)) +
                          ") is pinned to " + std::string(backend(it->second).name()) + ", which cannot compute it");
    }
    int chosen = -1;
    for (int b = 0; b < n_backends() && chosen < 0; ++b) {
      if (supports(b, *node)) chosen = b;
    }
    if (chosen < 0) {
      throw backend_error("scheduler: no backend can compute node " + describe(*node) + " (op " +
                          std::string(op_name(node->op)) + ")");
    }
    set(node, chosen);
  }
  // Leafs consumed by a node and not yet placed live with their first consumer.
  for (tensor* node : nodes) {
    for (tensor* s : node->src) {
      if (s != nullptr && !assigned_.count(s)) set(s, assigned_[node]);
    }
  }
}

void scheduler::build_splits(graph& g) {
  restore_sources();
  splits_.clear();
  copies_ctx_ = std::make_unique<context>(context_params{.max_tensors = 2 * g.n_nodes() * max_src + 16, .no_alloc = true});
  for (tensor* node : g.nodes()) {
    const int b = assigned_.at(node);
    if (splits_.empty() || splits_.back().backend != b) {
      splits_.push_back(split{});
      splits_.back().backend = b;
    }
    split& sp = splits_.back();
    sp.nodes.push_back(node);
    bool saved = false;
    for (size_t j = 0; j < max_src; ++j) {
      tensor* s = node->src[j];
      if (s == nullptr) continue;
      // Memory that exists outside the graph: usable in place when this backend can read its buffer type.
      const tensor& owner = s->view_src ? *s->view_src : *s;
      bool needs_copy;
      if (is_external(owner)) {
        needs_copy = !backend(b).supports_buft(owner.buffer->type());
      } else {
        const auto it = assigned_.find(s->view_src ? s->view_src : s);
        needs_copy = it != assigned_.end() && it->second != b;
      }
      if (!needs_copy) continue;
      tensor* copy = nullptr;
      for (auto& [src, c] : sp.inputs) {
        if (src == s) copy = c;
      }
      if (copy == nullptr) {
        copy = copies_ctx_->new_tensor(s->type, max_dims, s->ne.data());
        copy->nb = s->nb;
        copy->flags |= flag_input;
        std::string name = std::string(s->get_name().empty() ? "(unnamed)" : s->get_name()) + "#" +
                           std::string(backend(b).name());
        copy->set_name(name);
        assigned_[copy] = b;
        sp.inputs.emplace_back(s, copy);
      }
      if (!saved) {
        original_srcs_.emplace_back(node, node->src);
        saved = true;
      }
      node->src[j] = copy;
    }
  }
}

void scheduler::plan(graph& g, bool place) {
  assign(g);
  build_splits(g);
  // One graph for the allocator: each split's copies (as leafs), then its nodes, in order. A copy reads its
  // source when the split starts, which the allocator cannot see: a view of the source at that point (as
  // ggml's scheduler adds its input_dep views) keeps the source's memory from being reused by nodes planned
  // before the split (an input read by an early split on one backend and a late split on another).
  std::vector<tensor*> deps;
  for (const split& sp : splits_) {
    for (auto& [src, copy] : sp.inputs) {
      tensor* dep = copies_ctx_->new_tensor(src->type, max_dims, src->ne.data());
      dep->nb = src->nb;
      dep->op = op::view;
      dep->view_src = src->view_src ? src->view_src : src;
      dep->view_offs = src->view_src ? src->view_offs : 0;
      dep->src[0] = src;
      dep->set_name("dep:" + std::string(copy->get_name()));
      deps.push_back(dep);
    }
  }
  graph all(graph_capacity_ + copies_ctx_->n_tensors() + g.n_leafs());
  for (tensor* leaf : g.leafs()) all.append(leaf);
  size_t d = 0;
  for (const split& sp : splits_) {
    for (size_t i = 0; i < sp.inputs.size(); ++i) all.append(deps[d++]);
    for (auto& [src, copy] : sp.inputs) all.append(copy);
    for (tensor* node : sp.nodes) all.append(node);
  }
  if (place) {
    galloc_->alloc_graph(all);
  } else {
    galloc_->reserve(all);
  }
  current_ = &g;
}

void scheduler::reserve(graph& g) {
  try {
    plan(g, false);
  } catch (...) {
    forget_graph();
    throw;
  }
  // A reserve only measures: the graph's sources go back to what the caller built.
  restore_sources();
  current_ = nullptr;
}

void scheduler::alloc_graph(graph& g) {
  try {
    plan(g, true);
  } catch (...) {
    forget_graph();  // a failed plan (no memory...) must not leave g's nodes reading copies
    throw;
  }
}

void scheduler::forget_graph() {
  restore_sources();
  splits_.clear();
  current_ = nullptr;
}

void scheduler::run_split(const split& sp, bool sync_sources, bool submit) {
  backend_i& be = backend(sp.backend);
  const auto index = static_cast<int64_t>(&sp - splits_.data());
  if (!sp.inputs.empty()) {
    trace::span t("transfers", "inputs",
                  {{"ubatch", trace_id_}, {"split", index}, {"copies", static_cast<int64_t>(sp.inputs.size())}});
    for (auto& [src, copy] : sp.inputs) {
      const int from = tensor_backend(src->view_src ? src->view_src : src);
      if (sync_sources && from >= 0 && from != sp.backend) backend(from).synchronize();
      if (submit && src->buffer != nullptr && src->buffer->is_host() && copy->buffer != nullptr && !copy->buffer->is_host()) {
        // Into the backend's stream, ahead of the split's graph: a backend that queues graphs (Vulkan) takes
        // the bytes now and copies them once what it runs before is done, so the upload overlaps that work.
        be.set_tensor_async(*copy, src->data, 0, nbytes(*src));
      } else {
        tensor_copy(*src, *copy);
      }
    }
  }
  graph sg(sp.nodes.size() + 1);
  for (tensor* node : sp.nodes) sg.append(node);
  if (submit) {  // its span ends when it finishes (trace_finished)
    trace::span t("transfers", "submit", {{"ubatch", trace_id_}, {"split", index}, {"group", trace_group_}});
    be.graph_submit(sg);
    return;
  }
  trace::span t(be.device().name(), "split", {{"ubatch", trace_id_}, {"split", index}, {"group", trace_group_}});
  be.graph_compute(sg);
}

void scheduler::graph_compute(graph& g) {
  if (current_ != &g) alloc_graph(g);
  try {
    if (runner_) {
      for (size_t i = 0; i < splits_.size(); ++i) run_through_runner(static_cast<int>(i));
    } else {
      for (const split& sp : splits_) run_split(sp);
    }
    for (int b = 0; b < n_backends(); ++b) backend(b).synchronize();
    record_run();
  } catch (...) {
    // A backend failed (a remote peer dropped...): the caller will usually destroy g while unwinding, so
    // nothing here may keep pointing into it. Its nodes get their own sources back now, not in a later
    // reset() or the destructor, which would write into freed tensors.
    forget_graph();
    throw;
  }
}

void scheduler::record_run() {
  last_run_.resize(splits_.size());  // the records' vectors keep their capacity from graph to graph
  for (size_t i = 0; i < splits_.size(); ++i) {
    split_record& r = last_run_[i];
    r.backend = splits_[i].backend;
    r.ops.clear();
    for (const tensor* n : splits_[i].nodes) {
      if (n->op != op::none && !is_view_op(n->op)) r.ops.push_back(n->op);
    }
  }
}

const scheduler::split& scheduler::split_at(int i, const char* who) const {
  if (current_ == nullptr) throw error(std::string("scheduler: ") + who + " without an allocated graph");
  if (i < 0 || i >= n_splits()) {
    throw error("scheduler: split " + std::to_string(i) + " of " + std::to_string(n_splits()));
  }
  return splits_[static_cast<size_t>(i)];
}

void scheduler::run_and_synchronize(const split& sp) {
  run_split(sp);
  backend(sp.backend).synchronize();
}

void scheduler::run_through_runner(int i) {
  const split& sp = splits_[static_cast<size_t>(i)];
  runner_(i, sp, [this, &sp] { run_and_synchronize(sp); });
}

void scheduler::dispatch_split(int i, bool queue) {
  const split& sp = split_at(i, "dispatch_split");
  // The splits before it have completed: the backends its inputs come from have nothing left to finish.
  const std::function<void()> work = [this, &sp, queue] {
    run_split(sp, false, queue);
    if (!queue) backend(sp.backend).synchronize();
  };
  if (runner_) {
    runner_(i, sp, work);
  } else {
    work();
  }
}

void scheduler::trace_finished(int i, std::chrono::steady_clock::time_point since) const {
  const split& sp = split_at(i, "trace_finished");
  trace::record(backend(sp.backend).device().name(), "split", {{"ubatch", trace_id_}, {"split", i}, {"group", trace_group_}},
                since, std::chrono::steady_clock::now());
}

int scheduler::n_copies() const {
  int n = 0;
  for (const split& sp : splits_) n += static_cast<int>(sp.inputs.size());
  return n;
}

size_t scheduler::compute_buffer_size(int i) const { return galloc_->buffer_size(i); }

}  // namespace troupe
