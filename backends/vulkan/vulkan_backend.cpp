#include "backends/vulkan/vulkan_backend.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <sstream>

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
  VkCommandBufferAllocateInfo ai{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
  ai.commandPool = pool_;
  ai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
  ai.commandBufferCount = 1;
  VkResult r = vkAllocateCommandBuffers(d, &ai, &cmd_);
  VkFenceCreateInfo fi{VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
  if (r == VK_SUCCESS) r = vkCreateFence(d, &fi, nullptr, &fence_);
  if (r != VK_SUCCESS) {
    vkDestroyCommandPool(d, pool_, nullptr);
    check(r, std::string(dev_.name()), "creating a backend's command buffer");
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
  const VkDevice d = dev_.handle();  // nothing in flight: graph_compute waits for its work before returning
  drop_descriptor_sets();
  vkDestroyFence(d, fence_, nullptr);
  vkDestroyCommandPool(d, pool_, nullptr);
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
  std::vector<tensor*> work;
  for (tensor* node : g.nodes()) {
    if (is_layout_op(node->op)) continue;
    if (!computes(*node)) {
      throw backend_error(std::string(dev_.name()) + ": node " + describe(*node) + " (" + std::string(op_name(node->op)) +
                          ") is not supported");
    }
    work.push_back(node);
  }
  if (work.empty()) return;
  if (const uint64_t gen = dev_.buffer_generation(); gen != generation_) {  // a buffer went: its handle may return
    drop_descriptor_sets();
    generation_ = gen;
  }
  if (perf_) {
    for (tensor* node : work) {
      const auto t0 = std::chrono::steady_clock::now();
      begin();
      record(*node);
      finish();
      perf_entry& e = perf_totals_[std::string(op_name(node->op)) + " " + describe(*node->src[0])];
      e.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      ++e.count;
    }
    return;
  }
  begin();
  for (tensor* node : work) {
    order(*node);
    record(*node);
  }
  finish();
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

void backend::begin() {
  check(vkResetCommandBuffer(cmd_, 0), std::string(dev_.name()), "vkResetCommandBuffer");
  VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
  bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
  check(vkBeginCommandBuffer(cmd_, &bi), std::string(dev_.name()), "vkBeginCommandBuffer");
  full_barrier(cmd_);  // the uploads before this graph
  written_.clear();
  read_.clear();
  stats_ = {};
}

void backend::finish() {
  check(vkEndCommandBuffer(cmd_), std::string(dev_.name()), "vkEndCommandBuffer");
  dev_.submit_and_wait(cmd_, fence_);
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
