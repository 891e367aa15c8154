// AVX-512 (F/BW/VL/DQ + VNNI) dot products. Compiled with -mavx2 -mfma -mf16c -mavx512f -mavx512bw
// -mavx512vl -mavx512dq -mavx512vnni.
//
//   - f32 / f16: 64 values per iteration in four zmm accumulators, the tail with masked loads.
//   - 32-value block types: the code of dot_blocks_x86.inc, whose byte products go through vpdpbusd (one
//     instruction instead of maddubs + madd) on ymm registers; q4_0 and q4_1, the most common of them and
//     the ones whose decoding costs most per byte, two blocks per zmm register (below).
#include "backends/cpu/simd/x86_common.h"
#include "backends/cpu/simd/x86_kernels.h"

namespace troupe::cpu::simd::avx512 {

namespace ymm {
#include "backends/cpu/simd/dot_blocks_x86.inc"  // q4_0, q4_1, q5_0, q5_1, q8_0 with VNNI
}  // namespace ymm

void vec_dot_q5_0(int64_t n, float* s, const void* x, const void* y) { ymm::vec_dot_q5_0(n, s, x, y); }
void vec_dot_q5_1(int64_t n, float* s, const void* x, const void* y) { ymm::vec_dot_q5_1(n, s, x, y); }
void vec_dot_q8_0(int64_t n, float* s, const void* x, const void* y) { ymm::vec_dot_q8_0(n, s, x, y); }

namespace {

// Blocks i and i + 1 of q4_0 / q4_1 nibbles in one zmm, in value order. The two 16-byte nibble arrays become
// one ymm [qs_i | qs_i+1]; a zmm of that and the same shifted right by 4 holds [lo_i | lo_i+1 | hi_i |
// hi_i+1] after the 0x0F mask, and a 64-bit permute puts it in value order [lo_i | hi_i | lo_i+1 | hi_i+1],
// matching y_i.qs, y_i+1.qs.
inline __m512i nibbles_64(const uint8_t* qs0, const uint8_t* qs1) {
  const __m256i q2 = _mm256_inserti128_si256(_mm256_castsi128_si256(load128(qs0)), load128(qs1), 1);
  __m512i q = _mm512_inserti64x4(_mm512_castsi256_si512(q2), _mm256_srli_epi16(q2, 4), 1);
  q = _mm512_and_si512(q, _mm512_set1_epi8(0x0F));
  return _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 1, 4, 5, 2, 3, 6, 7), q);
}

// The 32 activation quants of blocks i and i + 1 (not contiguous: each block starts with its scale).
template <class BY>
inline __m512i quants_64(const BY& y0, const BY& y1) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(load256(y0.qs)), load256(y1.qs), 1);
}

// f in lanes 0..7, g in lanes 8..15.
inline __m512 halves(float f, float g) { return _mm512_insertf32x8(_mm512_set1_ps(f), _mm256_set1_ps(g), 1); }

// q4_0: the quants are used unsigned (0..15) with vpdpbusd, and 8 * sum(y) (another vpdpbusd, of the
// constant 8) is subtracted: sum (q - 8) y exactly, per block in 8 int32 lanes each.
inline __m512 step2_q4_0(const block_q4_0& x0, const block_q4_0& x1, const block_q8_0& y0, const block_q8_0& y1,
                         __m512 acc) {
  const __m512i q = nibbles_64(x0.qs, x1.qs);
  const __m512i r = quants_64(y0, y1);
  const __m512i eights = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(8), r);
  const __m512i sumi = _mm512_sub_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), q, r), eights);
  const __m512 d = halves(h2f(x0.d) * h2f(y0.d), h2f(x1.d) * h2f(y1.d));
  return _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(sumi), acc);
}

// q4_1 (x = dx q + m) against q8_1 (y = dy r): dx dy sum(q r) + m dy sum(r), sum(r) from the quants (a
// vpdpbusd of the constant 1), as the reference does.
inline void step2_q4_1(const block_q4_1& x0, const block_q4_1& x1, const block_q8_1& y0, const block_q8_1& y1,
                       __m512& acc, __m512& acc_m) {
  const __m512i q = nibbles_64(x0.qs, x1.qs);
  const __m512i r = quants_64(y0, y1);
  const __m512i sum_qr = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q, r);
  const __m512i sum_r = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(1), r);
  const float dy0 = h2f(y0.d), dy1 = h2f(y1.d);
  acc = _mm512_fmadd_ps(halves(h2f(x0.d) * dy0, h2f(x1.d) * dy1), _mm512_cvtepi32_ps(sum_qr), acc);
  acc_m = _mm512_fmadd_ps(halves(h2f(x0.m) * dy0, h2f(x1.m) * dy1), _mm512_cvtepi32_ps(sum_r), acc_m);
}

}  // namespace

void vec_dot_q4_0(int64_t n, float* s, const void* vx, const void* vy) {
  const block_q4_0* x = static_cast<const block_q4_0*>(vx);
  const block_q8_0* y = static_cast<const block_q8_0*>(vy);
  const int64_t nb = n / qk8_0;
  __m512 acc0 = _mm512_setzero_ps();
  __m512 acc1 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 3 < nb; i += 4) {
    acc0 = step2_q4_0(x[i], x[i + 1], y[i], y[i + 1], acc0);
    acc1 = step2_q4_0(x[i + 2], x[i + 3], y[i + 2], y[i + 3], acc1);
  }
  float sum = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
  if (i < nb) {  // up to 3 blocks left
    float rest;
    ymm::vec_dot_q4_0((nb - i) * qk8_0, &rest, x + i, y + i);
    sum += rest;
  }
  *s = sum;
}

void vec_dot_q4_1(int64_t n, float* s, const void* vx, const void* vy) {
  const block_q4_1* x = static_cast<const block_q4_1*>(vx);
  const block_q8_1* y = static_cast<const block_q8_1*>(vy);
  const int64_t nb = n / qk8_1;
  __m512 acc = _mm512_setzero_ps();
  __m512 acc_m = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 1 < nb; i += 2) step2_q4_1(x[i], x[i + 1], y[i], y[i + 1], acc, acc_m);
  float sum = _mm512_reduce_add_ps(_mm512_add_ps(acc, acc_m));
  if (i < nb) {  // an odd block count: the last block
    float rest;
    ymm::vec_dot_q4_1(qk8_1, &rest, x + i, y + i);
    sum += rest;
  }
  *s = sum;
}

// q4_K: each 64-value chunk c in one zmm. The 32 bytes qs[32 c ..] give [low nibbles | high nibbles] =
// values 64 c .. 64 c + 63 in order, against one 64-byte load of y. maddubs -> 32 int16 pair sums; madd with
// scale 2c in the low half and 2c + 1 in the high half (vpermw from the unpacked scales) -> 16 int32.
void vec_dot_q4_K(int64_t n, float* s, const void* vx, const void* vy) {
  const block_q4_K* x = static_cast<const block_q4_K*>(vx);
  const block_q8_K* y = static_cast<const block_q8_K*>(vy);
  const int64_t nb = n / qk_k;
  constexpr uint32_t kmask1 = 0x3f3f3f3f, kmask2 = 0x0f0f0f0f, kmask3 = 0x03030303;
  const __m256i m4 = _mm256_set1_epi8(0xF);
  // vpermw indices: int16 element 2c in lanes 0..15, 2c + 1 in lanes 16..31.
  __m512i scale_idx[4];
  for (int c = 0; c < 4; ++c) {
    scale_idx[c] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16(static_cast<short>(2 * c))),
                                      _mm256_set1_epi16(static_cast<short>(2 * c + 1)), 1);
  }
  __m512 acc = _mm512_setzero_ps();
  __m128 acc_m = _mm_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    const float d = y[i].d * h2f(x[i].d);
    const float dmin = -y[i].d * h2f(x[i].dmin);
    // Scales 0..7 and mins 0..7 as int16 (see k4_scales_mins in dot_avx2_k.cpp).
    uint32_t u[4];
    std::memcpy(u, x[i].scales, 12);
    u[3] = ((u[2] >> 4) & kmask2) | (((u[1] >> 6) & kmask3) << 4);
    const uint32_t mins_lo = u[1] & kmask1;
    u[1] = (u[2] & kmask2) | (((u[0] >> 6) & kmask3) << 4);
    u[2] = mins_lo;
    u[0] &= kmask1;
    const __m256i sm = _mm256_cvtepu8_epi16(
        _mm_set_epi32(static_cast<int>(u[3]), static_cast<int>(u[2]), static_cast<int>(u[1]), static_cast<int>(u[0])));
    const __m256i b = load256(y[i].bsums);
    const __m128i pair_sums = _mm_hadd_epi16(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
    const __m128i mins = _mm_madd_epi16(_mm256_extracti128_si256(sm, 1), pair_sums);
    acc_m = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(mins), acc_m);

    const __m512i scales = _mm512_castsi256_si512(sm);  // int16 0..7: the scales
    __m512i sumi = _mm512_setzero_si512();
    for (int c = 0; c < 4; ++c) {
      const __m256i bits = load256(x[i].qs + 32 * c);
      const __m512i q = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(bits, m4)),
                                           _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4), 1);
      const __m512i p = _mm512_maddubs_epi16(q, _mm512_loadu_si512(y[i].qs + 64 * c));
      sumi = _mm512_add_epi32(sumi, _mm512_madd_epi16(_mm512_permutexvar_epi16(scale_idx[c], scales), p));
    }
    acc = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(sumi), acc);
  }
  __m128 r = _mm_add_ps(acc_m, _mm_movehl_ps(acc_m, acc_m));
  r = _mm_add_ss(r, _mm_movehdup_ps(r));
  *s = _mm512_reduce_add_ps(acc) + _mm_cvtss_f32(r);
}

namespace {

inline __m512 load_f32(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load_f32_tail(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
inline __m512 load_f16(const uint16_t* p) { return _mm512_cvtph_ps(load256(p)); }
inline __m512 load_f16_tail(const uint16_t* p, __mmask16 m) { return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p)); }

template <class T, __m512 (*load)(const T*), __m512 (*load_tail)(const T*, __mmask16)>
float dot_floats(int64_t n, const void* vx, const void* vy) {
  const T* x = static_cast<const T*>(vx);
  const T* y = static_cast<const T*>(vy);
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    for (int j = 0; j < 4; ++j) acc[j] = _mm512_fmadd_ps(load(x + i + 16 * j), load(y + i + 16 * j), acc[j]);
  }
  for (; i + 16 <= n; i += 16) acc[0] = _mm512_fmadd_ps(load(x + i), load(y + i), acc[0]);
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
    acc[1] = _mm512_fmadd_ps(load_tail(x + i, m), load_tail(y + i, m), acc[1]);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
}

}  // namespace

void vec_dot_f32(int64_t n, float* s, const void* x, const void* y) {
  *s = dot_floats<float, load_f32, load_f32_tail>(n, x, y);
}
void vec_dot_f16(int64_t n, float* s, const void* x, const void* y) {
  *s = dot_floats<uint16_t, load_f16, load_f16_tail>(n, x, y);
}

TROUPE_SIMD_ROWS(vec_dot_f32)
TROUPE_SIMD_ROWS(vec_dot_f16)
TROUPE_SIMD_ROWS(vec_dot_q4_0)
TROUPE_SIMD_ROWS(vec_dot_q4_1)
TROUPE_SIMD_ROWS(vec_dot_q5_0)
TROUPE_SIMD_ROWS(vec_dot_q5_1)
TROUPE_SIMD_ROWS(vec_dot_q8_0)
TROUPE_SIMD_ROWS(vec_dot_q4_K)

}  // namespace troupe::cpu::simd::avx512
