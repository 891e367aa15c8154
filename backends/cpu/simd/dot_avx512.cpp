// AVX-512 (F/BW/VL/DQ + VNNI) dot products of the 32-value block types (q4_0, q4_1, q5_0, q5_1; q8_0's are
// in q8_0_x86.inc):
// two blocks per zmm register, byte products through vpdpbusd; vec_dot, vec_dot_rows, the tiles on
// q8_0 / q8_1 blocks (several activation rows at once, each weight block decoded once, every element
// bit-identical to the one-row function's) and the tiles on prepared activation rows.
// Compiled with -mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni
// (troupe_avx512_flags in backends/cpu/CMakeLists.txt), like the other dot_avx512*.cpp files.
//
// The other AVX-512 kernels are in gemm_avx512.cpp (q8_0, q4_K, q6_K) and dot_avx512_float.cpp (f32, f16 and
// the column products); the horizontal sums of this file's and that one's tiles are in avx512_reduce.h.
#include <algorithm>
#include <array>
#include <type_traits>
#include <utility>

#include "backends/cpu/simd/avx512_reduce.h"
#include "backends/cpu/simd/x86_common.h"
#include "backends/cpu/simd/x86_kernels.h"

namespace troupe::cpu::simd::avx512 {

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

// fp16 a in lanes 0..7 and b in lanes 8..15, as floats: the scales of two blocks against their 2 x 8 int32
// lanes (one conversion and a permute; the same floats as two scalar conversions and broadcasts).
inline __m512 halves_f16(uint16_t a, uint16_t b) {
  const __m128 f = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(a | static_cast<uint32_t>(b) << 16)));
  const __m512i idx = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  return _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(f));
}

// Two fp16 pairs (d, m) a and b (the first 4 bytes of two q4_1 blocks): d_a, d_b as halves into d, m_a,
// m_b into m.
inline void halves_f16x2(uint32_t a, uint32_t b, __m512& d, __m512& m) {
  const __m128 f = _mm_cvtph_ps(_mm_insert_epi32(_mm_cvtsi32_si128(static_cast<int>(a)), static_cast<int>(b), 1));
  const __m512 f4 = _mm512_castps128_ps512(f);  // d_a, m_a, d_b, m_b
  d = _mm512_permutexvar_ps(_mm512_set_epi32(2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0), f4);
  m = _mm512_permutexvar_ps(_mm512_set_epi32(3, 3, 3, 3, 3, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1), f4);
}

inline uint16_t u16(const uint16_t& h) { return h; }
inline uint32_t u32_at(const void* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// ---- q4_0, q4_1, q5_0, q5_1: pairs of blocks per zmm, and prepared activations ------------------------------
//
// These kernels work on pairs of blocks (64 values, two per zmm; an odd last block is a pair whose second
// half is zero, so it adds exactly nothing). Per pair, the activation side, act_i / act_f below (its 64
// quants, the two scales as halves, and one term per lane that depends only on the activations), comes
// either from the q8_0 / q8_1 blocks (computed as it goes) or from a row prepared once (tile_prepare_*:
// vec_dot_*_prepared_tile reads it with three loads instead of recomputing it for every weight row, at the
// price of 192 bytes per 64 activations instead of 68 to 72, which must stay in L1 to pay). Both compute
// the same registers with the same operations, so every tile's elements equal vec_dot's bit for bit.
//
// One weight row per tile: on the development machine, two or more weight rows streamed from memory side
// by side read at a fraction of one row's speed (31 GB/s for one stream, 19 for two interleaved, 13 for
// four, in a plain read loop; software prefetch did not help), so tiles span activation rows only.

// One pair of prepared activation blocks: 64 quants, scales (16 lanes), the activation-side term.
struct prepared_pair {
  int8_t q[64];
  float d[16];
  uint8_t t[64];  // int32 x 16 (q4_0, q5_0) or float x 16 (q4_1, q5_1)
};
static_assert(sizeof(prepared_pair) == 192, "a prepared pair is three zmm");

size_t prepared_row_size(int64_t n) { return static_cast<size_t>((n / 32 + 1) / 2) * sizeof(prepared_pair); }

// Activation side, integer term: the quants, the scales, and -bias * sum(r) per lane (the accumulator the
// byte products start from when the weights are made unsigned by adding bias).
struct act_i {
  __m512i q;
  __m512 d;
  __m512i t;
};

// Activation side, float term: the quants, the scales, and dy * sum(r) per lane (q4_1's m term).
struct act_f {
  __m512i q;
  __m512 d;
  __m512 t;
};

// Block p of the row as a pair: blocks 2p and 2p + 1, or 2p alone (half = true).
template <class BY>
inline __m512i pair_quants(const BY* y, int64_t p, bool half) {
  const __m256i lo = load256(y[2 * p].qs);
  if (half) return _mm512_zextsi256_si512(lo);
  return _mm512_inserti64x4(_mm512_castsi256_si512(lo), load256(y[2 * p + 1].qs), 1);
}

template <int bias>
inline act_i make_act_i(const block_q8_0* y, int64_t p, bool half) {
  act_i a;
  a.q = pair_quants(y, p, half);
  a.d = halves_f16(u16(y[2 * p].d), half ? uint16_t{0} : u16(y[2 * p + 1].d));
  const __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(static_cast<char>(bias)), a.q);
  a.t = _mm512_sub_epi32(_mm512_setzero_si512(), s);
  return a;
}

inline act_f make_act_f(const block_q8_1* y, int64_t p, bool half) {
  act_f a;
  a.q = pair_quants(y, p, half);
  a.d = halves_f16(u16(y[2 * p].d), half ? uint16_t{0} : u16(y[2 * p + 1].d));
  const __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(1), a.q);
  a.t = _mm512_mul_ps(a.d, _mm512_cvtepi32_ps(s));
  return a;
}

// Sources of activation pairs: standard blocks, or a prepared row.
template <int bias>
struct blocks_q8_0 {
  using block = block_q8_0;
  using act = act_i;
  [[gnu::always_inline]] static act get(const void* y, int64_t p, bool half) {
    return make_act_i<bias>(static_cast<const block*>(y), p, half);
  }
};
struct blocks_q8_1 {
  using block = block_q8_1;
  using act = act_f;
  [[gnu::always_inline]] static act get(const void* y, int64_t p, bool half) { return make_act_f(static_cast<const block*>(y), p, half); }
};
struct prepared_i {
  using act = act_i;
  [[gnu::always_inline]] static act get(const void* y, int64_t p, bool) {
    const prepared_pair& pp = static_cast<const prepared_pair*>(y)[p];
    return {_mm512_loadu_si512(pp.q), _mm512_loadu_ps(pp.d), _mm512_loadu_si512(pp.t)};
  }
};
struct prepared_f {
  using act = act_f;
  [[gnu::always_inline]] static act get(const void* y, int64_t p, bool) {
    const prepared_pair& pp = static_cast<const prepared_pair*>(y)[p];
    return {_mm512_loadu_si512(pp.q), _mm512_loadu_ps(pp.d), _mm512_loadu_ps(pp.t)};
  }
};

template <class Src>
void prepare_row(int64_t n, const void* y, void* out) {
  const int64_t nb = n / 32;
  prepared_pair* o = static_cast<prepared_pair*>(out);
  for (int64_t p = 0; 2 * p < nb; ++p) {
    const typename Src::act a = Src::get(y, p, 2 * p + 1 == nb);
    _mm512_storeu_si512(o[p].q, a.q);
    _mm512_storeu_ps(o[p].d, a.d);
    if constexpr (std::is_same_v<typename Src::act, act_f>) {
      _mm512_storeu_ps(o[p].t, a.t);
    } else {
      _mm512_storeu_si512(o[p].t, a.t);
    }
  }
}

// Weight side of a pair, decoded once for the NC activation rows of a tile.
struct w_q4_0 {
  using block = block_q4_0;
  __m512i q;  // nibbles, unsigned
  __m512 d;
  [[gnu::always_inline]] static w_q4_0 decode(const block* x, int64_t p, bool half) {
    const block& a = x[2 * p];
    if (half) return {_mm512_zextsi256_si512(nibbles_32(a.qs)), halves_f16(u16(a.d), 0)};
    const block& b = x[2 * p + 1];
    return {nibbles_64(a.qs, b.qs), halves_f16(u16(a.d), u16(b.d))};
  }
  // sum (q - 8) r: byte products onto -8 sum(r).
  [[gnu::always_inline]] void apply(const act_i& y, __m512& acc) const {
    const __m512i sumi = _mm512_dpbusd_epi32(y.t, q, y.q);
    acc = _mm512_fmadd_ps(_mm512_mul_ps(d, y.d), _mm512_cvtepi32_ps(sumi), acc);
  }
};

// The high bits of two q5 blocks (qh of blocks i and i + 1, bit j for value j) as bytes of 16 where set, in
// value order (matching nibbles_64); one block alone fills the low half.
inline __m512i high_bits_64(const uint8_t* qh0, const uint8_t* qh1) {
  const __mmask64 m =
      static_cast<__mmask64>(u32_at(qh0)) | (qh1 != nullptr ? static_cast<__mmask64>(u32_at(qh1)) << 32 : 0);
  return _mm512_maskz_mov_epi8(m, _mm512_set1_epi8(0x10));
}

// q5_0: q = nibble + 16 * bit, unsigned (0..31), x = d (q - 16): byte products onto -16 sum(r).
struct w_q5_0 {
  using block = block_q5_0;
  __m512i q;
  __m512 d;
  [[gnu::always_inline]] static w_q5_0 decode(const block* x, int64_t p, bool half) {
    const block& a = x[2 * p];
    if (half) {
      return {_mm512_or_si512(_mm512_zextsi256_si512(nibbles_32(a.qs)), high_bits_64(a.qh, nullptr)),
              halves_f16(u16(a.d), 0)};
    }
    const block& b = x[2 * p + 1];
    return {_mm512_or_si512(nibbles_64(a.qs, b.qs), high_bits_64(a.qh, b.qh)), halves_f16(u16(a.d), u16(b.d))};
  }
  [[gnu::always_inline]] void apply(const act_i& y, __m512& acc) const {
    const __m512i sumi = _mm512_dpbusd_epi32(y.t, q, y.q);
    acc = _mm512_fmadd_ps(_mm512_mul_ps(d, y.d), _mm512_cvtepi32_ps(sumi), acc);
  }
};

// q4_1 (x = dx q + m) against q8_1 (y = dy r): dx dy sum(q r) + m (dy sum(r)), sum(r) from the quants, as
// the reference does. The m term goes into its own accumulator (acc_m below).
struct w_q4_1 {
  using block = block_q4_1;
  __m512i q;
  __m512 d, m;
  [[gnu::always_inline]] static w_q4_1 decode(const block* x, int64_t p, bool half) {
    w_q4_1 w;
    const block& a = x[2 * p];
    if (half) {
      w.q = _mm512_zextsi256_si512(nibbles_32(a.qs));
      halves_f16x2(u32_at(&a), 0, w.d, w.m);
    } else {
      const block& b = x[2 * p + 1];
      w.q = nibbles_64(a.qs, b.qs);
      halves_f16x2(u32_at(&a), u32_at(&b), w.d, w.m);
    }
    return w;
  }
  [[gnu::always_inline]] void apply(const act_f& y, __m512& acc, __m512& acc_m) const {
    const __m512i sumi = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q, y.q);
    acc = _mm512_fmadd_ps(_mm512_mul_ps(d, y.d), _mm512_cvtepi32_ps(sumi), acc);
    acc_m = _mm512_fmadd_ps(m, y.t, acc_m);
  }
};

// q5_1 (x = dx q + m, q = nibble + 16 * bit) against q8_1: as q4_1.
struct w_q5_1 : w_q4_1 {
  using block = block_q5_1;
  [[gnu::always_inline]] static w_q5_1 decode(const block* x, int64_t p, bool half) {
    w_q5_1 w;
    const block& a = x[2 * p];
    if (half) {
      w.q = _mm512_or_si512(_mm512_zextsi256_si512(nibbles_32(a.qs)), high_bits_64(a.qh, nullptr));
      halves_f16x2(u32_at(&a), 0, w.d, w.m);
    } else {
      const block& b = x[2 * p + 1];
      w.q = _mm512_or_si512(nibbles_64(a.qs, b.qs), high_bits_64(a.qh, b.qh));
      halves_f16x2(u32_at(&a), u32_at(&b), w.d, w.m);
    }
    return w;
  }
};

// The kernels: W's pairs against NC activation rows from Src (see dot_tile in x86_common.h). Two
// accumulators per activation row, pairs alternating between them (q4_1: the m term's accumulator is the
// second), so consecutive FMAs do not wait on each other.
template <class W, class Src>
struct pair_kernel {
  static void step(const W& w, const typename Src::act& a, __m512& acc0, __m512& acc1, bool odd) {
    if constexpr (std::is_base_of_v<w_q4_1, W>) {
      w.apply(a, acc0, acc1);
    } else {
      w.apply(a, odd ? acc1 : acc0);
    }
  }


  template <int NC>
  static void run(int64_t n, const void* vx, const void* const* vy, float* out) {
    const typename W::block* x = static_cast<const typename W::block*>(vx);
    __m512 acc0[NC], acc1[NC];
    for (int c = 0; c < NC; ++c) {
      acc0[c] = _mm512_setzero_ps();
      acc1[c] = _mm512_setzero_ps();
    }
    const int64_t nb = n / 32;
    const int64_t full = nb / 2;  // whole pairs; pair p goes into acc0 when p is even, acc1 when odd
    int64_t p = 0;
    for (; p + 1 < full; p += 2) {
      const W w0 = W::decode(x, p, false);
      const W w1 = W::decode(x, p + 1, false);
      for (int c = 0; c < NC; ++c) {
        step(w0, Src::get(vy[c], p, false), acc0[c], acc1[c], false);
        step(w1, Src::get(vy[c], p + 1, false), acc0[c], acc1[c], true);
      }
    }
    if (p < full) {
      const W w0 = W::decode(x, p, false);
      for (int c = 0; c < NC; ++c) step(w0, Src::get(vy[c], p, false), acc0[c], acc1[c], false);
      ++p;
    }
    if (nb % 2 != 0) {  // the last block, a half pair
      const W w0 = W::decode(x, p, true);
      for (int c = 0; c < NC; ++c) step(w0, Src::get(vy[c], p, true), acc0[c], acc1[c], p % 2 != 0);
    }
    __m512 sums[NC];
    for (int c = 0; c < NC; ++c) sums[c] = _mm512_add_ps(acc0[c], acc1[c]);
    reduce_add_n<NC>(sums, out);
  }

  // RM weight rows (x_stride bytes apart) x NC activation rows: out[c * s_stride + r]. Per element exactly
  // run<1>'s operations (pair p into acc0 or acc1 by its parity, the same reduction); each activation pair
  // is loaded once for the RM rows, each weight pair decoded once for the NC rows.
  template <int RM, int NC>
  static void run_rows(int64_t n, const void* vx, size_t x_stride, const void* const* vy, float* out,
                       size_t s_stride) {
    const typename W::block* x[RM];
    for (int r = 0; r < RM; ++r) {
      x[r] = reinterpret_cast<const typename W::block*>(static_cast<const char*>(vx) + static_cast<size_t>(r) * x_stride);
    }
    __m512 acc0[RM][NC], acc1[RM][NC];
    for (int r = 0; r < RM; ++r) {
      for (int c = 0; c < NC; ++c) {
        acc0[r][c] = _mm512_setzero_ps();
        acc1[r][c] = _mm512_setzero_ps();
      }
    }
    const int64_t nb = n / 32;
    const int64_t full = nb / 2;
    auto pair = [&](int64_t p, bool half, bool odd) {
      W w[RM];
      for (int r = 0; r < RM; ++r) w[r] = W::decode(x[r], p, half);
      for (int c = 0; c < NC; ++c) {
        const typename Src::act a = Src::get(vy[c], p, half);
        for (int r = 0; r < RM; ++r) step(w[r], a, acc0[r][c], acc1[r][c], odd);
      }
    };
    int64_t p = 0;
    for (; p + 1 < full; p += 2) {
      pair(p, false, false);
      pair(p + 1, false, true);
    }
    if (p < full) pair(p++, false, false);
    if (nb % 2 != 0) pair(p, true, p % 2 != 0);
    __m512 sums[NC * RM];
    for (int c = 0; c < NC; ++c) {
      for (int r = 0; r < RM; ++r) sums[c * RM + r] = _mm512_add_ps(acc0[r][c], acc1[r][c]);
    }
    float o[NC * RM];
    reduce_add_n<NC * RM>(sums, o);
    for (int c = 0; c < NC; ++c) {
      for (int r = 0; r < RM; ++r) out[static_cast<size_t>(c) * s_stride + static_cast<size_t>(r)] = o[c * RM + r];
    }
  }
};

// Tiles of the pair kernels: for matrix-matrix products (a tile of 4 or more activation rows) register tiles
// of 2 weight rows x 4 activation rows (run_rows); for fewer activation rows (weights streamed from memory,
// where a core reads one stream faster than two interleaved) one weight row at a time (dot_tile).
template <class K>
void pair_tile(int64_t n, int64_t nrows, int64_t ncols, float* s, size_t s_stride, const void* x, size_t x_stride,
               const void* y, size_t y_stride) {
  if (ncols < tile_max_cols || nrows < 2) return dot_tile<K>(n, nrows, ncols, s, s_stride, x, x_stride, y, y_stride);
  const char* xb = static_cast<const char*>(x);
  const char* yb = static_cast<const char*>(y);
  int64_t c8 = 0;
  for (; c8 + 8 <= ncols; c8 += 8) {
    const void* ys[8];
    for (int c = 0; c < 8; ++c) ys[c] = yb + static_cast<size_t>(c8 + c) * y_stride;
    float* sc = s + static_cast<size_t>(c8) * s_stride;
    for (int64_t r = 0; r < nrows; ++r) K::template run_rows<1, 8>(n, xb + static_cast<size_t>(r) * x_stride, x_stride, ys, sc + r, s_stride);
  }
  if (c8 > 0) {
    if (c8 == ncols) return;
    return pair_tile<K>(n, nrows, ncols - c8, s + static_cast<size_t>(c8) * s_stride, s_stride, x, x_stride,
                        yb + static_cast<size_t>(c8) * y_stride, y_stride);
  }
  for (int64_t c0 = 0; c0 < ncols; c0 += tile_max_cols) {
    const int nc = static_cast<int>(std::min<int64_t>(tile_max_cols, ncols - c0));
    const void* ys[tile_max_cols] = {};
    for (int c = 0; c < nc; ++c) ys[c] = yb + static_cast<size_t>(c0 + c) * y_stride;
    float* sc = s + static_cast<size_t>(c0) * s_stride;
    int64_t r = 0;
    for (; r + 2 <= nrows; r += 2) {
      const char* xr = xb + static_cast<size_t>(r) * x_stride;
      switch (nc) {
        case 1: K::template run_rows<2, 1>(n, xr, x_stride, ys, sc + r, s_stride); break;
        case 2: K::template run_rows<2, 2>(n, xr, x_stride, ys, sc + r, s_stride); break;
        case 3: K::template run_rows<2, 3>(n, xr, x_stride, ys, sc + r, s_stride); break;
        default: K::template run_rows<2, 4>(n, xr, x_stride, ys, sc + r, s_stride); break;
      }
    }
    if (r < nrows) dot_tile<K>(n, 1, nc, sc + r, s_stride, xb + static_cast<size_t>(r) * x_stride, x_stride, ys[0], y_stride);
  }
}

}  // namespace

// q4_0, q4_1, q5_0, q5_1: vec_dot, vec_dot_rows and the tiles on q8_0 / q8_1 blocks, and the tiles on prepared
// rows.
#define TROUPE_SIMD_PAIRS(t, W, Src, Prep)                                                                     \
  void vec_dot_##t(int64_t n, float* s, const void* x, const void* y) {                                      \
    pair_kernel<W, Src>::run<1>(n, x, &y, s);                                                            \
  }                                                                                                          \
  void vec_dot_##t##_rows(int64_t n, int64_t nrows, float* s, const void* x, size_t x_stride, const void* y) { \
    dot_rows_k<pair_kernel<W, Src>>(n, nrows, s, x, x_stride, y);                                            \
  }                                                                                                          \
  void vec_dot_##t##_tile(int64_t n, int64_t nrows, int64_t ncols, float* s, size_t s_stride, const void* x, \
                          size_t x_stride, const void* y, size_t y_stride) {                                 \
    pair_tile<pair_kernel<W, Src>>(n, nrows, ncols, s, s_stride, x, x_stride, y, y_stride);                  \
  }                                                                                                          \
  void vec_dot_##t##_prepared_tile(int64_t n, int64_t nrows, int64_t ncols, float* s, size_t s_stride,        \
                                   const void* x, size_t x_stride, const void* y, size_t y_stride) {         \
    pair_tile<pair_kernel<W, Prep>>(n, nrows, ncols, s, s_stride, x, x_stride, y, y_stride);                 \
  }                                                                                                          \
  void tile_prepare_##t(int64_t n, const void* y, void* out) { prepare_row<Src>(n, y, out); }
TROUPE_SIMD_PAIRS(q4_0, w_q4_0, blocks_q8_0<8>, prepared_i)
TROUPE_SIMD_PAIRS(q4_1, w_q4_1, blocks_q8_1, prepared_f)
TROUPE_SIMD_PAIRS(q5_0, w_q5_0, blocks_q8_0<16>, prepared_i)
TROUPE_SIMD_PAIRS(q5_1, w_q5_1, blocks_q8_1, prepared_f)
#undef TROUPE_SIMD_PAIRS

size_t tile_prepared_size(int64_t n) { return prepared_row_size(n); }

}  // namespace troupe::cpu::simd::avx512
