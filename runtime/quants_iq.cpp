// Reference code of the codebook 4-bit i-quants (runtime/quants_iq.h): iq4_nl and iq4_xs.
#include "runtime/quants_iq.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>

#include "runtime/quants.h"

namespace troupe {

namespace {

constexpr int n_try = 7;  // candidate scales each side of the one that maps the largest value onto -127

// The index of the codebook entry nearest to v (in codebook units); ties go to the lower entry.
int nearest_iq4(float v) {
  if (v <= iq4nl_values[0]) return 0;
  if (v >= iq4nl_values[15]) return 15;
  int lo = 0, hi = 15;  // iq4nl_values[lo] < v < iq4nl_values[hi]
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    (v < iq4nl_values[mid] ? hi : lo) = mid;
  }
  return v - iq4nl_values[lo] <= iq4nl_values[hi] - v ? lo : hi;
}

// Indices of n values for scale d (0: every index 0, which decodes to 0 with d = 0).
void indices_for(const float* x, int n, float d, uint8_t* q) {
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  for (int j = 0; j < n; ++j) q[j] = static_cast<uint8_t>(d != 0.0f ? nearest_iq4(id * x[j]) : 0);
}

// The scale of a group of n values: the weighted least-squares scale of the best index assignment among the
// candidates that map the largest-magnitude value to -127 + t (t in [-n_try, n_try]); scores sumqx^2 / sumq2
// (the error each removes). 0 for a group of zeros. The weights are |x|: between plain squared error and
// ggml's x^2 (its choice without an importance matrix); on SmolLM2 re-quantized from Q4_1, |x| gave a 2-3%
// lower perplexity than x^2 for both types (docs/quantization.md).
float fit_group(const float* x, int n) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < n; ++j) {
    if (std::fabs(x[j]) > amax) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  if (amax < 1e-30f) return 0.0f;
  float best_d = 0.0f;
  double best = -1.0;
  for (int t = -n_try; t <= n_try; ++t) {
    const float id = static_cast<float>(iq4nl_values[0] + t) / max;
    double sumqx = 0.0, sumq2 = 0.0;
    for (int j = 0; j < n; ++j) {
      const double q = iq4nl_values[nearest_iq4(id * x[j])];
      const double w = std::fabs(static_cast<double>(x[j]));
      sumqx += w * q * x[j];
      sumq2 += w * q * q;
    }
    if (sumq2 > 0.0 && sumqx * sumqx / sumq2 > best) {
      best = sumqx * sumqx / sumq2;
      best_d = static_cast<float>(sumqx / sumq2);
    }
  }
  return best_d;
}

// Codebook values of one 32-value group laid out as an iq4_nl block's nibbles.
void pack_group(const uint8_t q[32], uint8_t qs[16]) {
  for (int j = 0; j < 16; ++j) qs[j] = static_cast<uint8_t>(q[j] | (q[j + 16] << 4));
}

void unpack_group(const uint8_t qs[16], int8_t v[32]) {
  for (int j = 0; j < 16; ++j) {
    v[j] = iq4nl_values[qs[j] & 0xF];
    v[j + 16] = iq4nl_values[qs[j] >> 4];
  }
}

int32_t int_dot32(const int8_t a[32], const int8_t b[32]) {
  int32_t s = 0;
  for (int j = 0; j < 32; ++j) s += static_cast<int32_t>(a[j]) * b[j];
  return s;
}

}  // namespace

// ===================================== iq4_nl ===========================================================

void quantize_row_iq4_nl_ref(const float* x, void* vy, int64_t n) {
  assert(n % qk4_nl == 0);
  block_iq4_nl* y = static_cast<block_iq4_nl*>(vy);
  uint8_t q[qk4_nl];
  for (int64_t i = 0; i < n / qk4_nl; ++i, x += qk4_nl) {
    y[i].d = fp32_to_fp16(fit_group(x, qk4_nl));
    // The indices for the scale as stored (fp16), which is what the dequantizer multiplies by.
    indices_for(x, qk4_nl, fp16_to_fp32(y[i].d), q);
    pack_group(q, y[i].qs);
  }
}

void dequantize_row_iq4_nl(const void* vx, float* y, int64_t n) {
  assert(n % qk4_nl == 0);
  const block_iq4_nl* x = static_cast<const block_iq4_nl*>(vx);
  int8_t v[qk4_nl];
  for (int64_t i = 0; i < n / qk4_nl; ++i, y += qk4_nl) {
    const float d = fp16_to_fp32(x[i].d);
    unpack_group(x[i].qs, v);
    for (int j = 0; j < qk4_nl; ++j) y[j] = d * v[j];
  }
}

void vec_dot_iq4_nl_q8_0(int64_t n, float* s, const void* vx, const void* vy) {
  assert(n % qk4_nl == 0);
  const block_iq4_nl* x = static_cast<const block_iq4_nl*>(vx);
  const block_q8_0* y = static_cast<const block_q8_0*>(vy);
  double sum = 0.0;
  int8_t v[qk4_nl];
  for (int64_t i = 0; i < n / qk4_nl; ++i) {
    unpack_group(x[i].qs, v);
    sum += static_cast<double>(fp16_to_fp32(x[i].d)) * fp16_to_fp32(y[i].d) * int_dot32(v, y[i].qs);
  }
  *s = static_cast<float>(sum);
}

// ===================================== iq4_xs ===========================================================

// Each sub-block's scale is fitted alone; the super-block scale d maps the largest-magnitude one to -32 (the
// 6-bit range is [-32, 31]), each sub-block keeps the nearest multiple of d, and its indices are chosen again
// for the scale it gets.
void quantize_row_iq4_xs_ref(const float* x, void* vy, int64_t n) {
  assert(n % qk_k == 0);
  block_iq4_xs* y = static_cast<block_iq4_xs*>(vy);
  constexpr int n_sub = qk_k / 32;
  for (int64_t i = 0; i < n / qk_k; ++i, x += qk_k) {
    block_iq4_xs& b = y[i];
    std::memset(&b, 0, sizeof b);
    float sub[n_sub];
    float max_scale = 0.0f;
    for (int j = 0; j < n_sub; ++j) {
      sub[j] = fit_group(x + 32 * j, 32);
      if (std::fabs(sub[j]) > std::fabs(max_scale)) max_scale = sub[j];
    }
    b.d = fp32_to_fp16(-max_scale / 32.0f);
    const float d = fp16_to_fp32(b.d);
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int j = 0; j < n_sub; ++j) {
      const int l = std::clamp(static_cast<int>(std::lround(id * sub[j])), -32, 31);
      uint8_t q[32];
      indices_for(x + 32 * j, 32, d * static_cast<float>(l), q);
      pack_group(q, b.qs + 16 * j);
      const int ls = l + 32;
      b.scales_l[j / 2] = static_cast<uint8_t>(b.scales_l[j / 2] | ((ls & 0xF) << (4 * (j % 2))));
      b.scales_h = static_cast<uint16_t>(b.scales_h | ((ls >> 4) << (2 * j)));
    }
  }
}

void dequantize_row_iq4_xs(const void* vx, float* y, int64_t n) {
  assert(n % qk_k == 0);
  const block_iq4_xs* x = static_cast<const block_iq4_xs*>(vx);
  int8_t v[32];
  for (int64_t i = 0; i < n / qk_k; ++i) {
    const float d = fp16_to_fp32(x[i].d);
    for (int j = 0; j < qk_k / 32; ++j, y += 32) {
      const float dl = d * static_cast<float>(iq4_xs_scale(x[i], j) - 32);
      unpack_group(x[i].qs + 16 * j, v);
      for (int l = 0; l < 32; ++l) y[l] = dl * v[l];
    }
  }
}

void vec_dot_iq4_xs_q8_K(int64_t n, float* s, const void* vx, const void* vy) {
  assert(n % qk_k == 0);
  const block_iq4_xs* x = static_cast<const block_iq4_xs*>(vx);
  const block_q8_K* y = static_cast<const block_q8_K*>(vy);
  double sum = 0.0;
  int8_t v[32];
  for (int64_t i = 0; i < n / qk_k; ++i) {
    int64_t isum = 0;
    for (int j = 0; j < qk_k / 32; ++j) {
      unpack_group(x[i].qs + 16 * j, v);
      isum += static_cast<int64_t>(iq4_xs_scale(x[i], j) - 32) * int_dot32(v, y[i].qs + 32 * j);
    }
    sum += static_cast<double>(y[i].d) * fp16_to_fp32(x[i].d) * static_cast<double>(isum);
  }
  *s = static_cast<float>(sum);
}

}  // namespace troupe
