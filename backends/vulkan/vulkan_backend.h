// The Vulkan backend: runs graphs on one device. Each graph is one command buffer: per node a compute
// pipeline (from the device's kernel cache), its buffers bound as storage buffers (whole buffers; element
// offsets and strides as push constants; descriptor sets made once per set of buffers and kept) and a
// dispatch. A barrier goes before a node only where it reads, or writes, bytes that a node since the last
// barrier wrote (or writes bytes one of them read): independent nodes (the q, k and v products of a layer)
// run without one between.
//
//   backend_ptr be = dev.init_backend();
//   be->graph_compute(g);         // every node supported (device::supports_op) and placed in dev's buffers
//
// Graphs queue (queues_graphs): graph_submit records and submits a graph and returns, the device runs what
// it was sent in order, finish_oldest / synchronize wait. Command buffers, fences and upload staging come
// from a ring of frames, so several graphs can be in flight. set_tensor_async copies host bytes into the
// frame being recorded (its own staging memory) and records the copy into it, ahead of the next graph: an
// upload costs the host a memcpy while the device still runs the graphs before it, and the device takes it
// in order. graph_compute is graph_submit and synchronize.
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
#include <deque>
#include <initializer_list>
#include <map>
#include <mutex>

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
  // Queued unless TROUPE_VULKAN_PERF profiles (each node then waited for on its own).
  bool queues_graphs() const override { return !perf_; }
  void graph_submit(graph& g) override;
  bool finish_oldest(std::chrono::microseconds timeout, int wake_fd = -1) override;
  void synchronize() override;
  // t in this device's buffers: recorded ahead of the next graph (data copied before return); elsewhere:
  // tensor_set.
  void set_tensor_async(tensor& t, const void* data, size_t offset, size_t size) override;
  // Waits for what was queued, then reads.
  void get_tensor_async(const tensor& t, void* data, size_t offset, size_t size) override;

  // What the last graph recorded: its dispatches and the barriers between them.
  struct graph_stats {
    uint32_t dispatches = 0;
    uint32_t barriers = 0;
    uint32_t descriptor_sets_made = 0;  // 0 once the same graph has run before
  };
  graph_stats last_graph() const { return stats_; }
  // Graphs submitted and not yet finished (finish_oldest, synchronize).
  size_t in_flight() const;
  static constexpr size_t n_frames = 4;  // graphs in flight at most (graph_submit waits for the oldest beyond)

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
  void record_weights_op(tensor& node);  // mul_mat, mul_mat_id, get_rows
  void record_set_rows(tensor& node);
  // Records one dispatch of an embedded shader over `buffers` (bindings 0..), with its push constants,
  // and the barrier after it.
  void dispatch(const char* shader, std::initializer_list<VkBuffer> buffers, const void* params, uint32_t params_size,
                uint64_t groups);

  // A frame of the ring: a command buffer, its fence, and staging chunks for the uploads recorded in it.
  struct chunk {
    VkBuffer buffer = VK_NULL_HANDLE;
    VkDeviceMemory memory = VK_NULL_HANDLE;
    void* map = nullptr;
    size_t size = 0, used = 0;
  };
  struct frame {
    VkCommandBuffer cmd = VK_NULL_HANDLE;
    VkFence fence = VK_NULL_HANDLE;
    std::vector<chunk> chunks;
    bool uploads = false;  // copies recorded since it was opened
    uint64_t serial = 0;   // of its submission, while in flight
  };
  // The frame being recorded (opened: the ring's next, its earlier use waited for, its command buffer
  // begun with a barrier after everything queued before). Under mu_.
  frame& open_frame();
  // Ends and submits the open frame. Under mu_.
  void submit_open();
  void destroy_frames();
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
  VkCommandBuffer cmd_ = VK_NULL_HANDLE;  // the open frame's, while one is open
  mutable std::mutex mu_;                 // the ring (graph_submit, finish_oldest and synchronize may come from several threads)
  std::array<frame, n_frames> frames_;
  size_t next_ = 0;                       // the frame opened next
  bool open_ = false;                     // frames_[next_] is being recorded
  std::deque<size_t> in_flight_;          // submitted frames, oldest first
  uint64_t serial_ = 0;
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
