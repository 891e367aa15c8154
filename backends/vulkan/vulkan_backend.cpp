#include "backends/vulkan/vulkan_backend.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include <poll.h>

#include "backends/vulkan/vulkan_buffer.h"
#include "runtime/log.h"

namespace troupe::vulkan {

backend::backend(vulkan::device& dev) : dev_(dev) {
  const char* perf = std::getenv("TROUPE_VULKAN_PERF");
  perf_ = perf != nullptr && std::strcmp(perf, "0") != 0;
  const VkDevice d = dev_.handle();
  VkCommandPoolCreateInfo pi{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
  pi.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
  pi.queueFamilyIndex = dev_.queue_family();
  check(vkCreateCommandPool(d, &pi, nullptr, &pool_), std::string(dev_.name()), "vkCreateCommandPool");
  VkResult r = VK_SUCCESS;
  for (frame& f : frames_) {
    VkCommandBufferAllocateInfo ai{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
    ai.commandPool = pool_;
    ai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    ai.commandBufferCount = 1;
    if (r == VK_SUCCESS) r = vkAllocateCommandBuffers(d, &ai, &f.cmd);
    VkFenceCreateInfo fi{VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    if (r == VK_SUCCESS) r = vkCreateFence(d, &fi, nullptr, &f.fence);
  }
  if (r != VK_SUCCESS) {
    destroy_frames();
    check(r, std::string(dev_.name()), "creating a backend's command buffers");
  }
}

backend::~backend() {
  if (perf_ && !perf_totals_.empty()) {
    std::ostringstream os;
    os << dev_.name() << " profile (TROUPE_VULKAN_PERF):";
    for (const auto& [what, e] : perf_totals_) {
      os << "\n  " << what << ": " << e.count << " x, " << e.seconds * 1e3 << " ms, " << e.seconds * 1e6 / static_cast<double>(e.count) << " us each";
    }
    TROUPE_LOG(info, os.str());
  }
  try {
    synchronize();  // nothing may be in flight when its command buffers and descriptor sets go
  } catch (const std::exception& e) {
    TROUPE_LOG(warn, std::string(dev_.name()) + ": a graph in flight failed as its backend went: " + e.what());
    vkDeviceWaitIdle(dev_.handle());
  }
  drop_descriptor_sets();
  destroy_frames();
}

void backend::destroy_frames() {
  const VkDevice d = dev_.handle();
  for (frame& f : frames_) {
    for (chunk& c : f.chunks) {
      if (c.map != nullptr) vkUnmapMemory(d, c.memory);
      vkDestroyBuffer(d, c.buffer, nullptr);
      vkFreeMemory(d, c.memory, nullptr);
    }
    f.chunks.clear();
    if (f.fence != VK_NULL_HANDLE) vkDestroyFence(d, f.fence, nullptr);
    f.fence = VK_NULL_HANDLE;
  }
  if (pool_ != VK_NULL_HANDLE) vkDestroyCommandPool(d, pool_, nullptr);  // frees the command buffers
  pool_ = VK_NULL_HANDLE;
}

size_t backend::in_flight() const {
  std::lock_guard l(mu_);
  return in_flight_.size();
}

backend::frame& backend::open_frame() {
  frame& f = frames_[next_];
  if (open_) return f;
  if (!in_flight_.empty() && in_flight_.front() == next_) {  // the ring is full: its oldest graph must finish
    const VkResult r = vkWaitForFences(dev_.handle(), 1, &f.fence, VK_TRUE, UINT64_MAX);
    in_flight_.pop_front();
    check(r, std::string(dev_.name()), "vkWaitForFences");
  }
  check(vkResetCommandBuffer(f.cmd, 0), std::string(dev_.name()), "vkResetCommandBuffer");
  VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
  bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
  check(vkBeginCommandBuffer(f.cmd, &bi), std::string(dev_.name()), "vkBeginCommandBuffer");
  full_barrier(f.cmd);  // what was queued before (uploads, graphs) is visible to this frame
  for (chunk& c : f.chunks) c.used = 0;
  f.uploads = false;
  cmd_ = f.cmd;
  open_ = true;
  written_.clear();
  read_.clear();
  return f;
}

void backend::submit_open() {
  frame& f = frames_[next_];
  // What the frame wrote becomes visible to the host (reads of mapped memory once its fence signalled).
  VkMemoryBarrier mb{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
  mb.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
  mb.dstAccessMask = VK_ACCESS_HOST_READ_BIT;
  vkCmdPipelineBarrier(f.cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT, VK_PIPELINE_STAGE_HOST_BIT, 0,
                       1, &mb, 0, nullptr, 0, nullptr);
  open_ = false;  // whatever happens next, this recording is over (a failed one is begun anew)
  cmd_ = VK_NULL_HANDLE;
  check(vkEndCommandBuffer(f.cmd), std::string(dev_.name()), "vkEndCommandBuffer");
  dev_.submit(f.cmd, f.fence);
  f.serial = ++serial_;
  in_flight_.push_back(next_);
  next_ = (next_ + 1) % n_frames;
}

bool backend::finish_oldest(std::chrono::microseconds timeout, int wake_fd) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    VkFence fence = VK_NULL_HANDLE;
    uint64_t serial = 0;
    {
      std::lock_guard l(mu_);
      if (in_flight_.empty()) return true;
      const frame& f = frames_[in_flight_.front()];
      fence = f.fence;
      serial = f.serial;
    }
    // In slices, so that a wake_fd becoming readable is seen within one.
    const int64_t left = std::max<int64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - std::chrono::steady_clock::now()).count(), 0);
    const auto slice = static_cast<uint64_t>(wake_fd >= 0 ? std::min<int64_t>(left, 500'000) : left);
    const VkResult r = vkWaitForFences(dev_.handle(), 1, &fence, VK_TRUE, slice);
    if (r != VK_TIMEOUT) {
      {
        std::lock_guard l(mu_);
        if (!in_flight_.empty() && frames_[in_flight_.front()].serial == serial) in_flight_.pop_front();
      }
      check(r, std::string(dev_.name()), "vkWaitForFences");
      return true;
    }
    if (wake_fd >= 0) {
      pollfd p{wake_fd, POLLIN, 0};
      if (::poll(&p, 1, 0) > 0) return false;
    }
    if (std::chrono::steady_clock::now() >= deadline) return false;
  }
}

void backend::synchronize() {
  {
    std::lock_guard l(mu_);
    if (open_ && frames_[next_].uploads) submit_open();  // uploads recorded with no graph after them yet
  }
  for (;;) {
    {
      std::lock_guard l(mu_);
      if (in_flight_.empty()) return;
    }
    finish_oldest(std::chrono::hours(24 * 365), -1);
  }
}

void backend::set_tensor_async(tensor& t, const void* data, size_t offset, size_t size) {
  auto* b = dynamic_cast<vulkan::buffer*>(t.buffer);
  if (b == nullptr || perf_ || size == 0) {
    backend_i::set_tensor_async(t, data, offset, size);
    return;
  }
  const size_t at = b->offset_of(t);
  if (offset > nbytes(t) || size > nbytes(t) - offset || at + offset + size > b->size()) {
    throw backend_error("set_tensor_async: bytes [" + std::to_string(offset) + ", " + std::to_string(offset + size) +
                        ") of tensor " + describe(t) + " are outside it or its buffer");
  }
  std::lock_guard l(mu_);
  frame& f = open_frame();
  chunk* c = nullptr;
  for (chunk& x : f.chunks) {
    if (x.size - x.used >= size) {
      c = &x;
      break;
    }
  }
  if (c == nullptr) {  // a new chunk, kept with the frame for its later uses
    chunk n;
    n.size = std::max<size_t>(size, size_t{1} << 20);
    const VkDevice d = dev_.handle();
    try {
      VkBufferCreateInfo bi{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
      bi.size = n.size;
      bi.usage = VK_BUFFER_USAGE_TRANSFER_SRC_BIT;
      bi.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
      check(vkCreateBuffer(d, &bi, nullptr, &n.buffer), std::string(dev_.name()), "vkCreateBuffer (upload staging)");
      VkMemoryRequirements req;
      vkGetBufferMemoryRequirements(d, n.buffer, &req);
      VkMemoryAllocateInfo ai{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
      ai.allocationSize = req.size;
      ai.memoryTypeIndex = dev_.memory_type(req.memoryTypeBits, VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT);
      check(vkAllocateMemory(d, &ai, nullptr, &n.memory), std::string(dev_.name()), "vkAllocateMemory (upload staging)");
      check(vkBindBufferMemory(d, n.buffer, n.memory, 0), std::string(dev_.name()), "vkBindBufferMemory (upload staging)");
      check(vkMapMemory(d, n.memory, 0, VK_WHOLE_SIZE, 0, &n.map), std::string(dev_.name()), "vkMapMemory (upload staging)");
    } catch (...) {
      if (n.buffer != VK_NULL_HANDLE) vkDestroyBuffer(d, n.buffer, nullptr);
      if (n.memory != VK_NULL_HANDLE) vkFreeMemory(d, n.memory, nullptr);
      throw;
    }
    f.chunks.push_back(n);
    c = &f.chunks.back();
  }
  std::memcpy(static_cast<uint8_t*>(c->map) + c->used, static_cast<const uint8_t*>(data), size);
  const VkBufferCopy region{c->used, at + offset, size};
  vkCmdCopyBuffer(f.cmd, c->buffer, b->handle(), 1, &region);
  c->used += (size + 15) & ~size_t{15};
  c->used = std::min(c->used, c->size);
  f.uploads = true;
}

void backend::get_tensor_async(const tensor& t, void* data, size_t offset, size_t size) {
  synchronize();
  tensor_get(t, data, offset, size);
}

void backend::drop_descriptor_sets() {
  for (VkDescriptorPool p : pools_) vkDestroyDescriptorPool(dev_.handle(), p, nullptr);
  pools_.clear();
  pool_left_ = 0;
  sets_.clear();
}

VkDescriptorSet backend::descriptor_set(const kernel& k, std::initializer_list<VkBuffer> buffers) {
  std::array<uint64_t, 1 + max_bindings> key{};
  key[0] = reinterpret_cast<uint64_t>(k.set_layout);
  size_t i = 1;
  for (VkBuffer b : buffers) key[i++] = reinterpret_cast<uint64_t>(b);
  if (const auto it = sets_.find(key); it != sets_.end()) return it->second;
  const VkDevice d = dev_.handle();
  if (pool_left_ == 0) {
    const VkDescriptorPoolSize size{VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, max_bindings * sets_per_pool};
    VkDescriptorPoolCreateInfo ci{VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO};
    ci.maxSets = sets_per_pool;
    ci.poolSizeCount = 1;
    ci.pPoolSizes = &size;
    VkDescriptorPool pool = VK_NULL_HANDLE;
    check(vkCreateDescriptorPool(d, &ci, nullptr, &pool), std::string(dev_.name()), "vkCreateDescriptorPool");
    pools_.push_back(pool);
    pool_left_ = sets_per_pool;
  }
  VkDescriptorSetAllocateInfo ai{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO};
  ai.descriptorPool = pools_.back();
  ai.descriptorSetCount = 1;
  ai.pSetLayouts = &k.set_layout;
  VkDescriptorSet set = VK_NULL_HANDLE;
  check(vkAllocateDescriptorSets(d, &ai, &set), std::string(dev_.name()), "vkAllocateDescriptorSets");
  --pool_left_;
  VkDescriptorBufferInfo infos[max_bindings];
  uint32_t n = 0;
  for (VkBuffer b : buffers) infos[n++] = {b, 0, VK_WHOLE_SIZE};
  VkWriteDescriptorSet w{VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET};
  w.dstSet = set;
  w.dstBinding = 0;
  w.descriptorCount = n;
  w.descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
  w.pBufferInfo = infos;
  vkUpdateDescriptorSets(d, 1, &w, 0, nullptr);
  sets_.emplace(key, set);
  ++stats_.descriptor_sets_made;
  return set;
}

void backend::graph_compute(graph& g) {
  graph_submit(g);
  synchronize();
}

void backend::graph_submit(graph& g) {
  std::vector<tensor*> work;
  for (tensor* node : g.nodes()) {
    if (is_layout_op(node->op)) continue;
    if (!computes(*node)) {
      throw backend_error(std::string(dev_.name()) + ": node " + describe(*node) + " (" + std::string(op_name(node->op)) +
                          ") is not supported");
    }
    work.push_back(node);
  }
  if (work.empty() && !perf_) return;
  if (const uint64_t gen = dev_.buffer_generation(); gen != generation_) {  // a buffer went: its handle may return
    synchronize();  // the sets may be bound by graphs in flight
    drop_descriptor_sets();
    generation_ = gen;
  }
  if (perf_) {
    synchronize();
    for (tensor* node : work) {
      const auto t0 = std::chrono::steady_clock::now();
      {
        std::lock_guard l(mu_);
        open_frame();
        stats_ = {};
        record(*node);
        submit_open();
      }
      synchronize();
      perf_entry& e = perf_totals_[std::string(op_name(node->op)) + " " + describe(*node->src[0])];
      e.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      ++e.count;
    }
    return;
  }
  std::lock_guard l(mu_);
  const bool uploads = open_ && frames_[next_].uploads;
  frame& f = open_frame();
  if (uploads) full_barrier(f.cmd);  // the copies recorded ahead of this graph, before its first node reads them
  stats_ = {};
  try {
    for (tensor* node : work) {
      order(*node);
      record(*node);
    }
  } catch (...) {
    // A node failed to record (no memory for a descriptor set...): the frame is dropped unsubmitted, the
    // uploads recorded for this graph with it (the graph they were for fails), and the error reaches the caller.
    vkEndCommandBuffer(f.cmd);
    open_ = false;
    cmd_ = VK_NULL_HANDLE;
    throw;
  }
  submit_open();
}

bool backend::overlaps(const std::vector<span>& spans, const span& s) {
  return std::any_of(spans.begin(), spans.end(), [&](const span& x) { return x.buffer == s.buffer && x.lo < s.hi && s.lo < x.hi; });
}

void backend::order(const tensor& node) {
  auto span_of = [](const tensor& t) {
    auto* b = dynamic_cast<vulkan::buffer*>(t.buffer);
    if (b == nullptr) return span{VK_NULL_HANDLE, 0, 0};  // not in this device's memory: record() says so
    const size_t at = b->offset_of(t);
    return span{b->handle(), at & ~size_t{3}, (at + nbytes(t) + 3) & ~size_t{3}};
  };
  const span w = span_of(node);
  bool hazard = overlaps(written_, w) || overlaps(read_, w);  // write after write, write after read
  std::array<span, max_src> reads{};  // on the stack: order() runs for every node of every graph
  size_t n_reads = 0;
  for (const tensor* src : node.src) {
    if (src == nullptr) continue;
    reads[n_reads] = span_of(*src);
    hazard = hazard || overlaps(written_, reads[n_reads]);  // read after write
    ++n_reads;
  }
  if (hazard) barrier();
  written_.push_back(w);
  read_.insert(read_.end(), reads.begin(), reads.begin() + static_cast<std::ptrdiff_t>(n_reads));
}

void backend::barrier() {
  VkMemoryBarrier mb{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
  mb.srcAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT;
  mb.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT;
  vkCmdPipelineBarrier(cmd_, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0, 1, &mb, 0,
                       nullptr, 0, nullptr);
  written_.clear();
  read_.clear();
  ++stats_.barriers;
}

void backend::dispatch(const char* shader, std::initializer_list<VkBuffer> buffers, const void* params,
                       uint32_t params_size, uint64_t groups) {
  const auto n_buffers = static_cast<uint32_t>(buffers.size());
  const kernel& k = dev_.kernel_for(shader, n_buffers, params_size);
  const VkDescriptorSet set = descriptor_set(k, buffers);
  vkCmdBindPipeline(cmd_, VK_PIPELINE_BIND_POINT_COMPUTE, k.pipeline);
  vkCmdBindDescriptorSets(cmd_, VK_PIPELINE_BIND_POINT_COMPUTE, k.layout, 0, 1, &set, 0, nullptr);
  vkCmdPushConstants(cmd_, k.layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, params_size, params);
  // Workgroups in x up to the driver's limit, the rest in y (shaders compute their index from both).
  const uint64_t gx = std::min<uint64_t>(std::max<uint64_t>(groups, 1), dev_.limits().max_workgroup_count_x);
  const uint64_t gy = (groups + gx - 1) / gx;
  vkCmdDispatch(cmd_, static_cast<uint32_t>(gx), static_cast<uint32_t>(std::max<uint64_t>(gy, 1)), 1);
  ++stats_.dispatches;
}

}  // namespace troupe::vulkan
