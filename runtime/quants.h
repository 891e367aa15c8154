// Quantized block formats, byte-identical to GGUF / ggml, with reference (scalar, deterministic) code:
//
//   quantize_row_<t>_ref(const float* x, void* y, int64_t n)   f32 -> blocks of <t>   (n: multiple of the block)
//   dequantize_row_<t>(const void* x, float* y, int64_t n)     blocks of <t> -> f32
//   vec_dot_<t>_<vt>(int64_t n, float* s, const void* x, const void* y)
//                                                               *s = sum_i x[i] * y[i], x of type t, y of its
//                                                               vec_dot type vt (the activations' format)
//
//   weights                     vec_dot type
//   f32 / f16 / bf16            same type
//   q4_0, q5_0, q8_0            q8_0
//   q4_1, q5_1, q8_1            q8_1
//   q2_K ... q6_K, q8_K         q8_K
//
// A GGUF tensor of one of these types is a row-major array of these blocks, used in place. Block i of a row
// holds values [i * block_size, (i + 1) * block_size). Within a block, "value v" below means element v of
// that block. fp16_t fields are IEEE binary16; every multi-byte field is little-endian (as GGUF is).
//
// The dot kernels accumulate integer products exactly inside a block and the per-block terms in double, so
// a result matches the double-precision dot of the dequantized rows to ~1e-7 relative. The q4_1 / q5_1
// kernels take the sum of y's quants from y.qs, not from the fp16-rounded y.s, for the same reason.
//
// Inputs must be finite. Magnitudes whose block scale overflows fp16 (|x| above ~5e5 for q4_0, ~4e6 for
// K-quants) are outside what the formats can hold, as in ggml.
#pragma once

#include <cstddef>
#include <cstdint>

#include "runtime/fp16.h"
#include "runtime/types.h"

namespace troupe {

constexpr int qk4_0 = 32;
constexpr int qk4_1 = 32;
constexpr int qk5_0 = 32;
constexpr int qk5_1 = 32;
constexpr int qk8_0 = 32;
constexpr int qk8_1 = 32;
constexpr int k_scale_size = 12;  // bytes of packed 6-bit scales and mins in q3_K / q4_K / q5_K

// ---- 32-value blocks --------------------------------------------------------------------------------

// q4_0: value v = d * (q_v - 8), q_v in [0, 15].
// qs[j] low nibble = q_j, high nibble = q_{j+16} (j in [0, 16)): the first half of the block in the low
// nibbles, the second half in the high nibbles.
struct block_q4_0 {
  fp16_t d;
  uint8_t qs[qk4_0 / 2];
};
static_assert(sizeof(block_q4_0) == 18, "q4_0 block must be 18 bytes");

// q4_1: value v = d * q_v + m, q_v in [0, 15], nibbles as q4_0.
struct block_q4_1 {
  fp16_t d;
  fp16_t m;
  uint8_t qs[qk4_1 / 2];
};
static_assert(sizeof(block_q4_1) == 20, "q4_1 block must be 20 bytes");

// q5_0: value v = d * (q_v - 16), q_v in [0, 31]. Low 4 bits as q4_0's nibbles; bit 4 of q_v is bit v of
// the little-endian uint32 qh (bits 0..15 for the first half, 16..31 for the second).
struct block_q5_0 {
  fp16_t d;
  uint8_t qh[4];
  uint8_t qs[qk5_0 / 2];
};
static_assert(sizeof(block_q5_0) == 22, "q5_0 block must be 22 bytes");

// q5_1: value v = d * q_v + m, q_v in [0, 31], bits as q5_0.
struct block_q5_1 {
  fp16_t d;
  fp16_t m;
  uint8_t qh[4];
  uint8_t qs[qk5_1 / 2];
};
static_assert(sizeof(block_q5_1) == 24, "q5_1 block must be 24 bytes");

// q8_0: value v = d * qs[v].
struct block_q8_0 {
  fp16_t d;
  int8_t qs[qk8_0];
};
static_assert(sizeof(block_q8_0) == 34, "q8_0 block must be 34 bytes");

// q8_1: value v = d * qs[v]; s = d * sum(qs) (as fp16), kept for kernels that want it.
struct block_q8_1 {
  fp16_t d;
  fp16_t s;
  int8_t qs[qk8_1];
};
static_assert(sizeof(block_q8_1) == 36, "q8_1 block must be 36 bytes");

// ---- 256-value super-blocks (K-quants) ---------------------------------------------------------------

// q2_K: 16 sub-blocks of 16 values. value v (sub-block j = v / 16) = d * sc_j * q_v - dmin * m_j with
// sc_j = scales[j] & 0xF, m_j = scales[j] >> 4, q_v in [0, 3].
// qs: two halves of 128 values; value v = 128 h + 32 k + l (k in [0, 4), l in [0, 32)) is bits 2k..2k+1
// of qs[32 h + l].
struct block_q2_K {
  uint8_t scales[qk_k / 16];
  uint8_t qs[qk_k / 4];
  fp16_t d;
  fp16_t dmin;
};
static_assert(sizeof(block_q2_K) == 84, "q2_K block must be 84 bytes");

// q3_K: 16 sub-blocks of 16. value v = d * (sc_j - 32) * q_v, q_v in [-4, 3].
// With v = 128 h + 32 k + l as in q2_K, lo = bits 2k..2k+1 of qs[32 h + l] and the "high bit" is bit
// (4 h + k) of hmask[l]: q_v = lo when that bit is set, lo - 4 when it is clear (q_v + 4 is 3-bit).
// The 6-bit scales sc_j: low 4 bits are scales[j] & 0xF for j < 8 and scales[j - 8] >> 4 for j >= 8;
// the high 2 bits are bits 2 (j / 4) .. 2 (j / 4) + 1 of scales[8 + j % 4].
struct block_q3_K {
  uint8_t hmask[qk_k / 8];
  uint8_t qs[qk_k / 4];
  uint8_t scales[k_scale_size];
  fp16_t d;
};
static_assert(sizeof(block_q3_K) == 110, "q3_K block must be 110 bytes");

// q4_K: 8 sub-blocks of 32. value v (sub-block j = v / 32) = d * sc_j * q_v - dmin * m_j, q_v in [0, 15],
// (sc_j, m_j) 6-bit, packed in scales[12] as get_scale_min_k4 reads them.
// qs: four chunks of 64 values; value 64 c + l (l < 32) is the low nibble of qs[32 c + l], value
// 64 c + 32 + l its high nibble.
struct block_q4_K {
  fp16_t d;
  fp16_t dmin;
  uint8_t scales[k_scale_size];
  uint8_t qs[qk_k / 2];
};
static_assert(sizeof(block_q4_K) == 144, "q4_K block must be 144 bytes");

// q5_K: as q4_K with q_v in [0, 31]: bit 4 of value 64 c + l is bit 2c of qh[l], of value 64 c + 32 + l
// bit 2c + 1 of qh[l].
struct block_q5_K {
  fp16_t d;
  fp16_t dmin;
  uint8_t scales[k_scale_size];
  uint8_t qh[qk_k / 8];
  uint8_t qs[qk_k / 2];
};
static_assert(sizeof(block_q5_K) == 176, "q5_K block must be 176 bytes");

// q6_K: 16 sub-blocks of 16. value v = d * scales[v / 16] * (q_v - 32), q_v in [0, 63], scales signed.
// Two halves of 128 values; value v = 128 h + 32 k + l (k in [0, 4), l in [0, 32)):
//   low 4 bits: k = 0: ql[64 h + l] & 0xF     k = 1: ql[64 h + 32 + l] & 0xF
//               k = 2: ql[64 h + l] >> 4      k = 3: ql[64 h + 32 + l] >> 4
//   high 2 bits: bits 2k..2k+1 of qh[32 h + l].
struct block_q6_K {
  uint8_t ql[qk_k / 2];
  uint8_t qh[qk_k / 4];
  int8_t scales[qk_k / 16];
  fp16_t d;
};
static_assert(sizeof(block_q6_K) == 210, "q6_K block must be 210 bytes");

// q8_K: value v = d * qs[v] (d is a float here); bsums[j] = sum of qs[16 j .. 16 j + 15].
struct block_q8_K {
  float d;
  int8_t qs[qk_k];
  int16_t bsums[qk_k / 16];
};
static_assert(sizeof(block_q8_K) == 292, "q8_K block must be 292 bytes");

// The 6-bit (scale, min) pair of sub-block j (in [0, 8)) of q4_K / q5_K from their 12 packed bytes q:
//   j < 4:  sc = q[j] & 63,                          m = q[j + 4] & 63
//   j >= 4: sc = (q[j + 4] & 0xF) | (q[j - 4] >> 6) << 4,  m = (q[j + 4] >> 4) | (q[j] >> 6) << 4
// i.e. bytes 0..3 hold the scales of sub-blocks 0..3 (plus 2 high bits of scales 4..7), bytes 4..7 the
// mins of 0..3 (plus 2 high bits of mins 4..7), bytes 8..11 the low 4 bits of scale (low nibble) and min
// (high nibble) of sub-blocks 4..7.
inline void get_scale_min_k4(int j, const uint8_t* q, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = static_cast<uint8_t>(q[j] & 63);
    *m = static_cast<uint8_t>(q[j + 4] & 63);
  } else {
    *sc = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

// Inverse of get_scale_min_k4: packs 8 (scale, min) pairs, each < 64, into 12 bytes.
void pack_scale_min_k4(const uint8_t sc[8], const uint8_t m[8], uint8_t q[k_scale_size]);

// The 6-bit unsigned scale j (in [0, 16)) of a q3_K block, before the -32 offset.
inline int q3_K_scale(const uint8_t* scales, int j) {
  const int lo = j < 8 ? (scales[j] & 0xF) : (scales[j - 8] >> 4);
  const int hi = (scales[8 + j % 4] >> (2 * (j / 4))) & 3;
  return lo | (hi << 4);
}

// ---- plain types ----
void quantize_row_f32_ref(const float* x, void* y, int64_t n);
void dequantize_row_f32(const void* x, float* y, int64_t n);
void vec_dot_f32_f32(int64_t n, float* s, const void* x, const void* y);

void quantize_row_f16_ref(const float* x, void* y, int64_t n);
void dequantize_row_f16(const void* x, float* y, int64_t n);
// f16 weights against f32 activations: f16 rows are multiplied with activations kept in f32 (not rounded to
// f16 first, as llama.cpp does), so an f16 model computes what the f32 model rounded to f16 computes.
void vec_dot_f16_f32(int64_t n, float* s, const void* x, const void* y);

void quantize_row_bf16_ref(const float* x, void* y, int64_t n);
void dequantize_row_bf16(const void* x, float* y, int64_t n);
void vec_dot_bf16_bf16(int64_t n, float* s, const void* x, const void* y);

// ---- 32-value blocks ----
void quantize_row_q4_0_ref(const float* x, void* y, int64_t n);
void quantize_row_q4_1_ref(const float* x, void* y, int64_t n);
void quantize_row_q5_0_ref(const float* x, void* y, int64_t n);
void quantize_row_q5_1_ref(const float* x, void* y, int64_t n);
void quantize_row_q8_0_ref(const float* x, void* y, int64_t n);
void quantize_row_q8_1_ref(const float* x, void* y, int64_t n);

void dequantize_row_q4_0(const void* x, float* y, int64_t n);
void dequantize_row_q4_1(const void* x, float* y, int64_t n);
void dequantize_row_q5_0(const void* x, float* y, int64_t n);
void dequantize_row_q5_1(const void* x, float* y, int64_t n);
void dequantize_row_q8_0(const void* x, float* y, int64_t n);
void dequantize_row_q8_1(const void* x, float* y, int64_t n);

void vec_dot_q4_0_q8_0(int64_t n, float* s, const void* x, const void* y);
void vec_dot_q4_1_q8_1(int64_t n, float* s, const void* x, const void* y);
void vec_dot_q5_0_q8_0(int64_t n, float* s, const void* x, const void* y);
void vec_dot_q5_1_q8_1(int64_t n, float* s, const void* x, const void* y);
void vec_dot_q8_0_q8_0(int64_t n, float* s, const void* x, const void* y);
void vec_dot_q8_1_q8_1(int64_t n, float* s, const void* x, const void* y);

// ---- K-quants (quants_k.cpp; the quantizers in quants_k_quantize.cpp) ----
void quantize_row_q2_K_ref(const float* x, void* y, int64_t n);
void quantize_row_q3_K_ref(const float* x, void* y, int64_t n);
void quantize_row_q4_K_ref(const float* x, void* y, int64_t n);
void quantize_row_q5_K_ref(const float* x, void* y, int64_t n);
void quantize_row_q6_K_ref(const float* x, void* y, int64_t n);
void quantize_row_q8_K_ref(const float* x, void* y, int64_t n);

void dequantize_row_q2_K(const void* x, float* y, int64_t n);
void dequantize_row_q3_K(const void* x, float* y, int64_t n);
void dequantize_row_q4_K(const void* x, float* y, int64_t n);
void dequantize_row_q5_K(const void* x, float* y, int64_t n);
void dequantize_row_q6_K(const void* x, float* y, int64_t n);
void dequantize_row_q8_K(const void* x, float* y, int64_t n);

void vec_dot_q2_K_q8_K(int64_t n, float* s, const void* x, const void* y);
void vec_dot_q3_K_q8_K(int64_t n, float* s, const void* x, const void* y);
void vec_dot_q4_K_q8_K(int64_t n, float* s, const void* x, const void* y);
void vec_dot_q5_K_q8_K(int64_t n, float* s, const void* x, const void* y);
void vec_dot_q6_K_q8_K(int64_t n, float* s, const void* x, const void* y);
void vec_dot_q8_K_q8_K(int64_t n, float* s, const void* x, const void* y);

}  // namespace troupe
