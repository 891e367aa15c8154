// The Vulkan backend: runs graphs on one device. Each graph is one command buffer: per node a compute
// pipeline (from the device's kernel cache), its buffers bound as storage buffers (whole buffers; element
// offsets and strides as push constants; descriptor sets made once per set of buffers and kept) and a
// dispatch; one submit and one fence wait. A barrier goes before a node only where it reads, or writes,
// bytes that a node since the last barrier wrote (or writes bytes one of them read): independent nodes
// (the q, k and v products of a layer) run without one between.
//
//   backend_ptr be = dev.init_backend();
//   be->graph_compute(g);         // every node supported (device::supports_op) and placed in dev's buffers
//
// Ops: add, sub, mul, div (b broadcast over a), scale, silu, gelu, rms_norm, soft_max (f32 / f16
// mask, ALiBi), swiglu / geglu on f32 of any strides;
// get_rows of f32 / f16 / bf16 / quantized rows; cpy / cont between f32, f16 and bf16;
// set_rows into f32 / f16 / bf16 / q8_0 rows; rope (normal / neox, YaRN); norm, sum_rows, mean, argmax,
// concat, pad;
// mul_mat with f32 / f16 / bf16 / q4_0 / q4_1 / q5_0 / q5_1 / q8_0 / q2_K..q6_K weights (rows contiguous)
// and f32 activations: a matrix-vector shader for 1..8 activation rows, a tiled one (64 x 64 outputs per
// workgroup) for more, or on a CPU driver a barrier-free one; views cost nothing.
#pragma once

#include <array>
#include <chrono>
#include <initializer_list>
#include <map>

#include "backends/vulkan/vulkan_device.h"
#include "runtime/ops.h"

namespace troupe::vulkan {

class backend final : public backend_i {
 public:
  explicit backend(vulkan::device& dev);
  ~backend() override;
  backend(const backend&) = delete;
  backend& operator=(const backend&) = delete;

  std::string_view name() const override { return dev_.name(); }
  device_i& device() const override { return dev_; }
  // Throws backend_error naming the node for one the device cannot compute or whose tensors are not in
  // its buffers, out_of_memory_error when the driver runs out.
  void graph_compute(graph& g) override;

  // What the last graph recorded: its dispatches and the barriers between them.
  struct graph_stats {
    uint32_t dispatches = 0;
    uint32_t barriers = 0;
    uint32_t descriptor_sets_made = 0;  // 0 once the same graph has run before
  };
  graph_stats last_graph() const { return stats_; }

  // Which shader takes matrix products of more than 8 activation rows (of 1..8 as well, when not
  // automatic): chosen per device by default (registers on a CPU driver, tiled on a GPU); tests force each
  // so both run on any driver.
  enum class matmul_shader : uint8_t { automatic, tiled, registers };
  void force_matmul(matmul_shader s) { matmul_ = s; }

 private:
  static constexpr uint32_t max_bindings = 4;

  // The descriptor set binding `buffers` (whole) to k's layout: made once and kept, since buffers are
  // bound whole and offsets travel as push constants, a decode step binds the same sets as the last one.
  VkDescriptorSet descriptor_set(const kernel& k, std::initializer_list<VkBuffer> buffers);
  void drop_descriptor_sets();
  void record(tensor& node);
  void record_weights_op(tensor& node);  // mul_mat, get_rows
  void record_set_rows(tensor& node);
  // Records one dispatch of an embedded shader over `buffers` (bindings 0..), with its push constants,
  // and the barrier after it.
  void dispatch(const char* shader, std::initializer_list<VkBuffer> buffers, const void* params, uint32_t params_size,
                uint64_t groups);

  void begin();
  void finish();
  // Puts a barrier before node when it depends on (or overwrites) what the nodes since the last one touched.
  void order(const tensor& node);
  void barrier();

  // Byte ranges of buffers touched since the last barrier (rounded out to words: 16-bit stores write
  // their word).
  struct span {
    VkBuffer buffer;
    size_t lo, hi;
  };
  static bool overlaps(const std::vector<span>& spans, const span& s);
  std::vector<span> written_, read_;
  graph_stats stats_;
  matmul_shader matmul_ = matmul_shader::automatic;

  vulkan::device& dev_;
  // TROUPE_VULKAN_PERF=1: each node submitted and waited for on its own, its time summed per op and shader,
  // the totals logged when the backend is destroyed (a profile, not a way to run).
  bool perf_ = false;
  struct perf_entry {
    double seconds = 0;
    uint64_t count = 0;
  };
  std::map<std::string, perf_entry> perf_totals_;
  VkCommandPool pool_ = VK_NULL_HANDLE;
  VkCommandBuffer cmd_ = VK_NULL_HANDLE;
  VkFence fence_ = VK_NULL_HANDLE;
  static constexpr uint32_t sets_per_pool = 256;
  std::vector<VkDescriptorPool> pools_;
  uint32_t pool_left_ = 0;  // sets the last pool can still give
  std::map<std::array<uint64_t, 1 + max_bindings>, VkDescriptorSet> sets_;  // (layout, buffers) -> set
  uint64_t generation_ = ~uint64_t{0};  // the device's buffer generation the sets were made in
};

// Whether node t is one the backend computes (or a view, which costs nothing). In vulkan_ops.cpp, with
// backend::record.
bool computes(const tensor& t);

// Nodes that only reinterpret their source's memory: no work.
inline bool is_layout_op(op o) { return o == op::none || is_view_op(o); }

// local_size_x of every shader.
inline constexpr uint32_t shader_group_size = 256;

}  // namespace troupe::vulkan
