// AVX2 + FMA row functions for the elementwise ops that show up next to the matrix products in a
// transformer layer: silu / swiglu (the FFN gate) and the exponentials of soft_max. Compiled with -mavx2
// -mfma -mf16c -ffp-contract=off.
//
// exp8 is Cephes' expf: x = n ln2 + r with |r| <= ln2 / 2 (ln2 split in two constants so r is exact
// enough), e^r by a degree-6 polynomial, 2^n from the exponent bits. Relative error about 2e-7 (1-2 ulp)
// against std::exp; inputs below -87.3 give 0 (std::exp gives a subnormal there) and above 88.37 give
// +inf, NaN stays NaN.
#include <algorithm>

#include "backends/cpu/simd/x86_common.h"
#include "backends/cpu/simd/x86_kernels.h"

namespace troupe::cpu::simd::avx2 {

namespace {

inline __m256 exp8(__m256 x) {
  const __m256 hi = _mm256_set1_ps(88.3762626647949f);
  const __m256 lo = _mm256_set1_ps(-87.3365447505531f);
  const __m256 xc = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), xc);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  const __m256 r2 = _mm256_mul_ps(r, r);
  const __m256 e = _mm256_add_ps(_mm256_fmadd_ps(p, r2, r), _mm256_set1_ps(1.0f));
  // 2^n: n in [-126, 127] here, so n + 127 is a valid biased exponent.
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  __m256 y = _mm256_mul_ps(e, _mm256_castsi256_ps(bits));
  y = _mm256_blendv_ps(y, _mm256_setzero_ps(), _mm256_cmp_ps(x, lo, _CMP_LT_OQ));
  y = _mm256_blendv_ps(y, _mm256_set1_ps(__builtin_inff()), _mm256_cmp_ps(x, hi, _CMP_GT_OQ));
  return _mm256_blendv_ps(y, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));  // NaN in, NaN out
}

// x / (1 + e^-x)
inline __m256 silu8(__m256 x) {
  const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), x));
  return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

// Up to 7 trailing values through the vector code, via a small stack buffer.
template <class F>
void tail(int64_t left, const float* x, const float* g, float* y, F f) {
  alignas(32) float bx[8] = {}, bg[8] = {}, by[8];
  for (int64_t i = 0; i < left; ++i) {
    bx[i] = x[i];
    if (g != nullptr) bg[i] = g[i];
  }
  _mm256_store_ps(by, f(_mm256_load_ps(bx), _mm256_load_ps(bg)));
  for (int64_t i = 0; i < left; ++i) y[i] = by[i];
}

}  // namespace

float exp_row(int64_t n, float* y, float max) {
  const __m256 mv = _mm256_set1_ps(max);
  __m256 sum = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(y + i), mv));
    _mm256_storeu_ps(y + i, e);
    sum = _mm256_add_ps(sum, e);
  }
  float s = hsum(sum);
  if (i < n) {
    alignas(32) float b[8];
    for (int64_t j = 0; j < 8; ++j) b[j] = i + j < n ? y[i + j] - max : -__builtin_inff();  // exp(-inf) = 0
    const __m256 e = exp8(_mm256_load_ps(b));
    _mm256_store_ps(b, e);
    for (int64_t j = 0; i + j < n; ++j) {
      y[i + j] = b[j];
      s += b[j];
    }
  }
  return s;
}

float scale_mask_max(int64_t n, float* y, const float* m, float scale) {
  const __m256 sv = _mm256_set1_ps(scale);
  __m256 lanes = _mm256_set1_ps(-__builtin_inff());
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(y + i), sv), _mm256_loadu_ps(m + i));
    _mm256_storeu_ps(y + i, x);
    lanes = _mm256_max_ps(x, lanes);  // x > lane ? x : lane
  }
  float mx = -__builtin_inff();
  for (; i < n; ++i) {
    const float x = y[i] * scale + m[i];
    y[i] = x;
    if (x > mx) mx = x;
  }
  alignas(32) float l[8];
  _mm256_store_ps(l, lanes);
  for (float v : l) mx = v > mx ? v : mx;
  return mx;
}

namespace {

void lane_add_each(const float* y, int64_t n, float* lanes, unsigned* lane) {
  for (int64_t i = 0; i < n; ++i) {
    if (y[i] != 0.0f) {
      lanes[*lane] += y[i];
      *lane = (*lane + 1) & 15u;
    }
  }
}

}  // namespace

// 16 values none of which is 0 go to lanes lane, lane + 1, ... (mod 16), which leaves lane where it was: with
// the lanes held rotated by lane (r[j] = lanes[(lane + j) % 16]) that is two vector additions. A group with a
// 0 (the masked cells of a causal row's last block) goes one value at a time.
void exp_lane_sum(int64_t n, float* y, float max, float* lanes, unsigned* lane) {
  const __m256 mv = _mm256_set1_ps(max);
  const __m256 zero = _mm256_setzero_ps();
  alignas(32) float rot[16];
  auto rotate = [&] {
    for (unsigned j = 0; j < 16; ++j) rot[j] = lanes[(*lane + j) & 15u];
  };
  auto unrotate = [&] {
    for (unsigned j = 0; j < 16; ++j) lanes[(*lane + j) & 15u] = rot[j];
  };
  rotate();
  __m256 r0 = _mm256_load_ps(rot), r1 = _mm256_load_ps(rot + 8);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 e0 = exp8(_mm256_sub_ps(_mm256_loadu_ps(y + i), mv));
    const __m256 e1 = exp8(_mm256_sub_ps(_mm256_loadu_ps(y + i + 8), mv));
    _mm256_storeu_ps(y + i, e0);
    _mm256_storeu_ps(y + i + 8, e1);
    const __m256 z = _mm256_or_ps(_mm256_cmp_ps(e0, zero, _CMP_EQ_OQ), _mm256_cmp_ps(e1, zero, _CMP_EQ_OQ));
    if (_mm256_movemask_ps(z) == 0) {
      r0 = _mm256_add_ps(r0, e0);
      r1 = _mm256_add_ps(r1, e1);
      continue;
    }
    _mm256_store_ps(rot, r0);
    _mm256_store_ps(rot + 8, r1);
    unrotate();
    lane_add_each(y + i, 16, lanes, lane);
    rotate();
    r0 = _mm256_load_ps(rot);
    r1 = _mm256_load_ps(rot + 8);
  }
  _mm256_store_ps(rot, r0);
  _mm256_store_ps(rot + 8, r1);
  unrotate();
  for (; i < n; i += 8) {  // the tail as exp_row's: through a buffer, the missing values -inf
    const int64_t left = std::min<int64_t>(8, n - i);
    alignas(32) float b[8];
    for (int64_t j = 0; j < 8; ++j) b[j] = j < left ? y[i + j] - max : -__builtin_inff();
    _mm256_store_ps(b, exp8(_mm256_load_ps(b)));
    for (int64_t j = 0; j < left; ++j) y[i + j] = b[j];
    lane_add_each(y + i, left, lanes, lane);
  }
}

void scale_row(int64_t n, float* y, float s) {
  const __m256 sv = _mm256_set1_ps(s);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(y + i), sv));
  for (; i < n; ++i) y[i] *= s;
}

void silu_row(int64_t n, const float* x, float* y) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, silu8(_mm256_loadu_ps(x + i)));
  if (i < n) tail(n - i, x + i, nullptr, y + i, [](__m256 v, __m256) { return silu8(v); });
}

void swiglu_row(int64_t n, const float* x, const float* g, float* y) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(y + i, _mm256_mul_ps(silu8(_mm256_loadu_ps(x + i)), _mm256_loadu_ps(g + i)));
  }
  if (i < n) tail(n - i, x + i, g + i, y + i, [](__m256 v, __m256 w) { return _mm256_mul_ps(silu8(v), w); });
}

}  // namespace troupe::cpu::simd::avx2
