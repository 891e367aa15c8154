// Helpers shared by the two files that record Vulkan nodes: vulkan_ops.cpp (computes() and
// backend::record, the element-wise and row ops) and vulkan_ops_weights.cpp (the ops over weights of any
// type, and set_rows): where a tensor lies in its Vulkan buffer, its dimensions as the shaders take them,
// workgroup counts. Not part of the backend's interface.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "backends/vulkan/vulkan_backend.h"
#include "backends/vulkan/vulkan_buffer.h"
#include "runtime/tensor.h"

namespace troupe::vulkan::detail {

// Element offset and strides of a tensor in its Vulkan buffer (in elements of its type: 4 or 2 bytes).
struct f32_view {
  VkBuffer buffer = VK_NULL_HANDLE;
  uint32_t off = 0;
  uint32_t nb[4] = {};
};

// The Vulkan buffer t lies in and t's byte offset in it, which must be a multiple of `align`; throws
// backend_error naming the tensor otherwise, or when t is not in dev's memory.
inline std::pair<vulkan::buffer*, size_t> place_of(const vulkan::device& dev, const tensor& t, size_t align) {
  auto* b = dynamic_cast<vulkan::buffer*>(t.buffer);
  if (b == nullptr || &b->type().device() != &dev) {
    throw backend_error(std::string(dev.name()) + ": tensor " + describe(t) + " is not in this device's memory");
  }
  const size_t at = b->offset_of(t);
  if (at % align != 0) throw backend_error(std::string(dev.name()) + ": tensor " + describe(t) + " is not aligned to its type");
  return {b, at};
}

inline f32_view view_of(const vulkan::device& dev, const tensor& t) {
  const size_t es = type_size(t.type);
  const auto [b, at] = place_of(dev, t, es);
  f32_view v;
  v.buffer = b->handle();
  v.off = static_cast<uint32_t>(at / es);
  for (int i = 0; i < 4; ++i) v.nb[i] = static_cast<uint32_t>(t.nb[static_cast<size_t>(i)] / es);
  return v;
}

// 0 f32, 1 f16, 2 bf16: the float types the copy shader converts between.
inline uint32_t float_code(type t) { return t == type::f32 ? 0 : t == type::f16 ? 1 : 2; }
// set_rows.comp's code for a destination of blocks of 32 values (a quantized KV cache): 3 q8_0, 4 q4_0, 5 q4_1,
// 6 q5_0, 7 q5_1, 8 iq4_nl; -1 for any other type.
int set_rows_code(type t);

// A tensor's four dimensions, as the shaders take them.
inline void dims_of(const tensor& t, uint32_t (&out)[4]) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<uint32_t>(t.ne[static_cast<size_t>(i)]);
}

// Workgroups for one invocation per unit (element, pair, word).
inline uint64_t groups_for(uint64_t units) { return (units + shader_group_size - 1) / shader_group_size; }

}  // namespace troupe::vulkan::detail
