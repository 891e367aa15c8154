// AVX-512 (F/BW/VL/DQ + VNNI) dot products of the K-quants q4_K and q6_K against q8_K: each 64-value chunk
// in one zmm, vec_dot, vec_dot_rows and tiles of several activation rows (each block decoded once, every
// element bit-identical to the one-row function's). The other K-quants keep their AVX2 kernels.
// Compiled with -mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni
// (troupe_avx512_flags in backends/cpu/CMakeLists.txt), like the other dot_avx512*.cpp files.
//
// Separate from dot_avx512.cpp (the 32-value block types): these kernels share none of its pair helpers,
// only the horizontal sums of avx512_reduce.h.
#include "backends/cpu/simd/avx512_reduce.h"
#include "backends/cpu/simd/x86_common.h"
#include "backends/cpu/simd/x86_kernels.h"

namespace troupe::cpu::simd::avx512 {

namespace {

// q4_K: each 64-value chunk k in one zmm. The 32 bytes qs[32 k ..] give [low nibbles | high nibbles] =
// values 64 k .. 64 k + 63 in order, against one 64-byte load of y. maddubs -> 32 int16 pair sums; madd with
// scale 2k in the low half and 2k + 1 in the high half (vpermw from the unpacked scales) -> 16 int32. The
// mins: min j times y's sums over sub-block j (bsums 2j and 2j + 1) as one madd of each min twice against
// the 16 bsums -> 8 int32. Both go into one accumulator per activation row (the block's d and dmin apart),
// so a tile of up to 8 activation rows fits the registers: each block's scales and chunks are decoded once
// for all of them (per 4 rows the decoding cost as much as the products).
struct q4_K_tile {
  static constexpr int max_cols = 8;

  template <int NC>
  static void run(int64_t n, const void* vx, const void* const* vy, float* out) {
    const block_q4_K* x = static_cast<const block_q4_K*>(vx);
    const block_q8_K* y[NC];
    __m512 acc[NC];
    for (int c = 0; c < NC; ++c) {
      y[c] = static_cast<const block_q8_K*>(vy[c]);
      acc[c] = _mm512_setzero_ps();
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
      // min j in both int16 halves of int32 lane j.
      const __m256i mins32 = _mm256_cvtepu16_epi32(_mm256_extracti128_si256(sm, 1));
      const __m256i mins_twice = _mm256_or_si256(mins32, _mm256_slli_epi32(mins32, 16));
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
          sumi[c] = _mm512_dpwssd_epi32(sumi[c], sc, p);
        }
      }
      for (int c = 0; c < NC; ++c) {
        const float d = y[c][i].d * xd;
        const float dmin = -y[c][i].d * xdmin;
        const __m256 mins = _mm256_cvtepi32_ps(_mm256_madd_epi16(mins_twice, load256(y[c][i].bsums)));
        acc[c] = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(sumi[c]), acc[c]);
        acc[c] = _mm512_fmadd_ps(_mm512_set1_ps(dmin), _mm512_zextps256_ps512(mins), acc[c]);
      }
    }
    reduce_add_n<NC>(acc, out);
  }
};

// q6_K: each 64-value chunk k (values 64 k .. 64 k + 63) in one zmm. In half h = k / 2 of a block the 64
// bytes ql[64 h ..] hold values 128 h + 0..63 in their low nibbles and 128 h + 64..127 in their high
// nibbles; qh[32 h + l] holds the two high bits of value 128 h + 32 j + l in bits 2 j. maddubs of the
// unsigned 6-bit values against one 64-byte load of y -> 32 int16 pair sums; madd with the scale of each
// 16 values (vpermw of the 16 int16 scales) -> 16 int32; the -32 of every value as 32 sum_j scale_j
// bsum_j (y's sums over its 16-value groups), as the AVX2 kernel does. NC activation rows at once.
struct q6_K_tile {
  static constexpr int max_cols = 8;

  template <int NC>
  static void run(int64_t n, const void* vx, const void* const* vy, float* out) {
    const block_q6_K* x = static_cast<const block_q6_K*>(vx);
    const block_q8_K* y[NC];
    __m512 acc[NC];
    for (int c = 0; c < NC; ++c) {
      y[c] = static_cast<const block_q8_K*>(vy[c]);
      acc[c] = _mm512_setzero_ps();
    }
    const int64_t nb = n / qk_k;
    const __m512i m4 = _mm512_set1_epi8(0xF);
    const __m512i m2 = _mm512_set1_epi8(3);
    // vpermw indices of chunk k: int16 lane L (bytes 2L, 2L + 1, values 64 k + 2L ..) takes scale 4k + L / 8.
    __m512i scale_idx[4];
    for (int k = 0; k < 4; ++k) {
      alignas(64) int32_t idx[16];
      for (int m = 0; m < 16; ++m) idx[m] = (4 * k + m / 4) * 0x10001;
      scale_idx[k] = _mm512_load_si512(idx);
    }
    for (int64_t i = 0; i < nb; ++i) {
      stream_ahead<sizeof(x[i])>(x + i);
      const float xd = h2f(x[i].d);
      const __m256i scales16 = _mm256_cvtepi8_epi16(load128(x[i].scales));
      const __m512i scales = _mm512_castsi256_si512(scales16);
      __m512i sumi[NC];
      for (int c = 0; c < NC; ++c) sumi[c] = _mm512_setzero_si512();
      for (int h = 0; h < 2; ++h) {
        const __m512i ql = _mm512_loadu_si512(x[i].ql + 64 * h);
        const __m256i qh = load256(x[i].qh + 32 * h);
        const __m512i qh01 = _mm512_inserti64x4(_mm512_castsi256_si512(qh), _mm256_srli_epi16(qh, 2), 1);
        const __m512i q[2] = {
            _mm512_or_si512(_mm512_and_si512(ql, m4), _mm512_slli_epi16(_mm512_and_si512(qh01, m2), 4)),
            _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4),
                            _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(qh01, 4), m2), 4)),
        };
        for (int j = 0; j < 2; ++j) {
          const int k = 2 * h + j;
          const __m512i sc = _mm512_permutexvar_epi16(scale_idx[k], scales);
          for (int c = 0; c < NC; ++c) {
            const __m512i p = _mm512_maddubs_epi16(q[j], _mm512_loadu_si512(y[c][i].qs + 64 * k));
            sumi[c] = _mm512_dpwssd_epi32(sumi[c], sc, p);
          }
        }
      }
      for (int c = 0; c < NC; ++c) {
        const __m256i offset = _mm256_slli_epi32(_mm256_madd_epi16(scales16, load256(y[c][i].bsums)), 5);
        sumi[c] = _mm512_sub_epi32(sumi[c], _mm512_zextsi256_si512(offset));
        const float d = y[c][i].d * xd;
        acc[c] = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(sumi[c]), acc[c]);
      }
    }
    reduce_add_n<NC>(acc, out);
  }
};

}  // namespace

TROUPE_SIMD_TILE(vec_dot_q4_K, q4_K_tile)
TROUPE_SIMD_TILE(vec_dot_q6_K, q6_K_tile)

}  // namespace troupe::cpu::simd::avx512
