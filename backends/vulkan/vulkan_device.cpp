#include "backends/vulkan/vulkan_device.h"

#include <algorithm>
#include <cstring>

#include "backends/vulkan/shaders.h"
#include "backends/vulkan/vulkan_backend.h"
#include "backends/vulkan/vulkan_buffer.h"

namespace troupe::vulkan {

std::string result_name(VkResult r) {
  switch (r) {
    case VK_SUCCESS: return "VK_SUCCESS";
    case VK_NOT_READY: return "VK_NOT_READY";
    case VK_TIMEOUT: return "VK_TIMEOUT";
    case VK_ERROR_OUT_OF_HOST_MEMORY: return "VK_ERROR_OUT_OF_HOST_MEMORY";
    case VK_ERROR_OUT_OF_DEVICE_MEMORY: return "VK_ERROR_OUT_OF_DEVICE_MEMORY";
    case VK_ERROR_INITIALIZATION_FAILED: return "VK_ERROR_INITIALIZATION_FAILED";
    case VK_ERROR_DEVICE_LOST: return "VK_ERROR_DEVICE_LOST";
    case VK_ERROR_MEMORY_MAP_FAILED: return "VK_ERROR_MEMORY_MAP_FAILED";
    case VK_ERROR_LAYER_NOT_PRESENT: return "VK_ERROR_LAYER_NOT_PRESENT";
    case VK_ERROR_EXTENSION_NOT_PRESENT: return "VK_ERROR_EXTENSION_NOT_PRESENT";
    case VK_ERROR_FEATURE_NOT_PRESENT: return "VK_ERROR_FEATURE_NOT_PRESENT";
    case VK_ERROR_INCOMPATIBLE_DRIVER: return "VK_ERROR_INCOMPATIBLE_DRIVER";
    case VK_ERROR_TOO_MANY_OBJECTS: return "VK_ERROR_TOO_MANY_OBJECTS";
    case VK_ERROR_OUT_OF_POOL_MEMORY: return "VK_ERROR_OUT_OF_POOL_MEMORY";
    default: return "VkResult " + std::to_string(static_cast<int>(r));
  }
}

void check(VkResult r, const std::string& who, const char* what) {
  if (r == VK_SUCCESS) return;
  const std::string msg = who + ": " + what + " failed (" + result_name(r) + ")";
  if (r == VK_ERROR_OUT_OF_DEVICE_MEMORY || r == VK_ERROR_OUT_OF_HOST_MEMORY) throw out_of_memory_error(msg);
  throw backend_error(msg);
}

namespace {

bool has_extension(VkPhysicalDevice p, const char* name) {
  uint32_t n = 0;
  if (vkEnumerateDeviceExtensionProperties(p, nullptr, &n, nullptr) != VK_SUCCESS) return false;
  std::vector<VkExtensionProperties> exts(n);
  if (vkEnumerateDeviceExtensionProperties(p, nullptr, &n, exts.data()) != VK_SUCCESS) return false;
  return std::any_of(exts.begin(), exts.end(), [&](const VkExtensionProperties& e) { return std::strcmp(e.extensionName, name) == 0; });
}

// The first queue family that can compute (a compute-only one when there is one: it does not share with
// graphics work), or -1.
int compute_family(VkPhysicalDevice p) {
  uint32_t n = 0;
  vkGetPhysicalDeviceQueueFamilyProperties(p, &n, nullptr);
  std::vector<VkQueueFamilyProperties> fams(n);
  vkGetPhysicalDeviceQueueFamilyProperties(p, &n, fams.data());
  int any = -1;
  for (uint32_t i = 0; i < n; ++i) {
    if (!(fams[i].queueFlags & VK_QUEUE_COMPUTE_BIT) || fams[i].queueCount == 0) continue;
    if (!(fams[i].queueFlags & VK_QUEUE_GRAPHICS_BIT)) return static_cast<int>(i);
    if (any < 0) any = static_cast<int>(i);
  }
  return any;
}

device_type type_of(VkPhysicalDeviceType t) {
  switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return device_type::igpu;
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return device_type::accel;  // lavapipe: computes, but not the host CPU device
    default: return device_type::gpu;
  }
}

}  // namespace

device::device(VkInstance instance, VkPhysicalDevice physical, int index) : physical_(physical) {
  (void)instance;
  name_ = "Vulkan" + std::to_string(index);

  VkPhysicalDeviceSubgroupProperties subgroup{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES};
  VkPhysicalDeviceMaintenance3Properties maint3{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_3_PROPERTIES};
  maint3.pNext = &subgroup;
  VkPhysicalDeviceProperties2 props{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2};
  props.pNext = &maint3;
  vkGetPhysicalDeviceProperties2(physical_, &props);
  description_ = props.properties.deviceName;
  type_ = type_of(props.properties.deviceType);
  cpu_driver_ = props.properties.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU;
  limits_.max_storage_buffer_range = props.properties.limits.maxStorageBufferRange;
  limits_.max_memory_allocation_size = maint3.maxMemoryAllocationSize;
  limits_.min_storage_buffer_offset_alignment = props.properties.limits.minStorageBufferOffsetAlignment;
  limits_.max_compute_workgroup_invocations = props.properties.limits.maxComputeWorkGroupInvocations;
  limits_.max_workgroup_count_x = props.properties.limits.maxComputeWorkGroupCount[0];
  limits_.subgroup_size = subgroup.subgroupSize;
  limits_.subgroup_arithmetic = (subgroup.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) != 0 &&
                                (subgroup.supportedOperations & VK_SUBGROUP_FEATURE_ARITHMETIC_BIT) != 0;
  limits_.memory_budget = has_extension(physical_, VK_EXT_MEMORY_BUDGET_EXTENSION_NAME);
  vkGetPhysicalDeviceMemoryProperties(physical_, &memory_props_);

  const int family = compute_family(physical_);
  if (family < 0) throw backend_error(name_ + " (" + description_ + "): no queue family can compute");
  queue_family_ = static_cast<uint32_t>(family);
  const float priority = 1.0f;
  VkDeviceQueueCreateInfo qi{VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO};
  qi.queueFamilyIndex = queue_family_;
  qi.queueCount = 1;
  qi.pQueuePriorities = &priority;
  std::vector<const char*> exts;
  if (limits_.memory_budget) exts.push_back(VK_EXT_MEMORY_BUDGET_EXTENSION_NAME);
  VkDeviceCreateInfo di{VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO};
  di.queueCreateInfoCount = 1;
  di.pQueueCreateInfos = &qi;
  di.enabledExtensionCount = static_cast<uint32_t>(exts.size());
  di.ppEnabledExtensionNames = exts.data();
  check(vkCreateDevice(physical_, &di, nullptr, &device_), name_, "vkCreateDevice");
  vkGetDeviceQueue(device_, queue_family_, 0, &queue_);

  try {
    VkCommandPoolCreateInfo pi{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
    pi.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
    pi.queueFamilyIndex = queue_family_;
    check(vkCreateCommandPool(device_, &pi, nullptr, &pool_), name_, "vkCreateCommandPool");
    VkCommandBufferAllocateInfo ai{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
    ai.commandPool = pool_;
    ai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    ai.commandBufferCount = 1;
    check(vkAllocateCommandBuffers(device_, &ai, &cmd_), name_, "vkAllocateCommandBuffers");
    VkFenceCreateInfo fi{VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    check(vkCreateFence(device_, &fi, nullptr, &fence_), name_, "vkCreateFence");
    VkPipelineCacheCreateInfo ci{VK_STRUCTURE_TYPE_PIPELINE_CACHE_CREATE_INFO};
    check(vkCreatePipelineCache(device_, &ci, nullptr, &pipeline_cache_), name_, "vkCreatePipelineCache");
    buffer_type_ = std::make_unique<vulkan::buffer_type>(*this);
  } catch (...) {
    release();  // the destructor does not run for an object whose constructor threw
    throw;
  }
}

device::~device() { release(); }

void device::release() {
  if (device_ == VK_NULL_HANDLE) return;
  vkDeviceWaitIdle(device_);
  buffer_type_.reset();
  for (auto& [n, k] : kernels_) {
    if (k.pipeline != VK_NULL_HANDLE) vkDestroyPipeline(device_, k.pipeline, nullptr);
    if (k.layout != VK_NULL_HANDLE) vkDestroyPipelineLayout(device_, k.layout, nullptr);
    if (k.set_layout != VK_NULL_HANDLE) vkDestroyDescriptorSetLayout(device_, k.set_layout, nullptr);
    if (k.module != VK_NULL_HANDLE) vkDestroyShaderModule(device_, k.module, nullptr);
  }
  kernels_.clear();
  if (pipeline_cache_ != VK_NULL_HANDLE) vkDestroyPipelineCache(device_, pipeline_cache_, nullptr);
  if (staging_map_ != nullptr) vkUnmapMemory(device_, staging_memory_);
  if (staging_ != VK_NULL_HANDLE) vkDestroyBuffer(device_, staging_, nullptr);
  if (staging_memory_ != VK_NULL_HANDLE) vkFreeMemory(device_, staging_memory_, nullptr);
  if (fence_ != VK_NULL_HANDLE) vkDestroyFence(device_, fence_, nullptr);
  if (pool_ != VK_NULL_HANDLE) vkDestroyCommandPool(device_, pool_, nullptr);
  vkDestroyDevice(device_, nullptr);
  device_ = VK_NULL_HANDLE;
}

device_memory device::memory() const {
  VkPhysicalDeviceMemoryBudgetPropertiesEXT budget{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_BUDGET_PROPERTIES_EXT};
  VkPhysicalDeviceMemoryProperties2 props{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_PROPERTIES_2};
  if (limits_.memory_budget) props.pNext = &budget;
  vkGetPhysicalDeviceMemoryProperties2(physical_, &props);
  device_memory m;
  for (uint32_t h = 0; h < props.memoryProperties.memoryHeapCount; ++h) {
    const VkMemoryHeap& heap = props.memoryProperties.memoryHeaps[h];
    if (!(heap.flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT)) continue;
    m.total += heap.size;
    if (limits_.memory_budget) {
      m.free += budget.heapBudget[h] > budget.heapUsage[h] ? budget.heapBudget[h] - budget.heapUsage[h] : 0;
    } else {  // the driver does not say: the heap less what troupe holds in it
      std::lock_guard l(const_cast<device*>(this)->held_mu_);
      m.free += heap.size > held_[h] ? heap.size - held_[h] : 0;
    }
  }
  return m;
}

void device::reserve(uint32_t type, size_t bytes) {
  const uint32_t heap = memory_props_.memoryTypes[type].heapIndex;
  const size_t size = memory_props_.memoryHeaps[heap].size;
  std::lock_guard l(held_mu_);
  if (bytes > size || held_[heap] > size - bytes) {
    throw out_of_memory_error(name_ + ": " + std::to_string(bytes) + " bytes requested with " + std::to_string(held_[heap]) +
                              " of its " + std::to_string(size) + "-byte memory heap " + std::to_string(heap) + " in use");
  }
  held_[heap] += bytes;
}

void device::release(uint32_t type, size_t bytes) {
  const uint32_t heap = memory_props_.memoryTypes[type].heapIndex;
  std::lock_guard l(held_mu_);
  held_[heap] -= std::min(held_[heap], bytes);
}

backend_ptr device::init_backend() { return std::make_unique<vulkan::backend>(*this); }

buffer_type_i& device::buffer_type() { return *buffer_type_; }

bool device::supports_op(const tensor& t) const {
  // mul_mat_id sums with subgroupAdd (a device without it leaves the experts to the CPU).
  if (t.op == op::mul_mat_id && !limits_.subgroup_arithmetic) return false;
  return computes(t);
}

bool device::supports_buft(const buffer_type_i& b) const { return &b == buffer_type_.get(); }

uint32_t device::memory_type(uint32_t type_bits, VkMemoryPropertyFlags want, VkMemoryPropertyFlags prefer) const {
  int found = -1;
  for (uint32_t i = 0; i < memory_props_.memoryTypeCount; ++i) {
    const VkMemoryPropertyFlags f = memory_props_.memoryTypes[i].propertyFlags;
    if (!(type_bits & (1u << i)) || (f & want) != want) continue;
    if ((f & prefer) == prefer) return i;
    if (found < 0) found = static_cast<int>(i);
  }
  if (found < 0) throw backend_error(name_ + ": no memory type with the properties asked for");
  return static_cast<uint32_t>(found);
}

void device::begin_commands() {
  check(vkResetCommandBuffer(cmd_, 0), name_, "vkResetCommandBuffer");
  VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
  bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
  check(vkBeginCommandBuffer(cmd_, &bi), name_, "vkBeginCommandBuffer");
}

void device::end_and_wait() {
  check(vkEndCommandBuffer(cmd_), name_, "vkEndCommandBuffer");
  submit_and_wait(cmd_, fence_);
}

void device::submit(VkCommandBuffer cmd, VkFence fence) {
  VkSubmitInfo si{VK_STRUCTURE_TYPE_SUBMIT_INFO};
  si.commandBufferCount = 1;
  si.pCommandBuffers = &cmd;
  check(vkResetFences(device_, 1, &fence), name_, "vkResetFences");
  std::lock_guard l(queue_mu_);
  check(vkQueueSubmit(queue_, 1, &si, fence), name_, "vkQueueSubmit");
}

void device::submit_and_wait(VkCommandBuffer cmd, VkFence fence) {
  submit(cmd, fence);
  check(vkWaitForFences(device_, 1, &fence, VK_TRUE, UINT64_MAX), name_, "vkWaitForFences");
}

void full_barrier(VkCommandBuffer cmd) {
  VkMemoryBarrier mb{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
  mb.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
  mb.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_READ_BIT |
                     VK_ACCESS_TRANSFER_WRITE_BIT | VK_ACCESS_HOST_READ_BIT;
  vkCmdPipelineBarrier(cmd, VK_PIPELINE_STAGE_ALL_COMMANDS_BIT, VK_PIPELINE_STAGE_ALL_COMMANDS_BIT, 0, 1, &mb, 0, nullptr, 0,
                       nullptr);
}

const kernel& device::kernel_for(const char* shader, uint32_t n_buffers, uint32_t push_bytes) {
  std::lock_guard l(kernels_mu_);
  if (const auto it = kernels_.find(std::string_view(shader)); it != kernels_.end()) return it->second;
  const shader_bytes code = shader_code(shader);
  if (code.data == nullptr) throw backend_error(name_ + ": no shader named '" + std::string(shader) + "' in this build");
  kernel k;
  try {
    VkShaderModuleCreateInfo mi{VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO};
    mi.codeSize = code.size;
    mi.pCode = reinterpret_cast<const uint32_t*>(code.data);
    check(vkCreateShaderModule(device_, &mi, nullptr, &k.module), name_, "vkCreateShaderModule");
    std::vector<VkDescriptorSetLayoutBinding> bindings(n_buffers);
    for (uint32_t i = 0; i < n_buffers; ++i) {
      bindings[i] = {i, VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 1, VK_SHADER_STAGE_COMPUTE_BIT, nullptr};
    }
    VkDescriptorSetLayoutCreateInfo li{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO};
    li.bindingCount = n_buffers;
    li.pBindings = bindings.data();
    check(vkCreateDescriptorSetLayout(device_, &li, nullptr, &k.set_layout), name_, "vkCreateDescriptorSetLayout");
    const VkPushConstantRange push{VK_SHADER_STAGE_COMPUTE_BIT, 0, push_bytes};
    VkPipelineLayoutCreateInfo pli{VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO};
    pli.setLayoutCount = 1;
    pli.pSetLayouts = &k.set_layout;
    pli.pushConstantRangeCount = 1;
    pli.pPushConstantRanges = &push;
    check(vkCreatePipelineLayout(device_, &pli, nullptr, &k.layout), name_, "vkCreatePipelineLayout");
    VkComputePipelineCreateInfo ci{VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO};
    ci.stage = {VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO};
    ci.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
    ci.stage.module = k.module;
    ci.stage.pName = "main";
    ci.layout = k.layout;
    check(vkCreateComputePipelines(device_, pipeline_cache_, 1, &ci, nullptr, &k.pipeline), name_,
          "vkCreateComputePipelines");
  } catch (...) {
    if (k.layout != VK_NULL_HANDLE) vkDestroyPipelineLayout(device_, k.layout, nullptr);
    if (k.set_layout != VK_NULL_HANDLE) vkDestroyDescriptorSetLayout(device_, k.set_layout, nullptr);
    if (k.module != VK_NULL_HANDLE) vkDestroyShaderModule(device_, k.module, nullptr);
    throw;
  }
  return kernels_.emplace(shader, k).first->second;
}

void* device::staging(size_t size, VkBuffer* buffer) {
  if (size > staging_size_) {
    if (staging_map_ != nullptr) vkUnmapMemory(device_, staging_memory_);
    if (staging_ != VK_NULL_HANDLE) vkDestroyBuffer(device_, staging_, nullptr);
    if (staging_memory_ != VK_NULL_HANDLE) vkFreeMemory(device_, staging_memory_, nullptr);
    staging_ = VK_NULL_HANDLE;
    staging_memory_ = VK_NULL_HANDLE;
    staging_map_ = nullptr;
    staging_size_ = 0;
    VkBufferCreateInfo bi{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
    bi.size = size;
    bi.usage = VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT;
    bi.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
    check(vkCreateBuffer(device_, &bi, nullptr, &staging_), name_, "vkCreateBuffer (staging)");
    VkMemoryRequirements req;
    vkGetBufferMemoryRequirements(device_, staging_, &req);
    VkMemoryAllocateInfo ai{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
    ai.allocationSize = req.size;
    ai.memoryTypeIndex = memory_type(req.memoryTypeBits, VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT,
                                     VK_MEMORY_PROPERTY_HOST_CACHED_BIT);
    check(vkAllocateMemory(device_, &ai, nullptr, &staging_memory_), name_, "vkAllocateMemory (staging)");
    check(vkBindBufferMemory(device_, staging_, staging_memory_, 0), name_, "vkBindBufferMemory (staging)");
    check(vkMapMemory(device_, staging_memory_, 0, VK_WHOLE_SIZE, 0, &staging_map_), name_, "vkMapMemory (staging)");
    staging_size_ = size;
  }
  *buffer = staging_;
  return staging_map_;
}

// ---- the process's devices ----

namespace {

struct instance_state {
  VkInstance instance = VK_NULL_HANDLE;
  std::vector<std::unique_ptr<device>> devices;
  std::string status;

  instance_state() {
    VkApplicationInfo app{VK_STRUCTURE_TYPE_APPLICATION_INFO};
    app.pApplicationName = "troupe";
    app.apiVersion = VK_API_VERSION_1_2;
    VkInstanceCreateInfo ci{VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO};
    ci.pApplicationInfo = &app;
    const VkResult r = vkCreateInstance(&ci, nullptr, &instance);
    if (r != VK_SUCCESS) {
      status = "no Vulkan instance (" + result_name(r) + "): no loader or no driver";
      instance = VK_NULL_HANDLE;
      return;
    }
    uint32_t n = 0;
    vkEnumeratePhysicalDevices(instance, &n, nullptr);
    std::vector<VkPhysicalDevice> phys(n);
    vkEnumeratePhysicalDevices(instance, &n, phys.data());
    std::string skipped;
    for (VkPhysicalDevice p : phys) {
      if (compute_family(p) < 0) continue;
      try {
        devices.push_back(std::make_unique<device>(instance, p, static_cast<int>(devices.size())));
      } catch (const std::exception& e) {
        skipped += std::string("; ") + e.what();
      }
    }
    status = std::to_string(devices.size()) + (devices.size() == 1 ? " device" : " devices") +
             (n == 0 ? " (the driver reports no physical device)" : "") + skipped;
  }
  ~instance_state() {
    devices.clear();
#if !defined(__SANITIZE_ADDRESS__)
    if (instance != VK_NULL_HANDLE) vkDestroyInstance(instance, nullptr);
#else
    // Under AddressSanitizer the instance is left to the end of the process: destroying it unloads the driver
    // (Mesa's lavapipe), and allocations its globals still point to would then be reported by LeakSanitizer,
    // which checks after static destructors, as leaks of an unknown module.
#endif
  }
};

instance_state& state() {
  static instance_state s;
  return s;
}

}  // namespace

std::vector<device*> devices() {
  std::vector<device*> out;
  for (const auto& d : state().devices) out.push_back(d.get());
  return out;
}

std::string status() { return state().status; }

}  // namespace troupe::vulkan
