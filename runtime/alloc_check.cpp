#include "runtime/alloc_check.h"

#include <algorithm>
#include <map>
#include <sstream>
#include <unordered_map>

namespace troupe {
namespace {

struct interval {
  int start;  // index of the producing node (-1: before the graph)
  int end;    // index of the last consuming node (n_nodes: alive after the graph)
};

// Liveness by node index. Views extend their source's life.
std::unordered_map<const tensor*, interval> liveness(const graph& g) {
  std::unordered_map<const tensor*, interval> live;
  const int n = static_cast<int>(g.n_nodes());
  for (tensor* l : g.leafs()) live[l] = {-1, -1};
  for (int i = 0; i < n; ++i) live[g.node(i)] = {i, i};
  for (int i = 0; i < n; ++i) {
    const tensor* node = g.node(i);
    for (const tensor* s : node->src) {
      if (s == nullptr) continue;
      const tensor* owner = s->view_src ? s->view_src : s;
      live[owner].end = std::max(live[owner].end, i);
      live[s].end = std::max(live[s].end, i);
    }
    if (node->view_src) live[node->view_src].end = std::max(live[node->view_src].end, i);
  }
  for (auto& [t, iv] : live) {
    if (t->flags & flag_output) iv.end = n;
  }
  return live;
}

bool is_src_of(const tensor* parent, const tensor* node) {
  for (const tensor* s : node->src) {
    if (s == parent || (s && s->view_src == parent)) return true;
  }
  return false;
}

}  // namespace

std::string check_plan(const graph& g, const graph_allocator& galloc) {
  std::ostringstream err;
  for (tensor* t : g.nodes()) {
    if (t->data == nullptr) err << "node " << describe(*t) << " has no memory; ";
  }
  for (tensor* t : g.leafs()) {
    if (t->data == nullptr) err << "leaf " << describe(*t) << " has no memory; ";
  }
  const auto live = liveness(g);
  std::vector<std::pair<const tensor*, graph_allocator::placement>> planned(galloc.last_plan().begin(),
                                                                            galloc.last_plan().end());
  // A chunk is max_size bytes unless a larger tensor made it (then it is that tensor's size), or it is the
  // last chunk, which may grow without bound.
  std::map<std::pair<int, int>, size_t> largest;
  for (auto& [t, p] : planned) {
    size_t& l = largest[{p.buft_id, p.addr.chunk}];
    const size_t a = galloc.buft(p.buft_id).alignment();
    l = std::max(l, (p.size + a - 1) / a * a);
  }
  for (auto& [t, p] : planned) {
    if (p.addr.chunk == dyn_allocator::max_chunks - 1) continue;
    const size_t limit = std::max(galloc.buft(p.buft_id).max_size(), largest[{p.buft_id, p.addr.chunk}]);
    if (p.addr.offset + p.size > limit) {
      err << describe(*t) << " at chunk " << p.addr.chunk << " offset " << p.addr.offset << " size " << p.size
          << " exceeds " << limit << "; ";
    }
  }
  for (size_t i = 0; i < planned.size(); ++i) {
    for (size_t j = i + 1; j < planned.size(); ++j) {
      const auto& [a, pa] = planned[i];
      const auto& [b, pb] = planned[j];
      if (pa.buft_id != pb.buft_id || pa.addr.chunk != pb.addr.chunk) continue;
      const bool bytes_overlap = pa.addr.offset < pb.addr.offset + pb.size && pb.addr.offset < pa.addr.offset + pa.size;
      if (!bytes_overlap) continue;
      const interval la = live.at(a), lb = live.at(b);
      const bool time_overlap = la.start <= lb.end && lb.start <= la.end;
      if (!time_overlap) continue;
      // In place: the later one is computed over the earlier at the earlier's last use.
      const bool inplace = pa.addr == pb.addr && ((lb.start == la.end && is_src_of(a, b)) || (la.start == lb.end && is_src_of(b, a)));
      if (!inplace) err << describe(*a) << " and " << describe(*b) << " overlap while both are alive; ";
    }
  }
  return err.str();
}

std::vector<size_t> live_peak(const graph& g, const graph_allocator& galloc) {
  const auto live = liveness(g);
  std::vector<size_t> peak(galloc.n_bufts(), 0);
  const int n = static_cast<int>(g.n_nodes());
  for (int step = -1; step <= n; ++step) {
    std::vector<size_t> now(galloc.n_bufts(), 0);
    std::map<std::pair<int, std::pair<int, size_t>>, size_t> seen;  // in-place tensors share memory: count once
    for (const auto& [t, p] : galloc.last_plan()) {
      const interval iv = live.at(t);
      if (iv.start <= step && step <= iv.end) {
        // Every allocation is rounded up to the buffer type's alignment; so is the bound.
        const size_t a = galloc.buft(p.buft_id).alignment();
        size_t& s = seen[{p.buft_id, {p.addr.chunk, p.addr.offset}}];
        s = std::max(s, (p.size + a - 1) / a * a);
      }
    }
    for (const auto& [k, s] : seen) now[static_cast<size_t>(k.first)] += s;
    for (size_t b = 0; b < now.size(); ++b) peak[b] = std::max(peak[b], now[b]);
  }
  return peak;
}

}  // namespace troupe
