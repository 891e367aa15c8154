// The dynamic allocator behind the graph allocator: plans addresses inside a virtual buffer of up to 16
// chunks without touching memory. Only sizes and offsets; real buffers are allocated afterwards, one per
// chunk, each as large as that chunk's high-water mark.
//
//   dyn_allocator a(/*alignment*/ 32, /*max_chunk_size*/ 1 << 30);
//   address x = a.alloc(4096);       // {chunk 0, offset 0}
//   address y = a.alloc(1 << 31);    // larger than a chunk: a chunk of its own size
//   a.free(x, 4096);
//   a.chunk_size(0);                 // bytes chunk 0 must have
//
// Placement policy, in order:
//   1. best fit among the free blocks of every chunk that lie below the chunk's unallocated tail (memory a
//      buffer will have anyway);
//   2. otherwise the tail of a chunk: one whose already-allocated part covers the tensor best (least growth,
//      or least waste when nothing has to grow);
//   3. otherwise a new chunk of max(size, max_chunk_size). The 16th chunk has no upper bound: the backend
//      then says whether it can allocate it.
// Freed blocks merge with their neighbours.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace troupe {

class dyn_allocator {
 public:
  static constexpr int max_chunks = 16;

  struct address {
    int chunk = -1;
    size_t offset = 0;
    bool valid() const { return chunk >= 0; }
    friend bool operator==(const address&, const address&) = default;
  };

  dyn_allocator(size_t alignment, size_t max_chunk_size);

  // Reserves size bytes (rounded up to the alignment). Throws capacity_error when all chunks are used up
  // (impossible in practice: the last chunk is unbounded).
  address alloc(size_t size);
  // Returns a block obtained from alloc with the same size.
  void free(address addr, size_t size);
  // Forgets every allocation and chunk.
  void reset();

  int n_chunks() const { return static_cast<int>(chunks_.size()); }
  // High-water mark of a chunk: the bytes its buffer needs.
  size_t chunk_size(int chunk) const { return chunks_[static_cast<size_t>(chunk)].high_water; }
  size_t aligned(size_t size) const;

 private:
  struct block {
    size_t offset;
    size_t size;
  };
  struct chunk {
    std::vector<block> free;  // sorted by offset, merged; the last one is the tail up to the chunk's limit
    size_t high_water = 0;
  };

  void new_chunk(size_t min_size);
  address take(int c, size_t index, size_t size);

  size_t alignment_;
  size_t max_chunk_size_;
  std::vector<chunk> chunks_;
};

}  // namespace troupe
