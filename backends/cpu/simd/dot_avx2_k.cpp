// AVX2 + FMA + F16C dot products of the K-quants (q2_K ... q6_K), iq4_xs and iq3_s against q8_K activations. Compiled with
// -mavx2 -mfma -mf16c only.
//
// Common scheme (ggml's): 32 weight quants in a register, as unsigned bytes, against 32 activation bytes
// with maddubs -> 16 int16 pair sums; madd of those with the sub-block scales (int16, broadcast by a byte
// shuffle) -> 8 int32, summed exactly over the super-block; then one float FMA per super-block with
// d(x) * d(y). Signed quants are made unsigned by an offset whose contribution (offset * sum of y, per
// sub-block) is subtracted in int16 (q3_K) or taken from y's bsums (q6_K, and the mins of q2_K / q4_K /
// q5_K).
//
// Value v of a q2_K / q3_K / q6_K super-block lies in sub-block v / 16. With v = 128 h + 32 k + l, a
// register holding the 32 values of (h, k) spans sub-blocks 8 h + 2 k (its low 128-bit lane, l < 16) and
// 8 h + 2 k + 1 (its high lane): k16_shuffle puts exactly those two scales in the two lanes.
#include <type_traits>

#include "backends/cpu/simd/x86_common.h"
#include "backends/cpu/simd/x86_kernels.h"

namespace troupe::cpu::simd::avx2 {

namespace {


// 16 6-bit q3_K scales, minus 32, as 16 signed bytes (see q3_K_scale in runtime/quants.h).
inline __m128i q3_K_scales(const uint8_t packed[12]) {
  constexpr uint32_t kmask1 = 0x03030303, kmask2 = 0x0f0f0f0f;
  uint32_t a[3];
  std::memcpy(a, packed, 12);
  const __m128i s = _mm_set_epi32(static_cast<int>(((a[1] >> 4) & kmask2) | (((a[2] >> 6) & kmask1) << 4)),
                                  static_cast<int>(((a[0] >> 4) & kmask2) | (((a[2] >> 4) & kmask1) << 4)),
                                  static_cast<int>((a[1] & kmask2) | (((a[2] >> 2) & kmask1) << 4)),
                                  static_cast<int>((a[0] & kmask2) | (((a[2] >> 0) & kmask1) << 4)));
  return _mm_sub_epi8(s, _mm_set1_epi8(32));
}

}  // namespace

void vec_dot_q2_K(int64_t n, float* s, const void* vx, const void* vy) {
  const block_q2_K* x = static_cast<const block_q2_K*>(vx);
  const block_q8_K* y = static_cast<const block_q8_K*>(vy);
  const int64_t nb = n / qk_k;
  const __m256i m3 = _mm256_set1_epi8(3);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    const float d = y[i].d * h2f(x[i].d);
    const float dmin = -y[i].d * h2f(x[i].dmin);
    const __m128i packed = load128(x[i].scales);  // low nibble: scale, high nibble: min
    const __m128i scales8 = _mm_and_si128(packed, _mm_set1_epi8(0xF));
    const __m128i mins8 = _mm_and_si128(_mm_srli_epi16(packed, 4), _mm_set1_epi8(0xF));
    const __m256i mins = _mm256_cvtepi8_epi16(mins8);
    const __m256i prod = _mm256_madd_epi16(mins, load256(y[i].bsums));  // sum_j m_j sum(r over sub-block j)
    acc = _mm256_fmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(prod), acc);

    const __m256i all_scales = _mm256_cvtepi8_epi16(scales8);
    const __m256i half_scales[2] = {_mm256_permute2x128_si256(all_scales, all_scales, 0x00),
                                    _mm256_permute2x128_si256(all_scales, all_scales, 0x11)};
    __m256i sumi = _mm256_setzero_si256();
    for (int h = 0; h < 2; ++h) {
      const __m256i bits = load256(x[i].qs + 32 * h);
      for (int k = 0; k < 4; ++k) {
        const __m256i q = _mm256_and_si256(_mm256_srli_epi16(bits, 2 * k), m3);
        const __m256i p = _mm256_maddubs_epi16(q, load256(y[i].qs + 128 * h + 32 * k));
        sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(_mm256_shuffle_epi8(half_scales[h], k16_shuffle(k)), p));
      }
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
  }
  *s = hsum(acc);
}

void vec_dot_q3_K(int64_t n, float* s, const void* vx, const void* vy) {
  const block_q3_K* x = static_cast<const block_q3_K*>(vx);
  const block_q8_K* y = static_cast<const block_q8_K*>(vy);
  const int64_t nb = n / qk_k;
  const __m256i m3 = _mm256_set1_epi8(3);
  const __m256i one = _mm256_set1_epi8(1);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    const float d = y[i].d * h2f(x[i].d);
    const __m256i all_scales = _mm256_cvtepi8_epi16(q3_K_scales(x[i].scales));
    const __m256i half_scales[2] = {_mm256_permute2x128_si256(all_scales, all_scales, 0x00),
                                    _mm256_permute2x128_si256(all_scales, all_scales, 0x11)};
    // hmask bit (4 h + k) of byte l is the high bit of value 128 h + 32 k + l: q = lo - 4 where it is clear.
    const __m256i hbits = load256(x[i].hmask);
    __m256i sumi = _mm256_setzero_si256();
    for (int h = 0; h < 2; ++h) {
      const __m256i bits = load256(x[i].qs + 32 * h);
      for (int k = 0; k < 4; ++k) {
        const int bit = 4 * h + k;
        const __m256i lo = _mm256_and_si256(_mm256_srli_epi16(bits, 2 * k), m3);
        // 4 where the bit is clear, 0 where set (the shifts stay inside each byte: the mask isolates one bit).
        const __m256i clear =
            _mm256_slli_epi16(_mm256_srli_epi16(_mm256_andnot_si256(hbits, _mm256_slli_epi16(one, bit)), bit), 2);
        const __m256i r = load256(y[i].qs + 128 * h + 32 * k);
        const __m256i p = _mm256_sub_epi16(_mm256_maddubs_epi16(lo, r), _mm256_maddubs_epi16(clear, r));
        sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(_mm256_shuffle_epi8(half_scales[h], k16_shuffle(k)), p));
      }
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
  }
  *s = hsum(acc);
}

namespace {

// q4_K and q5_K: chunk c (64 values) = sub-blocks 2c (low nibbles of qs[32 c ..]) and 2c + 1 (high
// nibbles); q5_K adds bit 4 from bits 2c / 2c + 1 of qh[l]. NC activation rows at once (dot_tile in
// x86_common.h): each chunk's quants and scales are decoded once and used for every row.
template <bool five>
struct k4_tile {

  template <int NC>
  static void run(int64_t n, const void* vx, const void* const* vy, float* out) {
    using block = std::conditional_t<five, block_q5_K, block_q4_K>;
    const block* x = static_cast<const block*>(vx);
    const block_q8_K* y[NC];
    __m256 acc[NC];
    for (int c = 0; c < NC; ++c) {
      y[c] = static_cast<const block_q8_K*>(vy[c]);
      acc[c] = _mm256_setzero_ps();
    }
    const int64_t nb = n / qk_k;
    const __m256i m4 = _mm256_set1_epi8(0xF);
    for (int64_t i = 0; i < nb; ++i) {
      stream_ahead<sizeof(x[i])>(x + i);
      const float xd = h2f(x[i].d);
      const float xdmin = h2f(x[i].dmin);
      const __m256i sm = k4_scales_mins(x[i].scales);
      // The mins: min j in both int16 halves of int32 lane j, one madd against the 16 bsums -> min j times
      // y's sum over sub-block j, into the row's accumulator with the block's dmin (below).
      const __m256i mins32 = _mm256_cvtepu16_epi32(_mm256_extracti128_si256(sm, 1));
      const __m256i mins_twice = _mm256_or_si256(mins32, _mm256_slli_epi32(mins32, 16));
      const __m256i scales = _mm256_permute2x128_si256(sm, sm, 0x00);  // scales 0..7 in both lanes
      __m256i hbits = _mm256_setzero_si256();
      if constexpr (five) hbits = load256(x[i].qh);
      __m256i sumi[NC];
      for (int c = 0; c < NC; ++c) sumi[c] = _mm256_setzero_si256();
      for (int k = 0; k < 4; ++k) {
        const __m256i bits = load256(x[i].qs + 32 * k);
        __m256i q_lo = _mm256_and_si256(bits, m4);
        __m256i q_hi = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
        if constexpr (five) {
          // bit 2k (2k + 1) of each qh byte to bit 4 of the byte, within the byte.
          const __m256i one = _mm256_set1_epi8(1);
          q_lo = _mm256_or_si256(q_lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hbits, 2 * k), one), 4));
          q_hi =
              _mm256_or_si256(q_hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hbits, 2 * k + 1), one), 4));
        }
        const __m256i s_lo = _mm256_shuffle_epi8(scales, k4_shuffle(2 * k));
        const __m256i s_hi = _mm256_shuffle_epi8(scales, k4_shuffle(2 * k + 1));
        for (int c = 0; c < NC; ++c) {
          const __m256i p_lo = _mm256_maddubs_epi16(q_lo, load256(y[c][i].qs + 64 * k));
          const __m256i p_hi = _mm256_maddubs_epi16(q_hi, load256(y[c][i].qs + 64 * k + 32));
          sumi[c] = _mm256_add_epi32(sumi[c], _mm256_madd_epi16(s_lo, p_lo));
          sumi[c] = _mm256_add_epi32(sumi[c], _mm256_madd_epi16(s_hi, p_hi));
        }
      }
      for (int c = 0; c < NC; ++c) {
        const float d = y[c][i].d * xd;
        const float dmin = -y[c][i].d * xdmin;
        const __m256 mins = _mm256_cvtepi32_ps(_mm256_madd_epi16(mins_twice, load256(y[c][i].bsums)));
        acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi[c]), acc[c]);
        acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(dmin), mins, acc[c]);
      }
    }
    for (int c = 0; c < NC; ++c) out[c] = hsum(acc[c]);
  }
};

// iq4_xs against q8_K: per sub-block of 32 values (laid out as an iq4_nl block), the nibbles index the
// codebook; byte products by the sign trick (|q| unsigned against r with q's sign) -> 16 int16 pair sums
// (at most 2 * 127 * 127), madd with the sub-block's scale ls - 32 -> 8 int32, summed exactly over the
// super-block; then one FMA per super-block with d(x) d(y).
struct iq4_xs_tile {
  // iq4_xs_scale of runtime/quants_iq.h, kept here: an inline function of that header compiled with this
  // file's flags could be the copy the linker keeps for every caller.
  static int scale(const block_iq4_xs& b, int j) {
    return ((b.scales_l[j / 2] >> (4 * (j % 2))) & 0xF) | (((b.scales_h >> (2 * j)) & 3) << 4);
  }

  template <int NC>
  static void run(int64_t n, const void* vx, const void* const* vy, float* out) {
    const block_iq4_xs* x = static_cast<const block_iq4_xs*>(vx);
    const block_q8_K* y[NC];
    __m256 acc[NC];
    for (int c = 0; c < NC; ++c) {
      y[c] = static_cast<const block_q8_K*>(vy[c]);
      acc[c] = _mm256_setzero_ps();
    }
    const __m256i codebook = iq4_codebook();
    for (int64_t i = 0; i < n / qk_k; ++i) {
      stream_ahead<sizeof(block_iq4_xs)>(x + i);
      __m256i sumi[NC];
      for (int c = 0; c < NC; ++c) sumi[c] = _mm256_setzero_si256();
      for (int j = 0; j < qk_k / 32; ++j) {
        const __m256i q = _mm256_shuffle_epi8(codebook, nibbles_32(x[i].qs + 16 * j));
        const __m256i abs_q = _mm256_sign_epi8(q, q);
        const __m256i sc = _mm256_set1_epi16(static_cast<int16_t>(scale(x[i], j) - 32));
        for (int c = 0; c < NC; ++c) {
          const __m256i p = _mm256_maddubs_epi16(abs_q, _mm256_sign_epi8(load256(y[c][i].qs + 32 * j), q));
          sumi[c] = _mm256_add_epi32(sumi[c], _mm256_madd_epi16(sc, p));
        }
      }
      const float xd = h2f(x[i].d);
      for (int c = 0; c < NC; ++c) {
        acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(y[c][i].d * xd), _mm256_cvtepi32_ps(sumi[c]), acc[c]);
      }
    }
    for (int c = 0; c < NC; ++c) out[c] = hsum(acc[c]);
  }
};

// iq3_s against q8_K: per sub-block of 32 values, its 8 grid rows (4 unsigned values each, 9-bit indices from
// qs and one qh bit) gathered into a register; the 32 explicit sign bits become a byte mask (each value's
// sign byte picked by a shuffle, its bit by an AND and compare) applied to the activations; maddubs ->
// 16 int16 pair sums (at most 2 * 15 * 127), madd with the sub-block's odd scale 2 s + 1 -> 8 int32, summed
// exactly over the super-block; then one FMA per super-block with d(x) d(y). The activations never hold
// -128 (troupe's q8_K maps its largest magnitude to 127), so negating them is exact.
struct iq3_s_tile {
  template <int NC>
  static void run(int64_t n, const void* vx, const void* const* vy, float* out) {
    const block_iq3_s* x = static_cast<const block_iq3_s*>(vx);
    const block_q8_K* y[NC];
    __m256 acc[NC];
    for (int c = 0; c < NC; ++c) {
      y[c] = static_cast<const block_q8_K*>(vy[c]);
      acc[c] = _mm256_setzero_ps();
    }
    // Byte v of a sub-block takes sign byte v / 8 and tests bit v % 8.
    const __m256i pick = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ull));
    for (int64_t i = 0; i < n / qk_k; ++i) {
      stream_ahead<sizeof(block_iq3_s)>(x + i);
      __m256i sumi[NC];
      for (int c = 0; c < NC; ++c) sumi[c] = _mm256_setzero_si256();
      for (int j = 0; j < qk_k / 32; ++j) {
        const uint8_t* qs = x[i].qs + 8 * j;
        const int qh = x[i].qh[j];
        uint32_t rows[8];
        for (int e = 0; e < 8; ++e) std::memcpy(&rows[e], iq_grids::iq3s[qs[e] | (((qh >> e) & 1) << 8)], 4);
        const __m256i q = load256(rows);
        uint32_t sw;
        std::memcpy(&sw, x[i].signs + 4 * j, 4);
        const __m256i sb = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(sw)), pick), bit);
        const __m256i neg = _mm256_cmpeq_epi8(sb, bit);  // 0xFF where the value is negative
        const __m256i sc = _mm256_set1_epi16(static_cast<int16_t>(2 * ((x[i].scales[j / 2] >> (4 * (j % 2))) & 0xF) + 1));
        for (int c = 0; c < NC; ++c) {
          const __m256i yv = load256(y[c][i].qs + 32 * j);
          const __m256i ys = _mm256_sub_epi8(_mm256_xor_si256(yv, neg), neg);
          sumi[c] = _mm256_add_epi32(sumi[c], _mm256_madd_epi16(sc, _mm256_maddubs_epi16(q, ys)));
        }
      }
      const float xd = h2f(x[i].d);
      for (int c = 0; c < NC; ++c) {
        acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(y[c][i].d * xd), _mm256_cvtepi32_ps(sumi[c]), acc[c]);
      }
    }
    for (int c = 0; c < NC; ++c) out[c] = hsum(acc[c]);
  }
};

}  // namespace

TROUPE_SIMD_TILE(vec_dot_iq3_s, iq3_s_tile)
TROUPE_SIMD_TILE(vec_dot_iq4_xs, iq4_xs_tile)
TROUPE_SIMD_TILE(vec_dot_q5_K, k4_tile<true>)

TROUPE_SIMD_ROWS(vec_dot_q2_K)
TROUPE_SIMD_ROWS(vec_dot_q3_K)

}  // namespace troupe::cpu::simd::avx2
