// Platform handles for model files: read-only memory maps and memory locks (pimpl; SUPPORTED says whether
// the platform has them, so callers can fall back to reads).
//
//   if (mapped_file::SUPPORTED) {
//     mapped_file m(path);                    // the whole file, read-only, shared
//     m.prefetch(offset, n);                  // posix_madvise(WILLNEED): start reading ahead
//     const std::byte* p = m.data() + offset; // weights used in place
//     memory_lock lock(p, n);                 // optional: keep the weights resident (mlock)
//     m.release(offset, n);                   // pages already copied to a device are dropped from memory
//   }
//
// Failures throw error naming the file and the system error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

namespace troupe {

class mapped_file {
 public:
  static const bool SUPPORTED;

  explicit mapped_file(const std::filesystem::path& path);
  ~mapped_file();
  mapped_file(const mapped_file&) = delete;
  mapped_file& operator=(const mapped_file&) = delete;
  mapped_file(mapped_file&&) noexcept;
  mapped_file& operator=(mapped_file&&) noexcept;

  const std::byte* data() const;

  // Hints that bytes [offset, offset + n) will be read soon (no effect where unsupported).
  void prefetch(size_t offset, size_t n) const;
  // Drops the whole pages inside [offset, offset + n) from this mapping: their memory is returned and the
  // bytes must not be read through this mapping again. Pages shared with the rest of the range's
  // neighbours are kept.
  void release(size_t offset, size_t n);
  // Unmaps the whole pages inside [offset, offset + n) from this process (MADV_DONTNEED) without making them
  // unreadable: a later read faults them in again from the file. A copy's source pages, dropped as it goes,
  // so that a model's weights are not resident twice while they are copied (the peak RSS).
  void drop(size_t offset, size_t n) const;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

// Locks a range of memory into RAM for the lock's lifetime (best effort: a limit that is too low is reported
// by warn, not thrown, since the model still works unlocked).
class memory_lock {
 public:
  static const bool SUPPORTED;
  memory_lock(const void* addr, size_t size);
  ~memory_lock();
  memory_lock(const memory_lock&) = delete;
  memory_lock& operator=(const memory_lock&) = delete;

 private:
  const void* addr_;
  size_t size_;
  bool locked_ = false;
};

// A file read with pread at explicit offsets (no shared file position: safe from several threads).
class model_file {
 public:
  explicit model_file(const std::filesystem::path& path);
  ~model_file();
  model_file(const model_file&) = delete;
  model_file& operator=(const model_file&) = delete;
  // Reads exactly n bytes at offset into dst; throws error naming the file, offset and size on a short read.
  void read_at(size_t offset, void* dst, size_t n) const;

 private:
  int fd_ = -1;
  size_t size_ = 0;
  std::string path_;
};

}  // namespace troupe
