#include "backends/vulkan/vulkan_buffer.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace troupe::vulkan {

namespace {

// The host never dereferences a Vulkan buffer's base: tensors hold offsets from it. Not null, so that a
// placed tensor of size 0 still has an address.
char* const opaque_base = reinterpret_cast<char*>(uintptr_t{0x1000});

constexpr size_t staging_piece = size_t{16} << 20;  // transfers through at most 16 MiB of staging at a time

}  // namespace

buffer_type::buffer_type(vulkan::device& dev) : dev_(dev), name_(dev.name()) {
  const device_limits& l = dev.limits();
  max_size_ = static_cast<size_t>(std::min(l.max_storage_buffer_range, l.max_memory_allocation_size));
  alignment_ = std::max<size_t>(32, static_cast<size_t>(l.min_storage_buffer_offset_alignment));
}

buffer_ptr buffer_type::alloc_buffer(size_t size) {
  if (size > max_size_) {
    throw out_of_memory_error("buffer type " + name_ + ": " + std::to_string(size) + " bytes exceed its max size " +
                              std::to_string(max_size_));
  }
  const VkDevice d = dev_.handle();
  VkBufferCreateInfo bi{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
  bi.size = std::max(size, alignment_);
  bi.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT;
  bi.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
  VkBuffer buf = VK_NULL_HANDLE;
  check(vkCreateBuffer(d, &bi, nullptr, &buf), name_, "vkCreateBuffer");
  VkMemoryRequirements req;
  vkGetBufferMemoryRequirements(d, buf, &req);
  VkDeviceMemory mem = VK_NULL_HANDLE;
  uint32_t mem_type = 0;
  bool reserved = false;
  void* mapped = nullptr;
  try {
    constexpr VkMemoryPropertyFlags host_access = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
    // Host access preferred only where device memory is host memory (a CPU driver, an integrated GPU): on a
    // discrete GPU the host-visible device-local type is the small BAR window, kept for what needs it.
    const bool unified = dev_.is_cpu() || dev_.type() != device_type::gpu;
    mem_type = dev_.memory_type(req.memoryTypeBits, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, unified ? host_access : 0);
    dev_.reserve(mem_type, req.size);
    reserved = true;
    VkMemoryAllocateInfo ai{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
    ai.allocationSize = req.size;
    ai.memoryTypeIndex = mem_type;
    check(vkAllocateMemory(d, &ai, nullptr, &mem), name_, ("vkAllocateMemory of " + std::to_string(size) + " bytes").c_str());
    check(vkBindBufferMemory(d, buf, mem, 0), name_, "vkBindBufferMemory");
    if (unified && (dev_.memory_flags(mem_type) & host_access) == host_access &&
        vkMapMemory(d, mem, 0, VK_WHOLE_SIZE, 0, &mapped) != VK_SUCCESS) {
      mapped = nullptr;  // not mappable after all (address space): read through staging
    }
  } catch (...) {
    if (mem != VK_NULL_HANDLE) vkFreeMemory(d, mem, nullptr);
    if (reserved) dev_.release(mem_type, req.size);
    vkDestroyBuffer(d, buf, nullptr);
    throw;
  }
  return std::make_unique<vulkan::buffer>(*this, dev_, buf, mem, size, mem_type, req.size, mapped);
}

buffer::buffer(buffer_type& type, vulkan::device& dev, VkBuffer buf, VkDeviceMemory mem, size_t size, uint32_t mem_type,
               size_t mem_size, void* mapped)
    : buffer_i(type, size), dev_(dev), buf_(buf), mem_(mem), mem_type_(mem_type), mem_size_(mem_size), mapped_(mapped) {}

buffer::~buffer() {
  if (mapped_ != nullptr) vkUnmapMemory(dev_.handle(), mem_);
  vkDestroyBuffer(dev_.handle(), buf_, nullptr);
  vkFreeMemory(dev_.handle(), mem_, nullptr);
  dev_.release(mem_type_, mem_size_);
  dev_.buffer_destroyed();
}

void* buffer::base() { return opaque_base; }

size_t buffer::offset_of(const tensor& t) const {
  const auto at = static_cast<size_t>(static_cast<const char*>(t.data) - opaque_base);
  if (t.data == nullptr || static_cast<const char*>(t.data) < opaque_base || at > size()) {
    throw backend_error(std::string(dev_.name()) + ": tensor " + describe(t) + " does not lie in this buffer");
  }
  return at;
}

void buffer::write(size_t at, const void* data, size_t size) {
  std::lock_guard l(dev_.transfer_mutex());
  const auto* src = static_cast<const uint8_t*>(data);
  for (size_t done = 0; done < size;) {
    const size_t n = std::min(staging_piece, size - done);
    VkBuffer stage = VK_NULL_HANDLE;
    std::memcpy(dev_.staging(n, &stage), src + done, n);
    dev_.submit_and_wait([&](VkCommandBuffer cmd) {
      const VkBufferCopy region{0, at + done, n};
      vkCmdCopyBuffer(cmd, stage, buf_, 1, &region);
    });
    done += n;
  }
}

void buffer::read(size_t at, void* data, size_t size) {
  if (mapped_ != nullptr) {  // coherent: what finished graphs wrote (their last barrier makes it host-visible)
    std::memcpy(data, static_cast<const uint8_t*>(mapped_) + at, size);
    return;
  }
  std::lock_guard l(dev_.transfer_mutex());
  auto* dst = static_cast<uint8_t*>(data);
  for (size_t done = 0; done < size;) {
    const size_t n = std::min(staging_piece, size - done);
    VkBuffer stage = VK_NULL_HANDLE;
    void* mapped = dev_.staging(n, &stage);
    dev_.submit_and_wait([&](VkCommandBuffer cmd) {
      const VkBufferCopy region{at + done, 0, n};
      vkCmdCopyBuffer(cmd, buf_, stage, 1, &region);
    });
    std::memcpy(dst + done, mapped, n);
    done += n;
  }
}

void buffer::fill(size_t at, uint8_t value, size_t size) {
  if (size == 0) return;
  // vkCmdFillBuffer writes 4-byte words at 4-byte offsets: the aligned middle by the device, the ends
  // (at most 3 bytes each) through staging.
  const size_t begin = std::min(at + size, (at + 3) / 4 * 4);
  const size_t end = std::max(begin, (at + size) / 4 * 4);
  const std::vector<uint8_t> edge(4, value);
  if (begin > at) write(at, edge.data(), begin - at);
  if (end > begin) {
    std::lock_guard l(dev_.transfer_mutex());
    const uint32_t word = 0x01010101u * value;
    dev_.submit_and_wait([&](VkCommandBuffer cmd) { vkCmdFillBuffer(cmd, buf_, begin, end - begin, word); });
  }
  if (at + size > end) write(end, edge.data(), at + size - end);
}

namespace {

void check_range(const buffer& b, const tensor& t, size_t at, size_t offset, size_t size, const char* what) {
  if (offset > nbytes(t) || size > nbytes(t) - offset || at + offset + size > b.size()) {
    throw backend_error(std::string(what) + ": bytes [" + std::to_string(offset) + ", " + std::to_string(offset + size) +
                        ") of tensor " + describe(t) + " are outside it or its buffer");
  }
}

}  // namespace

void buffer::set_tensor(tensor& t, const void* data, size_t offset, size_t size) {
  const size_t at = offset_of(t);
  check_range(*this, t, at, offset, size, "set_tensor");
  write(at + offset, data, size);
}

void buffer::get_tensor(const tensor& t, void* data, size_t offset, size_t size) {
  const size_t at = offset_of(t);
  check_range(*this, t, at, offset, size, "get_tensor");
  read(at + offset, data, size);
}

void buffer::memset_tensor(tensor& t, uint8_t value, size_t offset, size_t size) {
  const size_t at = offset_of(t);
  check_range(*this, t, at, offset, size, "memset_tensor");
  fill(at + offset, value, size);
}

void buffer::clear(uint8_t value) { fill(0, value, size()); }

}  // namespace troupe::vulkan
