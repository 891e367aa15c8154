// Tensors: up to 4 dimensions with byte strides, views, op + parameters + sources.
//
//   tensor* w = ctx.new_tensor_2d(type::q4_0, 4096, 11008);  // ne = [4096, 11008], nb[1] = row bytes
//   tensor* x = ctx.new_tensor_2d(type::f32, 4096, n_tokens);
//   tensor* y = mul_mat(ctx, w, x);                          // [11008, n_tokens], f32
//
// Dimension 0 is the innermost (contiguous) one. nb[0] is the size of one block (element for plain types),
// nb[i] the byte stride of dimension i. A view shares its source's data: view_src/view_offs say where.
// Tensors are created by a context, which owns them; everything else holds non-owning pointers.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "runtime/types.h"

namespace troupe {

constexpr int max_dims = 4;
constexpr int max_src = 4;
constexpr int max_op_params = 16;  // 32-bit words
constexpr size_t max_name = 64;    // including the terminating zero

class buffer_i;

// What a node computes. Parameters and sources of each op are documented in runtime/ops.h.
enum class op : uint8_t {
  none,  // a leaf: input, weight or constant
  add,
  sub,
  mul,
  div,
  scale,
  rms_norm,
  norm,
  rope,
  soft_max,
  silu,
  gelu,
  glu,
  cpy,
  cont,
  set_rows,
  get_rows,
  mul_mat,
  view,
  reshape,
  permute,
  transpose,
  concat,
  pad,
  mean,
  sum_rows,
  argmax,
  flash_attn,
  mul_mat_id,
  top_k,
  sigmoid,
  count,
};

std::string_view op_name(op o);

enum tensor_flag : uint32_t {
  flag_input = 1u << 0,   // filled by the caller before compute
  flag_output = 1u << 1,  // read by the caller after compute: its memory is never reused
  flag_weight = 1u << 2,  // model weight: placed by the loader, read-only during compute
};

struct tensor {
  ::troupe::type type = ::troupe::type::f32;
  std::array<int64_t, max_dims> ne{1, 1, 1, 1};  // elements per dimension
  std::array<size_t, max_dims> nb{0, 0, 0, 0};   // bytes per step in each dimension

  ::troupe::op op = ::troupe::op::none;
  std::array<int32_t, max_op_params> op_params{};  // op-specific, see runtime/ops.h
  uint32_t flags = 0;
  std::array<tensor*, max_src> src{};

  tensor* view_src = nullptr;  // the tensor whose data this one views (never itself a view)
  size_t view_offs = 0;        // byte offset into view_src's data

  void* data = nullptr;        // host address or device handle, placed by a context or an allocator
  buffer_i* buffer = nullptr;  // the buffer holding data, if any
  void* extra = nullptr;       // backend-private per-tensor state

  char name[max_name] = {};

  void set_name(std::string_view n);
  std::string_view get_name() const { return name; }

  template <class T>
  T param(int i) const {
    static_assert(sizeof(T) == 4);
    T v;
    __builtin_memcpy(&v, &op_params[static_cast<size_t>(i)], 4);
    return v;
  }
  template <class T>
  void set_param(int i, T v) {
    static_assert(sizeof(T) == 4);
    __builtin_memcpy(&op_params[static_cast<size_t>(i)], &v, 4);
  }
};

int64_t nelements(const tensor& t);
int64_t nrows(const tensor& t);  // ne[1] * ne[2] * ne[3]
size_t nbytes(const tensor& t);  // bytes spanned from data to the last element, strides respected
int n_dims(const tensor& t);     // index of the last dimension > 1, plus one (at least 1)

bool is_contiguous(const tensor& t);       // dense, in dimension order
bool is_contiguous_rows(const tensor& t);  // each row (dim 0) dense; rows may be strided
bool is_transposed(const tensor& t);       // nb[0] > nb[1]
bool is_permuted(const tensor& t);         // strides not increasing
bool same_shape(const tensor& a, const tensor& b);
// b can be broadcast over a: each a.ne[i] is a multiple of b.ne[i].
bool can_repeat(const tensor& b, const tensor& a);

// "name [ne0, ne1, ne2, ne3] type": for error messages and logs.
std::string describe(const tensor& t);

// Strides of a dense tensor of this type and shape.
std::array<size_t, max_dims> dense_strides(type t, const std::array<int64_t, max_dims>& ne);

}  // namespace troupe
