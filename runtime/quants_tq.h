// The ternary types (weights in {-1, 0, 1} times a scale, for models trained ternary: BitNet b1.58, TriLMs),
// byte-identical to GGUF / ggml, with reference (scalar, deterministic) code in the style of
// runtime/quants.h. Both take their activations as q8_K; their dot products are exact integer sums.
//
//   tq2_0   256 values in 66 bytes (2 bits/value):    value v = d * (t_v - 1), t_v in {0, 1, 2}
//   tq1_0   256 values in 54 bytes (1.69 bits/value): 5 (or 4) ternary digits per byte
#pragma once

#include <cstddef>
#include <cstdint>

#include "runtime/fp16.h"
#include "runtime/types.h"

namespace troupe {

// tq2_0: t_v of value v = 128 h + 32 k + l (h in [0, 2), k in [0, 4), l in [0, 32)) is bits 2k..2k+1 of
// qs[32 h + l] (q2_K's order).
struct block_tq2_0 {
  uint8_t qs[qk_k / 4];
  fp16_t d;
};
static_assert(sizeof(block_tq2_0) == 66, "tq2_0 block must be 66 bytes");

// tq1_0: a byte b holds ternary digits as a fixed-point fraction: digit n (n = 0 first) of b is
// ((uint8_t)(b * 3^n) * 3) >> 8. Values 0..159: digit n of qs[j] (j < 32) is value 32 n + j; values
// 160..239: digit n of qs[32 + j] (j < 16) is value 160 + 16 n + j; values 240..255: digit n < 4 of qh[j]
// (j < 4) is value 240 + 4 n + j. value v = d * (digit - 1).
struct block_tq1_0 {
  uint8_t qs[(qk_k - 4 * qk_k / 64) / 5];
  uint8_t qh[qk_k / 64];
  fp16_t d;
};
static_assert(sizeof(block_tq1_0) == 54, "tq1_0 block must be 54 bytes");

// Digit n of a tq1_0 byte (0, 1 or 2).
inline int tq1_digit(uint8_t b, int n) {
  static constexpr uint8_t pow3[5] = {1, 3, 9, 27, 81};
  return (static_cast<uint8_t>(b * pow3[n]) * 3) >> 8;
}

// Quantizers: d = max |x| of the block, t = round(x / d) + 1 (round half away from zero).
void quantize_row_tq1_0_ref(const float* x, void* y, int64_t n);
void quantize_row_tq2_0_ref(const float* x, void* y, int64_t n);

void dequantize_row_tq1_0(const void* x, float* y, int64_t n);
void dequantize_row_tq2_0(const void* x, float* y, int64_t n);

void vec_dot_tq1_0_q8_K(int64_t n, float* s, const void* x, const void* y);
void vec_dot_tq2_0_q8_K(int64_t n, float* s, const void* x, const void* y);

}  // namespace troupe
