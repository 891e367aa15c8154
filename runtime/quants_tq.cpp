// Reference code of the ternary types (runtime/quants_tq.h): tq1_0 and tq2_0.
#include "runtime/quants_tq.h"

#include <cassert>
#include <cmath>
#include <cstring>

#include "runtime/quants.h"

namespace troupe {

namespace {

// The ternary digits t_v in {0, 1, 2} of a 256-value block, and its scale.
float ternary_of(const float* x, uint8_t t[qk_k]) {
  float amax = 0.0f;
  for (int j = 0; j < qk_k; ++j) amax = std::fmax(amax, std::fabs(x[j]));
  const float id = amax != 0.0f ? 1.0f / amax : 0.0f;
  for (int j = 0; j < qk_k; ++j) t[j] = static_cast<uint8_t>(static_cast<int>(std::round(x[j] * id)) + 1);
  return amax;
}

// Digits (most significant first, at most 5) as a byte: the base-3 number scaled to 256 / 243, rounded up,
// so that tq1_digit reads them back.
uint8_t pack_digits(const uint8_t* t, int stride, int count) {
  int v = 0;
  for (int n = 0; n < 5; ++n) v = 3 * v + (n < count ? t[n * stride] : 0);
  return static_cast<uint8_t>((v * 256 + 242) / 243);
}

// Both types' digits of a block, in value order.
void digits_tq1_0(const block_tq1_0& b, int8_t q[qk_k]) {
  for (int n = 0; n < 5; ++n) {
    for (int j = 0; j < 32; ++j) q[32 * n + j] = static_cast<int8_t>(tq1_digit(b.qs[j], n) - 1);
    for (int j = 0; j < 16; ++j) q[160 + 16 * n + j] = static_cast<int8_t>(tq1_digit(b.qs[32 + j], n) - 1);
  }
  for (int n = 0; n < 4; ++n) {
    for (int j = 0; j < 4; ++j) q[240 + 4 * n + j] = static_cast<int8_t>(tq1_digit(b.qh[j], n) - 1);
  }
}

void digits_tq2_0(const block_tq2_0& b, int8_t q[qk_k]) {
  for (int h = 0; h < 2; ++h) {
    for (int k = 0; k < 4; ++k) {
      for (int l = 0; l < 32; ++l) q[128 * h + 32 * k + l] = static_cast<int8_t>(((b.qs[32 * h + l] >> (2 * k)) & 3) - 1);
    }
  }
}

template <class Block, void (*digits)(const Block&, int8_t*)>
void dequantize_blocks(const void* vx, float* y, int64_t n) {
  assert(n % qk_k == 0);
  const Block* x = static_cast<const Block*>(vx);
  int8_t q[qk_k];
  for (int64_t i = 0; i < n / qk_k; ++i, y += qk_k) {
    const float d = fp16_to_fp32(x[i].d);
    digits(x[i], q);
    for (int j = 0; j < qk_k; ++j) y[j] = d * q[j];
  }
}

template <class Block, void (*digits)(const Block&, int8_t*)>
void dot_blocks(int64_t n, float* s, const void* vx, const void* vy) {
  assert(n % qk_k == 0);
  const Block* x = static_cast<const Block*>(vx);
  const block_q8_K* y = static_cast<const block_q8_K*>(vy);
  double sum = 0.0;
  int8_t q[qk_k];
  for (int64_t i = 0; i < n / qk_k; ++i) {
    digits(x[i], q);
    int32_t isum = 0;
    for (int j = 0; j < qk_k; ++j) isum += static_cast<int32_t>(q[j]) * y[i].qs[j];
    sum += static_cast<double>(fp16_to_fp32(x[i].d)) * y[i].d * isum;
  }
  *s = static_cast<float>(sum);
}

}  // namespace

void quantize_row_tq1_0_ref(const float* x, void* vy, int64_t n) {
  assert(n % qk_k == 0);
  block_tq1_0* y = static_cast<block_tq1_0*>(vy);
  uint8_t t[qk_k];
  for (int64_t i = 0; i < n / qk_k; ++i, x += qk_k) {
    y[i].d = fp32_to_fp16(ternary_of(x, t));
    for (int j = 0; j < 32; ++j) y[i].qs[j] = pack_digits(t + j, 32, 5);
    for (int j = 0; j < 16; ++j) y[i].qs[32 + j] = pack_digits(t + 160 + j, 16, 5);
    for (int j = 0; j < 4; ++j) y[i].qh[j] = pack_digits(t + 240 + j, 4, 4);
  }
}

void quantize_row_tq2_0_ref(const float* x, void* vy, int64_t n) {
  assert(n % qk_k == 0);
  block_tq2_0* y = static_cast<block_tq2_0*>(vy);
  uint8_t t[qk_k];
  for (int64_t i = 0; i < n / qk_k; ++i, x += qk_k) {
    y[i].d = fp32_to_fp16(ternary_of(x, t));
    std::memset(y[i].qs, 0, sizeof y[i].qs);
    for (int v = 0; v < qk_k; ++v) {
      const int h = v / 128, k = (v % 128) / 32, l = v % 32;
      y[i].qs[32 * h + l] = static_cast<uint8_t>(y[i].qs[32 * h + l] | (t[v] << (2 * k)));
    }
  }
}

void dequantize_row_tq1_0(const void* x, float* y, int64_t n) { dequantize_blocks<block_tq1_0, digits_tq1_0>(x, y, n); }
void dequantize_row_tq2_0(const void* x, float* y, int64_t n) { dequantize_blocks<block_tq2_0, digits_tq2_0>(x, y, n); }

void vec_dot_tq1_0_q8_K(int64_t n, float* s, const void* x, const void* y) { dot_blocks<block_tq1_0, digits_tq1_0>(n, s, x, y); }
void vec_dot_tq2_0_q8_K(int64_t n, float* s, const void* x, const void* y) { dot_blocks<block_tq2_0, digits_tq2_0>(n, s, x, y); }

}  // namespace troupe
