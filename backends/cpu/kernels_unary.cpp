// Activations: silu, gelu (tanh approximation), sigmoid and the fused gated units swiglu / geglu.
//
// f32 with any strides; threads split the rows of the destination. Outside reference mode, silu and swiglu
// over dense rows use the active SIMD table's row functions.
#include <cmath>
#include <cstring>
#include <utility>

#include "backends/cpu/kernels_internal.h"
#include "backends/cpu/simd/simd.h"
#include "runtime/ops.h"

namespace troupe::cpu::detail {

namespace {

constexpr float gelu_coef_a = 0.044715f;
constexpr float sqrt_2_over_pi = 0.79788456080286535587989211986876f;

inline float silu(float x) { return x / (1.0f + std::exp(-x)); }
inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
inline float gelu(float x) {
  return 0.5f * x * (1.0f + std::tanh(sqrt_2_over_pi * x * (1.0f + gelu_coef_a * x * x)));
}

inline float ld(const char* p) {
  float v;
  std::memcpy(&v, p, 4);
  return v;
}
inline void st(char* p, float v) { std::memcpy(p, &v, 4); }

template <float (*Act)(float)>
void unary(const compute_params& params, tensor& node) {
  const tensor& a = *node.src[0];
  const int64_t ne0 = node.ne[0];
  const int64_t sa = static_cast<int64_t>(a.nb[0]);
  const int64_t sd = static_cast<int64_t>(node.nb[0]);
  const simd::silu_row_fn silu_row =
      Act == silu && !params.reference && dense_rows(a, 4) && dense_rows(node, 4) ? simd::active_table().silu_row
                                                                                  : nullptr;
  const item_range rows = split_range(nrows(node), params.ith, params.nth);
  for (int64_t r = rows.begin; r < rows.end; ++r) {
    const row_index ri = unravel_row(node, r);
    const char* x = row_addr(a, ri);
    char* y = row_addr(node, ri);
    if (silu_row != nullptr) {
      silu_row(ne0, reinterpret_cast<const float*>(x), reinterpret_cast<float*>(y));
      continue;
    }
    for (int64_t i = 0; i < ne0; ++i) st(y + i * sd, Act(ld(x + i * sa)));
  }
}

// dst row = act(x) * g over nc values; x and g are strided views into a (and b).
template <float (*Act)(float)>
void glu_rows(const compute_params& params, tensor& node) {
  const tensor& a = *node.src[0];
  const tensor* b = node.src[1];
  const bool swapped = node.param<int32_t>(1) != 0;
  const int64_t nc = node.ne[0];
  const int64_t sa = static_cast<int64_t>(a.nb[0]);
  const int64_t sb = b != nullptr ? static_cast<int64_t>(b->nb[0]) : sa;
  const int64_t sd = static_cast<int64_t>(node.nb[0]);
  const bool dense = dense_rows(a, 4) && (b == nullptr || dense_rows(*b, 4)) && dense_rows(node, 4);
  const simd::swiglu_row_fn swiglu_row =
      Act == silu && !params.reference && dense ? simd::active_table().swiglu_row : nullptr;
  const item_range rows = split_range(nrows(node), params.ith, params.nth);
  for (int64_t r = rows.begin; r < rows.end; ++r) {
    const row_index ri = unravel_row(node, r);
    const char* x;  // activated half
    const char* g;  // gate half
    int64_t sx = sa;
    int64_t sg = sb;
    if (b != nullptr) {
      // Two tensors of the same shape: act(a) * b, or act(b) * a when swapped.
      x = row_addr(a, ri);
      g = row_addr(*b, ri);
      if (swapped) {
        std::swap(x, g);
        std::swap(sx, sg);
      }
    } else {
      // One tensor whose rows are [x | g] (2 * nc values): act(x) * g, or act(g) * x when swapped.
      const char* row = row_addr(a, ri);
      x = row + (swapped ? nc : 0) * sa;
      g = row + (swapped ? 0 : nc) * sa;
    }
    char* y = row_addr(node, ri);
    if (swiglu_row != nullptr) {
      swiglu_row(nc, reinterpret_cast<const float*>(x), reinterpret_cast<const float*>(g), reinterpret_cast<float*>(y));
      continue;
    }
    for (int64_t i = 0; i < nc; ++i) st(y + i * sd, Act(ld(x + i * sx)) * ld(g + i * sg));
  }
}

}  // namespace

bool supports_unary(const tensor& node) {
  return node.type == type::f32 && node.src[0] != nullptr && node.src[0]->type == type::f32;
}

void compute_unary(const compute_params& params, tensor& node) {
  if (!supports_unary(node)) unsupported(node, "needs f32 a and dst");
  if (node.op == op::silu) return unary<silu>(params, node);
  if (node.op == op::gelu) return unary<gelu>(params, node);
  if (node.op == op::sigmoid) return unary<sigmoid>(params, node);
  unsupported(node, "not a unary op");
}

bool supports_glu(const tensor& node) {
  if (node.type != type::f32 || node.src[0] == nullptr || node.src[0]->type != type::f32) return false;
  if (node.src[1] != nullptr && node.src[1]->type != type::f32) return false;
  const int32_t kind = node.param<int32_t>(0);
  return kind == static_cast<int32_t>(glu_kind::swiglu) || kind == static_cast<int32_t>(glu_kind::geglu);
}

void compute_glu(const compute_params& params, tensor& node) {
  if (!supports_glu(node)) unsupported(node, "needs f32 a, b, dst and a swiglu/geglu kind");
  if (node.param<int32_t>(0) == static_cast<int32_t>(glu_kind::swiglu)) return glu_rows<silu>(params, node);
  glu_rows<gelu>(params, node);
}

}  // namespace troupe::cpu::detail
