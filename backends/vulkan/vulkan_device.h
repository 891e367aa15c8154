// Vulkan devices: every physical device with a compute queue, as troupe devices named Vulkan0, Vulkan1, ...
// (llama.cpp's convention), over one process-wide VkInstance.
//
//   for (vulkan::device* d : vulkan::devices()) {       // created once; empty without a loader or driver
//     d->name();                                        // "Vulkan0"
//     d->memory();                                      // device-local heaps; free from VK_EXT_memory_budget
//     buffer_ptr b = d->buffer_type().alloc_buffer(n);  // device-local memory, uploads through staging
//   }
//   vulkan::status();                                   // "1 device" / why there is none
//
// Everything is asked of the driver (heaps, budgets, limits, queue families), never assumed. The buffer
// type's max_size is the smaller of maxStorageBufferRange and maxMemoryAllocationSize (lavapipe: 128 MiB),
// so the graph allocator plans compute memory larger than that as several chunks.
//
// register_builtin_backends() (backends/registry.h) registers these devices; the backend (vulkan_backend.h)
// computes what the llama / qwen2 / qwen3 / gemma3 graphs need. See docs/architecture.md ("Vulkan").
#pragma once

#include <vulkan/vulkan.h>

#include <cstdint>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/backend.h"
#include "runtime/error.h"

namespace troupe::vulkan {

class buffer_type;

// A compute pipeline of one embedded shader: n storage buffers at bindings 0..n-1 and push constants.
struct kernel {
  VkShaderModule module = VK_NULL_HANDLE;
  VkDescriptorSetLayout set_layout = VK_NULL_HANDLE;
  VkPipelineLayout layout = VK_NULL_HANDLE;
  VkPipeline pipeline = VK_NULL_HANDLE;
};

// What the driver says about a device that troupe uses.
struct device_limits {
  uint64_t max_storage_buffer_range = 0;    // VkPhysicalDeviceLimits::maxStorageBufferRange
  uint64_t max_memory_allocation_size = 0;  // VkPhysicalDeviceMaintenance3Properties
  uint64_t min_storage_buffer_offset_alignment = 0;
  uint32_t max_compute_workgroup_invocations = 0;
  uint32_t max_workgroup_count_x = 0;       // maxComputeWorkGroupCount[0]
  uint32_t subgroup_size = 0;               // VkPhysicalDeviceSubgroupProperties
  bool subgroup_arithmetic = false;         // subgroupAdd in compute shaders (the matrix-vector shader's sums)
  bool memory_budget = false;               // VK_EXT_memory_budget (free memory from the driver)
};

class device final : public device_i {
 public:
  // Creates the logical device and its compute queue. Throws backend_error.
  device(VkInstance instance, VkPhysicalDevice physical, int index);
  ~device() override;
  device(const device&) = delete;
  device& operator=(const device&) = delete;

  std::string_view name() const override { return name_; }
  std::string description() const override { return description_; }
  device_type type() const override { return type_; }
  // A driver that runs on the CPU (lavapipe: VK_PHYSICAL_DEVICE_TYPE_CPU), where shaders without shared
  // memory and barriers run faster.
  bool is_cpu() const { return cpu_driver_; }
  device_memory memory() const override;
  device_caps caps() const override { return {}; }
  // A vulkan::backend (vulkan_backend.h) on this device.
  backend_ptr init_backend() override;
  buffer_type_i& buffer_type() override;
  bool supports_op(const tensor& t) const override;
  bool supports_buft(const buffer_type_i& b) const override;

  const device_limits& limits() const { return limits_; }

  // ---- for the buffers (vulkan_buffer.cpp) ----
  VkDevice handle() const { return device_; }
  uint32_t queue_family() const { return queue_family_; }
  // The pipeline of an embedded shader (shaders.h), created at its first use with the device's pipeline
  // cache. Thread-safe.
  const kernel& kernel_for(const char* shader, uint32_t n_buffers, uint32_t push_bytes);
  // Submits a recorded command buffer and waits for its fence (the queue is shared: submits are serialized).
  void submit_and_wait(VkCommandBuffer cmd, VkFence fence);
  // The index of a memory type allowed by `type_bits` with all of `want` (and, when possible, `prefer`).
  // Throws backend_error when none has `want`.
  uint32_t memory_type(uint32_t type_bits, VkMemoryPropertyFlags want, VkMemoryPropertyFlags prefer = 0) const;
  VkMemoryPropertyFlags memory_flags(uint32_t type) const { return memory_props_.memoryTypes[type].propertyFlags; }
  // Submits a recorded command buffer with a fence to signal, not waiting (the queue is shared: submits are
  // serialized).
  void submit(VkCommandBuffer cmd, VkFence fence);
  // Records commands with `record` into the transfer command buffer, submits them and waits (one transfer
  // at a time per device). Throws backend_error (out_of_memory_error, device lost) naming the device.
  template <class Record>
  void submit_and_wait(Record&& record);
  // Host-visible memory of at least `size` bytes for staging transfers, mapped (valid until the next call).
  // Used under transfer_mutex().
  void* staging(size_t size, VkBuffer* buffer);
  std::mutex& transfer_mutex() { return transfer_mu_; }
  // Accounts `bytes` of device memory of memory type `type` against its heap before it is allocated: throws
  // out_of_memory_error naming the device when the heap (its size as the driver reports it) cannot hold them
  // besides what troupe already holds there. Drivers that do not enforce their heap sizes (lavapipe) are
  // held to them this way. release() gives them back.
  void reserve(uint32_t type, size_t bytes);
  void release(uint32_t type, size_t bytes);
  // Counts buffers destroyed: a backend's descriptor sets name buffers by handle, and a handle may be reused
  // by a later buffer, so a backend drops its sets when this has moved.
  uint64_t buffer_generation() const { return buffer_generation_.load(std::memory_order_acquire); }
  void buffer_destroyed() { buffer_generation_.fetch_add(1, std::memory_order_acq_rel); }

 private:
  void release();  // every Vulkan object this device created (idempotent)
  void begin_commands();
  void end_and_wait();

  std::string name_;
  std::string description_;
  device_type type_ = device_type::gpu;
  bool cpu_driver_ = false;
  VkPhysicalDevice physical_ = VK_NULL_HANDLE;
  VkDevice device_ = VK_NULL_HANDLE;
  VkQueue queue_ = VK_NULL_HANDLE;
  uint32_t queue_family_ = 0;
  VkPhysicalDeviceMemoryProperties memory_props_{};
  std::mutex held_mu_;
  size_t held_[VK_MAX_MEMORY_HEAPS] = {};  // bytes troupe holds per heap
  std::atomic<uint64_t> buffer_generation_{0};
  device_limits limits_;

  std::mutex queue_mu_;  // vkQueueSubmit needs the queue externally synchronized
  std::mutex kernels_mu_;
  VkPipelineCache pipeline_cache_ = VK_NULL_HANDLE;
  std::map<std::string, kernel, std::less<>> kernels_;  // by shader name (stable references; found without a copy of it)

  std::mutex transfer_mu_;
  VkCommandPool pool_ = VK_NULL_HANDLE;
  VkCommandBuffer cmd_ = VK_NULL_HANDLE;
  VkFence fence_ = VK_NULL_HANDLE;
  VkBuffer staging_ = VK_NULL_HANDLE;
  VkDeviceMemory staging_memory_ = VK_NULL_HANDLE;
  void* staging_map_ = nullptr;
  size_t staging_size_ = 0;

  std::unique_ptr<vulkan::buffer_type> buffer_type_;
};

// Makes every earlier write of the queue (copies, shaders) visible to every later read and write: recorded
// first in each command buffer, since submissions of the same queue are not memory-ordered by themselves.
void full_barrier(VkCommandBuffer cmd);

// Throws for a failed call: out_of_memory_error for the out-of-memory results, backend_error otherwise,
// naming `who` (the device) and `what` (the call).
void check(VkResult r, const std::string& who, const char* what);
std::string result_name(VkResult r);

template <class Record>
void device::submit_and_wait(Record&& record) {
  begin_commands();
  full_barrier(cmd_);
  record(cmd_);
  end_and_wait();
}

// The devices of this machine, created at the first call (thread-safe). Empty when the Vulkan loader or a
// driver is missing, or no device has a compute queue: status() says which.
std::vector<device*> devices();
std::string status();

}  // namespace troupe::vulkan
