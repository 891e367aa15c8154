// The i-quants below 4 bits, byte-identical to GGUF / ggml, as reference (scalar, deterministic) code:
//
//   iq2_xxs  256 values in  66 bytes (2.06 bits/value)   iq3_xxs  256 values in  98 bytes (3.06 bits/value)
//   iq2_xs   256 values in  74 bytes (2.31 bits/value)   iq3_s    256 values in 110 bytes (3.44 bits/value)
//   iq2_s    256 values in  82 bytes (2.56 bits/value)   iq1_s    256 values in  50 bytes (1.56 bits/value)
//                                                         iq1_m    256 values in  56 bytes (1.75 bits/value)
//
// Each block is groups of 8 values (4 for the iq3 grids, read in pairs): an index into a lookup grid of
// 8 (4) small unsigned values, signs (iq2, iq3: from a 7-bit pattern whose eighth sign makes the count of
// minus signs even, or 8 explicit bits), and a scale shared by 16 or 32 values. iq1 grids hold -1, 0, 1 and
// add a shift of +-1/8 instead of signs. The grids are data from the format's definition
// (runtime/quants_iq_grids.cpp, written by scripts/gen-iq-grids from gguf-py).
//
// Every value is d * unit * num * (v + delta): d the block's fp16 scale, unit a constant of the type
// (iq2: 1/8, iq3_xxs: 1/4, iq3_s and iq1: 1), num an odd integer from the group's scale bits, v the grid
// value with its sign, delta 0 or +-1/8 (iq1). The dot products take q8_K activations (as llama.cpp) and sum
// v * q in integers per group; the per-group terms are added in double.
//
// troupe computes with these types; it does not write them (a useful quantizer needs an importance matrix:
// `troupe quantize` refuses them by name).
#pragma once

#include <cstddef>
#include <cstdint>

#include "runtime/fp16.h"
#include "runtime/types.h"

namespace troupe {

struct block_iq2_xxs {
  fp16_t d;
  uint16_t qs[qk_k / 8];  // per 32 values: 4 grid indices (bytes 0..3), then 4 x 7 sign bits and a 4-bit scale
};
static_assert(sizeof(block_iq2_xxs) == 66, "iq2_xxs block must be 66 bytes");

struct block_iq2_xs {
  fp16_t d;
  uint16_t qs[qk_k / 8];         // per 8 values: 9-bit grid index, 7 sign bits
  uint8_t scales[qk_k / 32];     // a 4-bit scale per 16 values
};
static_assert(sizeof(block_iq2_xs) == 74, "iq2_xs block must be 74 bytes");

struct block_iq2_s {
  fp16_t d;
  uint8_t qs[qk_k / 8];          // grid index low 8 bits per 8 values
  uint8_t signs[qk_k / 8];       // 8 sign bits per 8 values
  uint8_t qh[qk_k / 32];         // grid index bits 8..9, 2 per 8 values
  uint8_t scales[qk_k / 32];     // a 4-bit scale per 16 values
};
static_assert(sizeof(block_iq2_s) == 82, "iq2_s block must be 82 bytes");

struct block_iq3_xxs {
  fp16_t d;
  uint8_t qs[3 * qk_k / 8];  // 64 grid indices (one per 4 values), then per 32 values 4 x 7 sign bits and a scale
};
static_assert(sizeof(block_iq3_xxs) == 98, "iq3_xxs block must be 98 bytes");

struct block_iq3_s {
  fp16_t d;
  uint8_t qs[qk_k / 4];       // grid index low 8 bits per 4 values
  uint8_t qh[qk_k / 32];      // grid index bit 8, one per 4 values
  uint8_t signs[qk_k / 8];    // 8 sign bits per 8 values
  uint8_t scales[qk_k / 64];  // a 4-bit scale per 32 values
};
static_assert(sizeof(block_iq3_s) == 110, "iq3_s block must be 110 bytes");

struct block_iq1_s {
  fp16_t d;
  uint8_t qs[qk_k / 8];    // grid index low 8 bits per 8 values
  uint16_t qh[qk_k / 32];  // per 32 values: 4 x 3 index bits, a 3-bit scale, the shift's sign
};
static_assert(sizeof(block_iq1_s) == 50, "iq1_s block must be 50 bytes");

struct block_iq1_m {
  uint8_t qs[qk_k / 8];      // grid index low 8 bits per 8 values
  uint8_t qh[qk_k / 16];     // per 8 values: 3 index bits and the shift's sign (a nibble)
  uint8_t scales[qk_k / 32];  // 3-bit scales per 16 values; the block's fp16 scale in the top nibbles
};
static_assert(sizeof(block_iq1_m) == 56, "iq1_m block must be 56 bytes");

// The lookup grids and the iq2 / iq3_xxs sign patterns (runtime/quants_iq_grids.cpp).
namespace iq_grids {
extern const uint8_t iq2xxs[256][8];  // values 8, 25, 43
extern const uint8_t iq2xs[512][8];
extern const uint8_t iq2s[1024][8];
extern const uint8_t iq3xxs[256][4];  // values 4, 12, .. 52, 62
extern const uint8_t iq3s[512][4];    // values 1, 3, .. 15
extern const int8_t iq1s[2048][8];    // values -1, 0, 1
extern const uint8_t ksigns_iq2xs[128];  // 7 sign bits -> 8 with an even number set
}  // namespace iq_grids

// The shift of iq1_s / iq1_m values (ggml's IQ1S_DELTA).
inline constexpr float iq1_delta = 0.125f;

void dequantize_row_iq2_xxs(const void* x, float* y, int64_t n);
void dequantize_row_iq2_xs(const void* x, float* y, int64_t n);
void dequantize_row_iq2_s(const void* x, float* y, int64_t n);
void dequantize_row_iq3_xxs(const void* x, float* y, int64_t n);
void dequantize_row_iq3_s(const void* x, float* y, int64_t n);
void dequantize_row_iq1_s(const void* x, float* y, int64_t n);
void dequantize_row_iq1_m(const void* x, float* y, int64_t n);

void vec_dot_iq2_xxs_q8_K(int64_t n, float* s, const void* x, const void* y);
void vec_dot_iq2_xs_q8_K(int64_t n, float* s, const void* x, const void* y);
void vec_dot_iq2_s_q8_K(int64_t n, float* s, const void* x, const void* y);
void vec_dot_iq3_xxs_q8_K(int64_t n, float* s, const void* x, const void* y);
void vec_dot_iq3_s_q8_K(int64_t n, float* s, const void* x, const void* y);
void vec_dot_iq1_s_q8_K(int64_t n, float* s, const void* x, const void* y);
void vec_dot_iq1_m_q8_K(int64_t n, float* s, const void* x, const void* y);

// The fp16 scale of an iq1_m block (spread over the top nibbles of its four 16-bit scale words).
float iq1_m_scale(const block_iq1_m& b);

}  // namespace troupe
