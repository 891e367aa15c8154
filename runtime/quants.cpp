// Reference conversions and dot products of the plain types (f32, f16, bf16) and of the 32-value block
// types (q4_0, q4_1, q5_0, q5_1, q8_0, q8_1). Layouts are documented in quants.h; the quantizers follow
// ggml's quantize_row_*_ref algorithms step by step, so their output matches ggml's for the same input.
#include "runtime/quants.h"

#include <algorithm>
#include <cassert>
#include <cfloat>
#include <cmath>
#include <cstring>

namespace troupe {

namespace {

// ---- helpers shared by the 32-value formats ----

// Bit 4 of value v of a q5_0 / q5_1 block: bit v of the 32-bit little-endian field qh.
inline int q5_high_bit(const uint8_t qh[4], int v) { return (qh[v >> 3] >> (v & 7)) & 1; }

inline void q5_set_high_bit(uint8_t qh[4], int v) { qh[v >> 3] = static_cast<uint8_t>(qh[v >> 3] | (1u << (v & 7))); }

// The 32 unsigned 4-bit quants of a q4_0 / q4_1 block, in value order.
inline void unpack_nibbles(const uint8_t qs[16], int q[32]) {
  for (int j = 0; j < 16; ++j) {
    q[j] = qs[j] & 0xF;       // first half: low nibbles
    q[j + 16] = qs[j] >> 4;   // second half: high nibbles
  }
}

// The 32 unsigned 5-bit quants of a q5_0 / q5_1 block, in value order.
inline void unpack_q5(const uint8_t qh[4], const uint8_t qs[16], int q[32]) {
  unpack_nibbles(qs, q);
  for (int v = 0; v < 32; ++v) q[v] |= q5_high_bit(qh, v) << 4;
}

// Sum over a block of (x quant) * (y quant), exactly, in 32-bit integers (|sum| < 2^17 for these types).
inline int32_t int_dot32(const int q[32], int offset, const int8_t y[32]) {
  int32_t sum = 0;
  for (int v = 0; v < 32; ++v) sum += (q[v] - offset) * static_cast<int32_t>(y[v]);
  return sum;
}

inline int32_t int_sum32(const int8_t y[32]) {
  int32_t sum = 0;
  for (int v = 0; v < 32; ++v) sum += y[v];
  return sum;
}

// ggml's (int8_t)(v) truncation of an (offset, rounded) non-negative quant. Values outside [0, 127] only
// come from degenerate scales (1 / d overflowing for subnormal blocks); they are clamped instead of
// converting out of range (undefined behavior), and NaN gives 0.
inline int trunc_to_int(float v) {
  if (!(v >= 0.0f)) return 0;
  if (v >= 127.0f) return 127;
  return static_cast<int>(v);
}

// ggml's roundf() of a q8 quant, clamped to [-127, 127] for the same reason.
inline int8_t round_to_q8(float v) {
  if (!(v > -127.0f)) return v != v ? 0 : -127;
  if (v >= 127.0f) return 127;
  return static_cast<int8_t>(std::round(v));
}

// Value with the largest magnitude, keeping its sign (the first one when several tie).
inline float signed_abs_max(const float* x, int n) {
  float amax = 0.0f;
  float max = 0.0f;
  for (int j = 0; j < n; ++j) {
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  return max;
}

}  // namespace

// ===================================== plain types ======================================================

void quantize_row_f32_ref(const float* x, void* y, int64_t n) {
  if (n > 0) std::memcpy(y, x, static_cast<size_t>(n) * sizeof(float));
}

void dequantize_row_f32(const void* x, float* y, int64_t n) {
  if (n > 0) std::memcpy(y, x, static_cast<size_t>(n) * sizeof(float));
}

void vec_dot_f32_f32(int64_t n, float* s, const void* vx, const void* vy) {
  const float* x = static_cast<const float*>(vx);
  const float* y = static_cast<const float*>(vy);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i]) * static_cast<double>(y[i]);
  *s = static_cast<float>(sum);
}

void quantize_row_f16_ref(const float* x, void* vy, int64_t n) {
  fp16_t* y = static_cast<fp16_t*>(vy);
  for (int64_t i = 0; i < n; ++i) y[i] = fp32_to_fp16(x[i]);
}

void dequantize_row_f16(const void* vx, float* y, int64_t n) {
  const fp16_t* x = static_cast<const fp16_t*>(vx);
  for (int64_t i = 0; i < n; ++i) y[i] = fp16_to_fp32(x[i]);
}

void vec_dot_f16_f32(int64_t n, float* s, const void* vx, const void* vy) {
  const fp16_t* x = static_cast<const fp16_t*>(vx);
  const float* y = static_cast<const float*>(vy);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(fp16_to_fp32(x[i])) * static_cast<double>(y[i]);
  *s = static_cast<float>(sum);
}

void quantize_row_bf16_ref(const float* x, void* vy, int64_t n) {
  bf16_t* y = static_cast<bf16_t*>(vy);
  for (int64_t i = 0; i < n; ++i) y[i] = fp32_to_bf16(x[i]);
}

void dequantize_row_bf16(const void* vx, float* y, int64_t n) {
  const bf16_t* x = static_cast<const bf16_t*>(vx);
  for (int64_t i = 0; i < n; ++i) y[i] = bf16_to_fp32(x[i]);
}

void vec_dot_bf16_bf16(int64_t n, float* s, const void* vx, const void* vy) {
  const bf16_t* x = static_cast<const bf16_t*>(vx);
  const bf16_t* y = static_cast<const bf16_t*>(vy);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    sum += static_cast<double>(bf16_to_fp32(x[i])) * static_cast<double>(bf16_to_fp32(y[i]));
  }
  *s = static_cast<float>(sum);
}

// ===================================== quantizers =======================================================

// q4_0: the value of largest magnitude maps to quant 0 (d = max / -8, so max / d = -8); the others round
// to nearest in [0, 15] after the +8 offset.
void quantize_row_q4_0_ref(const float* x, void* vy, int64_t n) {
  assert(n % qk4_0 == 0);
  block_q4_0* y = static_cast<block_q4_0*>(vy);
  const int64_t nb = n / qk4_0;
  for (int64_t i = 0; i < nb; ++i, x += qk4_0) {
    const float max = signed_abs_max(x, qk4_0);
    const float d = max / -8;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = fp32_to_fp16(d);
    for (int j = 0; j < qk4_0 / 2; ++j) {
      const int q0 = std::min(15, trunc_to_int(x[j] * id + 8.5f));
      const int q1 = std::min(15, trunc_to_int(x[j + qk4_0 / 2] * id + 8.5f));
      y[i].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

// q4_1: [min, max] of the block split in 15 steps; m = min.
void quantize_row_q4_1_ref(const float* x, void* vy, int64_t n) {
  assert(n % qk4_1 == 0);
  block_q4_1* y = static_cast<block_q4_1*>(vy);
  const int64_t nb = n / qk4_1;
  for (int64_t i = 0; i < nb; ++i, x += qk4_1) {
    float min = FLT_MAX;
    float max = -FLT_MAX;
    for (int j = 0; j < qk4_1; ++j) {
      min = std::min(min, x[j]);
      max = std::max(max, x[j]);
    }
    const float d = (max - min) / 15;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = fp32_to_fp16(d);
    y[i].m = fp32_to_fp16(min);
    for (int j = 0; j < qk4_1 / 2; ++j) {
      const int q0 = std::min(15, trunc_to_int((x[j] - min) * id + 0.5f));
      const int q1 = std::min(15, trunc_to_int((x[j + qk4_1 / 2] - min) * id + 0.5f));
      y[i].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

// q5_0: as q4_0 with 32 levels: d = max / -16.
void quantize_row_q5_0_ref(const float* x, void* vy, int64_t n) {
  assert(n % qk5_0 == 0);
  block_q5_0* y = static_cast<block_q5_0*>(vy);
  const int64_t nb = n / qk5_0;
  for (int64_t i = 0; i < nb; ++i, x += qk5_0) {
    const float max = signed_abs_max(x, qk5_0);
    const float d = max / -16;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = fp32_to_fp16(d);
    std::memset(y[i].qh, 0, sizeof y[i].qh);
    for (int j = 0; j < qk5_0 / 2; ++j) {
      const int q0 = std::min(31, trunc_to_int(x[j] * id + 16.5f));
      const int q1 = std::min(31, trunc_to_int(x[j + qk5_0 / 2] * id + 16.5f));
      y[i].qs[j] = static_cast<uint8_t>((q0 & 0xF) | ((q1 & 0xF) << 4));
      if (q0 & 0x10) q5_set_high_bit(y[i].qh, j);
      if (q1 & 0x10) q5_set_high_bit(y[i].qh, j + qk5_0 / 2);
    }
  }
}

// q5_1: as q4_1 with 31 steps.
void quantize_row_q5_1_ref(const float* x, void* vy, int64_t n) {
  assert(n % qk5_1 == 0);
  block_q5_1* y = static_cast<block_q5_1*>(vy);
  const int64_t nb = n / qk5_1;
  for (int64_t i = 0; i < nb; ++i, x += qk5_1) {
    float min = FLT_MAX;
    float max = -FLT_MAX;
    for (int j = 0; j < qk5_1; ++j) {
      min = std::min(min, x[j]);
      max = std::max(max, x[j]);
    }
    const float d = (max - min) / 31;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = fp32_to_fp16(d);
    y[i].m = fp32_to_fp16(min);
    std::memset(y[i].qh, 0, sizeof y[i].qh);
    for (int j = 0; j < qk5_1 / 2; ++j) {
      // (x - min) * id is in [0, 31] (up to rounding), so + 0.5 truncates to at most 31.
      const int q0 = std::min(31, trunc_to_int((x[j] - min) * id + 0.5f));
      const int q1 = std::min(31, trunc_to_int((x[j + qk5_1 / 2] - min) * id + 0.5f));
      y[i].qs[j] = static_cast<uint8_t>((q0 & 0xF) | ((q1 & 0xF) << 4));
      if (q0 & 0x10) q5_set_high_bit(y[i].qh, j);
      if (q1 & 0x10) q5_set_high_bit(y[i].qh, j + qk5_1 / 2);
    }
  }
}

// q8_0: symmetric, d = amax / 127, round half away from zero.
void quantize_row_q8_0_ref(const float* x, void* vy, int64_t n) {
  assert(n % qk8_0 == 0);
  block_q8_0* y = static_cast<block_q8_0*>(vy);
  const int64_t nb = n / qk8_0;
  for (int64_t i = 0; i < nb; ++i, x += qk8_0) {
    float amax = 0.0f;
    for (int j = 0; j < qk8_0; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = fp32_to_fp16(d);
    for (int j = 0; j < qk8_0; ++j) y[i].qs[j] = round_to_q8(x[j] * id);
  }
}

// q8_1: as q8_0, plus s = d * sum(qs) with the unrounded d.
void quantize_row_q8_1_ref(const float* x, void* vy, int64_t n) {
  assert(n % qk8_1 == 0);
  block_q8_1* y = static_cast<block_q8_1*>(vy);
  const int64_t nb = n / qk8_1;
  for (int64_t i = 0; i < nb; ++i, x += qk8_1) {
    float amax = 0.0f;
    for (int j = 0; j < qk8_1; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = fp32_to_fp16(d);
    int sum = 0;
    for (int j = 0; j < qk8_1; ++j) {
      y[i].qs[j] = round_to_q8(x[j] * id);
      sum += y[i].qs[j];
    }
    y[i].s = fp32_to_fp16(static_cast<float>(sum) * d);
  }
}

// ===================================== dequantizers =====================================================

void dequantize_row_q4_0(const void* vx, float* y, int64_t n) {
  assert(n % qk4_0 == 0);
  const block_q4_0* x = static_cast<const block_q4_0*>(vx);
  const int64_t nb = n / qk4_0;
  int q[32];
  for (int64_t i = 0; i < nb; ++i, y += qk4_0) {
    const float d = fp16_to_fp32(x[i].d);
    unpack_nibbles(x[i].qs, q);
    for (int v = 0; v < 32; ++v) y[v] = static_cast<float>(q[v] - 8) * d;
  }
}

void dequantize_row_q4_1(const void* vx, float* y, int64_t n) {
  assert(n % qk4_1 == 0);
  const block_q4_1* x = static_cast<const block_q4_1*>(vx);
  const int64_t nb = n / qk4_1;
  int q[32];
  for (int64_t i = 0; i < nb; ++i, y += qk4_1) {
    const float d = fp16_to_fp32(x[i].d);
    const float m = fp16_to_fp32(x[i].m);
    unpack_nibbles(x[i].qs, q);
    for (int v = 0; v < 32; ++v) y[v] = static_cast<float>(q[v]) * d + m;
  }
}

void dequantize_row_q5_0(const void* vx, float* y, int64_t n) {
  assert(n % qk5_0 == 0);
  const block_q5_0* x = static_cast<const block_q5_0*>(vx);
  const int64_t nb = n / qk5_0;
  int q[32];
  for (int64_t i = 0; i < nb; ++i, y += qk5_0) {
    const float d = fp16_to_fp32(x[i].d);
    unpack_q5(x[i].qh, x[i].qs, q);
    for (int v = 0; v < 32; ++v) y[v] = static_cast<float>(q[v] - 16) * d;
  }
}

void dequantize_row_q5_1(const void* vx, float* y, int64_t n) {
  assert(n % qk5_1 == 0);
  const block_q5_1* x = static_cast<const block_q5_1*>(vx);
  const int64_t nb = n / qk5_1;
  int q[32];
  for (int64_t i = 0; i < nb; ++i, y += qk5_1) {
    const float d = fp16_to_fp32(x[i].d);
    const float m = fp16_to_fp32(x[i].m);
    unpack_q5(x[i].qh, x[i].qs, q);
    for (int v = 0; v < 32; ++v) y[v] = static_cast<float>(q[v]) * d + m;
  }
}

void dequantize_row_q8_0(const void* vx, float* y, int64_t n) {
  assert(n % qk8_0 == 0);
  const block_q8_0* x = static_cast<const block_q8_0*>(vx);
  const int64_t nb = n / qk8_0;
  for (int64_t i = 0; i < nb; ++i, y += qk8_0) {
    const float d = fp16_to_fp32(x[i].d);
    for (int v = 0; v < 32; ++v) y[v] = static_cast<float>(x[i].qs[v]) * d;
  }
}

void dequantize_row_q8_1(const void* vx, float* y, int64_t n) {
  assert(n % qk8_1 == 0);
  const block_q8_1* x = static_cast<const block_q8_1*>(vx);
  const int64_t nb = n / qk8_1;
  for (int64_t i = 0; i < nb; ++i, y += qk8_1) {
    const float d = fp16_to_fp32(x[i].d);
    for (int v = 0; v < 32; ++v) y[v] = static_cast<float>(x[i].qs[v]) * d;
  }
}

// ===================================== dot products =====================================================
//
// Per block: an exact integer sum of quant products, times the block scales in double (a product of two
// fp16 values and an int < 2^17 is exact in double), summed in double.

void vec_dot_q4_0_q8_0(int64_t n, float* s, const void* vx, const void* vy) {
  assert(n % qk8_0 == 0);
  const block_q4_0* x = static_cast<const block_q4_0*>(vx);
  const block_q8_0* y = static_cast<const block_q8_0*>(vy);
  const int64_t nb = n / qk8_0;
  double sum = 0.0;
  int q[32];
  for (int64_t i = 0; i < nb; ++i) {
    unpack_nibbles(x[i].qs, q);
    const int32_t sumi = int_dot32(q, 8, y[i].qs);
    sum += static_cast<double>(fp16_to_fp32(x[i].d)) * fp16_to_fp32(y[i].d) * sumi;
  }
  *s = static_cast<float>(sum);
}

// x = d_x q + m_x, y = d_y r:  sum x y = d_x d_y sum(q r) + m_x d_y sum(r).
void vec_dot_q4_1_q8_1(int64_t n, float* s, const void* vx, const void* vy) {
  assert(n % qk8_1 == 0);
  const block_q4_1* x = static_cast<const block_q4_1*>(vx);
  const block_q8_1* y = static_cast<const block_q8_1*>(vy);
  const int64_t nb = n / qk8_1;
  double sum = 0.0;
  int q[32];
  for (int64_t i = 0; i < nb; ++i) {
    unpack_nibbles(x[i].qs, q);
    const int32_t sumi = int_dot32(q, 0, y[i].qs);
    const double dy = fp16_to_fp32(y[i].d);
    sum += static_cast<double>(fp16_to_fp32(x[i].d)) * dy * sumi;
    sum += static_cast<double>(fp16_to_fp32(x[i].m)) * dy * int_sum32(y[i].qs);
  }
  *s = static_cast<float>(sum);
}

void vec_dot_q5_0_q8_0(int64_t n, float* s, const void* vx, const void* vy) {
  assert(n % qk8_0 == 0);
  const block_q5_0* x = static_cast<const block_q5_0*>(vx);
  const block_q8_0* y = static_cast<const block_q8_0*>(vy);
  const int64_t nb = n / qk8_0;
  double sum = 0.0;
  int q[32];
  for (int64_t i = 0; i < nb; ++i) {
    unpack_q5(x[i].qh, x[i].qs, q);
    const int32_t sumi = int_dot32(q, 16, y[i].qs);
    sum += static_cast<double>(fp16_to_fp32(x[i].d)) * fp16_to_fp32(y[i].d) * sumi;
  }
  *s = static_cast<float>(sum);
}

void vec_dot_q5_1_q8_1(int64_t n, float* s, const void* vx, const void* vy) {
  assert(n % qk8_1 == 0);
  const block_q5_1* x = static_cast<const block_q5_1*>(vx);
  const block_q8_1* y = static_cast<const block_q8_1*>(vy);
  const int64_t nb = n / qk8_1;
  double sum = 0.0;
  int q[32];
  for (int64_t i = 0; i < nb; ++i) {
    unpack_q5(x[i].qh, x[i].qs, q);
    const int32_t sumi = int_dot32(q, 0, y[i].qs);
    const double dy = fp16_to_fp32(y[i].d);
    sum += static_cast<double>(fp16_to_fp32(x[i].d)) * dy * sumi;
    sum += static_cast<double>(fp16_to_fp32(x[i].m)) * dy * int_sum32(y[i].qs);
  }
  *s = static_cast<float>(sum);
}

void vec_dot_q8_0_q8_0(int64_t n, float* s, const void* vx, const void* vy) {
  assert(n % qk8_0 == 0);
  const block_q8_0* x = static_cast<const block_q8_0*>(vx);
  const block_q8_0* y = static_cast<const block_q8_0*>(vy);
  const int64_t nb = n / qk8_0;
  double sum = 0.0;
  for (int64_t i = 0; i < nb; ++i) {
    int32_t sumi = 0;
    for (int v = 0; v < 32; ++v) sumi += static_cast<int32_t>(x[i].qs[v]) * y[i].qs[v];
    sum += static_cast<double>(fp16_to_fp32(x[i].d)) * fp16_to_fp32(y[i].d) * sumi;
  }
  *s = static_cast<float>(sum);
}

void vec_dot_q8_1_q8_1(int64_t n, float* s, const void* vx, const void* vy) {
  assert(n % qk8_1 == 0);
  const block_q8_1* x = static_cast<const block_q8_1*>(vx);
  const block_q8_1* y = static_cast<const block_q8_1*>(vy);
  const int64_t nb = n / qk8_1;
  double sum = 0.0;
  for (int64_t i = 0; i < nb; ++i) {
    int32_t sumi = 0;
    for (int v = 0; v < 32; ++v) sumi += static_cast<int32_t>(x[i].qs[v]) * y[i].qs[v];
    sum += static_cast<double>(fp16_to_fp32(x[i].d)) * fp16_to_fp32(y[i].d) * sumi;
  }
  *s = static_cast<float>(sum);
}

}  // namespace troupe
