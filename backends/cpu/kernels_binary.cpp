// Element-wise binary ops (add, sub, mul, div) with b broadcast over a, and scale.
//
// All f32. Sources and destination may have any strides (views, permutes); threads split the rows of
// the destination. The destination may alias a (in-place): every element is read before it is written.
#include <cstring>

#include "backends/cpu/kernels_internal.h"

namespace troupe::cpu::detail {

namespace {

struct op_add {
  float operator()(float x, float y) const { return x + y; }
};
struct op_sub {
  float operator()(float x, float y) const { return x - y; }
};
struct op_mul {
  float operator()(float x, float y) const { return x * y; }
};
struct op_div {
  float operator()(float x, float y) const { return x / y; }
};

inline float ld(const char* p) {
  float v;
  std::memcpy(&v, p, 4);
  return v;
}
inline void st(char* p, float v) { std::memcpy(p, &v, 4); }

// dst row = op(a row, b row broadcast): a row has ne0 values, b row ne10 (ne0 a multiple of ne10).
template <class Op>
void binary_row(Op f, float* d, const float* a, const float* b, int64_t ne0, int64_t ne10) {
  if (ne10 == ne0) {
    for (int64_t i = 0; i < ne0; ++i) d[i] = f(a[i], b[i]);
  } else if (ne10 == 1) {
    const float y = b[0];
    for (int64_t i = 0; i < ne0; ++i) d[i] = f(a[i], y);
  } else {
    for (int64_t i0 = 0; i0 < ne0; i0 += ne10) {
      for (int64_t i = 0; i < ne10; ++i) d[i0 + i] = f(a[i0 + i], b[i]);
    }
  }
}

template <class Op>
void binary(Op f, const compute_params& params, tensor& dst) {
  const tensor& a = *dst.src[0];
  const tensor& b = *dst.src[1];
  const int64_t ne0 = dst.ne[0];
  const int64_t ne10 = b.ne[0];
  const bool dense = dense_rows(a, 4) && dense_rows(b, 4) && dense_rows(dst, 4);
  const item_range rows = split_range(nrows(dst), params.ith, params.nth);
  for (int64_t r = rows.begin; r < rows.end; ++r) {
    const row_index ri = unravel_row(dst, r);
    // b's row: each index of a taken modulo b's extent in that dimension (broadcast).
    const row_index rb{ri.i1 % b.ne[1], ri.i2 % b.ne[2], ri.i3 % b.ne[3]};
    const char* pa = row_addr(a, ri);
    const char* pb = row_addr(b, rb);
    char* pd = row_addr(dst, ri);
    if (dense) {
      binary_row(f, reinterpret_cast<float*>(pd), reinterpret_cast<const float*>(pa),
                 reinterpret_cast<const float*>(pb), ne0, ne10);
      continue;
    }
    for (int64_t i0 = 0; i0 < ne0; ++i0) {
      const float x = ld(pa + i0 * static_cast<int64_t>(a.nb[0]));
      const float y = ld(pb + (i0 % ne10) * static_cast<int64_t>(b.nb[0]));
      st(pd + i0 * static_cast<int64_t>(dst.nb[0]), f(x, y));
    }
  }
}

bool f32_all(const tensor& node, int n_src) {
  if (node.type != type::f32) return false;
  for (int i = 0; i < n_src; ++i) {
    const tensor* s = node.src[static_cast<size_t>(i)];
    if (s == nullptr || s->type != type::f32) return false;
  }
  return true;
}

}  // namespace

bool supports_binary(const tensor& node) { return f32_all(node, 2); }

void compute_binary(const compute_params& params, tensor& node) {
  if (!supports_binary(node)) unsupported(node, "needs f32 a, b and dst");
  switch (node.op) {
    case op::add: return binary(op_add{}, params, node);
    case op::sub: return binary(op_sub{}, params, node);
    case op::mul: return binary(op_mul{}, params, node);
    case op::div: return binary(op_div{}, params, node);
    default: unsupported(node, "not a binary op");
  }
}

bool supports_scale(const tensor& node) { return f32_all(node, 1); }

// dst = a * scale + bias
void compute_scale(const compute_params& params, tensor& node) {
  if (!supports_scale(node)) unsupported(node, "needs f32 a and dst");
  const tensor& a = *node.src[0];
  const float s = node.param<float>(0);
  const float bias = node.param<float>(1);
  const int64_t ne0 = node.ne[0];
  const bool dense = dense_rows(a, 4) && dense_rows(node, 4);
  const item_range rows = split_range(nrows(node), params.ith, params.nth);
  for (int64_t r = rows.begin; r < rows.end; ++r) {
    const row_index ri = unravel_row(node, r);
    const char* pa = row_addr(a, ri);
    char* pd = row_addr(node, ri);
    if (dense) {
      const float* x = reinterpret_cast<const float*>(pa);
      float* y = reinterpret_cast<float*>(pd);
      for (int64_t i = 0; i < ne0; ++i) y[i] = x[i] * s + bias;
      continue;
    }
    for (int64_t i = 0; i < ne0; ++i) {
      st(pd + i * static_cast<int64_t>(node.nb[0]), ld(pa + i * static_cast<int64_t>(a.nb[0])) * s + bias);
    }
  }
}

}  // namespace troupe::cpu::detail
