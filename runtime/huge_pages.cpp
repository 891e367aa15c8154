#include "runtime/huge_pages.h"

#include <algorithm>
#include <fstream>
#include <string>
#include <utility>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace troupe {

bool transparent_huge_pages() {
#if defined(__linux__)
  static const bool v = [] {
    std::ifstream in("/sys/kernel/mm/transparent_hugepage/enabled");
    std::string line;
    if (!std::getline(in, line)) return false;
    return line.find("[always]") != std::string::npos || line.find("[madvise]") != std::string::npos;
  }();
  return v;
#else
  return false;
#endif
}

uint64_t available_host_memory() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t value = 0;
  std::string unit;
  while (in >> key >> value) {
    std::getline(in, unit);
    if (key == "MemAvailable:") return value * 1024;
  }
  return 0;
}

host_pages host_pages::allocate(size_t bytes) {
  host_pages p;
#if defined(__linux__)
  const size_t size = (std::max<size_t>(bytes, 1) + huge_page - 1) / huge_page * huge_page;
  // Over-map by one huge page, then trim the unaligned head and the tail.
  void* raw = mmap(nullptr, size + huge_page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return p;
  const auto base = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (base + huge_page - 1) / huge_page * huge_page;
  if (aligned > base) munmap(raw, aligned - base);
  const uintptr_t end = base + size + huge_page;
  if (end > aligned + size) munmap(reinterpret_cast<void*>(aligned + size), end - (aligned + size));
  // Advice only: without it (a kernel without THP) the memory is still good, in 4 KiB pages.
  (void)madvise(reinterpret_cast<void*>(aligned), size, MADV_HUGEPAGE);
  p.data_ = reinterpret_cast<void*>(aligned);
  p.size_ = size;
#else
  (void)bytes;
#endif
  return p;
}

void host_pages::release(void* data, size_t size) {
#if defined(__linux__)
  if (data != nullptr) munmap(data, size);
#else
  (void)data;
  (void)size;
#endif
}

host_pages::~host_pages() { release(data_, size_); }

host_pages::host_pages(host_pages&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}

host_pages& host_pages::operator=(host_pages&& o) noexcept {
  if (this != &o) {
    release(data_, size_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

}  // namespace troupe
