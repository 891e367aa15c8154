// Row-wise normalisations: rms_norm, norm, soft_max (with mask and ALiBi).
//
// f32 sources with any strides; threads split rows. Sums are accumulated in double, except soft_max's sum of
// exponentials outside reference mode, which comes from the active SIMD table's exp_row (float lanes).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "backends/cpu/kernels_internal.h"
#include "backends/cpu/simd/simd.h"
#include "runtime/ops.h"

namespace troupe::cpu::detail {

namespace {

inline float ld(const char* p) {
  float v;
  std::memcpy(&v, p, 4);
  return v;
}
inline void st(char* p, float v) { std::memcpy(p, &v, 4); }

}  // namespace

bool supports_norm(const tensor& node) {
  return node.type == type::f32 && node.src[0] != nullptr && node.src[0]->type == type::f32;
}

// rms_norm: y = x / sqrt(mean(x^2) + eps); norm: y = (x - mean) / sqrt(var + eps). Per row of ne0 values.
void compute_norm(const compute_params& params, tensor& node) {
  if (!supports_norm(node)) unsupported(node, "needs f32 a and dst");
  const tensor& a = *node.src[0];
  const float eps = node.param<float>(0);
  const bool rms = node.op == op::rms_norm;
  const int64_t ne0 = a.ne[0];
  const int64_t sa = static_cast<int64_t>(a.nb[0]);
  const int64_t sd = static_cast<int64_t>(node.nb[0]);
  const item_range rows = split_range(nrows(node), params.ith, params.nth);
  for (int64_t r = rows.begin; r < rows.end; ++r) {
    const row_index ri = unravel_row(node, r);
    const char* x = row_addr(a, ri);
    char* y = row_addr(node, ri);
    if (rms) {
      double sum = 0.0;
      for (int64_t i = 0; i < ne0; ++i) {
        const double v = ld(x + i * sa);
        sum += v * v;
      }
      const float mean = static_cast<float>(sum / static_cast<double>(ne0));
      const float s = 1.0f / std::sqrt(mean + eps);
      for (int64_t i = 0; i < ne0; ++i) st(y + i * sd, ld(x + i * sa) * s);
    } else {
      double sum = 0.0;
      for (int64_t i = 0; i < ne0; ++i) sum += ld(x + i * sa);
      const double mean = sum / static_cast<double>(ne0);
      double sum2 = 0.0;
      for (int64_t i = 0; i < ne0; ++i) {
        const double v = ld(x + i * sa) - mean;
        sum2 += v * v;
      }
      const float var = static_cast<float>(sum2 / static_cast<double>(ne0));
      const float s = 1.0f / std::sqrt(var + eps);
      for (int64_t i = 0; i < ne0; ++i) {
        st(y + i * sd, static_cast<float>(ld(x + i * sa) - mean) * s);
      }
    }
  }
}

// y[i] = exp(y[i] - mx) / sum for a row of scaled, masked logits whose max is mx (soft_max's second half,
// shared with flash_attn so the two give the same bits); a row whose every logit is -inf comes out zeros.
void softmax_normalize(float* y, int64_t ne0, float mx, bool reference) {
  if (mx == -INFINITY) {  // fully masked row: exp(-inf - -inf) would be NaN
    for (int64_t i = 0; i < ne0; ++i) y[i] = 0.0f;
    return;
  }
  if (!reference) {
    // Entries after the last unmasked one (a causal prefill's rows end in -inf) are exp(-inf) = +0 and are
    // not computed. The sum does not take exp_row's (whose lanes follow the entries' positions):
    // nonzero_lane_sum's depends only on the unmasked values and their order, not on where they lie in the
    // row (a sequence's cells in the cache) or on the masked entries between them (other sequences' cells).
    int64_t n_live = ne0;
    while (n_live > 0 && y[n_live - 1] == -INFINITY) --n_live;
    const simd::kernel_table& tb = simd::active_table();
    nonzero_lane_sum lanes;
    tb.exp_lane_sum(n_live, y, mx, lanes.lanes, &lanes.lane);
    for (int64_t i = n_live; i < ne0; ++i) y[i] = 0.0f;
    const float inv = static_cast<float>(1.0 / static_cast<double>(lanes.total()));
    tb.scale_row(ne0, y, inv);
    return;
  }
  double sum = 0.0;
  for (int64_t i = 0; i < ne0; ++i) {
    const float e = std::exp(y[i] - mx);
    y[i] = e;
    sum += e;
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < ne0; ++i) y[i] *= inv;
}

bool supports_soft_max(const tensor& node) {
  const tensor* a = node.src[0];
  const tensor* mask = node.src[1];
  if (a == nullptr || a->type != type::f32 || node.type != type::f32) return false;
  // The destination row doubles as the scratch row, so it must be a dense f32 array.
  if (!dense_rows(node, 4)) return false;
  if (mask != nullptr && mask->type != type::f32 && mask->type != type::f16) return false;
  return true;
}

// dst = softmax(a * scale + slope * mask) per row, like ggml's soft_max: the mask row is row i1 of the
// mask plane (i2 % mask.ne2, i3 % mask.ne3); slope is 1, or with max_bias > 0 the ALiBi slope of head i2.
// A row whose every logit is -inf (fully masked) comes out all zeros rather than NaN.
void compute_soft_max(const compute_params& params, tensor& node) {
  if (!supports_soft_max(node)) unsupported(node, "needs f32 a, f32/f16 mask and dense f32 dst rows");
  const tensor& a = *node.src[0];
  const tensor* mask = node.src[1];
  const float scale = node.param<float>(0);
  const float max_bias = node.param<float>(1);

  const alibi_constants alibi = alibi_constants_of(max_bias, static_cast<uint32_t>(a.ne[2]));
  const uint32_t n_head_log2 = alibi.n_head_log2;
  const float m0 = alibi.m0;
  const float m1 = alibi.m1;

  const int64_t ne0 = a.ne[0];
  const int64_t sa = static_cast<int64_t>(a.nb[0]);
  const int64_t sm = mask != nullptr ? static_cast<int64_t>(mask->nb[0]) : 0;
  const item_range rows = split_range(nrows(node), params.ith, params.nth);
  for (int64_t r = rows.begin; r < rows.end; ++r) {
    const row_index ri = unravel_row(node, r);
    const uint32_t h = static_cast<uint32_t>(ri.i2);
    float slope = 1.0f;
    if (max_bias > 0.0f) {
      slope = h < n_head_log2 ? std::pow(m0, static_cast<float>(h + 1))
                              : std::pow(m1, static_cast<float>(2 * (h - n_head_log2) + 1));
    }
    const char* x = row_addr(a, ri);
    const char* m = mask != nullptr ? addr(*mask, 0, ri.i1, ri.i2 % mask->ne[2], ri.i3 % mask->ne[3]) : nullptr;
    float* y = reinterpret_cast<float*>(row_addr(node, ri));

    float mx = -INFINITY;
    for (int64_t i = 0; i < ne0; ++i) {
      float v = ld(x + i * sa) * scale;
      if (m != nullptr) v += slope * load_float(m + i * sm, mask->type);
      y[i] = v;
      if (v > mx) mx = v;
    }
    softmax_normalize(y, ne0, mx, params.reference);
  }
}

}  // namespace troupe::cpu::detail
