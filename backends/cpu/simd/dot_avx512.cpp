// AVX-512 (F/BW/VL/DQ + VNNI) dot products. Compiled with -mavx2 -mfma -mf16c -mavx512f -mavx512bw
// -mavx512vl -mavx512dq -mavx512vnni.
//
//   - f32 / f16: 64 values per iteration in four zmm accumulators, the tail with masked loads.
//   - 32-value block types: the code of dot_blocks_x86.inc, whose byte products go through vpdpbusd (one
//     instruction instead of maddubs + madd) on ymm registers; q4_0, q4_1 and q8_0, the most common of
//     them, two blocks per zmm register (below).
//   - vec_dot_*_tile: the same dot products against several activation rows at once, each weight block
//     decoded once (dot_tile in x86_common.h), every element bit-identical to the one-row function's.
#include "backends/cpu/simd/x86_common.h"
#include "backends/cpu/simd/x86_kernels.h"

namespace troupe::cpu::simd::avx512 {

namespace ymm {
#include "backends/cpu/simd/dot_blocks_x86.inc"  // q4_0, q4_1, q5_0, q5_1, q8_0 with VNNI
}  // namespace ymm

// q5_0, q5_1: the ymm kernels (with vpdpbusd).
#define TROUPE_SIMD_FORWARD(name)                                                                            \
  void name(int64_t n, float* s, const void* x, const void* y) { ymm::name(n, s, x, y); }                   \
  void name##_rows(int64_t n, int64_t nrows, float* s, const void* x, size_t x_stride, const void* y) {     \
    ymm::name##_rows(n, nrows, s, x, x_stride, y);                                                          \
  }                                                                                                          \
  void name##_tile(int64_t n, int64_t nrows, int64_t ncols, float* s, size_t s_stride, const void* x,       \
                   size_t x_stride, const void* y, size_t y_stride) {                                      \
    ymm::name##_tile(n, nrows, ncols, s, s_stride, x, x_stride, y, y_stride);                               \
  }
TROUPE_SIMD_FORWARD(vec_dot_q5_0)
TROUPE_SIMD_FORWARD(vec_dot_q5_1)
#undef TROUPE_SIMD_FORWARD

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

// The fp16 values at p and q as floats, p's in lanes 0..7 and q's in lanes 8..15: the per-block scales of
// two blocks against their 2 x 8 int32 lanes. (One conversion and a permute; the same floats as two
// scalar conversions and broadcasts.)
inline __m512 halves_f16(const uint16_t* p, const uint16_t* q) {
  uint16_t a, b;
  std::memcpy(&a, p, 2);
  std::memcpy(&b, q, 2);
  const __m128 f = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(a | static_cast<uint32_t>(b) << 16)));
  const __m512i idx = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  return _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(f));
}

// Two fp16 pairs (d, m) at p and q (the start of two q4_1 blocks): d_p, d_q as halves_f16 into d, and
// m_p, m_q into m.
inline void halves_f16x2(const uint16_t* p, const uint16_t* q, __m512& d, __m512& m) {
  uint32_t a, b;
  std::memcpy(&a, p, 4);
  std::memcpy(&b, q, 4);
  const __m128 f = _mm_cvtph_ps(_mm_insert_epi32(_mm_cvtsi32_si128(static_cast<int>(a)), static_cast<int>(b), 1));
  const __m512 f4 = _mm512_castps128_ps512(f);  // d_p, m_p, d_q, m_q
  d = _mm512_permutexvar_ps(_mm512_set_epi32(2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0), f4);
  m = _mm512_permutexvar_ps(_mm512_set_epi32(3, 3, 3, 3, 3, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1), f4);
}

// q4_0 (x = d (q - 8)) against q8_0 (y = dy r): the quants are used unsigned (0..15) with vpdpbusd, whose
// accumulator starts at -8 sum(r) (another vpdpbusd, of the constant 8: activation side): sum (q - 8) r
// exactly, per block in 8 int32 lanes. Four blocks per iteration (two per zmm, two accumulators per pair), up to 3
// blocks left through the ymm kernel. A register tile of MR weight rows x NC activation rows (dot_tile in
// x86_common.h): 2 x MR x NC accumulators of 32 zmm registers.
struct q4_0_tile {
  static constexpr int max_rows = 2;
  template <int MR, int NC>
  static constexpr bool fits = MR == 1 || MR * NC <= 8;

  template <int MR, int NC>
  static void run(int64_t n, const void* const* vx, const void* const* vy, float* out) {
    const block_q4_0* x[MR];
    const block_q8_0* y[NC];
    __m512 acc0[MR][NC], acc1[MR][NC];
    for (int r = 0; r < MR; ++r) x[r] = static_cast<const block_q4_0*>(vx[r]);
    for (int c = 0; c < NC; ++c) y[c] = static_cast<const block_q8_0*>(vy[c]);
    for (int r = 0; r < MR; ++r) {
      for (int c = 0; c < NC; ++c) {
        acc0[r][c] = _mm512_setzero_ps();
        acc1[r][c] = _mm512_setzero_ps();
      }
    }
    const int64_t nb = n / qk8_0;
    int64_t i = 0;
    for (; i + 3 < nb; i += 4) {
      __m512i q0[MR], q1[MR];
      __m512 d0[MR], d1[MR];
      for (int r = 0; r < MR; ++r) {
        q0[r] = nibbles_64(x[r][i].qs, x[r][i + 1].qs);
        q1[r] = nibbles_64(x[r][i + 2].qs, x[r][i + 3].qs);
        d0[r] = halves_f16(&x[r][i].d, &x[r][i + 1].d);
        d1[r] = halves_f16(&x[r][i + 2].d, &x[r][i + 3].d);
      }
      for (int c = 0; c < NC; ++c) {
        const block_q8_0* yc = y[c] + i;
        const __m512i r0 = quants_64(yc[0], yc[1]);
        const __m512i r1 = quants_64(yc[2], yc[3]);
        // -8 sum(r) per lane, the accumulator the byte products of every weight row start from.
        const __m512i e0 = _mm512_sub_epi32(_mm512_setzero_si512(),
                                            _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(8), r0));
        const __m512i e1 = _mm512_sub_epi32(_mm512_setzero_si512(),
                                            _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(8), r1));
        const __m512 dy0 = halves_f16(&yc[0].d, &yc[1].d);
        const __m512 dy1 = halves_f16(&yc[2].d, &yc[3].d);
        for (int r = 0; r < MR; ++r) {
          const __m512i s0 = _mm512_dpbusd_epi32(e0, q0[r], r0);
          const __m512i s1 = _mm512_dpbusd_epi32(e1, q1[r], r1);
          acc0[r][c] = _mm512_fmadd_ps(_mm512_mul_ps(d0[r], dy0), _mm512_cvtepi32_ps(s0), acc0[r][c]);
          acc1[r][c] = _mm512_fmadd_ps(_mm512_mul_ps(d1[r], dy1), _mm512_cvtepi32_ps(s1), acc1[r][c]);
        }
      }
    }
    for (int r = 0; r < MR; ++r) {
      for (int c = 0; c < NC; ++c) out[r * NC + c] = _mm512_reduce_add_ps(_mm512_add_ps(acc0[r][c], acc1[r][c]));
    }
    if (i < nb) {  // up to 3 blocks left
      const void* yt[NC];
      for (int c = 0; c < NC; ++c) yt[c] = y[c] + i;
      for (int r = 0; r < MR; ++r) {
        const void* xt[1] = {x[r] + i};
        float rest[NC];
        ymm::signed_tile<ymm::q4_0_k>::run<1, NC>((nb - i) * qk8_0, xt, yt, rest);
        for (int c = 0; c < NC; ++c) out[r * NC + c] += rest[c];
      }
    }
  }
};

// q4_1 (x = dx q + m) against q8_1 (y = dy r): dx dy sum(q r) + m (dy sum(r)), sum(r) from the quants (a
// vpdpbusd of the constant 1), as the reference does; dy sum(r) is activation side. Two blocks per
// iteration, an odd last block through the ymm kernel; a register tile of MR x NC pairs, 2 accumulators
// each.
struct q4_1_tile {
  static constexpr int max_rows = 2;
  template <int MR, int NC>
  static constexpr bool fits = MR == 1 || MR * NC <= 8;

  template <int MR, int NC>
  static void run(int64_t n, const void* const* vx, const void* const* vy, float* out) {
    const block_q4_1* x[MR];
    const block_q8_1* y[NC];
    __m512 acc[MR][NC], acc_m[MR][NC];
    for (int r = 0; r < MR; ++r) x[r] = static_cast<const block_q4_1*>(vx[r]);
    for (int c = 0; c < NC; ++c) y[c] = static_cast<const block_q8_1*>(vy[c]);
    for (int r = 0; r < MR; ++r) {
      for (int c = 0; c < NC; ++c) {
        acc[r][c] = _mm512_setzero_ps();
        acc_m[r][c] = _mm512_setzero_ps();
      }
    }
    const int64_t nb = n / qk8_1;
    int64_t i = 0;
    for (; i + 1 < nb; i += 2) {
      __m512i q[MR];
      __m512 dx[MR], mx[MR];
      for (int r = 0; r < MR; ++r) {
        q[r] = nibbles_64(x[r][i].qs, x[r][i + 1].qs);
        halves_f16x2(&x[r][i].d, &x[r][i + 1].d, dx[r], mx[r]);
      }
      for (int c = 0; c < NC; ++c) {
        const __m512i rq = quants_64(y[c][i], y[c][i + 1]);
        const __m512i sum_r = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(1), rq);
        const __m512 dy = halves_f16(&y[c][i].d, &y[c][i + 1].d);
        const __m512 dy_sum_r = _mm512_mul_ps(dy, _mm512_cvtepi32_ps(sum_r));
        for (int r = 0; r < MR; ++r) {
          const __m512i sum_qr = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q[r], rq);
          acc[r][c] = _mm512_fmadd_ps(_mm512_mul_ps(dx[r], dy), _mm512_cvtepi32_ps(sum_qr), acc[r][c]);
          acc_m[r][c] = _mm512_fmadd_ps(mx[r], dy_sum_r, acc_m[r][c]);
        }
      }
    }
    for (int r = 0; r < MR; ++r) {
      for (int c = 0; c < NC; ++c) out[r * NC + c] = _mm512_reduce_add_ps(_mm512_add_ps(acc[r][c], acc_m[r][c]));
    }
    if (i < nb) {  // an odd block count: the last block
      const void* yt[NC];
      for (int c = 0; c < NC; ++c) yt[c] = y[c] + i;
      for (int r = 0; r < MR; ++r) {
        const void* xt[1] = {x[r] + i};
        float rest[NC];
        ymm::unsigned_tile<ymm::q4_1_k>::run<1, NC>(qk8_1, xt, yt, rest);
        for (int c = 0; c < NC; ++c) out[r * NC + c] += rest[c];
      }
    }
  }
};

// q8_0 against q8_0: two blocks per zmm. The weight quants are made unsigned by adding 128 (an xor of the
// sign bit) for vpdpbusd, whose accumulator starts at -128 sum(r) (a vpdpbusd of the constant 128:
// activation side): sum q r exactly, per block in 8 int32 lanes. An odd last block through the ymm kernel.
// A register tile of up to 4 weight rows x 4 activation rows, one accumulator per pair (the pairs are
// independent chains).
struct q8_0_tile {
  static constexpr int max_rows = 4;
  template <int MR, int NC>
  static constexpr bool fits = MR * NC <= 16;

  template <int MR, int NC>
  static void run(int64_t n, const void* const* vx, const void* const* vy, float* out) {
    const block_q8_0* x[MR];
    const block_q8_0* y[NC];
    __m512 acc[MR][NC];
    for (int r = 0; r < MR; ++r) x[r] = static_cast<const block_q8_0*>(vx[r]);
    for (int c = 0; c < NC; ++c) y[c] = static_cast<const block_q8_0*>(vy[c]);
    for (int r = 0; r < MR; ++r) {
      for (int c = 0; c < NC; ++c) acc[r][c] = _mm512_setzero_ps();
    }
    const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80));
    const int64_t nb = n / qk8_0;
    int64_t i = 0;
    for (; i + 1 < nb; i += 2) {
      __m512i u[MR];
      __m512 dx[MR];
      for (int r = 0; r < MR; ++r) {
        u[r] = _mm512_xor_si512(quants_64(x[r][i], x[r][i + 1]), bias);
        dx[r] = halves_f16(&x[r][i].d, &x[r][i + 1].d);
      }
      for (int c = 0; c < NC; ++c) {
        const __m512i rq = quants_64(y[c][i], y[c][i + 1]);
        const __m512i e =
            _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), bias, rq));
        const __m512 dy = halves_f16(&y[c][i].d, &y[c][i + 1].d);
        for (int r = 0; r < MR; ++r) {
          const __m512i sumi = _mm512_dpbusd_epi32(e, u[r], rq);
          acc[r][c] = _mm512_fmadd_ps(_mm512_mul_ps(dx[r], dy), _mm512_cvtepi32_ps(sumi), acc[r][c]);
        }
      }
    }
    for (int r = 0; r < MR; ++r) {
      for (int c = 0; c < NC; ++c) out[r * NC + c] = _mm512_reduce_add_ps(acc[r][c]);
    }
    if (i < nb) {  // an odd block count: the last block
      const void* yt[NC];
      for (int c = 0; c < NC; ++c) yt[c] = y[c] + i;
      for (int r = 0; r < MR; ++r) {
        const void* xt[1] = {x[r] + i};
        float rest[NC];
        ymm::signed_tile<ymm::q8_0_k>::run<1, NC>(qk8_0, xt, yt, rest);
        for (int c = 0; c < NC; ++c) out[r * NC + c] += rest[c];
      }
    }
  }
};

// q4_K: each 64-value chunk k in one zmm. The 32 bytes qs[32 k ..] give [low nibbles | high nibbles] =
// values 64 k .. 64 k + 63 in order, against one 64-byte load of y. maddubs -> 32 int16 pair sums; madd with
// scale 2k in the low half and 2k + 1 in the high half (vpermw from the unpacked scales) -> 16 int32. NC
// activation rows at once, each chunk decoded once.
struct q4_K_tile {
  static constexpr int max_rows = 1;
  template <int MR, int NC>
  static constexpr bool fits = MR == 1;

  template <int MR, int NC>
  static void run(int64_t n, const void* const* vx, const void* const* vy, float* out) {
    static_assert(MR == 1);
    const block_q4_K* x = static_cast<const block_q4_K*>(vx[0]);
    const block_q8_K* y[NC];
    __m512 acc[NC];
    __m128 acc_m[NC];
    for (int c = 0; c < NC; ++c) {
      y[c] = static_cast<const block_q8_K*>(vy[c]);
      acc[c] = _mm512_setzero_ps();
      acc_m[c] = _mm_setzero_ps();
    }
    const int64_t nb = n / qk_k;
    constexpr uint32_t kmask1 = 0x3f3f3f3f, kmask2 = 0x0f0f0f0f, kmask3 = 0x03030303;
    const __m256i m4 = _mm256_set1_epi8(0xF);
    // vpermw indices: int16 element 2k in lanes 0..15, 2k + 1 in lanes 16..31.
    __m512i scale_idx[4];
    for (int k = 0; k < 4; ++k) {
      scale_idx[k] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16(static_cast<short>(2 * k))),
                                        _mm256_set1_epi16(static_cast<short>(2 * k + 1)), 1);
    }
    for (int64_t i = 0; i < nb; ++i) {
      const float xd = h2f(x[i].d);
      const float xdmin = h2f(x[i].dmin);
      // Scales 0..7 and mins 0..7 as int16 (see k4_scales_mins in dot_avx2_k.cpp).
      uint32_t u[4];
      std::memcpy(u, x[i].scales, 12);
      u[3] = ((u[2] >> 4) & kmask2) | (((u[1] >> 6) & kmask3) << 4);
      const uint32_t mins_lo = u[1] & kmask1;
      u[1] = (u[2] & kmask2) | (((u[0] >> 6) & kmask3) << 4);
      u[2] = mins_lo;
      u[0] &= kmask1;
      const __m256i sm = _mm256_cvtepu8_epi16(_mm_set_epi32(static_cast<int>(u[3]), static_cast<int>(u[2]),
                                                            static_cast<int>(u[1]), static_cast<int>(u[0])));
      const __m128i mins16 = _mm256_extracti128_si256(sm, 1);
      for (int c = 0; c < NC; ++c) {
        const float dmin = -y[c][i].d * xdmin;
        const __m256i b = load256(y[c][i].bsums);
        const __m128i pair_sums = _mm_hadd_epi16(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
        const __m128i mins = _mm_madd_epi16(mins16, pair_sums);
        acc_m[c] = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(mins), acc_m[c]);
      }
      const __m512i scales = _mm512_castsi256_si512(sm);  // int16 0..7: the scales
      __m512i sumi[NC];
      for (int c = 0; c < NC; ++c) sumi[c] = _mm512_setzero_si512();
      for (int k = 0; k < 4; ++k) {
        const __m256i bits = load256(x[i].qs + 32 * k);
        const __m512i q = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(bits, m4)),
                                             _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4), 1);
        const __m512i sc = _mm512_permutexvar_epi16(scale_idx[k], scales);
        for (int c = 0; c < NC; ++c) {
          const __m512i p = _mm512_maddubs_epi16(q, _mm512_loadu_si512(y[c][i].qs + 64 * k));
          sumi[c] = _mm512_add_epi32(sumi[c], _mm512_madd_epi16(sc, p));
        }
      }
      for (int c = 0; c < NC; ++c) {
        const float d = y[c][i].d * xd;
        acc[c] = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(sumi[c]), acc[c]);
      }
    }
    for (int c = 0; c < NC; ++c) {
      __m128 r = _mm_add_ps(acc_m[c], _mm_movehl_ps(acc_m[c], acc_m[c]));
      r = _mm_add_ss(r, _mm_movehdup_ps(r));
      out[c] = _mm512_reduce_add_ps(acc[c]) + _mm_cvtss_f32(r);
    }
  }
};

}  // namespace

TROUPE_SIMD_TILE(vec_dot_q4_0, q4_0_tile)
TROUPE_SIMD_TILE(vec_dot_q4_1, q4_1_tile)
TROUPE_SIMD_TILE(vec_dot_q8_0, q8_0_tile)
TROUPE_SIMD_TILE(vec_dot_q4_K, q4_K_tile)

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

}  // namespace troupe::cpu::simd::avx512
