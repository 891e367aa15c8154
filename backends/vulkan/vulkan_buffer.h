// Device-local Vulkan buffers: one VkBuffer over its own VkDeviceMemory per troupe buffer. The host writes
// them through the device's staging memory (copies recorded, submitted and waited for: ordered after the
// graphs queued before). It reads them the same way, or, where the device-local memory is also host-visible
// and coherent (lavapipe, integrated GPUs, resizable BAR), straight from the memory mapped once: a read then
// never waits behind graphs queued since (the caller reads what a finished graph wrote, as on the CPU), which
// is what lets a CPU split read a Vulkan split's output while the device runs the next micro-batch.
//
//   buffer_ptr b = dev.buffer_type().alloc_buffer(1 << 20);   // out_of_memory_error when the driver refuses,
//                                                             // or the heap it reports cannot hold it
//   tensor_set(*t, host, 0, nbytes(*t));                       // host -> staging -> buffer
//
// Tensors' data fields are offsets from an opaque base (never dereferenced by the host).
#pragma once

#include "backends/vulkan/vulkan_device.h"

namespace troupe::vulkan {

class buffer_type final : public buffer_type_i {
 public:
  explicit buffer_type(vulkan::device& dev);
  std::string_view name() const override { return name_; }
  buffer_ptr alloc_buffer(size_t size) override;
  size_t alignment() const override { return alignment_; }
  // min(maxStorageBufferRange, maxMemoryAllocationSize): what one shader binding can address and one
  // allocation can hold.
  size_t max_size() const override { return max_size_; }
  device_i& device() const override { return dev_; }

 private:
  vulkan::device& dev_;
  std::string name_;
  size_t alignment_ = 32;
  size_t max_size_ = 0;
};

class buffer final : public buffer_i {
 public:
  // mem: mem_size bytes of memory type mem_type, reserved on dev (released when the buffer goes).
  // mapped: mem mapped whole (host-visible and coherent memory), or null.
  buffer(buffer_type& type, vulkan::device& dev, VkBuffer buf, VkDeviceMemory mem, size_t size, uint32_t mem_type,
         size_t mem_size, void* mapped);
  ~buffer() override;

  void* base() override;
  void set_tensor(tensor& t, const void* data, size_t offset, size_t size) override;
  void get_tensor(const tensor& t, void* data, size_t offset, size_t size) override;
  void memset_tensor(tensor& t, uint8_t value, size_t offset, size_t size) override;
  void clear(uint8_t value) override;

  VkBuffer handle() const { return buf_; }
  // Whether reads are straight from mapped memory.
  bool mapped() const { return mapped_ != nullptr; }
  // The byte offset of t's data in this buffer (t must lie in it).
  size_t offset_of(const tensor& t) const;

 private:
  // Writes / reads [at, at + size) of the buffer through staging, in pieces of at most the staging size.
  void write(size_t at, const void* data, size_t size);
  void read(size_t at, void* data, size_t size);
  void fill(size_t at, uint8_t value, size_t size);

  vulkan::device& dev_;
  VkBuffer buf_;
  VkDeviceMemory mem_;
  uint32_t mem_type_;
  size_t mem_size_;
  void* mapped_;
};

}  // namespace troupe::vulkan
