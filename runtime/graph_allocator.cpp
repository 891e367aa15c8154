#include "runtime/graph_allocator.h"

#include <algorithm>
#include <string>

#include "runtime/error.h"
#include "runtime/log.h"

namespace troupe {
namespace {

bool can_inplace(op o) {
  switch (o) {
    case op::add:
    case op::sub:
    case op::mul:
    case op::div:
    case op::scale:
    case op::silu:
    case op::gelu:
    case op::rope:
    case op::rms_norm:
    case op::soft_max:
      return true;
    default:
      return false;
  }
}

bool same_layout(const tensor& a, const tensor& b) { return a.type == b.type && a.ne == b.ne && a.nb == b.nb; }

}  // namespace

graph_allocator::graph_allocator(std::vector<buffer_type_i*> bufts) : bufts_(std::move(bufts)) {
  if (bufts_.empty()) throw backend_error("graph_allocator: no buffer types");
  for (size_t i = 0; i < bufts_.size(); ++i) {
    if (bufts_[i] == nullptr) throw backend_error("graph_allocator: null buffer type");
    // A buffer type listed again shares the first entry's planner and chunks (as ggml's allocator does): one
    // set of buffers, not two of which one would never be freed or counted twice.
    size_t first = i;
    for (size_t j = 0; j < i; ++j) {
      if (bufts_[j] == bufts_[i]) {
        first = slot_[j];
        break;
      }
    }
    slot_.push_back(first);
    dyn_.emplace_back(bufts_[i]->alignment(), bufts_[i]->max_size());  // (unused for a repeated entry)
  }
  buffers_.resize(bufts_.size());
}

graph_allocator::~graph_allocator() = default;

bool graph_allocator::owns(const tensor& t) const {
  const auto it = placed_.find(&t);
  return it != placed_.end() && t.buffer == it->second;
}

bool graph_allocator::is_external(const tensor& t) const {
  // Memory placed by someone else: a weight, a KV cache, an input the caller allocated.
  return t.data != nullptr && !owns(t);
}

int graph_allocator::buft_of(const tensor& t) const {
  const int id = assign_ ? assign_(t) : 0;
  if (id < 0 || static_cast<size_t>(id) >= bufts_.size()) {
    throw backend_error("graph_allocator: tensor " + describe(t) + " assigned to buffer type " + std::to_string(id) +
                        " of " + std::to_string(bufts_.size()));
  }
  return id;
}

void graph_allocator::allocate(tensor& t, int buft_id) {
  node_state& s = state_[&t];
  if (s.allocated || t.view_src != nullptr || is_external(t)) return;
  s.allocated = true;

  // In place over a parent whose memory is otherwise dead after this node. The node takes over the parent's
  // placement, in the parent's buffer type: the scheduler only gives a node parents its backend can use
  // (inputs from elsewhere are copied in first), so the memory is usable where the node runs.
  if (can_inplace(t.op)) {
    for (tensor* p : t.src) {
      if (p == nullptr || !same_layout(t, *p)) continue;
      if ((p->flags & flag_output) || (p->view_src != nullptr && (p->view_src->flags & flag_output))) continue;
      node_state& ps = state_[p];
      if (ps.n_children != 1 || ps.n_views != 0) continue;
      tensor* owner = p;
      if (p->view_src != nullptr) {
        // A view can be reused only when it starts where its source starts and nothing else uses the source.
        owner = p->view_src;
        const node_state& vs = state_[owner];
        if (vs.n_views != 1 || vs.n_children != 0 || p->view_offs != 0) continue;
      }
      node_state& os = state_[owner];
      if (!os.allocated || is_external(*owner)) continue;
      take_over(t, s, os);
      return;
    }
  }
  const size_t size = bufts_[static_cast<size_t>(buft_id)]->alloc_size(t);
  buft_id = static_cast<int>(slot_[static_cast<size_t>(buft_id)]);
  s.where.buft_id = buft_id;
  s.where.size = size;
  s.where.addr = dyn_[static_cast<size_t>(buft_id)].alloc(size);
}

void graph_allocator::take_over(const tensor& t, node_state& s, node_state& owner) {
  s.where = owner.where;
  owner.allocated = false;  // ownership moves to t: the parent is not freed again
  // Give back the tail of the parent's block that t does not need.
  dyn_allocator& d = dyn_[static_cast<size_t>(s.where.buft_id)];
  const size_t need = d.aligned(bufts_[static_cast<size_t>(s.where.buft_id)]->alloc_size(t));
  const size_t have = d.aligned(s.where.size);
  if (have > need) {
    d.free({s.where.addr.chunk, s.where.addr.offset + need}, have - need);
    s.where.size = need;
  }
}

void graph_allocator::release(tensor& t) {
  node_state& s = state_[&t];
  if (!s.allocated || (t.flags & flag_output) || is_external(t)) return;
  dyn_[static_cast<size_t>(s.where.buft_id)].free(s.where.addr, s.where.size);
  s.allocated = false;
}

void graph_allocator::plan(const graph& g) {
  state_.clear();
  plan_.clear();
  // Every tensor of the graph (twice over, for any view source outside it): no growing below, so the
  // references allocate() holds stay valid.
  state_.reserve(2 * (g.nodes().size() + g.leafs().size()));
  for (auto& d : dyn_) d.reset();

  // Count consumers and views.
  for (tensor* node : g.nodes()) {
    if (node->view_src != nullptr) state_[node->view_src].n_views += 1;
    for (tensor* s : node->src) {
      if (s != nullptr) state_[s].n_children += 1;
    }
  }
  // Inputs first, so that nothing planned before them can overwrite them.
  for (tensor* leaf : g.leafs()) {
    if (leaf->flags & flag_input) allocate(*leaf, buft_of(*leaf));
  }
  for (tensor* node : g.nodes()) {
    if (node->flags & flag_input) allocate(*node, buft_of(*node));
  }
  for (tensor* node : g.nodes()) {
    for (tensor* s : node->src) {
      if (s != nullptr) allocate(*s, buft_of(*s));
    }
    allocate(*node, buft_of(*node));
    // Parents whose last consumer this was give their memory back (views: their source, once every view of
    // it is dead too).
    for (tensor* p : node->src) {
      if (p == nullptr) continue;
      node_state& ps = state_[p];
      ps.n_children -= 1;
      if (ps.n_children != 0 || ps.n_views != 0) continue;
      if (p->view_src != nullptr) {
        tensor* v = p->view_src;
        node_state& vs = state_[v];
        vs.n_views -= 1;
        if (vs.n_views == 0 && vs.n_children == 0) release(*v);
      } else {
        release(*p);
      }
    }
  }
  // Record where everything went (tensors moved in place share their parent's placement).
  for (auto& [t, s] : state_) {
    if (s.where.buft_id >= 0) plan_[t] = s.where;
  }
}

bool graph_allocator::ensure_buffers() {
  bool grew = false;
  for (size_t b = 0; b < bufts_.size(); ++b) {
    if (slot_[b] != b) continue;  // a repeated buffer type: its first entry's chunks
    const dyn_allocator& d = dyn_[b];
    auto& chunks = buffers_[b];
    if (chunks.size() < static_cast<size_t>(d.n_chunks())) chunks.resize(static_cast<size_t>(d.n_chunks()));
    for (int c = 0; c < d.n_chunks(); ++c) {
      const size_t need = d.chunk_size(c);
      buffer_ptr& buf = chunks[static_cast<size_t>(c)];
      if (need == 0 || (buf && buf->size() >= need)) continue;
      if (buf) {
        TROUPE_LOG(debug, "graph_allocator: " << bufts_[b]->name() << " chunk " << c << " grows from " << buf->size()
                                              << " to " << need << " bytes");
      }
      buf.reset();  // free the old one first: the device may not hold both
      buf = bufts_[b]->alloc_buffer(need);
      buf->set_usage(buffer_usage::compute);
      grew = true;
    }
  }
  if (grew) ++n_reallocations_;
  return grew;
}

void graph_allocator::reserve(const graph& g) {
  plan(g);
  ensure_buffers();
}

void graph_allocator::place(graph& g) {
  placed_.clear();
  for (auto& [t, p] : plan_) {
    buffer_i& buf = *buffers_[static_cast<size_t>(p.buft_id)][static_cast<size_t>(p.addr.chunk)];
    tensor_alloc(buf, *const_cast<tensor*>(t), static_cast<char*>(buf.base()) + p.addr.offset);
    placed_[t] = &buf;
  }
  auto init_view = [](tensor* t) {
    if (t->view_src != nullptr && t->view_src->buffer != nullptr) view_init(*t);
  };
  for (tensor* t : g.leafs()) init_view(t);
  for (tensor* t : g.nodes()) init_view(t);
}

bool graph_allocator::alloc_graph(graph& g) {
  plan(g);
  const bool grew = ensure_buffers();
  place(g);
  return grew;
}

size_t graph_allocator::buffer_size(int buft_id) const {
  // A repeated buffer type's bytes are its first entry's: counted once, there.
  if (slot_[static_cast<size_t>(buft_id)] != static_cast<size_t>(buft_id)) return 0;
  size_t total = 0;
  for (const auto& b : buffers_[static_cast<size_t>(buft_id)]) {
    if (b) total += b->size();
  }
  return total;
}

int graph_allocator::n_chunks(int buft_id) const { return static_cast<int>(buffers_[slot_[static_cast<size_t>(buft_id)]].size()); }

buffer_i* graph_allocator::chunk_buffer(int buft_id, int chunk) const {
  return buffers_[slot_[static_cast<size_t>(buft_id)]][static_cast<size_t>(chunk)].get();
}

}  // namespace troupe
