// Reference code of MXFP4 (runtime/quants_mx.h).
#include "runtime/quants_mx.h"

#include <cassert>
#include <cmath>
#include <cstring>

#include "runtime/fp16.h"
#include "runtime/quants.h"

namespace troupe {

float mxfp4_scale(uint8_t e) {
  const uint32_t bits = e < 2 ? (0x00200000u << e) : (static_cast<uint32_t>(e - 1) << 23);
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

namespace {

// The nearest of the 16 values to x / d (the first on ties), and the squared error.
int nearest_mxfp4(float x, float d, float* err) {
  int best = 0;
  float best_err = std::fabs(d * mxfp4_values[0] - x);
  for (int k = 1; k < 16; ++k) {
    const float e = std::fabs(d * mxfp4_values[k] - x);
    if (e < best_err) {
      best_err = e;
      best = k;
    }
  }
  *err = best_err * best_err;
  return best;
}

}  // namespace

void quantize_row_mxfp4_ref(const float* x, void* vy, int64_t n) {
  assert(n % qk_mxfp4 == 0);
  block_mxfp4* y = static_cast<block_mxfp4*>(vy);
  for (int64_t i = 0; i < n / qk_mxfp4; ++i, x += qk_mxfp4) {
    float amax = 0.0f;
    for (int j = 0; j < qk_mxfp4; ++j) amax = std::fmax(amax, std::fabs(x[j]));
    // The spec's exponent puts amax / d in [8, 16), where the largest value is 12: values above 12 d clip.
    // The next exponent up holds them; each block keeps whichever of the two errs less.
    const int e0 = amax > 0.0f ? static_cast<int>(std::floor(std::log2(amax))) - 2 + 127 : 0;
    float best_err = INFINITY;
    for (int e = e0; e <= e0 + 1; ++e) {
      const uint8_t ec = static_cast<uint8_t>(e < 0 ? 0 : (e > 254 ? 254 : e));
      const float d = mxfp4_scale(ec);
      uint8_t q[qk_mxfp4];
      float err = 0.0f;
      for (int j = 0; j < qk_mxfp4; ++j) {
        float ej;
        q[j] = static_cast<uint8_t>(nearest_mxfp4(x[j], d, &ej));
        err += ej;
      }
      if (err < best_err) {
        best_err = err;
        y[i].e = ec;
        for (int j = 0; j < 16; ++j) y[i].qs[j] = static_cast<uint8_t>(q[j] | (q[j + 16] << 4));
      }
    }
  }
}

void dequantize_row_mxfp4(const void* vx, float* y, int64_t n) {
  assert(n % qk_mxfp4 == 0);
  const block_mxfp4* x = static_cast<const block_mxfp4*>(vx);
  for (int64_t i = 0; i < n / qk_mxfp4; ++i, y += qk_mxfp4) {
    const float d = mxfp4_scale(x[i].e);
    for (int j = 0; j < 16; ++j) {
      y[j] = d * mxfp4_values[x[i].qs[j] & 0xF];
      y[j + 16] = d * mxfp4_values[x[i].qs[j] >> 4];
    }
  }
}

void vec_dot_mxfp4_q8_0(int64_t n, float* s, const void* vx, const void* vy) {
  assert(n % qk_mxfp4 == 0);
  const block_mxfp4* x = static_cast<const block_mxfp4*>(vx);
  const block_q8_0* y = static_cast<const block_q8_0*>(vy);
  double sum = 0.0;
  for (int64_t i = 0; i < n / qk_mxfp4; ++i) {
    int32_t isum = 0;
    for (int j = 0; j < 16; ++j) {
      isum += mxfp4_values[x[i].qs[j] & 0xF] * y[i].qs[j] + mxfp4_values[x[i].qs[j] >> 4] * y[i].qs[j + 16];
    }
    sum += static_cast<double>(mxfp4_scale(x[i].e)) * fp16_to_fp32(y[i].d) * isum;
  }
  *s = static_cast<float>(sum);
}

}  // namespace troupe
