// Graphs to graph_compute messages (see backends/rpc/wire/validate.h for how the peer reads them back).
#include <algorithm>
#include <bit>
#include <string>

#include "backends/rpc/rpc_device.h"
#include "runtime/error.h"
#include "runtime/ops.h"

namespace troupe::rpc {
namespace {

// Entry index of each tensor already in the message: open addressing over pointers (std::unordered_map
// allocates a node per tensor, and a message is built for every graph run).
class tensor_index {
 public:
  explicit tensor_index(size_t n) { rehash(std::max<size_t>(16, std::bit_ceil(n * 2))); }
  int32_t find(const tensor* t) const {
    for (size_t i = slot(t);; i = (i + 1) & mask_) {
      if (slots_[i].first == t) return slots_[i].second;
      if (slots_[i].first == nullptr) return -1;
    }
  }
  void insert(const tensor* t, int32_t v) {
    if ((size_ + 1) * 2 > slots_.size()) rehash(slots_.size() * 2);
    size_t i = slot(t);
    while (slots_[i].first != nullptr) i = (i + 1) & mask_;
    slots_[i] = {t, v};
    ++size_;
  }

 private:
  size_t slot(const tensor* t) const {
    return static_cast<size_t>((reinterpret_cast<uintptr_t>(t) >> 4) * 0x9e3779b97f4a7c15ull) & mask_;
  }
  void rehash(size_t cap) {
    std::vector<std::pair<const tensor*, int32_t>> old = std::move(slots_);
    slots_.assign(cap, {nullptr, -1});
    mask_ = cap - 1;
    size_ = 0;
    for (const auto& [t, v] : old) {
      if (t != nullptr) insert(t, v);
    }
  }
  std::vector<std::pair<const tensor*, int32_t>> slots_;
  size_t mask_ = 0;
  size_t size_ = 0;
};

class serializer {
 public:
  serializer(const rpc_device& dev, size_t n_nodes) : dev_(dev), epoch_(dev.conn().epoch()), index_(n_nodes * 2) {
    out_.reserve(4 + n_nodes * 2 * wire_tensor::wire_size);
    writer(out_).u32(0);  // the entry count, set by finish()
  }

  // A node of the graph: its sources first (leafs, or views rebuilt on the peer), then itself.
  void node(const tensor* t) {
    if (index_.find(t) >= 0) return;
    // A layout node (a view, reshape, permute, transpose) over memory that is not on this peer: the scheduler
    // may place one here next to its neighbours when the node it views was computed elsewhere (a product
    // this device refused, run on the CPU). It computes nothing, and its users here read a copy of it (the
    // scheduler's split inputs), so it is not sent.
    if ((t->op == op::none || is_view_op(t->op)) && t->buffer != nullptr && !on_this_peer(*t)) return;
    for (const tensor* s : t->src) {
      if (s != nullptr && index_.find(s) < 0) outside(s);
    }
    add(t, wire_tensor::kind::node);
  }

  std::vector<uint8_t> finish() {
    store_le(out_.data(), static_cast<uint32_t>(n_));
    return std::move(out_);
  }

 private:
  // A tensor the graph reads but does not compute. Views are sent as view nodes over their source (the peer
  // rebuilds them, which costs nothing), so a transposed or permuted view needs no special leaf layout.
  void outside(const tensor* t) {
    if (is_view_op(t->op) && t->src[0] != nullptr) {
      node(t);
      return;
    }
    add(t, wire_tensor::kind::leaf);
  }

  bool on_this_peer(const tensor& t) const {
    const auto* b = dynamic_cast<const rpc_buffer*>(t.buffer);
    return b != nullptr && &b->owner() == &dev_.conn();
  }

  const rpc_buffer& buffer_of(const tensor& t) {
    if (t.data == nullptr || t.buffer == nullptr) {
      throw backend_error(std::string(dev_.name()) + ": tensor " + describe(t) + " has no memory (graph not allocated)");
    }
    if (t.buffer == last_) return *last_rpc_;
    const auto* b = dynamic_cast<const rpc_buffer*>(t.buffer);
    if (b == nullptr || &b->owner() != &dev_.conn()) {
      throw backend_error(std::string(dev_.name()) + ": tensor " + describe(t) + " lives in buffer type " +
                          std::string(t.buffer->type().name()) + ", not on this peer");
    }
    if (b->remote().epoch != epoch_) {
      throw backend_error(std::string(dev_.name()) + ": tensor " + describe(t) +
                          " is in a buffer that was lost when the connection to the peer dropped");
    }
    last_ = t.buffer;
    last_rpc_ = b;
    return *b;
  }

  void add(const tensor* t, wire_tensor::kind k) {
    if (n_ >= max_graph_entries) {
      throw backend_error(std::string(dev_.name()) + ": graph of more than " + std::to_string(max_graph_entries) +
                          " tensors");
    }
    wire_tensor w = to_wire(*t, &buffer_of(*t));
    w.k = k;
    if (k == wire_tensor::kind::leaf) {
      w.op = static_cast<uint8_t>(op::none);
      w.op_params = {};
    } else {
      for (size_t i = 0; i < max_src; ++i) w.src[i] = t->src[i] ? index_.find(t->src[i]) : -1;
    }
    index_.insert(t, static_cast<int32_t>(n_));
    writer wr(out_);
    w.write(wr);
    ++n_;
  }

  const rpc_device& dev_;
  uint64_t epoch_;
  tensor_index index_;
  std::vector<uint8_t> out_;
  size_t n_ = 0;
  const buffer_i* last_ = nullptr;
  const rpc_buffer* last_rpc_ = nullptr;
};

}  // namespace

wire_tensor to_wire(const tensor& t, const rpc_buffer* buf) {
  wire_tensor w;
  w.op = static_cast<uint8_t>(t.op);
  w.type = static_cast<uint32_t>(t.type);
  w.ne = t.ne;
  for (size_t i = 0; i < max_dims; ++i) w.nb[i] = t.nb[i];
  w.op_params = t.op_params;
  w.flags = t.flags;
  if (buf != nullptr) {
    w.buffer = buf->remote().handle;
    w.offset = buf->offset_of(t);
  }
  return w;
}

std::vector<uint8_t> op_question(const tensor& node) {
  std::vector<uint8_t> out;
  out.reserve(4 + max_query_entries * wire_tensor::wire_size);
  writer w(out);
  std::array<const tensor*, max_src> distinct{};
  std::array<int32_t, max_src> index{-1, -1, -1, -1};
  uint32_t n = 0;
  for (size_t k = 0; k < max_src; ++k) {
    const tensor* s = node.src[k];
    if (s == nullptr) continue;
    for (uint32_t j = 0; j < n; ++j) {
      if (distinct[j] == s) index[k] = static_cast<int32_t>(j);
    }
    if (index[k] < 0) {
      distinct[n] = s;
      index[k] = static_cast<int32_t>(n++);
    }
  }
  w.u32(n + 1);
  for (uint32_t j = 0; j < n; ++j) {
    wire_tensor leaf = to_wire(*distinct[j], nullptr);
    leaf.k = wire_tensor::kind::leaf;
    leaf.op = static_cast<uint8_t>(op::none);
    leaf.op_params = {};
    leaf.flags = 0;
    leaf.write(w);
  }
  wire_tensor x = to_wire(node, nullptr);
  x.k = wire_tensor::kind::node;
  x.flags = 0;
  for (size_t k = 0; k < max_src; ++k) x.src[k] = index[k];
  x.write(w);
  return out;
}

std::vector<uint8_t> serialize_graph(const graph& g, const rpc_device& dev) {
  serializer s(dev, g.n_nodes());
  for (const tensor* n : g.nodes()) s.node(n);
  return s.finish();
}

}  // namespace troupe::rpc
