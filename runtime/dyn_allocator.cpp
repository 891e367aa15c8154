#include "runtime/dyn_allocator.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "runtime/error.h"

namespace troupe {
namespace {
// The unbounded last chunk: large enough for anything, small enough that offset + size never overflows.
constexpr size_t unbounded = SIZE_MAX / 2;
}  // namespace

dyn_allocator::dyn_allocator(size_t alignment, size_t max_chunk_size)
    : alignment_(alignment == 0 ? 1 : alignment), max_chunk_size_(std::min(max_chunk_size, unbounded)) {}

size_t dyn_allocator::aligned(size_t size) const {
  const size_t a = alignment_;
  if (size > unbounded) return size;  // caught by alloc
  return (size + a - 1) / a * a;
}

void dyn_allocator::reset() { chunks_.clear(); }

void dyn_allocator::new_chunk(size_t min_size) {
  chunk c;
  size_t limit = std::max(min_size, max_chunk_size_);
  if (static_cast<int>(chunks_.size()) == max_chunks - 1) limit = unbounded;  // the last chunk may grow
  c.free.push_back({0, limit});
  chunks_.push_back(std::move(c));
}

dyn_allocator::address dyn_allocator::take(int ci, size_t index, size_t size) {
  chunk& c = chunks_[static_cast<size_t>(ci)];
  block& b = c.free[index];
  const address addr{ci, b.offset};
  b.offset += size;
  b.size -= size;
  if (b.size == 0 && index + 1 < c.free.size()) c.free.erase(c.free.begin() + static_cast<std::ptrdiff_t>(index));
  c.high_water = std::max(c.high_water, addr.offset + size);
  return addr;
}

dyn_allocator::address dyn_allocator::alloc(size_t size_in) {
  if (size_in > unbounded) {
    throw capacity_error("dyn_allocator: a request of " + std::to_string(size_in) + " bytes is too large");
  }
  const size_t size = aligned(size_in);

  // 1. Best fit among blocks that are not a chunk's tail.
  int best_chunk = -1;
  size_t best_index = 0;
  size_t best_size = SIZE_MAX;
  for (size_t ci = 0; ci < chunks_.size(); ++ci) {
    const chunk& c = chunks_[ci];
    for (size_t i = 0; i + 1 < c.free.size(); ++i) {
      const block& b = c.free[i];
      if (b.size >= size && b.size < best_size) {
        best_chunk = static_cast<int>(ci);
        best_index = i;
        best_size = b.size;
      }
    }
  }
  if (best_chunk >= 0) return take(best_chunk, best_index, size);

  // 2. A chunk's tail. reuse = allocated bytes past the tail's start minus the request: negative means the
  //    chunk must grow by that much, zero an exact fit, positive bytes of the buffer left unused.
  //    Prefer any fit that needs no growth (the smallest waste), else the least growth.
  int64_t best_reuse = INT64_MIN;
  for (size_t ci = 0; ci < chunks_.size(); ++ci) {
    const chunk& c = chunks_[ci];
    if (c.free.empty()) continue;
    const block& tail = c.free.back();
    if (tail.size < size) continue;
    const int64_t reuse = static_cast<int64_t>(c.high_water) - static_cast<int64_t>(tail.offset) - static_cast<int64_t>(size);
    const bool better_growth = best_reuse < 0 && reuse > best_reuse;
    const bool better_fit = reuse >= 0 && reuse < best_reuse;
    if (best_chunk < 0 || better_growth || better_fit) {
      best_chunk = static_cast<int>(ci);
      best_reuse = reuse;
    }
  }
  if (best_chunk >= 0) return take(best_chunk, chunks_[static_cast<size_t>(best_chunk)].free.size() - 1, size);

  // 3. A new chunk.
  if (static_cast<int>(chunks_.size()) >= max_chunks) {
    throw capacity_error("dyn_allocator: all " + std::to_string(max_chunks) + " chunks are full (" +
                         std::to_string(size) + " bytes requested)");
  }
  new_chunk(size);
  return take(n_chunks() - 1, 0, size);
}

void dyn_allocator::free(address addr, size_t size_in) {
  if (!addr.valid() || addr.chunk >= n_chunks()) return;
  const size_t size = aligned(size_in);
  chunk& c = chunks_[static_cast<size_t>(addr.chunk)];
  // Insert in offset order, then merge with the neighbours.
  auto it = std::lower_bound(c.free.begin(), c.free.end(), addr.offset,
                             [](const block& b, size_t off) { return b.offset < off; });
  it = c.free.insert(it, block{addr.offset, size});
  if (it + 1 != c.free.end() && it->offset + it->size == (it + 1)->offset) {
    it->size += (it + 1)->size;
    c.free.erase(it + 1);
  }
  if (it != c.free.begin() && (it - 1)->offset + (it - 1)->size == it->offset) {
    (it - 1)->size += it->size;
    c.free.erase(it);
  }
}

}  // namespace troupe
