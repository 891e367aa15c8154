// Shared helpers of the CPU kernels (backends/cpu/kernels_*.cpp); not part of the backend's interface.
//
// Every kernel family has a supports_* predicate (types and layouts it really handles; shapes are
// guaranteed by op construction in runtime/ops.cpp) and a compute_* function that checks the predicate,
// throws backend_error through unsupported() when it fails, and computes its share ith/nth of the node.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "backends/cpu/kernels.h"
#include "runtime/fp16.h"
#include "runtime/tensor.h"
#include "runtime/types.h"

namespace troupe::cpu::detail {

constexpr size_t cache_line = 64;

inline size_t align_up(size_t n, size_t a = cache_line) { return (n + a - 1) / a * a; }

// The share [begin, end) of n items that thread ith of nth works on (contiguous, possibly empty).
struct item_range {
  int64_t begin = 0;
  int64_t end = 0;
};
inline item_range split_range(int64_t n, int ith, int nth) {
  const int64_t per = (n + nth - 1) / nth;
  const int64_t begin = std::min(n, per * ith);
  return {begin, std::min(n, begin + per)};
}

// Items [0, n) claimed dynamically (a busy core takes fewer): thread ith starts with item ith, then takes the
// next unclaimed one from a counter in the first 8 bytes of the work buffer (which thread 0 sets before the
// sync). Every thread of the node must call it.
template <class F>
void for_each_claimed(const compute_params& params, int64_t n, F&& f) {
  if (params.nth == 1) {
    for (int64_t t = 0; t < n; ++t) f(t);
    return;
  }
  std::atomic_ref<int64_t> next(*reinterpret_cast<int64_t*>(params.wdata));
  if (params.ith == 0) next.store(params.nth, std::memory_order_relaxed);
  params.sync();
  for (int64_t t = params.ith; t < n; t = next.fetch_add(1, std::memory_order_relaxed)) f(t);
}

// Row r (over dims 1..3, dim 1 fastest) of a tensor of shape ne as indices (i1, i2, i3).
struct row_index {
  int64_t i1 = 0;
  int64_t i2 = 0;
  int64_t i3 = 0;
};
inline row_index unravel_row(const tensor& t, int64_t r) {
  row_index ri;
  ri.i1 = r % t.ne[1];
  r /= t.ne[1];
  ri.i2 = r % t.ne[2];
  ri.i3 = r / t.ne[2];
  return ri;
}

// Byte address of (i0, i1, i2, i3) with i0 counted in units of nb[0] (elements or blocks).
inline char* addr(const tensor& t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
  return static_cast<char*>(t.data) + i0 * static_cast<int64_t>(t.nb[0]) + i1 * static_cast<int64_t>(t.nb[1]) +
         i2 * static_cast<int64_t>(t.nb[2]) + i3 * static_cast<int64_t>(t.nb[3]);
}
inline char* row_addr(const tensor& t, const row_index& r) { return addr(t, 0, r.i1, r.i2, r.i3); }

// Rows of t are dense arrays of `elem`-byte values at aligned addresses (so a typed pointer may walk them).
inline bool dense_rows(const tensor& t, size_t elem) {
  if (t.nb[0] != elem || reinterpret_cast<uintptr_t>(t.data) % elem != 0) return false;
  return t.nb[1] % elem == 0 && t.nb[2] % elem == 0 && t.nb[3] % elem == 0;
}

// Throws backend_error "cpu: <op>: <why>: node = <describe>, src0 = <describe>, ...".
[[noreturn]] void unsupported(const tensor& node, std::string_view why);

// Throws backend_error when the work buffer the backend passed is smaller than `need`.
void require_work(const compute_params& params, const tensor& node, size_t need);

// ---- plain float element types (f32, f16, bf16) ----

inline bool is_float_type(type t) { return t == type::f32 || t == type::f16 || t == type::bf16; }

inline float load_float(const void* p, type t) {
  if (t == type::f32) {
    float v;
    std::memcpy(&v, p, 4);
    return v;
  }
  uint16_t h;
  std::memcpy(&h, p, 2);
  return t == type::f16 ? fp16_to_fp32(h) : bf16_to_fp32(h);
}

inline void store_float(void* p, type t, float v) {
  if (t == type::f32) {
    std::memcpy(p, &v, 4);
    return;
  }
  const uint16_t h = t == type::f16 ? fp32_to_fp16(v) : fp32_to_bf16(v);
  std::memcpy(p, &h, 2);
}

// Converts n elements between plain float types; either side may be strided (byte strides).
void convert_floats(const char* src, size_t src_stride, type src_t, char* dst, size_t dst_stride, type dst_t,
                    int64_t n);

// Reads n f32 values at a byte stride into a dense float array.
inline void gather_f32(const char* src, size_t stride, float* out, int64_t n) {
  if (stride == sizeof(float)) {
    std::memcpy(out, src, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  for (int64_t i = 0; i < n; ++i) std::memcpy(&out[i], src + i * static_cast<int64_t>(stride), sizeof(float));
}

// Copies n units of `size` bytes; either side may be strided.
void copy_units(const char* src, size_t src_stride, char* dst, size_t dst_stride, size_t size, int64_t n);

// ---- kernel families ----

bool supports_binary(const tensor& node);  // add, sub, mul, div
void compute_binary(const compute_params& params, tensor& node);
bool supports_scale(const tensor& node);
void compute_scale(const compute_params& params, tensor& node);

bool supports_norm(const tensor& node);  // rms_norm, norm
void compute_norm(const compute_params& params, tensor& node);
void softmax_normalize(float* y, int64_t n, float mx, bool reference);
// The sum softmax_normalize (and flash_attn's sparse softmax) divides by: the nonzero values in order, the
// r-th into lane r % 16, the lanes then added pairwise. It depends only on the nonzero values and their
// order, not on where they lie in the row (a sequence's cells in the cache) or on the zeros between them.
// The values are added by the kernel table's exp_lane_sum, with their exponentials.
struct nonzero_lane_sum {
  float lanes[16] = {};
  unsigned lane = 0;
  float total() {
    for (unsigned w = 8; w > 0; w /= 2) {
      for (unsigned j = 0; j < w; ++j) lanes[j] += lanes[j + w];
    }
    return lanes[0];
  }
};
bool supports_soft_max(const tensor& node);
void compute_soft_max(const compute_params& params, tensor& node);

bool supports_unary(const tensor& node);  // silu, gelu, sigmoid
void compute_unary(const compute_params& params, tensor& node);
bool supports_glu(const tensor& node);
void compute_glu(const compute_params& params, tensor& node);

bool supports_rope(const tensor& node);
size_t rope_work_size(const tensor& node, int nth);
void compute_rope(const compute_params& params, tensor& node);

bool supports_cpy(const tensor& node);  // cpy, cont
size_t cpy_work_size(const tensor& node, int nth);
void compute_cpy(const compute_params& params, tensor& node);
bool supports_get_rows(const tensor& node);
void compute_get_rows(const compute_params& params, tensor& node);
bool supports_set_rows(const tensor& node);
size_t set_rows_work_size(const tensor& node, int nth);
void compute_set_rows(const compute_params& params, tensor& node);

bool supports_concat(const tensor& node);
void compute_concat(const compute_params& params, tensor& node);
bool supports_pad(const tensor& node);
void compute_pad(const compute_params& params, tensor& node);
bool supports_reduce(const tensor& node);  // sum_rows, mean
void compute_reduce(const compute_params& params, tensor& node);
bool supports_argmax(const tensor& node);
void compute_argmax(const compute_params& params, tensor& node);

bool supports_flash_attn(const tensor& node);
size_t flash_attn_work_size(const tensor& node, int nth);
void compute_flash_attn(const compute_params& params, tensor& node);

bool supports_mul_mat(const tensor& node);
size_t mul_mat_work_size(const tensor& node, int nth, bool reference);
void compute_mul_mat(const compute_params& params, tensor& node);
const char* mul_mat_kernel_family_of(type t, int64_t n);  // mul_mat_kernel_family (kernels.h)
bool supports_mul_mat_id(const tensor& node);
size_t mul_mat_id_work_size(const tensor& node, int nth);
void compute_mul_mat_id(const compute_params& params, tensor& node);
bool supports_top_k(const tensor& node);
size_t top_k_work_size(const tensor& node, int nth);
void compute_top_k(const compute_params& params, tensor& node);

}  // namespace troupe::cpu::detail
