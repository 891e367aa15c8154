// Reference quantizers of the K-quants (q2_K, q3_K, q4_K, q5_K, q6_K) and of q8_K, their activation format.
//
// Layouts are documented in quants.h. The quantizers follow ggml's quantize_row_*_ref algorithms (the
// scale searches make_qkx2_quants, make_q3_quants and make_qx_quants, then a second pass that re-rounds
// every value with the stored, quantized scales), with the same float operations in the same order, so
// their output matches ggml's bit for bit on the same input and compiler flags.
//
// Separate from quants_k.cpp (decoding: dequantizers and dot products): the scale searches and bit packing
// here are needed only to write the formats, the decoders only to read them, and they share no helpers.
#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>

#include "runtime/quants.h"

namespace troupe {

namespace {

constexpr int qk = static_cast<int>(qk_k);  // 256
constexpr float group_max_eps = 1e-15f;  // a sub-block with no |x| above this is all zero

// Round to nearest (ties to even) for |f| <= 2^22 by adding 1.5 * 2^23 and reading the mantissa, as
// ggml's nearest_int does. Larger inputs give some int (no undefined behavior); every caller clamps.
inline int nearest_int(float f) {
  const float v = f + 12582912.0f;
  int32_t i;
  std::memcpy(&i, &v, sizeof i);
  return (i & 0x007fffff) - 0x00400000;
}

inline int clamp_int(int v, int lo, int hi) { return std::max(lo, std::min(hi, v)); }

// ---- scale searches --------------------------------------------------------------------------------

// Asymmetric quants L[i] in [0, nmax] with x[i] ~ scale * L[i] - the_min, scale and min chosen by a
// weighted least-squares fit over nstep + 1 trial inverse scales (nmax + rmin + rdelta * is) / range.
// Returns scale; *the_min >= 0. use_mad: minimize weighted |error| instead of squared error.
float make_qkx2_quants(int n, int nmax, const float* x, const float* weights, uint8_t* L, float* the_min,
                       uint8_t* Laux, float rmin, float rdelta, int nstep, bool use_mad) {
  float min = x[0];
  float max = x[0];
  float sum_w = weights[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    const float w = weights[i];
    sum_w += w;
    sum_x += w * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    *the_min = -min;
    return 0.0f;
  }
  float iscale = nmax / (max - min);
  float scale = 1 / iscale;
  float best_error = 0;
  for (int i = 0; i < n; ++i) {
    const int l = nearest_int(iscale * (x[i] - min));
    L[i] = static_cast<uint8_t>(clamp_int(l, 0, nmax));
    float diff = scale * L[i] + min - x[i];
    diff = use_mad ? std::fabs(diff) : diff * diff;
    best_error += weights[i] * diff;
  }
  if (nstep < 1) {
    *the_min = -min;
    return scale;
  }
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * is + nmax) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = clamp_int(nearest_int(iscale * (x[i] - min)), 0, nmax);
      Laux[i] = static_cast<uint8_t>(l);
      const float w = weights[i];
      sum_l += w * l;
      sum_l2 += w * l * l;
      sum_xl += w * l * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
      if (this_min > 0) {  // the offset may only lower values: refit the scale alone
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      float cur_error = 0;
      for (int i = 0; i < n; ++i) {
        float diff = this_scale * Laux[i] + this_min - x[i];
        diff = use_mad ? std::fabs(diff) : diff * diff;
        cur_error += weights[i] * diff;
      }
      if (cur_error < best_error) {
        for (int i = 0; i < n; ++i) L[i] = Laux[i];
        best_error = cur_error;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  *the_min = -min;
  return scale;
}

// Symmetric quants for q3_K: L[i] - nmax in [-nmax, nmax - 1], starting from the scale that maps the
// largest-magnitude value to -nmax, then up to 5 rounds of coordinate descent on the x^2-weighted error.
// Returns the (signed) scale; an all-zero group gives L = 0 and 0.
float make_q3_quants(int n, int nmax, const float* x, int8_t* L) {
  float max = 0;
  float amax = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < group_max_eps) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    return 0.0f;
  }
  const float iscale = -nmax / max;
  float sumlx = 0;
  float suml2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = clamp_int(nearest_int(iscale * x[i]), -nmax, nmax - 1);
    L[i] = static_cast<int8_t>(l);
    const float w = x[i] * x[i];
    sumlx += w * x[i] * l;
    suml2 += w * l * l;
  }
  for (int itry = 0; itry < 5; ++itry) {
    int n_changed = 0;
    for (int i = 0; i < n; ++i) {
      const float w = x[i] * x[i];
      float slx = sumlx - w * x[i] * L[i];
      if (slx > 0) {
        float sl2 = suml2 - w * L[i] * L[i];
        const int new_l = clamp_int(nearest_int(x[i] * sl2 / slx), -nmax, nmax - 1);
        if (new_l != L[i]) {
          slx += w * x[i] * new_l;
          sl2 += w * new_l * new_l;
          if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
            L[i] = static_cast<int8_t>(new_l);
            sumlx = slx;
            suml2 = sl2;
            ++n_changed;
          }
        }
      }
    }
    if (!n_changed) break;
  }
  for (int i = 0; i < n; ++i) L[i] = static_cast<int8_t>(L[i] + nmax);
  return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

// Symmetric quants for q6_K (ggml's make_qx_quants with rmse_type 1): L[i] - nmax in [-nmax, nmax - 1];
// tries the inverse scales -(nmax + 0.1 is) / max for is in [-9, 9] and keeps the best weighted
// least-squares fit (weights w, or x^2 when w is null). Returns the scale; all-zero gives L = 0 and 0.
float make_qx_quants(int n, int nmax, const float* x, int8_t* L, const float* qw) {
  float max = 0;
  float amax = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < group_max_eps) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    return 0.0f;
  }
  float iscale = -nmax / max;
  float sumlx = 0;
  float suml2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = clamp_int(nearest_int(iscale * x[i]), -nmax, nmax - 1);
    L[i] = static_cast<int8_t>(l + nmax);
    const float w = qw ? qw[i] : x[i] * x[i];
    sumlx += w * x[i] * l;
    suml2 += w * l * l;
  }
  float scale = suml2 != 0.0f ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = -(nmax + 0.1f * is) / max;
    sumlx = suml2 = 0;
    for (int i = 0; i < n; ++i) {
      const int l = clamp_int(nearest_int(iscale * x[i]), -nmax, nmax - 1);
      const float w = qw ? qw[i] : x[i] * x[i];
      sumlx += w * x[i] * l;
      suml2 += w * l * l;
    }
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; ++i) {
        L[i] = static_cast<int8_t>(nmax + clamp_int(nearest_int(iscale * x[i]), -nmax, nmax - 1));
      }
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

// ---- bit packing shared by q2_K and q3_K: 2-bit fields, value 128 h + 32 k + l in bits 2k of qs[32 h + l]

inline void pack_2bit(const uint8_t* L, uint8_t* qs) {
  for (int h = 0; h < 2; ++h) {
    for (int l = 0; l < 32; ++l) {
      const uint8_t* v = L + 128 * h + l;
      qs[32 * h + l] = static_cast<uint8_t>(v[0] | (v[32] << 2) | (v[64] << 4) | (v[96] << 6));
    }
  }
}

// The 6-bit scales and mins of q4_K / q5_K from the float ones of the 8 sub-blocks (all >= 0): each
// rounded relative to the largest (which becomes 63), then packed as get_scale_min_k4 reads them.
void quantize_scale_min_k4(const float scales[8], const float mins[8], float max_scale, float max_min,
                           uint8_t packed[k_scale_size]) {
  const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
  const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
  uint8_t ls[8], lm[8];
  for (int j = 0; j < 8; ++j) {
    ls[j] = static_cast<uint8_t>(clamp_int(nearest_int(inv_scale * scales[j]), 0, 63));
    lm[j] = static_cast<uint8_t>(clamp_int(nearest_int(inv_min * mins[j]), 0, 63));
  }
  pack_scale_min_k4(ls, lm, packed);
}

}  // namespace

void pack_scale_min_k4(const uint8_t sc[8], const uint8_t m[8], uint8_t q[k_scale_size]) {
  for (int j = 0; j < 4; ++j) {
    // bytes 0..3: scale j (6 bits) + bits 4..5 of scale j + 4 in the top 2 bits
    q[j] = static_cast<uint8_t>((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
    // bytes 4..7: min j (6 bits) + bits 4..5 of min j + 4 in the top 2 bits
    q[j + 4] = static_cast<uint8_t>((m[j] & 63) | ((m[j + 4] >> 4) << 6));
    // bytes 8..11: low 4 bits of scale j + 4 (low nibble) and of min j + 4 (high nibble)
    q[j + 8] = static_cast<uint8_t>((sc[j + 4] & 0xF) | ((m[j + 4] & 0xF) << 4));
  }
}

// ===================================== q2_K =============================================================

void quantize_row_q2_K_ref(const float* x, void* vy, int64_t n) {
  assert(n % qk == 0);
  block_q2_K* y = static_cast<block_q2_K*>(vy);
  const int64_t nb = n / qk;
  uint8_t L[qk];
  uint8_t Laux[16];
  float weights[16];
  float mins[16];
  float scales[16];
  const float q4scale = 15.f;

  for (int64_t i = 0; i < nb; ++i, x += qk) {
    float max_scale = 0;  // the min is subtracted, so scales are >= 0
    float max_min = 0;
    for (int j = 0; j < 16; ++j) {
      for (int l = 0; l < 16; ++l) weights[l] = std::fabs(x[16 * j + l]);
      scales[j] = make_qkx2_quants(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], Laux, -0.5f, 0.1f, 15, true);
      max_scale = std::max(max_scale, scales[j]);
      max_min = std::max(max_min, mins[j]);
    }

    // 4-bit scales (low nibbles) and mins (high nibbles), relative to d = max_scale / 15, dmin likewise.
    if (max_scale > 0) {
      const float iscale = q4scale / max_scale;
      for (int j = 0; j < 16; ++j) y[i].scales[j] = static_cast<uint8_t>(clamp_int(nearest_int(iscale * scales[j]), 0, 15));
      y[i].d = fp32_to_fp16(max_scale / q4scale);
    } else {
      for (int j = 0; j < 16; ++j) y[i].scales[j] = 0;
      y[i].d = fp32_to_fp16(0.f);
    }
    if (max_min > 0) {
      const float iscale = q4scale / max_min;
      for (int j = 0; j < 16; ++j) {
        const int l = clamp_int(nearest_int(iscale * mins[j]), 0, 15);
        y[i].scales[j] = static_cast<uint8_t>(y[i].scales[j] | (l << 4));
      }
      y[i].dmin = fp32_to_fp16(max_min / q4scale);
    } else {
      y[i].dmin = fp32_to_fp16(0.f);
    }

    // Re-round every value against the stored scales.
    for (int j = 0; j < 16; ++j) {
      const float d = fp16_to_fp32(y[i].d) * (y[i].scales[j] & 0xF);
      if (d == 0.0f) continue;
      const float dm = fp16_to_fp32(y[i].dmin) * (y[i].scales[j] >> 4);
      for (int ii = 0; ii < 16; ++ii) L[16 * j + ii] = static_cast<uint8_t>(clamp_int(nearest_int((x[16 * j + ii] + dm) / d), 0, 3));
    }
    pack_2bit(L, y[i].qs);
  }
}

// ===================================== q3_K =============================================================

void quantize_row_q3_K_ref(const float* x, void* vy, int64_t n) {
  assert(n % qk == 0);
  block_q3_K* y = static_cast<block_q3_K*>(vy);
  const int64_t nb = n / qk;
  int8_t L[qk];
  float scales[16];

  for (int64_t i = 0; i < nb; ++i, x += qk) {
    float max_scale = 0;  // the signed scale of largest magnitude
    float amax = 0;
    for (int j = 0; j < 16; ++j) {
      scales[j] = make_q3_quants(16, 4, x + 16 * j, L + 16 * j);
      const float a = std::fabs(scales[j]);
      if (a > amax) {
        amax = a;
        max_scale = scales[j];
      }
    }

    // 6-bit scales, offset by 32, relative to d = max_scale / -32.
    std::memset(y[i].scales, 0, sizeof y[i].scales);
    if (max_scale != 0.0f) {
      const float iscale = -32.f / max_scale;
      for (int j = 0; j < 16; ++j) {
        const int l = clamp_int(nearest_int(iscale * scales[j]), -32, 31) + 32;
        if (j < 8) {
          y[i].scales[j] = static_cast<uint8_t>(l & 0xF);
        } else {
          y[i].scales[j - 8] = static_cast<uint8_t>(y[i].scales[j - 8] | ((l & 0xF) << 4));
        }
        y[i].scales[8 + j % 4] = static_cast<uint8_t>(y[i].scales[8 + j % 4] | ((l >> 4) << (2 * (j / 4))));
      }
      y[i].d = fp32_to_fp16(1 / iscale);
    } else {
      y[i].d = fp32_to_fp16(0.f);
    }

    for (int j = 0; j < 16; ++j) {
      const float d = fp16_to_fp32(y[i].d) * static_cast<float>(q3_K_scale(y[i].scales, j) - 32);
      if (d == 0.0f) continue;
      for (int ii = 0; ii < 16; ++ii) {
        L[16 * j + ii] = static_cast<int8_t>(clamp_int(nearest_int(x[16 * j + ii] / d), -4, 3) + 4);
      }
    }

    // High bit (L > 3) of value v into bit v / 32 of hmask[v % 32]; the low 2 bits into qs.
    std::memset(y[i].hmask, 0, sizeof y[i].hmask);
    uint8_t low[qk];
    for (int v = 0; v < qk; ++v) {
      int l = L[v];
      if (l > 3) {
        y[i].hmask[v % 32] = static_cast<uint8_t>(y[i].hmask[v % 32] | (1u << (v / 32)));
        l -= 4;
      }
      low[v] = static_cast<uint8_t>(l);
    }
    pack_2bit(low, y[i].qs);
  }
}

// ===================================== q4_K / q5_K ======================================================

namespace {

// The search shared by q4_K (nmax 15) and q5_K (nmax 31): per sub-block of 32, weights sqrt(mean x^2) + |x|,
// make_qkx2_quants; then 6-bit scales and mins relative to their maxima, d and dmin; then L re-rounded
// against the stored scales. Returns L (in [0, nmax]) and fills d, dmin and scales of the block.
void quantize_k4_block(const float* x, int nmax, float rmin, float rdelta, int nstep, uint8_t L[qk], fp16_t* d_out,
                       fp16_t* dmin_out, uint8_t scales_out[k_scale_size]) {
  uint8_t Laux[32];
  float weights[32];
  float mins[8];
  float scales[8];
  float max_scale = 0;
  float max_min = 0;
  for (int j = 0; j < 8; ++j) {
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
    const float av_x = std::sqrt(sum_x2 / 32);
    for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(x[32 * j + l]);
    scales[j] = make_qkx2_quants(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, rmin, rdelta, nstep, false);
    max_scale = std::max(max_scale, scales[j]);
    max_min = std::max(max_min, mins[j]);
  }
  quantize_scale_min_k4(scales, mins, max_scale, max_min, scales_out);
  *d_out = fp32_to_fp16(max_scale / 63.f);
  *dmin_out = fp32_to_fp16(max_min / 63.f);

  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    get_scale_min_k4(j, scales_out, &sc, &m);
    const float d = fp16_to_fp32(*d_out) * sc;
    if (d == 0.0f) continue;
    const float dm = fp16_to_fp32(*dmin_out) * m;
    for (int ii = 0; ii < 32; ++ii) {
      L[32 * j + ii] = static_cast<uint8_t>(clamp_int(nearest_int((x[32 * j + ii] + dm) / d), 0, nmax));
    }
  }
}

}  // namespace

void quantize_row_q4_K_ref(const float* x, void* vy, int64_t n) {
  assert(n % qk == 0);
  block_q4_K* y = static_cast<block_q4_K*>(vy);
  const int64_t nb = n / qk;
  uint8_t L[qk];
  for (int64_t i = 0; i < nb; ++i, x += qk) {
    quantize_k4_block(x, 15, -1.f, 0.1f, 20, L, &y[i].d, &y[i].dmin, y[i].scales);
    // Chunk c of 64 values: the first 32 in the low nibbles of qs[32 c ...], the next 32 in the high ones.
    for (int c = 0; c < 4; ++c) {
      for (int l = 0; l < 32; ++l) y[i].qs[32 * c + l] = static_cast<uint8_t>(L[64 * c + l] | (L[64 * c + 32 + l] << 4));
    }
  }
}

void quantize_row_q5_K_ref(const float* x, void* vy, int64_t n) {
  assert(n % qk == 0);
  block_q5_K* y = static_cast<block_q5_K*>(vy);
  const int64_t nb = n / qk;
  uint8_t L[qk];
  for (int64_t i = 0; i < nb; ++i, x += qk) {
    quantize_k4_block(x, 31, -0.5f, 0.1f, 15, L, &y[i].d, &y[i].dmin, y[i].scales);
    // As q4_K for the low 4 bits; bit 4 of value 64 c + l into bit 2c of qh[l], of 64 c + 32 + l into bit 2c + 1.
    std::memset(y[i].qh, 0, sizeof y[i].qh);
    for (int c = 0; c < 4; ++c) {
      for (int l = 0; l < 32; ++l) {
        const int l1 = L[64 * c + l];
        const int l2 = L[64 * c + 32 + l];
        y[i].qs[32 * c + l] = static_cast<uint8_t>((l1 & 0xF) | ((l2 & 0xF) << 4));
        y[i].qh[l] = static_cast<uint8_t>(y[i].qh[l] | (((l1 >> 4) & 1) << (2 * c)) | (((l2 >> 4) & 1) << (2 * c + 1)));
      }
    }
  }
}

// ===================================== q6_K =============================================================

void quantize_row_q6_K_ref(const float* x, void* vy, int64_t n) {
  assert(n % qk == 0);
  block_q6_K* y = static_cast<block_q6_K*>(vy);
  const int64_t nb = n / qk;
  int8_t L[qk];
  float scales[16];

  for (int64_t i = 0; i < nb; ++i, x += qk) {
    float max_scale = 0;  // the signed scale of largest magnitude
    float max_abs_scale = 0;
    for (int ib = 0; ib < 16; ++ib) {
      scales[ib] = make_qx_quants(16, 32, x + 16 * ib, L + 16 * ib, nullptr);
      const float a = std::fabs(scales[ib]);
      if (a > max_abs_scale) {
        max_abs_scale = a;
        max_scale = scales[ib];
      }
    }
    if (max_abs_scale < group_max_eps) {
      std::memset(&y[i], 0, sizeof y[i]);
      continue;
    }

    // 8-bit signed scales relative to d = max_scale / -128.
    const float iscale = -128.f / max_scale;
    y[i].d = fp32_to_fp16(1 / iscale);
    for (int ib = 0; ib < 16; ++ib) y[i].scales[ib] = static_cast<int8_t>(clamp_int(nearest_int(iscale * scales[ib]), -128, 127));

    for (int j = 0; j < 16; ++j) {
      const float d = fp16_to_fp32(y[i].d) * y[i].scales[j];
      if (d == 0.0f) continue;
      for (int ii = 0; ii < 16; ++ii) {
        L[16 * j + ii] = static_cast<int8_t>(clamp_int(nearest_int(x[16 * j + ii] / d), -32, 31) + 32);
      }
    }

    // Half h, value 128 h + 32 k + l: low nibble into ql (k = 0, 1: low nibbles of ql[64 h + 32 k + l];
    // k = 2, 3: high nibbles of ql[64 h + 32 (k - 2) + l]), top 2 bits into bits 2k of qh[32 h + l].
    for (int h = 0; h < 2; ++h) {
      uint8_t* ql = y[i].ql + 64 * h;
      uint8_t* qh = y[i].qh + 32 * h;
      const int8_t* v = L + 128 * h;
      for (int l = 0; l < 32; ++l) {
        ql[l] = static_cast<uint8_t>((v[l] & 0xF) | ((v[l + 64] & 0xF) << 4));
        ql[l + 32] = static_cast<uint8_t>((v[l + 32] & 0xF) | ((v[l + 96] & 0xF) << 4));
        qh[l] = static_cast<uint8_t>((v[l] >> 4) | ((v[l + 32] >> 4) << 2) | ((v[l + 64] >> 4) << 4) | ((v[l + 96] >> 4) << 6));
      }
    }
  }
}

// ===================================== q8_K =============================================================

// q8_K: the value of largest magnitude maps to -127 (d = max / -127, a float), bsums of 16.
void quantize_row_q8_K_ref(const float* x, void* vy, int64_t n) {
  assert(n % qk == 0);
  block_q8_K* y = static_cast<block_q8_K*>(vy);
  const int64_t nb = n / qk;
  for (int64_t i = 0; i < nb; ++i, x += qk) {
    float max = 0;
    float amax = 0;
    for (int j = 0; j < qk; ++j) {
      const float ax = std::fabs(x[j]);
      if (ax > amax) {
        amax = ax;
        max = x[j];
      }
    }
    if (amax == 0.0f) {
      std::memset(&y[i], 0, sizeof y[i]);  // ggml leaves bsums unset here; zero is what they sum to
      continue;
    }
    const float iscale = -127.f / max;
    for (int j = 0; j < qk; ++j) y[i].qs[j] = static_cast<int8_t>(clamp_int(nearest_int(iscale * x[j]), -128, 127));
    for (int j = 0; j < 16; ++j) {
      int sum = 0;
      for (int l = 0; l < 16; ++l) sum += y[i].qs[16 * j + l];
      y[i].bsums[j] = static_cast<int16_t>(sum);
    }
    y[i].d = 1 / iscale;
  }
}

}  // namespace troupe
