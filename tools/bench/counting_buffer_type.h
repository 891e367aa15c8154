// Test support for allocator tests: a host buffer type that counts the bytes it allocates.
#pragma once

#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "runtime/backend.h"
#include "runtime/error.h"
#include "runtime/graph.h"
#include "runtime/alloc_check.h"
#include "runtime/graph_allocator.h"

namespace troupe::testing {

// Host memory; alloc_buffer of more than max_size still works when asked (the allocator's last chunk) but is
// recorded, so tests can see it.
class counting_buffer_type final : public buffer_type_i {
 public:
  counting_buffer_type(std::string name, size_t max_size, size_t alignment = 8)
      : name_(std::move(name)), max_size_(max_size), alignment_(alignment) {}

  std::string_view name() const override { return name_; }
  size_t alignment() const override { return alignment_; }
  size_t max_size() const override { return max_size_; }
  bool is_host() const override { return true; }
  device_i& device() const override { throw backend_error("counting_buffer_type has no device"); }
  buffer_ptr alloc_buffer(size_t size) override;

  size_t allocated = 0;  // bytes of live buffers
  size_t n_buffers = 0;  // live buffers
  size_t largest = 0;    // largest single buffer ever

 private:
  std::string name_;
  size_t max_size_;
  size_t alignment_;
};

class counting_buffer final : public buffer_i {
 public:
  counting_buffer(counting_buffer_type& type, size_t size) : buffer_i(type, size), owner_(type) {
    mem_ = std::calloc(1, size == 0 ? 1 : size);
    owner_.allocated += size;
    owner_.n_buffers += 1;
    if (size > owner_.largest) owner_.largest = size;
  }
  ~counting_buffer() override {
    std::free(mem_);
    owner_.allocated -= size();
    owner_.n_buffers -= 1;
  }
  void* base() override { return mem_; }
  void set_tensor(tensor& t, const void* d, size_t o, size_t n) override { std::memcpy(static_cast<char*>(t.data) + o, d, n); }
  void get_tensor(const tensor& t, void* d, size_t o, size_t n) override { std::memcpy(d, static_cast<const char*>(t.data) + o, n); }
  void memset_tensor(tensor& t, uint8_t v, size_t o, size_t n) override { std::memset(static_cast<char*>(t.data) + o, v, n); }
  void clear(uint8_t v) override { std::memset(mem_, v, size()); }

 private:
  counting_buffer_type& owner_;
  void* mem_;
};

inline buffer_ptr counting_buffer_type::alloc_buffer(size_t size) { return std::make_unique<counting_buffer>(*this, size); }

}  // namespace troupe::testing
