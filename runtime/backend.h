// Backend interfaces: registry -> device -> backend (a stream that runs graphs), buffer type -> buffer.
//
//   register_builtin_backends();                         // backends/registry.h: every compiled backend
//   device_i& dev = *registry::instance().devices()[0];  // "CPU", "Vulkan0", "CUDA0", "RPC[host:port]"...
//   backend_ptr be = dev.init_backend();
//   context ctx({.max_tensors = 64, .no_alloc = true});
//   ... build tensors and ops ...
//   buffer_ptr buf = alloc_ctx_tensors(ctx, dev.buffer_type());  // place every tensor in one buffer
//   tensor_set(*x, host_data, 0, nbytes(*x));
//   graph g; g.build_forward_expand(y);
//   be->graph_compute(g);
//   tensor_get(*y, out, 0, nbytes(*y));
//
// Capabilities are asked (supports_op, supports_buft, caps()), never guessed from a device's type. Every
// optional method says so and what its default does. Failures throw backend_error.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/context.h"
#include "runtime/graph.h"
#include "runtime/tensor.h"

namespace troupe {

class device_i;
class buffer_type_i;
class buffer_i;
class backend_i;

using buffer_ptr = std::unique_ptr<buffer_i>;
using backend_ptr = std::unique_ptr<backend_i>;

enum class buffer_usage : uint8_t { any, weights, compute };

// How memory of one kind is allocated on a device: "CPU", "Vulkan0", "CUDA0_host"...
class buffer_type_i {
 public:
  virtual ~buffer_type_i() = default;
  virtual std::string_view name() const = 0;
  // A buffer of size bytes. Throws backend_error (naming this type and the size) when it cannot.
  virtual buffer_ptr alloc_buffer(size_t size) = 0;
  // Alignment of every tensor placed in buffers of this type (a power of two).
  virtual size_t alignment() const = 0;
  // Optional: the largest buffer this type can allocate. Default: unbounded (SIZE_MAX).
  virtual size_t max_size() const { return SIZE_MAX; }
  // Optional: bytes tensor t occupies in a buffer of this type (padding for kernels). Default: nbytes(t).
  virtual size_t alloc_size(const tensor& t) const { return nbytes(t); }
  // Optional: whether the memory is host memory the CPU may read and write directly. Default: false.
  virtual bool is_host() const { return false; }
  virtual device_i& device() const = 0;
};

// A block of memory of one buffer type, holding tensors.
class buffer_i {
 public:
  buffer_i(buffer_type_i& type, size_t size) : type_(&type), size_(size) {}
  virtual ~buffer_i() = default;
  buffer_i(const buffer_i&) = delete;
  buffer_i& operator=(const buffer_i&) = delete;

  buffer_type_i& type() const { return *type_; }
  size_t size() const { return size_; }
  buffer_usage usage() const { return usage_; }
  void set_usage(buffer_usage u) { usage_ = u; }
  bool is_host() const { return type_->is_host(); }

  // Start of the buffer: a host address, or an opaque device address-space base that tensors' data fields
  // are offsets from (never dereferenced by the host unless is_host()).
  virtual void* base() = 0;
  // Optional: prepare backend-private state (tensor::extra) of a tensor placed in this buffer. Default: none.
  virtual void init_tensor(tensor& t) { (void)t; }
  // Copies size bytes from host memory into t's data at byte offset.
  virtual void set_tensor(tensor& t, const void* data, size_t offset, size_t size) = 0;
  // Copies size bytes at byte offset of t's data into host memory.
  virtual void get_tensor(const tensor& t, void* data, size_t offset, size_t size) = 0;
  // Sets size bytes at byte offset of t's data to value.
  virtual void memset_tensor(tensor& t, uint8_t value, size_t offset, size_t size) = 0;
  // Optional: copies src (in any buffer) into dst (in this buffer) directly. Default: false, and the caller
  // copies through host memory.
  virtual bool copy_tensor(const tensor& src, tensor& dst) {
    (void)src;
    (void)dst;
    return false;
  }
  // Sets every byte of the buffer to value.
  virtual void clear(uint8_t value) = 0;

 private:
  buffer_type_i* type_;
  size_t size_;
  buffer_usage usage_ = buffer_usage::any;
};

// A stream of work on one device: runs graphs, moves tensor data.
class backend_i {
 public:
  virtual ~backend_i() = default;
  virtual std::string_view name() const = 0;
  virtual device_i& device() const = 0;
  // Optional: starts a host -> tensor copy that may complete after return (host memory must stay valid until
  // synchronize()). Default: synchronous tensor_set.
  virtual void set_tensor_async(tensor& t, const void* data, size_t offset, size_t size);
  // Optional: tensor -> host, may complete after return. Default: synchronous tensor_get.
  virtual void get_tensor_async(const tensor& t, void* data, size_t offset, size_t size);
  // Optional: waits for all queued work. Default: nothing to wait for.
  virtual void synchronize() {}
  // Computes every node of g in order (all tensors placed in buffers this backend can use). Throws
  // backend_error naming the node when a node is unsupported or the device fails.
  virtual void graph_compute(graph& g) = 0;
  // Backends that queue graphs (a remote peer: graph_submit returns once the graph is on its way, and the
  // device runs what it was sent in order) say so; the others compute in graph_submit. g itself may go once
  // graph_submit returns, its tensors' memory not before the graph has finished.
  virtual bool queues_graphs() const { return false; }
  virtual void graph_submit(graph& g) { graph_compute(g); }
  // Waits up to timeout for the oldest graph submitted and not finished, returning early (false) when
  // wake_fd (>= 0) becomes readable; true once it has finished, or when none was waiting. Rethrows its
  // failure (the next call waits for the next graph). synchronize() waits for them all.
  virtual bool finish_oldest(std::chrono::microseconds timeout, int wake_fd = -1);
  // Optional: how many host threads this backend computes with (0: every hardware thread). Default: ignored,
  // for backends whose work does not run on host threads.
  virtual void set_n_threads(int n) { (void)n; }

  bool supports_op(const tensor& t) const;
  bool supports_buft(const buffer_type_i& b) const;
};

enum class device_type : uint8_t { cpu, gpu, igpu, accel };
std::string_view device_type_name(device_type t);

struct device_caps {
  bool async = false;                 // set/get_tensor_async really overlap with host work
  bool host_buffer = false;           // has a pinned host buffer type for faster uploads
  bool buffer_from_host_ptr = false;  // can wrap existing host memory (mmapped weights) without copying
  bool events = false;                // cross-stream events
};

struct device_memory {
  size_t free = 0;
  size_t total = 0;
};

// One device: a CPU, a GPU, a remote peer's device.
class device_i {
 public:
  virtual ~device_i() = default;
  virtual std::string_view name() const = 0;         // unique: "CPU", "Vulkan0"
  virtual std::string description() const = 0;       // human-readable model name
  virtual device_type type() const = 0;
  // Whether this device computes with troupe's CPU kernels (a CPU, or a remote peer's CPU): its layers keep
  // the CPU's KV layout (a row per cell) and attention graph, so they give the local CPU's bits.
  virtual bool cpu_kernels() const { return type() == device_type::cpu; }
  virtual device_memory memory() const = 0;
  virtual device_caps caps() const = 0;
  virtual backend_ptr init_backend() = 0;
  // The default buffer type for this device's tensors.
  virtual buffer_type_i& buffer_type() = 0;
  // Optional: pinned host memory for staging uploads. Default: none (null).
  virtual buffer_type_i* host_buffer_type() { return nullptr; }
  // Optional (caps().buffer_from_host_ptr): a buffer over existing host memory that the caller keeps alive
  // and unchanged for the buffer's lifetime; max_tensor_size bounds any tensor placed in it. Default: throws.
  virtual buffer_ptr buffer_from_host_ptr(void* ptr, size_t size, size_t max_tensor_size);
  // Whether this device can compute node t with its sources' types and layouts.
  virtual bool supports_op(const tensor& t) const = 0;
  // Whether this device's backends can read and write tensors in buffers of type b.
  virtual bool supports_buft(const buffer_type_i& b) const = 0;
};

// All devices of this process. Backends register their devices; the registry owns them.
class registry {
 public:
  static registry& instance();
  // Adds a device; a device whose name is already registered is ignored (registration is idempotent).
  device_i& add(std::unique_ptr<device_i> dev);
  // Adds a process-wide device the registry does not own (it must outlive every user of the registry).
  device_i& add(device_i& dev);
  std::vector<device_i*> devices() const;
  device_i* find(std::string_view name) const;
  // The first device of this type, or null.
  device_i* first_of(device_type t) const;

 private:
  std::vector<device_i*> devices_;
  std::vector<std::unique_ptr<device_i>> owned_;
};

// ---- placing tensors in buffers ----

// Makes t live at addr inside buf (t.data = addr, t.buffer = &buf) and initializes it. addr must lie inside
// buf with room for alloc_size(t).
void tensor_alloc(buffer_i& buf, tensor& t, void* addr);
// Points a view at its view_src's data (the source must be placed).
void view_init(tensor& t);
// Places every tensor of ctx that has no data yet into one new buffer of type bt (views share their
// source's memory), or returns null when ctx holds no tensor needing memory.
buffer_ptr alloc_ctx_tensors(context& ctx, buffer_type_i& bt);

// ---- moving tensor data (bounds-checked: throws backend_error naming the tensor) ----
void tensor_set(tensor& t, const void* data, size_t offset, size_t size);
void tensor_get(const tensor& t, void* data, size_t offset, size_t size);
void tensor_memset(tensor& t, uint8_t value, size_t offset, size_t size);
// Copies src's bytes into dst (same byte size), directly when dst's buffer can, else through host memory.
void tensor_copy(const tensor& src, tensor& dst);

}  // namespace troupe
