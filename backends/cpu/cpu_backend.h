// The CPU device, its host buffer type and its backend (a thread pool running graphs node by node).
//
//   register_cpu_backend();                         // adds device "CPU" to the registry
//   auto be = make_cpu_backend({.n_threads = 2});   // or registry.find("CPU")->init_backend()
//   be->graph_compute(g);
//
// Host buffers are 64-byte aligned heap memory; their buffer type's max_size is configurable (default
// unbounded) so that chunked compute allocation can be exercised on the CPU. buffer_from_host_ptr wraps
// memory the caller owns (mmapped weights) without copying.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "runtime/backend.h"

namespace troupe::cpu {

struct cpu_backend_params {
  int n_threads = 0;       // 0: the machine's hardware threads
  bool reference = false;  // scalar reference kernels on one thread (the conformance suite's baseline)
};

class cpu_backend : public backend_i {
 public:
  virtual int n_threads() const = 0;
};

// A buffer in memory the CPU addresses directly: tensors are read, written and cleared with memcpy and
// memset. Who owns the memory (and how it is freed) is the derived class's business.
class host_memory_buffer : public buffer_i {
 public:
  void* base() override { return base_; }
  void set_tensor(tensor& t, const void* data, size_t offset, size_t size) override;
  void get_tensor(const tensor& t, void* data, size_t offset, size_t size) override;
  void memset_tensor(tensor& t, uint8_t value, size_t offset, size_t size) override;
  void clear(uint8_t value) override;

 protected:
  host_memory_buffer(buffer_type_i& type, void* base, size_t size) : buffer_i(type, size), base_(base) {}

 private:
  void* base_;
};

// The CPU device (registered as "CPU" by register_cpu_backend()).
device_i& cpu_device();
// Registers the CPU device. Idempotent.
void register_cpu_backend();
std::unique_ptr<cpu_backend> make_cpu_backend(const cpu_backend_params& params = {});

// A host buffer type named `name` whose buffers are at most max_size bytes (alloc_buffer of more throws).
std::unique_ptr<buffer_type_i> make_host_buffer_type(std::string name, size_t max_size = SIZE_MAX);

// Machine facts the CPU backend uses.
int hardware_threads();

}  // namespace troupe::cpu
