// The i-quants with a non-linear 4-bit codebook, byte-identical to GGUF / ggml, with reference (scalar,
// deterministic) code in the style of runtime/quants.h:
//
//   iq4_nl   32 values in 18 bytes (4.5 bits/value):  value v = d * iq4nl_values[q_v]
//   iq4_xs   256 values in 136 bytes (4.25 bits/value): 8 sub-blocks of 32, each with a 6-bit scale
//
// Both map a 4-bit index through the same 16-entry table of signed bytes (iq4nl_values, the format's
// definition: denser near zero, where most weights are). Their dot products take the activations as q8_0
// (iq4_nl) and q8_K (iq4_xs), like q4_0 and the K-quants, and are exact in integers inside a block.
//
// The quantizers need no importance matrix: each block's scale is the best weighted least-squares fit
// (weights |x|) among candidate scales that map the block's largest value near the codebook's -127 end, and
// the value indices are the nearest codebook entries.
#pragma once

#include <cstddef>
#include <cstdint>

#include "runtime/fp16.h"
#include "runtime/types.h"

namespace troupe {

constexpr int qk4_nl = 32;

// The codebook of iq4_nl and iq4_xs (ggml's kvalues_iq4nl), in increasing order.
inline constexpr int8_t iq4nl_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

// iq4_nl: value v = d * iq4nl_values[q_v]; qs[j] low nibble = q_j, high nibble = q_{j+16} (as q4_0).
struct block_iq4_nl {
  fp16_t d;
  uint8_t qs[qk4_nl / 2];
};
static_assert(sizeof(block_iq4_nl) == 18, "iq4_nl block must be 18 bytes");

// iq4_xs: 8 sub-blocks of 32. Sub-block j's scale is ls_j - 32 with the 6-bit ls_j: low 4 bits in
// scales_l[j / 2] (low nibble for even j, high for odd), high 2 bits at bits 2j..2j+1 of scales_h.
// value 32 j + l = d * (ls_j - 32) * iq4nl_values[q], q the low nibble of qs[16 j + l] for l < 16 and the
// high nibble of qs[16 j + l - 16] for l >= 16 (each sub-block laid out as an iq4_nl block).
struct block_iq4_xs {
  fp16_t d;
  uint16_t scales_h;
  uint8_t scales_l[qk_k / 64];
  uint8_t qs[qk_k / 2];
};
static_assert(sizeof(block_iq4_xs) == 136, "iq4_xs block must be 136 bytes");

// The 6-bit scale ls_j (before the -32) of sub-block j of an iq4_xs block.
inline int iq4_xs_scale(const block_iq4_xs& b, int j) {
  return ((b.scales_l[j / 2] >> (4 * (j % 2))) & 0xF) | (((b.scales_h >> (2 * j)) & 3) << 4);
}

void quantize_row_iq4_nl_ref(const float* x, void* y, int64_t n);
void quantize_row_iq4_xs_ref(const float* x, void* y, int64_t n);

void dequantize_row_iq4_nl(const void* x, float* y, int64_t n);
void dequantize_row_iq4_xs(const void* x, float* y, int64_t n);

void vec_dot_iq4_nl_q8_0(int64_t n, float* s, const void* x, const void* y);
void vec_dot_iq4_xs_q8_K(int64_t n, float* s, const void* x, const void* y);

}  // namespace troupe
