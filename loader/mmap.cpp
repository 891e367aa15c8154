#include "loader/mmap.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "runtime/error.h"
#include "runtime/log.h"

#if defined(__unix__) || defined(__APPLE__)
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#define TROUPE_POSIX 1
#else
#define TROUPE_POSIX 0
#endif

namespace troupe {
namespace {

std::string sys_error(const std::string& what, const std::string& path) {
  return what + " '" + path + "': " + std::strerror(errno);
}

#if TROUPE_POSIX
size_t page_size() {
  static const size_t p = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return p;
}

// The whole pages inside [offset, offset + n) of a mapping of `size` bytes (empty: begin == end).
struct page_span {
  size_t begin = 0, end = 0;
};
page_span whole_pages(size_t offset, size_t n, size_t size) {
  if (offset >= size) return {};
  n = std::min(n, size - offset);
  const size_t ps = page_size();
  const page_span s{(offset + ps - 1) / ps * ps, (offset + n) / ps * ps};
  return s.end > s.begin ? s : page_span{};
}
#endif

}  // namespace

// ---- mapped_file ----

struct mapped_file::impl {
  std::string path;
  void* addr = nullptr;
  size_t size = 0;
};

const bool mapped_file::SUPPORTED = TROUPE_POSIX != 0;

mapped_file::mapped_file(const std::filesystem::path& path) : impl_(std::make_unique<impl>()) {
  impl_->path = path.string();
#if TROUPE_POSIX
  const int fd = ::open(impl_->path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw error(sys_error("cannot open", impl_->path));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const std::string msg = sys_error("cannot stat", impl_->path);
    ::close(fd);
    throw error(msg);
  }
  impl_->size = static_cast<size_t>(st.st_size);
  if (impl_->size > 0) {
    void* p = ::mmap(nullptr, impl_->size, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      const std::string msg = sys_error("cannot map", impl_->path);
      ::close(fd);
      throw error(msg);
    }
    impl_->addr = p;
  }
  ::close(fd);  // the mapping keeps the file
#else
  throw error("cannot map '" + impl_->path + "': memory maps are not supported on this platform");
#endif
}

mapped_file::~mapped_file() {
#if TROUPE_POSIX
  if (impl_ && impl_->addr != nullptr) ::munmap(impl_->addr, impl_->size);
#endif
}

mapped_file::mapped_file(mapped_file&&) noexcept = default;
mapped_file& mapped_file::operator=(mapped_file&&) noexcept = default;

const std::byte* mapped_file::data() const { return static_cast<const std::byte*>(impl_->addr); }

void mapped_file::prefetch(size_t offset, size_t n) const {
#if TROUPE_POSIX
  if (impl_->addr == nullptr || offset >= impl_->size) return;
  n = std::min(n, impl_->size - offset);
  const size_t ps = page_size();
  const size_t begin = offset / ps * ps;
  auto* p = static_cast<char*>(impl_->addr) + begin;
  if (posix_madvise(p, n + (offset - begin), POSIX_MADV_WILLNEED) != 0) {
    TROUPE_LOG(debug, "posix_madvise(WILLNEED) failed on " << impl_->path << ": " << std::strerror(errno));
  }
#else
  (void)offset;
  (void)n;
#endif
}

void mapped_file::release(size_t offset, size_t n) {
#if TROUPE_POSIX
  if (impl_->addr == nullptr) return;
  const auto [begin, end] = whole_pages(offset, n, impl_->size);
  if (end == begin) return;
  // Replace the pages with an inaccessible anonymous mapping: the memory is returned, and a stray read of
  // released weights faults instead of silently reading the file again.
  void* p = static_cast<char*>(impl_->addr) + begin;
  if (::mmap(p, end - begin, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == MAP_FAILED) {
    TROUPE_LOG(warn, "cannot release " << (end - begin) << " bytes of the mapping of " << impl_->path << ": "
                                       << std::strerror(errno));
    return;
  }
#else
  (void)offset;
  (void)n;
#endif
}

void mapped_file::drop(size_t offset, size_t n) const {
#if TROUPE_POSIX
  if (impl_->addr == nullptr) return;
  const auto [begin, end] = whole_pages(offset, n, impl_->size);
  if (end == begin) return;
  // A private read-only file mapping: the pages are dropped from this process, the page cache keeps them.
  (void)::madvise(static_cast<char*>(impl_->addr) + begin, end - begin, MADV_DONTNEED);
#else
  (void)offset;
  (void)n;
#endif
}

// ---- memory_lock ----

const bool memory_lock::SUPPORTED = TROUPE_POSIX != 0;

memory_lock::memory_lock(const void* addr, size_t size) : addr_(addr), size_(size) {
#if TROUPE_POSIX
  if (size_ == 0) return;
  if (::mlock(addr_, size_) == 0) {
    locked_ = true;
    return;
  }
  struct rlimit lim {};
  getrlimit(RLIMIT_MEMLOCK, &lim);
  TROUPE_LOG(warn, "mlock of " << size_ << " bytes failed (" << std::strerror(errno) << "); RLIMIT_MEMLOCK is "
                               << lim.rlim_cur << " bytes; the model stays usable but may be paged out");
#endif
}

memory_lock::~memory_lock() {
#if TROUPE_POSIX
  if (locked_) ::munlock(addr_, size_);
#endif
}

// ---- model_file ----

model_file::model_file(const std::filesystem::path& path) : path_(path.string()) {
#if TROUPE_POSIX
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw error(sys_error("cannot open", path_));
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    const std::string msg = sys_error("cannot stat", path_);
    ::close(fd_);
    throw error(msg);
  }
  size_ = static_cast<size_t>(st.st_size);
#else
  throw error("cannot open '" + path_ + "': unsupported platform");
#endif
}

model_file::~model_file() {
#if TROUPE_POSIX
  if (fd_ >= 0) ::close(fd_);
#endif
}

void model_file::read_at(size_t offset, void* dst, size_t n) const {
#if TROUPE_POSIX
  auto* out = static_cast<char*>(dst);
  size_t done = 0;
  while (done < n) {
    const ssize_t r = ::pread(fd_, out + done, n - done, static_cast<off_t>(offset + done));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      throw error("cannot read " + std::to_string(n) + " bytes at offset " + std::to_string(offset) + " of '" + path_ +
                  "' (file size " + std::to_string(size_) + ")" + (r < 0 ? std::string(": ") + std::strerror(errno) : ""));
    }
    done += static_cast<size_t>(r);
  }
#else
  (void)offset;
  (void)dst;
  (void)n;
#endif
}

}  // namespace troupe
