// Host memory in 2 MiB pages (Linux transparent huge pages) for the large buffers weights, KV cache and
// compute graphs live in.
//
//   host_pages p = host_pages::allocate(bytes);   // 2 MiB-aligned, MADV_HUGEPAGE where the kernel allows
//   use(p.data());                                 // munmap'd by p's destructor
//
// Why: a matrix-vector product streams every weight once per token, and through 4 KiB pages a core pays a
// TLB miss every 4 KiB and its prefetchers stop at every page boundary: reading a 256 MiB f16 matrix on a
// Sapphire Rapids-class core ran at 12 GB/s in 4 KiB pages and 17 GB/s in 2 MiB ones. File mappings
// cannot get huge pages on most file systems (MADV_COLLAPSE answers EINVAL), which is why the loader copies
// large host weights out of the mapping (load_params::huge_pages).
#pragma once

#include <cstddef>
#include <cstdint>

namespace troupe {

// The kernel hands out transparent huge pages to memory that asks for them: the mode in
// /sys/kernel/mm/transparent_hugepage/enabled is "always" or "madvise" (false elsewhere, and off Linux).
bool transparent_huge_pages();

// MemAvailable of /proc/meminfo in bytes (0 where unknown).
uint64_t available_host_memory();

// An anonymous private mapping of at least `bytes`, 2 MiB-aligned, advised MADV_HUGEPAGE; zero-filled.
class host_pages {
 public:
  static constexpr size_t huge_page = size_t{2} << 20;
  host_pages() = default;
  // Returns an empty host_pages (data() == nullptr) when the mapping fails.
  static host_pages allocate(size_t bytes);
  ~host_pages();
  host_pages(host_pages&& o) noexcept;
  host_pages& operator=(host_pages&& o) noexcept;
  host_pages(const host_pages&) = delete;
  host_pages& operator=(const host_pages&) = delete;

  void* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  static void release(void* data, size_t size);

  void* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace troupe
