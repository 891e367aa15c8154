// AVX2 + FMA + F16C conversions: the activation quantizers (f32 -> q8_0 / q8_1 / q8_K / f16 / bf16) and
// dequantizers of the common weight types (for the BLAS path). Compiled with -mavx2 -mfma -mf16c
// -ffp-contract=off.
//
// Every function here is bit-identical to its reference in runtime/quants*.cpp: the same float operations
// in the same order per element (no FMA contraction), and roundings reproduced exactly:
//   - q8_0 / q8_1 round half away from zero (std::round): truncate, then add +-1 where |fraction| >= 0.5
//     (the fraction v - trunc(v) is exact in float);
//   - q8_K rounds half to even (ggml's nearest_int): cvtps_epi32 under the default MXCSR mode;
//   - fp16 scales with vcvtps2ph (round to nearest even, as fp32_to_fp16 for finite values);
//   - bf16 with the integer rounding of fp32_to_bf16.
// Horizontal maxima are order-independent, so vector and scalar scans agree.
#include "backends/cpu/simd/x86_common.h"
#include "backends/cpu/simd/x86_kernels.h"

namespace troupe::cpu::simd::avx2 {

namespace {

// vcvtps2ph of one float (clang's _cvtss_sh is a macro that -Wpedantic rejects).
inline uint16_t f2h(float f) {
  return static_cast<uint16_t>(_mm_extract_epi16(_mm_cvtps_ph(_mm_set_ss(f), _MM_FROUND_TO_NEAREST_INT), 0));
}

inline __m256 abs_ps(__m256 v) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v); }

inline float hmax(__m256 v) {
  __m128 r = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  r = _mm_max_ps(r, _mm_movehl_ps(r, r));
  r = _mm_max_ss(r, _mm_movehdup_ps(r));
  return _mm_cvtss_f32(r);
}

// std::round: half away from zero.
inline __m256 round_away(__m256 v) {
  const __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  const __m256 frac = abs_ps(_mm256_sub_ps(v, t));
  const __m256 one = _mm256_or_ps(_mm256_set1_ps(1.0f), _mm256_and_ps(v, _mm256_set1_ps(-0.0f)));  // +-1
  return _mm256_add_ps(t, _mm256_and_ps(_mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ), one));
}

// 32 int32 (four registers, values in [-128, 127]) -> 32 int8 in order. The packs work per 128-bit lane,
// so the result's 32-bit groups come out as 0 2 4 6 1 3 5 7 ... and a permute restores the order.
inline __m256i pack_i32_to_i8(__m256i a, __m256i b, __m256i c, __m256i d) {
  const __m256i ab = _mm256_packs_epi32(a, b);
  const __m256i cd = _mm256_packs_epi32(c, d);
  const __m256i abcd = _mm256_packs_epi16(ab, cd);
  return _mm256_permutevar8x32_epi32(abcd, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// One q8_0 / q8_1 block: quants into qs, returns d; *sum = sum of the quants.
inline float quantize_block_q8(const float* x, int8_t* qs, int32_t* sum) {
  __m256 v[4];
  __m256 amax = _mm256_setzero_ps();
  for (int j = 0; j < 4; ++j) {
    v[j] = _mm256_loadu_ps(x + 8 * j);
    amax = _mm256_max_ps(amax, abs_ps(v[j]));
  }
  const float d = hmax(amax) / 127;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  const __m256 mul = _mm256_set1_ps(id);
  __m256i q[4];
  for (int j = 0; j < 4; ++j) {
    __m256 r = round_away(_mm256_mul_ps(v[j], mul));
    r = _mm256_min_ps(_mm256_max_ps(r, _mm256_set1_ps(-127.0f)), _mm256_set1_ps(127.0f));
    q[j] = _mm256_cvtps_epi32(r);  // integral already: exact
  }
  *sum = hsum_i32(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(qs), pack_i32_to_i8(q[0], q[1], q[2], q[3]));
  return d;
}

}  // namespace

void quantize_row_q8_0(const float* x, void* vy, int64_t n) {
  block_q8_0* y = static_cast<block_q8_0*>(vy);
  for (int64_t i = 0; i < n / qk8_0; ++i, x += qk8_0) {
    int32_t sum;
    y[i].d = f2h(quantize_block_q8(x, y[i].qs, &sum));
  }
}

void quantize_row_q8_1(const float* x, void* vy, int64_t n) {
  block_q8_1* y = static_cast<block_q8_1*>(vy);
  for (int64_t i = 0; i < n / qk8_1; ++i, x += qk8_1) {
    int32_t sum;
    const float d = quantize_block_q8(x, y[i].qs, &sum);
    y[i].d = f2h(d);
    y[i].s = f2h(static_cast<float>(sum) * d);
  }
}

void quantize_row_q8_K(const float* x, void* vy, int64_t n) {
  block_q8_K* y = static_cast<block_q8_K*>(vy);
  for (int64_t i = 0; i < n / qk_k; ++i, x += qk_k) {
    __m256 amax_v = _mm256_setzero_ps();
    for (int j = 0; j < 32; ++j) amax_v = _mm256_max_ps(amax_v, abs_ps(_mm256_loadu_ps(x + 8 * j)));
    const float amax = hmax(amax_v);
    if (amax == 0.0f) {
      std::memset(&y[i], 0, sizeof y[i]);
      continue;
    }
    // The reference keeps the first value of largest magnitude (its sign decides the scale's sign).
    float max = 0.0f;
    const __m256 target = _mm256_set1_ps(amax);
    for (int j = 0; j < 32; ++j) {
      const int mask = _mm256_movemask_ps(_mm256_cmp_ps(abs_ps(_mm256_loadu_ps(x + 8 * j)), target, _CMP_EQ_OQ));
      if (mask != 0) {
        max = x[8 * j + __builtin_ctz(static_cast<unsigned>(mask))];
        break;
      }
    }
    const float iscale = -127.f / max;
    const __m256 mul = _mm256_set1_ps(iscale);
    for (int g = 0; g < 8; ++g) {  // 32 values per group: two 16-value bsums
      __m256i q[4];
      for (int j = 0; j < 4; ++j) q[j] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 32 * g + 8 * j), mul));
      // packs saturate to [-128, 127], the reference's clamp; the bsums use the clamped values.
      const __m256i packed = pack_i32_to_i8(q[0], q[1], q[2], q[3]);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(y[i].qs + 32 * g), packed);
      const __m256i wide0 = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(packed));
      const __m256i wide1 = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(packed, 1));
      y[i].bsums[2 * g] = static_cast<int16_t>(hsum_i32(_mm256_madd_epi16(wide0, _mm256_set1_epi16(1))));
      y[i].bsums[2 * g + 1] = static_cast<int16_t>(hsum_i32(_mm256_madd_epi16(wide1, _mm256_set1_epi16(1))));
    }
    y[i].d = 1 / iscale;
  }
}

void quantize_row_f16(const float* x, void* vy, int64_t n) {
  uint16_t* y = static_cast<uint16_t*>(vy);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
  }
  for (; i < n; ++i) y[i] = f2h(x[i]);
}

// fp32_to_bf16: NaN -> (u >> 16) | 64; otherwise (u + 0x7fff + ((u >> 16) & 1)) >> 16.
void quantize_row_bf16(const float* x, void* vy, int64_t n) {
  uint16_t* y = static_cast<uint16_t*>(vy);
  int64_t i = 0;
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
  const __m256i inf = _mm256_set1_epi32(0x7f800000);
  for (; i + 8 <= n; i += 8) {
    const __m256i u = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i));
    const __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs_mask), inf);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb)), 16);
    const __m256i nan = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(64));
    const __m256i r = _mm256_blendv_epi8(rounded, nan, is_nan);
    // packus per 128-bit lane gives groups 0 1 | 0 1 of the two inputs; permute the 64-bit groups back.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0xD8);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i), _mm256_castsi256_si128(packed));
  }
  for (; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, x + i, 4);
    y[i] = (u & 0x7fffffffu) > 0x7f800000u ? static_cast<uint16_t>((u >> 16) | 64u)
                                           : static_cast<uint16_t>((u + (0x7fffu + ((u >> 16) & 1u))) >> 16);
  }
}

// ---- dequantizers -------------------------------------------------------------------------------------

void dequantize_row_f16(const void* vx, float* y, int64_t n) {
  const uint16_t* x = static_cast<const uint16_t*>(vx);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_cvtph_ps(load128(x + i)));
  for (; i < n; ++i) y[i] = h2f(x[i]);
}

void dequantize_row_bf16(const void* vx, float* y, int64_t n) {
  const uint16_t* x = static_cast<const uint16_t*>(vx);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + i), _mm256_slli_epi32(_mm256_cvtepu16_epi32(load128(x + i)), 16));
  }
  for (; i < n; ++i) {
    const uint32_t w = static_cast<uint32_t>(x[i]) << 16;
    std::memcpy(y + i, &w, 4);
  }
}

namespace {

// 32 signed bytes times d -> 32 floats.
inline void store_scaled_32(__m256i q, float d, float* y) {
  const __m256 dv = _mm256_set1_ps(d);
  const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
  _mm256_storeu_ps(y, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)), dv));
  _mm256_storeu_ps(y + 8, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8))), dv));
  _mm256_storeu_ps(y + 16, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)), dv));
  _mm256_storeu_ps(y + 24, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8))), dv));
}

// 32 signed bytes -> d * q - m per float (the reference's order: product, then difference).
inline void store_scaled_min_32(__m256i q, float d, float m, float* y) {
  const __m256 dv = _mm256_set1_ps(d), mv = _mm256_set1_ps(m);
  const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
  const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
  for (int j = 0; j < 4; ++j) {
    const __m256 f = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(parts[j]));
    _mm256_storeu_ps(y + 8 * j, _mm256_sub_ps(_mm256_mul_ps(dv, f), mv));
  }
}

}  // namespace

void dequantize_row_q4_0(const void* vx, float* y, int64_t n) {
  const block_q4_0* x = static_cast<const block_q4_0*>(vx);
  for (int64_t i = 0; i < n / qk4_0; ++i, y += qk4_0) {
    store_scaled_32(_mm256_sub_epi8(nibbles_32(x[i].qs), _mm256_set1_epi8(8)), h2f(x[i].d), y);
  }
}

void dequantize_row_q4_1(const void* vx, float* y, int64_t n) {
  const block_q4_1* x = static_cast<const block_q4_1*>(vx);
  for (int64_t i = 0; i < n / qk4_1; ++i, y += qk4_1) {
    store_scaled_min_32(nibbles_32(x[i].qs), h2f(x[i].d), -h2f(x[i].m), y);  // d q - (-m) = d q + m, exactly
  }
}

// q5_0: nibble + 16 * bit - 16 (see q5_0_k in dot_blocks_x86.inc: 0xF0 | nibble where the bit is clear).
void dequantize_row_q5_0(const void* vx, float* y, int64_t n) {
  const block_q5_0* x = static_cast<const block_q5_0*>(vx);
  for (int64_t i = 0; i < n / qk5_0; ++i, y += qk5_0) {
    const __m256i hi = _mm256_andnot_si256(bytes_from_bits_32(x[i].qh), _mm256_set1_epi8(static_cast<char>(0xF0)));
    store_scaled_32(_mm256_or_si256(nibbles_32(x[i].qs), hi), h2f(x[i].d), y);
  }
}

void dequantize_row_q5_1(const void* vx, float* y, int64_t n) {
  const block_q5_1* x = static_cast<const block_q5_1*>(vx);
  for (int64_t i = 0; i < n / qk5_1; ++i, y += qk5_1) {
    const __m256i hi = _mm256_and_si256(bytes_from_bits_32(x[i].qh), _mm256_set1_epi8(0x10));
    store_scaled_min_32(_mm256_or_si256(nibbles_32(x[i].qs), hi), h2f(x[i].d), -h2f(x[i].m), y);
  }
}

void dequantize_row_q8_0(const void* vx, float* y, int64_t n) {
  const block_q8_0* x = static_cast<const block_q8_0*>(vx);
  for (int64_t i = 0; i < n / qk8_0; ++i, y += qk8_0) store_scaled_32(load256(x[i].qs), h2f(x[i].d), y);
}

void dequantize_row_q4_K(const void* vx, float* y, int64_t n) {
  const block_q4_K* x = static_cast<const block_q4_K*>(vx);
  for (int64_t i = 0; i < n / qk_k; ++i) {
    const float d = h2f(x[i].d), dmin = h2f(x[i].dmin);
    const uint8_t* q = x[i].scales;
    for (int c = 0; c < 4; ++c, y += 64) {
      // (scale, min) of sub-blocks 2c and 2c + 1, unpacked as get_scale_min_k4 does.
      int sc[2], mn[2];
      for (int t = 0; t < 2; ++t) {
        const int j = 2 * c + t;
        sc[t] = j < 4 ? (q[j] & 63) : ((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        mn[t] = j < 4 ? (q[j + 4] & 63) : ((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
      }
      const __m256i bits = load256(x[i].qs + 32 * c);
      const __m256i m4 = _mm256_set1_epi8(0xF);
      store_scaled_min_32(_mm256_and_si256(bits, m4), d * static_cast<float>(sc[0]), dmin * static_cast<float>(mn[0]), y);
      store_scaled_min_32(_mm256_and_si256(_mm256_srli_epi16(bits, 4), m4), d * static_cast<float>(sc[1]),
                          dmin * static_cast<float>(mn[1]), y + 32);
    }
  }
}

void dequantize_row_q6_K(const void* vx, float* y, int64_t n) {
  const block_q6_K* x = static_cast<const block_q6_K*>(vx);
  const __m256i m4 = _mm256_set1_epi8(0xF), m2 = _mm256_set1_epi8(3), m32 = _mm256_set1_epi8(32);
  for (int64_t i = 0; i < n / qk_k; ++i) {
    const float d = h2f(x[i].d);
    for (int h = 0; h < 2; ++h) {
      const __m256i ql0 = load256(x[i].ql + 64 * h), ql1 = load256(x[i].ql + 64 * h + 32);
      const __m256i qh = load256(x[i].qh + 32 * h);
      const __m256i lows[4] = {_mm256_and_si256(ql0, m4), _mm256_and_si256(ql1, m4),
                               _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                               _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4)};
      for (int k = 0; k < 4; ++k) {
        const __m256i hi = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * k), m2), 4);
        const __m256i q = _mm256_sub_epi8(_mm256_or_si256(lows[k], hi), m32);
        // values 128 h + 32 k + l: sub-blocks 8 h + 2 k (l < 16) and 8 h + 2 k + 1.
        float* out = y + 256 * i + 128 * h + 32 * k;
        const int j = 8 * h + 2 * k;
        alignas(32) float tmp[32];
        store_scaled_32(q, 1.0f, tmp);  // exact: small integers
        const __m256 d0 = _mm256_set1_ps(d * static_cast<float>(x[i].scales[j]));
        const __m256 d1 = _mm256_set1_ps(d * static_cast<float>(x[i].scales[j + 1]));
        _mm256_storeu_ps(out, _mm256_mul_ps(d0, _mm256_load_ps(tmp)));
        _mm256_storeu_ps(out + 8, _mm256_mul_ps(d0, _mm256_load_ps(tmp + 8)));
        _mm256_storeu_ps(out + 16, _mm256_mul_ps(d1, _mm256_load_ps(tmp + 16)));
        _mm256_storeu_ps(out + 24, _mm256_mul_ps(d1, _mm256_load_ps(tmp + 24)));
      }
    }
  }
}

}  // namespace troupe::cpu::simd::avx2
