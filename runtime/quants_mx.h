// MXFP4 (OCP microscaling, 4-bit floats), byte-identical to GGUF / ggml, with reference (scalar,
// deterministic) code in the style of runtime/quants.h. Activations as q8_0; the dot product is an exact
// integer sum per block.
//
//   mxfp4   32 values in 17 bytes: a shared power-of-two scale (E8M0) and 32 E2M1 values
//
// value v = mxfp4_scale(e) * mxfp4_values[q_v]: mxfp4_values are E2M1's values doubled (0, 0.5, 1, 1.5, 2, 3,
// 4, 6 and their negatives, times 2, as signed bytes) and the scale halved to match: 2^(e - 128) (e >= 2;
// below, the subnormal floats 2^-128 and 2^-127 ggml uses). q_v as q4_0's nibbles (value j < 16: the low
// nibble of qs[j], value j + 16 its high nibble).
#pragma once

#include <cstddef>
#include <cstdint>

#include "runtime/types.h"

namespace troupe {

constexpr int qk_mxfp4 = 32;

inline constexpr int8_t mxfp4_values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

struct block_mxfp4 {
  uint8_t e;
  uint8_t qs[qk_mxfp4 / 2];
};
static_assert(sizeof(block_mxfp4) == 17, "mxfp4 block must be 17 bytes");

// The scale an E8M0 exponent byte stands for, halved (the doubled values' partner).
float mxfp4_scale(uint8_t e);

// Quantizer: the spec's exponent e = floor(log2(max |x|)) - 2 + 127 or the one above it (the spec's clips
// values between 12 d and 16 d), whichever errs less; each value the nearest of the 16 (the first on ties).
void quantize_row_mxfp4_ref(const float* x, void* y, int64_t n);
void dequantize_row_mxfp4(const void* x, float* y, int64_t n);
void vec_dot_mxfp4_q8_0(int64_t n, float* s, const void* x, const void* y);

}  // namespace troupe
