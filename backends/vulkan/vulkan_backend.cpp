#include "backends/vulkan/vulkan_backend.h"

#include <algorithm>

#include "backends/vulkan/vulkan_buffer.h"

namespace troupe::vulkan {

namespace {

constexpr uint32_t group_size = 256;  // local_size_x of every shader

bool is_layout_op(op o) { return o == op::none || o == op::view || o == op::reshape || o == op::permute || o == op::transpose; }

bool f32_strides(const tensor& t) {
  return t.type == type::f32 && std::all_of(t.nb.begin(), t.nb.end(), [](size_t nb) { return nb % 4 == 0; });
}

// Element offset and strides of an f32 tensor in its Vulkan buffer.
struct f32_view {
  VkBuffer buffer = VK_NULL_HANDLE;
  uint32_t off = 0;
  uint32_t nb[4] = {};
};

f32_view view_of(const vulkan::device& dev, const tensor& t) {
  auto* b = dynamic_cast<vulkan::buffer*>(t.buffer);
  if (b == nullptr || &b->type().device() != &dev) {
    throw backend_error(std::string(dev.name()) + ": tensor " + describe(t) + " is not in this device's memory");
  }
  const size_t at = b->offset_of(t);
  if (at % 4 != 0) throw backend_error(std::string(dev.name()) + ": tensor " + describe(t) + " is not 4-byte aligned");
  f32_view v;
  v.buffer = b->handle();
  v.off = static_cast<uint32_t>(at / 4);
  for (int i = 0; i < 4; ++i) v.nb[i] = static_cast<uint32_t>(t.nb[static_cast<size_t>(i)] / 4);
  return v;
}

struct binary_params {
  uint32_t ne[4];
  uint32_t a_off, a_nb[4];
  uint32_t b_ne[4];
  uint32_t b_off, b_nb[4];
  uint32_t d_off, d_nb[4];
  uint32_t op;
};

struct unary_params {
  uint32_t ne[4];
  uint32_t a_off, a_nb[4];
  uint32_t d_off, d_nb[4];
  uint32_t op;
  float s;
  float bias;
};

}  // namespace

bool computes(const tensor& t) {
  if (is_layout_op(t.op)) return true;
  switch (t.op) {
    case op::add:
    case op::sub:
    case op::mul:
    case op::div:
      return f32_strides(t) && t.src[0] && t.src[1] && f32_strides(*t.src[0]) && f32_strides(*t.src[1]) &&
             same_shape(t, *t.src[0]) && can_repeat(*t.src[1], *t.src[0]);
    case op::scale:
    case op::silu:
    case op::gelu:
      return f32_strides(t) && t.src[0] && f32_strides(*t.src[0]) && same_shape(t, *t.src[0]);
    default:
      return false;
  }
}

backend::backend(vulkan::device& dev) : dev_(dev) {
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
  const VkDevice d = dev_.handle();  // nothing in flight: graph_compute waits for its work before returning
  if (descriptors_ != VK_NULL_HANDLE) vkDestroyDescriptorPool(d, descriptors_, nullptr);
  vkDestroyFence(d, fence_, nullptr);
  vkDestroyCommandPool(d, pool_, nullptr);
}

void backend::reserve_descriptors(uint32_t sets) {
  const VkDevice d = dev_.handle();
  if (sets > descriptor_sets_) {
    if (descriptors_ != VK_NULL_HANDLE) vkDestroyDescriptorPool(d, descriptors_, nullptr);
    descriptors_ = VK_NULL_HANDLE;
    descriptor_sets_ = 0;
    const uint32_t n = std::max(sets, 2 * descriptor_sets_ + 64);
    const VkDescriptorPoolSize size{VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 3 * n};
    VkDescriptorPoolCreateInfo ci{VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO};
    ci.maxSets = n;
    ci.poolSizeCount = 1;
    ci.pPoolSizes = &size;
    check(vkCreateDescriptorPool(d, &ci, nullptr, &descriptors_), std::string(dev_.name()), "vkCreateDescriptorPool");
    descriptor_sets_ = n;
  }
  check(vkResetDescriptorPool(d, descriptors_, 0), std::string(dev_.name()), "vkResetDescriptorPool");
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
  reserve_descriptors(static_cast<uint32_t>(work.size()));
  check(vkResetCommandBuffer(cmd_, 0), std::string(dev_.name()), "vkResetCommandBuffer");
  VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
  bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
  check(vkBeginCommandBuffer(cmd_, &bi), std::string(dev_.name()), "vkBeginCommandBuffer");
  full_barrier(cmd_);  // the uploads before this graph
  for (tensor* node : work) record(*node);
  check(vkEndCommandBuffer(cmd_), std::string(dev_.name()), "vkEndCommandBuffer");
  dev_.submit_and_wait(cmd_, fence_);
}

void backend::record(tensor& node) {
  const bool binary = node.op == op::add || node.op == op::sub || node.op == op::mul || node.op == op::div;
  const kernel& k = dev_.kernel_for(binary ? "binary" : "unary", binary ? 3 : 2,
                                    binary ? sizeof(binary_params) : sizeof(unary_params));
  const f32_view a = view_of(dev_, *node.src[0]);
  const f32_view d = view_of(dev_, node);
  f32_view b;
  if (binary) b = view_of(dev_, *node.src[1]);

  VkDescriptorSetAllocateInfo ai{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO};
  ai.descriptorPool = descriptors_;
  ai.descriptorSetCount = 1;
  ai.pSetLayouts = &k.set_layout;
  VkDescriptorSet set = VK_NULL_HANDLE;
  check(vkAllocateDescriptorSets(dev_.handle(), &ai, &set), std::string(dev_.name()), "vkAllocateDescriptorSets");
  VkDescriptorBufferInfo infos[3] = {{a.buffer, 0, VK_WHOLE_SIZE}, {b.buffer, 0, VK_WHOLE_SIZE}, {d.buffer, 0, VK_WHOLE_SIZE}};
  if (!binary) infos[1] = infos[2];
  VkWriteDescriptorSet w{VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET};
  w.dstSet = set;
  w.dstBinding = 0;
  w.descriptorCount = binary ? 3 : 2;
  w.descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
  w.pBufferInfo = infos;
  vkUpdateDescriptorSets(dev_.handle(), 1, &w, 0, nullptr);

  uint32_t ne[4];
  for (int i = 0; i < 4; ++i) ne[i] = static_cast<uint32_t>(node.ne[static_cast<size_t>(i)]);
  vkCmdBindPipeline(cmd_, VK_PIPELINE_BIND_POINT_COMPUTE, k.pipeline);
  vkCmdBindDescriptorSets(cmd_, VK_PIPELINE_BIND_POINT_COMPUTE, k.layout, 0, 1, &set, 0, nullptr);
  if (binary) {
    binary_params p{};
    std::copy(ne, ne + 4, p.ne);
    p.a_off = a.off;
    std::copy(a.nb, a.nb + 4, p.a_nb);
    for (int i = 0; i < 4; ++i) p.b_ne[i] = static_cast<uint32_t>(node.src[1]->ne[static_cast<size_t>(i)]);
    p.b_off = b.off;
    std::copy(b.nb, b.nb + 4, p.b_nb);
    p.d_off = d.off;
    std::copy(d.nb, d.nb + 4, p.d_nb);
    p.op = node.op == op::add ? 0 : node.op == op::sub ? 1 : node.op == op::mul ? 2 : 3;
    vkCmdPushConstants(cmd_, k.layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, sizeof p, &p);
  } else {
    unary_params p{};
    std::copy(ne, ne + 4, p.ne);
    p.a_off = a.off;
    std::copy(a.nb, a.nb + 4, p.a_nb);
    p.d_off = d.off;
    std::copy(d.nb, d.nb + 4, p.d_nb);
    p.op = node.op == op::scale ? 0 : node.op == op::silu ? 1 : 2;
    if (node.op == op::scale) {
      p.s = node.param<float>(0);
      p.bias = node.param<float>(1);
    }
    vkCmdPushConstants(cmd_, k.layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, sizeof p, &p);
  }
  // One invocation per element: groups in x up to the driver's limit, the rest in y.
  const uint64_t n = static_cast<uint64_t>(nelements(node));
  const uint64_t groups = (n + group_size - 1) / group_size;
  const uint64_t gx = std::min<uint64_t>(groups, dev_.limits().max_workgroup_count_x);
  const uint64_t gy = (groups + gx - 1) / gx;
  vkCmdDispatch(cmd_, static_cast<uint32_t>(gx), static_cast<uint32_t>(gy), 1);
  // The next node may read what this one wrote.
  VkMemoryBarrier mb{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
  mb.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT;
  mb.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT;
  vkCmdPipelineBarrier(cmd_, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0, 1, &mb, 0,
                       nullptr, 0, nullptr);
}

}  // namespace troupe::vulkan
