#include "backends/cpu_instance.h"

#include <sys/mman.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "backends/cpu/cpu_backend.h"
#include "runtime/error.h"

namespace troupe {

namespace {

constexpr size_t instance_alignment = 64;

class instance_device;

class instance_buffer_type final : public buffer_type_i {
 public:
  instance_buffer_type(instance_device& dev, std::string name, size_t limit) : dev_(dev), name_(std::move(name)), limit_(limit) {}
  std::string_view name() const override { return name_; }
  buffer_ptr alloc_buffer(size_t size) override;
  size_t alignment() const override { return instance_alignment; }
  device_i& device() const override;
  size_t used() const { return used_.load(); }
  size_t limit() const { return limit_; }
  void release(size_t n) { used_.fetch_sub(n); }

 private:
  instance_device& dev_;
  std::string name_;
  size_t limit_;
  std::atomic<size_t> used_{0};
};

// Memory the CPU reads directly, counted against the instance's limit. Large buffers are anonymous
// mappings of their own (as a device allocation is), so every allocation costs the same (fresh pages, no
// reuse of freed heap memory) and measurements of loading do not depend on the allocator's history.
constexpr size_t mapped_min = size_t{1} << 20;

void* alloc_memory(size_t bytes) {
  if (bytes < mapped_min) return std::aligned_alloc(instance_alignment, bytes);
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

void free_memory(void* p, size_t bytes) {
  if (bytes < mapped_min) {
    std::free(p);
  } else {
    munmap(p, bytes);
  }
}

class instance_buffer final : public cpu::host_memory_buffer {
 public:
  instance_buffer(instance_buffer_type& type, void* base, size_t size, size_t bytes)
      : host_memory_buffer(type, base, size), owner_(type), bytes_(bytes) {}
  ~instance_buffer() override {
    free_memory(base(), bytes_);
    owner_.release(bytes_);
  }

 private:
  instance_buffer_type& owner_;
  size_t bytes_;
};

class instance_backend final : public backend_i {
 public:
  instance_backend(device_i& dev, std::string name, int n_threads)
      : dev_(dev), name_(std::move(name)), inner_(cpu::make_cpu_backend({.n_threads = n_threads})) {}
  std::string_view name() const override { return name_; }
  device_i& device() const override { return dev_; }
  void graph_compute(graph& g) override { inner_->graph_compute(g); }

 private:
  device_i& dev_;
  std::string name_;
  std::unique_ptr<cpu::cpu_backend> inner_;
};

class instance_device final : public device_i {
 public:
  explicit instance_device(const cpu_instance_params& p)
      : name_("CPU" + std::to_string(p.index)), n_threads_(p.n_threads), buft_(*this, name_, p.memory) {}
  std::string_view name() const override { return name_; }
  std::string description() const override { return "CPU instance " + name_ + " (" + cpu::cpu_device().description() + ")"; }
  device_type type() const override { return device_type::cpu; }
  device_memory memory() const override {
    if (buft_.limit() == 0) return cpu::cpu_device().memory();
    return {buft_.limit() - std::min(buft_.limit(), buft_.used()), buft_.limit()};
  }
  device_caps caps() const override { return {}; }
  backend_ptr init_backend() override { return std::make_unique<instance_backend>(*this, name_, n_threads_); }
  buffer_type_i& buffer_type() override { return buft_; }
  bool supports_op(const tensor& t) const override { return cpu::cpu_device().supports_op(t); }
  bool supports_buft(const buffer_type_i& b) const override { return &b == &buft_ || b.is_host(); }

 private:
  std::string name_;
  int n_threads_;
  instance_buffer_type buft_;
};

buffer_ptr instance_buffer_type::alloc_buffer(size_t size) {
  const size_t bytes = std::max(instance_alignment, (size + instance_alignment - 1) / instance_alignment * instance_alignment);
  if (limit_ > 0) {
    size_t cur = used_.load();
    do {
      if (cur + bytes > limit_) {
        throw out_of_memory_error("buffer type " + name_ + ": cannot allocate " + std::to_string(size) + " bytes (" +
                                  std::to_string(limit_ - cur) + " of " + std::to_string(limit_) + " bytes free)");
      }
    } while (!used_.compare_exchange_weak(cur, cur + bytes));
  } else {
    used_.fetch_add(bytes);
  }
  void* p = alloc_memory(bytes);
  if (p == nullptr) {
    used_.fetch_sub(bytes);
    throw out_of_memory_error("buffer type " + name_ + ": cannot allocate " + std::to_string(size) + " bytes");
  }
  return std::make_unique<instance_buffer>(*this, p, size, bytes);
}

device_i& instance_buffer_type::device() const { return dev_; }

std::mutex instances_mutex;

}  // namespace

device_i& add_cpu_instance(const cpu_instance_params& p) {
  if (p.index < 1) throw error("cpu instance: index " + std::to_string(p.index) + " (must be >= 1)");
  std::lock_guard<std::mutex> lock(instances_mutex);
  const std::string name = "CPU" + std::to_string(p.index);
  if (device_i* d = registry::instance().find(name)) return *d;
  return registry::instance().add(std::make_unique<instance_device>(p));
}

}  // namespace troupe
