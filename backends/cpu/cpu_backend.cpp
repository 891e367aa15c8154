#include "backends/cpu/cpu_backend.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <new>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "backends/cpu/kernels.h"
#include "backends/cpu/thread_pool.h"
#include "runtime/error.h"
#include "runtime/huge_pages.h"

namespace troupe::cpu {
namespace {

constexpr size_t host_alignment = 64;

}  // namespace

// ---- buffers ----

void host_memory_buffer::set_tensor(tensor& t, const void* data, size_t offset, size_t size) {
  std::memcpy(static_cast<char*>(t.data) + offset, data, size);
}
void host_memory_buffer::get_tensor(const tensor& t, void* data, size_t offset, size_t size) {
  std::memcpy(data, static_cast<const char*>(t.data) + offset, size);
}
void host_memory_buffer::memset_tensor(tensor& t, uint8_t value, size_t offset, size_t size) {
  std::memset(static_cast<char*>(t.data) + offset, value, size);
}
void host_memory_buffer::clear(uint8_t value) { std::memset(base_, value, size()); }

namespace {

class host_buffer final : public host_memory_buffer {
 public:
  // owned: memory from aligned_alloc, freed with the buffer; otherwise the caller's memory.
  host_buffer(buffer_type_i& type, void* base, size_t size, bool owned)
      : host_memory_buffer(type, base, size), owned_(owned) {}
  // Memory in (2 MiB) pages of its own, unmapped with the buffer.
  host_buffer(buffer_type_i& type, host_pages pages, size_t size)
      : host_memory_buffer(type, pages.data(), size), owned_(false), pages_(std::move(pages)) {}
  ~host_buffer() override {
    if (owned_) std::free(base());
  }
  bool copy_tensor(const tensor& src, tensor& dst) override {
    if (src.buffer == nullptr || !src.buffer->is_host()) return false;
    std::memcpy(dst.data, src.data, nbytes(src));
    return true;
  }

 private:
  bool owned_;
  host_pages pages_;
};

class host_buffer_type_impl final : public buffer_type_i {
 public:
  host_buffer_type_impl(std::string name, size_t max_size) : name_(std::move(name)), max_size_(max_size) {}
  std::string_view name() const override { return name_; }
  buffer_ptr alloc_buffer(size_t size) override {
    if (size > max_size_) {
      throw out_of_memory_error("buffer type " + name_ + ": " + std::to_string(size) + " bytes exceed its max size " +
                                std::to_string(max_size_));
    }
    // Never hand out a null base, even for an empty buffer, so tensors of size 0 still have an address.
    // Buffers of a huge page or more (weights, KV cache, compute) get pages of their own, advised to be
    // transparent huge pages (runtime/huge_pages.h: streamed weights read ~40% faster from them).
    if (size >= host_pages::huge_page) {
      host_pages pages = host_pages::allocate(size);
      if (pages.data() != nullptr) return std::make_unique<host_buffer>(*this, std::move(pages), size);
    }
    const size_t bytes = std::max<size_t>(host_alignment, (size + host_alignment - 1) / host_alignment * host_alignment);
    void* p = std::aligned_alloc(host_alignment, bytes);
    if (p == nullptr) {
      throw out_of_memory_error("buffer type " + name_ + ": cannot allocate " + std::to_string(size) + " bytes");
    }
    return std::make_unique<host_buffer>(*this, p, size, true);
  }
  size_t alignment() const override { return host_alignment; }
  size_t max_size() const override { return max_size_; }
  bool is_host() const override { return true; }
  device_i& device() const override { return cpu_device(); }

 private:
  std::string name_;
  size_t max_size_;
};

// ---- backend ----

bool is_noop(const tensor& t) {
  switch (t.op) {
    case op::none:
    case op::view:
    case op::reshape:
    case op::permute:
    case op::transpose:
      return true;
    default:
      return nelements(t) == 0;
  }
}

class cpu_backend_impl final : public cpu_backend {
 public:
  explicit cpu_backend_impl(const cpu_backend_params& p)
      : reference_(p.reference),
        n_threads_(p.reference ? 1 : (p.n_threads > 0 ? p.n_threads : hardware_threads())),
        pool_(std::make_unique<thread_pool>(n_threads_)) {}

  std::string_view name() const override { return reference_ ? "CPU-reference" : "CPU"; }
  device_i& device() const override { return cpu_device(); }

  void set_n_threads(int n) override {
    if (reference_) return;
    n = n > 0 ? n : hardware_threads();
    if (n == n_threads_) return;
    n_threads_ = n;
    pool_ = std::make_unique<thread_pool>(n_threads_);
  }
  int n_threads() const override { return n_threads_; }

  void graph_compute(graph& g) override {
    const int nth = n_threads_;
    const auto nodes = g.nodes();
    // Threads per node: small nodes run on thread 0 alone. A barrier separates two nodes only when one of
    // them runs on several threads, so a run of small nodes (token generation on a small model) costs no
    // synchronisation at all.
    tasks_.assign(nodes.size(), 0);
    size_t wsize = 0;
    for (size_t i = 0; i < nodes.size(); ++i) {
      tensor* node = nodes[i];
      if (is_noop(*node)) continue;
      if (!supports_op_checked(*node)) {
        throw backend_error("CPU: cannot compute node " + describe(*node) + " (op " + std::string(op_name(node->op)) +
                            ") with these source types or layouts");
      }
      if (node->data == nullptr) {
        throw backend_error("CPU: node " + describe(*node) + " has no memory (graph not allocated)");
      }
      tasks_[i] = nth > 1 && is_small(*node) ? 1 : nth;
      wsize = std::max(wsize, work_size(*node, tasks_[i], reference_));
    }
    if (wsize > work_.size) work_.resize(wsize);

    // next_[i]: index of the next node that computes anything (nodes.size() at the end).
    next_.assign(nodes.size() + 1, nodes.size());
    for (size_t i = nodes.size(); i-- > 0;) next_[i] = tasks_[i] ? i : next_[i + 1];

    // A graph of small nodes only (token generation on a small model) runs on the calling thread: waking
    // the pool would cost more than the whole graph.
    const bool all_small = std::all_of(tasks_.begin(), tasks_.end(), [](int n) { return n <= 1; });
    pool_->run(all_small ? 1 : nth, [&](int ith, barrier& b) {
      compute_params params;
      params.ith = ith;
      params.wdata = work_.data;
      params.wsize = work_.size;
      params.reference = reference_;
      for (size_t i = next_[0]; i < nodes.size(); i = next_[i + 1]) {
        const int n = tasks_[i];
        if (ith < n) {
          params.nth = n;
          params.barrier = n > 1 ? std::function<void()>([&b] { b.wait(); }) : std::function<void()>();
          compute_forward(params, *nodes[i]);
        }
        const size_t j = next_[i + 1];
        const bool needs_barrier = !all_small && (n > 1 || (j < nodes.size() && tasks_[j] > 1));
        if (needs_barrier && !b.wait()) return;
      }
    });
  }

 private:
  bool supports_op_checked(const tensor& t) const { return supports_op(t); }

  // Below this much work a node is faster on one thread than split: the split costs a barrier (about a
  // microsecond with two threads), the work a few nanoseconds per element or multiply-add.
  static constexpr int64_t small_mul_mat_macs = 1 << 16;
  static constexpr int64_t small_elements = 1 << 12;
  static bool is_small(const tensor& t) {
    switch (t.op) {
      case op::mul_mat:
        return t.src[0]->ne[0] * nelements(t) < small_mul_mat_macs;  // k * m * n
      case op::get_rows:
        return nelements(t) < small_elements;  // the rows read, not the table
      case op::set_rows:
        return nelements(*t.src[1]) < small_elements;  // the rows written, not the cache
      case op::flash_attn:
        // A decode step's output is one row per head, but its work is the query rows times the cells: K and V
        // read whole (a 1B model's step at 4,096 cells reads 8 MiB per layer).
        return t.src[1]->ne[1] * nelements(*t.src[0]) < small_mul_mat_macs;  // cells * query values
      default:
        return std::max(nelements(t), t.src[0] ? nelements(*t.src[0]) : 0) < small_elements;
    }
  }

  std::vector<int> tasks_;
  std::vector<size_t> next_;

  struct work_buffer {
    uint8_t* data = nullptr;
    size_t size = 0;
    ~work_buffer() { std::free(data); }
    void resize(size_t n) {
      std::free(data);
      data = nullptr;
      size = 0;
      const size_t bytes = (n + host_alignment - 1) / host_alignment * host_alignment;
      data = static_cast<uint8_t*>(std::aligned_alloc(host_alignment, bytes));
      if (data == nullptr) throw out_of_memory_error("CPU: cannot allocate a work buffer of " + std::to_string(n) + " bytes");
      size = n;
    }
  };

  bool reference_;
  int n_threads_;
  std::unique_ptr<thread_pool> pool_;
  work_buffer work_;
};

// ---- device ----

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
    }
  }
  return "CPU";
}

class cpu_device_impl final : public device_i {
 public:
  cpu_device_impl() : buffer_type_("CPU", SIZE_MAX), description_(cpu_model_name()) {}
  std::string_view name() const override { return "CPU"; }
  std::string description() const override { return description_; }
  device_type type() const override { return device_type::cpu; }
  device_memory memory() const override {
    const long pages = sysconf(_SC_PHYS_PAGES);
    const long avail = sysconf(_SC_AVPHYS_PAGES);
    const long page = sysconf(_SC_PAGE_SIZE);
    device_memory m;
    if (pages > 0 && page > 0) m.total = static_cast<size_t>(pages) * static_cast<size_t>(page);
    if (avail > 0 && page > 0) m.free = static_cast<size_t>(avail) * static_cast<size_t>(page);
    return m;
  }
  device_caps caps() const override {
    device_caps c;
    c.buffer_from_host_ptr = true;
    return c;
  }
  backend_ptr init_backend() override { return make_cpu_backend(); }
  buffer_type_i& buffer_type() override { return buffer_type_; }
  buffer_ptr buffer_from_host_ptr(void* ptr, size_t size, size_t max_tensor_size) override {
    (void)max_tensor_size;
    if (ptr == nullptr) throw backend_error("CPU: buffer_from_host_ptr with a null pointer");
    return std::make_unique<host_buffer>(buffer_type_, ptr, size, false);
  }
  bool supports_op(const tensor& t) const override { return cpu::supports_op(t); }
  bool supports_buft(const buffer_type_i& b) const override { return b.is_host(); }

 private:
  host_buffer_type_impl buffer_type_;
  std::string description_;
};

}  // namespace

int hardware_threads() {
  const unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

device_i& cpu_device() {
  static cpu_device_impl dev;
  return dev;
}

void register_cpu_backend() { registry::instance().add(cpu_device()); }

std::unique_ptr<cpu_backend> make_cpu_backend(const cpu_backend_params& params) {
  return std::make_unique<cpu_backend_impl>(params);
}

std::unique_ptr<buffer_type_i> make_host_buffer_type(std::string name, size_t max_size) {
  return std::make_unique<host_buffer_type_impl>(std::move(name), max_size);
}

}  // namespace troupe::cpu
