// AVX-512 (F/BW/VL/DQ + VNNI) dot products. Compiled with -mavx2 -mfma -mf16c -mavx512f -mavx512bw
// -mavx512vl -mavx512dq -mavx512vnni.
//
//   - f32 / f16 weights against f32 activations: register tiles of up to 4 weight rows x 6 activation rows
//     (float_gemm below), one accumulator per element, the tail with masked loads.
//   - 32-value block types (q4_0, q4_1, q5_0, q5_1, q8_0): two blocks per zmm register, byte products
//     through vpdpbusd (below).
//   - vec_dot_*_tile: the same dot products against several activation rows at once, each weight block
//     decoded once (dot_tile in x86_common.h), every element bit-identical to the one-row function's.
#include <algorithm>
#include <array>
#include <type_traits>
#include <utility>

#include "backends/cpu/simd/x86_common.h"
#include "backends/cpu/simd/x86_kernels.h"

namespace troupe::cpu::simd::avx512 {

namespace ymm {
#include "backends/cpu/simd/dot_blocks_x86.inc"  // q4_0, q4_1, q5_0, q5_1, q8_0 with VNNI
}  // namespace ymm


namespace {

// Horizontal sums of many vectors at once: out[i] = _mm512_reduce_add_ps(v[i]) for i < N, bit for bit.
// _mm512_reduce_add_ps adds lanes i and i + 8, then i and i + 4, i and i + 2, i and i + 1 (8 dependent
// shuffles and adds per vector); the same pairing tree is done here for 16 vectors in 15 steps of two
// shuffles and an add, each step serving two vectors (float addition is commutative, so which operand of
// a pair comes first does not change a bit). A tile's 8 .. 24 dot products of short rows (attention's
// 64-value heads, k = 576 weight rows) spent as much time in their reductions as in their products.
[[gnu::always_inline]] inline __m512 reduce_add_x16(const __m512* v) {
  __m512 w[8], u[4], z[2];
  for (int k = 0; k < 8; ++k) {  // lanes i + (i + 8): v[2k] in lanes 0..7, v[2k + 1] in 8..15
    w[k] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], 0x44),
                         _mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], 0xEE));
  }
  for (int m = 0; m < 4; ++m) {  // + 4: 128-bit chunk j holds v[4m + j]
    u[m] = _mm512_add_ps(_mm512_shuffle_f32x4(w[2 * m], w[2 * m + 1], 0x88),
                         _mm512_shuffle_f32x4(w[2 * m], w[2 * m + 1], 0xDD));
  }
  for (int l = 0; l < 2; ++l) {  // + 2: chunk j holds v[8l + j] in lanes 0, 1 and v[8l + 4 + j] in 2, 3
    z[l] = _mm512_add_ps(_mm512_shuffle_ps(u[2 * l], u[2 * l + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(u[2 * l], u[2 * l + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  }
  // + 1: lane 4j + t holds the sum of v[j + 4t]; a permute puts the sum of v[i] in lane i.
  const __m512 r = _mm512_add_ps(_mm512_shuffle_ps(z[0], z[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm512_shuffle_ps(z[0], z[1], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), r);
}

// The same for 8 vectors: the first three steps on them alone, the last on the one vector left.
[[gnu::always_inline]] inline __m256 reduce_add_x8(const __m512* v) {
  __m512 w[4], u[2];
  for (int k = 0; k < 4; ++k) {
    w[k] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], 0x44),
                         _mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], 0xEE));
  }
  for (int m = 0; m < 2; ++m) {
    u[m] = _mm512_add_ps(_mm512_shuffle_f32x4(w[2 * m], w[2 * m + 1], 0x88),
                         _mm512_shuffle_f32x4(w[2 * m], w[2 * m + 1], 0xDD));
  }
  const __m512 z = _mm512_add_ps(_mm512_shuffle_ps(u[0], u[1], _MM_SHUFFLE(1, 0, 1, 0)),
                                 _mm512_shuffle_ps(u[0], u[1], _MM_SHUFFLE(3, 2, 3, 2)));
  // Lane 4j of r: the sum of v[j], lane 4j + 1: of v[4 + j].
  const __m512 r = _mm512_add_ps(_mm512_shuffle_ps(z, z, _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm512_shuffle_ps(z, z, _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_castps512_ps256(
      _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 0, 0, 0, 0, 0, 0, 0, 0), r));
}

template <int N>
[[gnu::always_inline]] inline void reduce_add_n(const __m512* v, float* out) {
  if constexpr (N == 8) {
    _mm256_storeu_ps(out, reduce_add_x8(v));
    return;
  }
  for (int i0 = 0; i0 < N; i0 += 16) {
    if (N - i0 == 1) {
      out[i0] = _mm512_reduce_add_ps(v[i0]);
      break;
    }
    __m512 b[16];
    for (int i = 0; i < 16; ++i) b[i] = i0 + i < N ? v[i0 + i] : _mm512_setzero_ps();
    const __m512 r = reduce_add_x16(b);
    if (N - i0 >= 16) _mm512_storeu_ps(out + i0, r);
    else _mm512_mask_storeu_ps(out + i0, static_cast<__mmask16>((1u << (N - i0)) - 1), r);
  }
}

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

// ---- q4_0, q4_1, q8_0: pairs of blocks per zmm, and prepared activations ------------------------------
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
  uint8_t t[64];  // int32 x 16 (q4_0, q8_0) or float x 16 (q4_1)
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

struct w_q8_0 {
  using block = block_q8_0;
  __m512i u;  // quants + 128 (the sign bit flipped), unsigned
  __m512 d;
  [[gnu::always_inline]] static w_q8_0 decode(const block* x, int64_t p, bool half) {
    const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80));
    const block& a = x[2 * p];
    if (half) return {_mm512_xor_si512(_mm512_zextsi256_si512(load256(a.qs)), bias), halves_f16(u16(a.d), 0)};
    const block& b = x[2 * p + 1];
    const __m512i q = _mm512_inserti64x4(_mm512_castsi256_si512(load256(a.qs)), load256(b.qs), 1);
    return {_mm512_xor_si512(q, bias), halves_f16(u16(a.d), u16(b.d))};
  }
  // sum q r: byte products of q + 128 onto -128 sum(r).
  [[gnu::always_inline]] void apply(const act_i& y, __m512& acc) const {
    const __m512i sumi = _mm512_dpbusd_epi32(y.t, u, y.q);
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

// q4_K: each 64-value chunk k in one zmm. The 32 bytes qs[32 k ..] give [low nibbles | high nibbles] =
// values 64 k .. 64 k + 63 in order, against one 64-byte load of y. maddubs -> 32 int16 pair sums; madd with
// scale 2k in the low half and 2k + 1 in the high half (vpermw from the unpacked scales) -> 16 int32. NC
// activation rows at once, each chunk decoded once.
struct q4_K_tile {

  template <int NC>
  static void run(int64_t n, const void* vx, const void* const* vy, float* out) {
    const block_q4_K* x = static_cast<const block_q4_K*>(vx);
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
    float sums[NC];
    reduce_add_n<NC>(acc, sums);
    for (int c = 0; c < NC; ++c) {
      __m128 r = _mm_add_ps(acc_m[c], _mm_movehl_ps(acc_m[c], acc_m[c]));
      r = _mm_add_ss(r, _mm_movehdup_ps(r));
      out[c] = sums[c] + _mm_cvtss_f32(r);
    }
  }
};

// q6_K: each 64-value chunk k (values 64 k .. 64 k + 63) in one zmm. In half h = k / 2 of a block the 64
// bytes ql[64 h ..] hold values 128 h + 0..63 in their low nibbles and 128 h + 64..127 in their high
// nibbles; qh[32 h + l] holds the two high bits of value 128 h + 32 j + l in bits 2 j. maddubs of the
// unsigned 6-bit values against one 64-byte load of y -> 32 int16 pair sums; madd with the scale of each
// 16 values (vpermw of the 16 int16 scales) -> 16 int32; the -32 of every value as 32 sum_j scale_j
// bsum_j (y's sums over its 16-value groups), as the AVX2 kernel does. NC activation rows at once.
struct q6_K_tile {
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
            sumi[c] = _mm512_add_epi32(sumi[c], _mm512_madd_epi16(sc, p));
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

// q4_0, q4_1, q8_0: vec_dot, vec_dot_rows and the tiles on q8_0 / q8_1 blocks, and the tiles on prepared
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
TROUPE_SIMD_PAIRS(q8_0, w_q8_0, blocks_q8_0<0x80>, prepared_i)
TROUPE_SIMD_PAIRS(q5_0, w_q5_0, blocks_q8_0<16>, prepared_i)
TROUPE_SIMD_PAIRS(q5_1, w_q5_1, blocks_q8_1, prepared_f)
#undef TROUPE_SIMD_PAIRS

size_t tile_prepared_size(int64_t n) { return prepared_row_size(n); }

namespace {

inline __m512 load_f32(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load_f32_tail(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
inline __m512 load_f16(const uint16_t* p) { return _mm512_cvtph_ps(load256(p)); }
inline __m512 load_f16_tail(const uint16_t* p, __mmask16 m) { return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p)); }

// How far ahead of a streamed weight row's loads the float kernels prefetch (measured on a Sapphire
// Rapids-class core: 1-2 KiB ahead reads a 256 MiB f16 matrix 10-20% faster than no prefetch).
constexpr int float_stream_distance = 2048;

// Float weights (f32, f16) against f32 activation rows: register tiles of RM weight rows x RN activation rows,
// one zmm accumulator per element, 16 values per step: the RM weight vectors are loaded (and converted)
// once for the RN rows and each activation vector once for the RM rows, so a 4 x 6 tile does 24 FMAs for
// 10 loads (the one-row-of-weights tiles of the quantized types would be load-bound here). Every element is
// one chain of FMAs over its 16-value slices, in order, the masked tail last, and one reduce_add: the same
// operations whatever the tile, so vec_dot (a 1 x 1 tile), vec_dot_rows and the tiles are bit-identical.
// LX: the weights' element type T, load (16 values as floats) and load_tail (the first values of a mask).
template <class LX>
struct float_gemm {
  using T = typename LX::T;

  template <int RM, int RN>
  static void run(int64_t n, const char* x, size_t x_stride, const char* y, size_t y_stride, float* s,
                  size_t s_stride) {
    const T* xr[RM];
    const float* yr[RN];
    for (int r = 0; r < RM; ++r) xr[r] = reinterpret_cast<const T*>(x + static_cast<size_t>(r) * x_stride);
    for (int c = 0; c < RN; ++c) yr[c] = reinterpret_cast<const float*>(y + static_cast<size_t>(c) * y_stride);
    __m512 acc[RM][RN];
    for (int r = 0; r < RM; ++r) {
      for (int c = 0; c < RN; ++c) acc[r][c] = _mm512_setzero_ps();
    }
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
      // One weight row streamed from memory (matrix-vector products): a software prefetch well ahead of
      // the loads keeps more line fills in flight than the hardware prefetcher alone (rows are contiguous,
      // so past this row's end it fetches the next rows'). It changes no arithmetic.
      if constexpr (RM == 1) stream_line(xr[0], i);
      __m512 xv[RM];
      for (int r = 0; r < RM; ++r) xv[r] = LX::load(xr[r] + i);
      for (int c = 0; c < RN; ++c) {
        const __m512 yv = load_f32(yr[c] + i);
        for (int r = 0; r < RM; ++r) acc[r][c] = _mm512_fmadd_ps(xv[r], yv, acc[r][c]);
      }
    }
    if (i < n) {
      const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
      __m512 xv[RM];
      for (int r = 0; r < RM; ++r) xv[r] = LX::load_tail(xr[r] + i, m);
      for (int c = 0; c < RN; ++c) {
        const __m512 yv = load_f32_tail(yr[c] + i, m);
        for (int r = 0; r < RM; ++r) acc[r][c] = _mm512_fmadd_ps(xv[r], yv, acc[r][c]);
      }
    }
    __m512 flat[RN * RM];
    for (int c = 0; c < RN; ++c) {
      for (int r = 0; r < RM; ++r) flat[c * RM + r] = acc[r][c];
    }
    float o[RN * RM];
    reduce_add_n<RN * RM>(flat, o);
    for (int c = 0; c < RN; ++c) {
      for (int r = 0; r < RM; ++r) s[static_cast<size_t>(c) * s_stride + static_cast<size_t>(r)] = o[c * RM + r];
    }
  }

  // Before the load of value i of a streamed row: one prefetch per 64-byte line, float_stream_distance on
  // (always inlined: called out of line it cost the f16 matrix-vector product ~20%).
  [[gnu::always_inline]] static void stream_line(const T* row, int64_t i) {
    if ((i * static_cast<int64_t>(sizeof(T))) % 64 == 0) stream_ahead<64, float_stream_distance>(row + i);
  }

  // s[r] = run<1, 1>(row r of x, y) for 16 rows, n a multiple of 16 (see gemm_tile).
  static void matvec16(int64_t n, const char* x, size_t x_stride, const float* y, float* s) {
    __m512 acc[16];
    for (int r = 0; r < 16; ++r) {
      const T* xr = reinterpret_cast<const T*>(x + static_cast<size_t>(r) * x_stride);
      __m512 a = _mm512_setzero_ps();
      for (int64_t i = 0; i < n; i += 16) {
        stream_line(xr, i);
        a = _mm512_fmadd_ps(LX::load(xr + i), load_f32(y + i), a);
      }
      acc[r] = a;
    }
    _mm512_storeu_ps(s, reduce_add_x16(acc));
  }
};

constexpr int gemm_rm = 4;  // weight rows per register tile
constexpr int gemm_rn = 6;  // activation rows per register tile (4 x 6 accumulators + 4 + 1 of 32 zmm)

// s[c * s_stride + r] = dot(row r of x, row c of y) for r < nrows, c < ncols, in register tiles: for each
// group of gemm_rm weight rows (reused from L1), every group of gemm_rn activation rows. With fewer
// activation rows than a tile's (matrix-vector products, weights streamed from memory) one weight row at a
// time: a core reads one stream faster than several interleaved.
//
// A matrix-vector product (one activation row) takes 16 weight rows at a time, one after the other, each
// its own chain of FMAs as in run<1, 1> (and its prefetch), and sums the 16 accumulators at once
// (reduce_add_x16): the same bits as one run<1, 1> per row, without a horizontal sum per row.
template <class K>
void gemm_tile(int64_t n, int64_t nrows, int64_t ncols, float* s, size_t s_stride, const void* x, size_t x_stride,
               const void* y, size_t y_stride) {
  if (ncols == 1 && n % 16 == 0) {
    const int64_t full = nrows - nrows % 16;
    for (int64_t r0 = 0; r0 < full; r0 += 16) {
      K::matvec16(n, static_cast<const char*>(x) + static_cast<size_t>(r0) * x_stride, x_stride,
                  static_cast<const float*>(y), s + r0);
    }
    if (full == nrows) return;
    return gemm_tiles<K, gemm_rm, gemm_rn>(n, nrows - full, 1, 1, s + full, s_stride,
                                           static_cast<const char*>(x) + static_cast<size_t>(full) * x_stride,
                                           x_stride, y, y_stride);
  }
  const int64_t rows_per = ncols >= gemm_rn ? gemm_rm : 1;
  gemm_tiles<K, gemm_rm, gemm_rn>(n, nrows, ncols, rows_per, s, s_stride, x, x_stride, y, y_stride);
}

struct f32_loads {
  using T = float;
  static __m512 load(const float* p) { return load_f32(p); }
  static __m512 load_tail(const float* p, __mmask16 m) { return load_f32_tail(p, m); }
};
struct f16_loads {
  using T = uint16_t;
  static __m512 load(const uint16_t* p) { return load_f16(p); }
  static __m512 load_tail(const uint16_t* p, __mmask16 m) { return load_f16_tail(p, m); }
};
using f32_gemm = float_gemm<f32_loads>;
using f16_gemm = float_gemm<f16_loads>;

}  // namespace

namespace {

// Column products (mad_tile.h): register tiles of up to 6 columns of b x 64 values of a's rows (4 zmm
// accumulators per column), a row of a loaded (converted) once for the columns, each b value broadcast;
// rows whose b values of the tile are all 0 are skipped (each would add exactly nothing to every element).
template <class LX, int NC>
void mad_cols(int64_t k, int64_t w, const char* a, size_t a_stride, const float* const* bc, float* const* out) {
  using T = typename LX::T;
  constexpr int nv = 4;
  const int nvec = static_cast<int>((w + 15) / 16);
  const __mmask16 tail = static_cast<__mmask16>(w % 16 == 0 ? 0xFFFF : (1u << (w % 16)) - 1);
  __m512 acc[NC][nv];
  for (int c = 0; c < NC; ++c) {
    for (int v = 0; v < nv; ++v) acc[c][v] = _mm512_setzero_ps();
  }
  for (int64_t l = 0; l < k; ++l) {
    float bv[NC];
    bool any = false;
    for (int c = 0; c < NC; ++c) {
      bv[c] = bc[c][l];
      any |= bv[c] != 0.0f;
    }
    if (!any) continue;
    const T* row = reinterpret_cast<const T*>(a + static_cast<size_t>(l) * a_stride);
    __m512 av[nv];
    for (int v = 0; v < nv; ++v) {
      if (v < nvec) av[v] = v + 1 < nvec ? LX::load(row + 16 * v) : LX::load_tail(row + 16 * v, tail);
    }
    for (int c = 0; c < NC; ++c) {
      if (bv[c] == 0.0f) continue;
      const __m512 b = _mm512_set1_ps(bv[c]);
      for (int v = 0; v < nv; ++v) {
        if (v < nvec) acc[c][v] = _mm512_fmadd_ps(av[v], b, acc[c][v]);
      }
    }
  }
  for (int c = 0; c < NC; ++c) {
    for (int v = 0; v < nvec; ++v) {
      if (v + 1 < nvec) _mm512_storeu_ps(out[c] + 16 * v, acc[c][v]);
      else _mm512_mask_storeu_ps(out[c] + 16 * v, tail, acc[c][v]);
    }
  }
}

template <class LX>
void mad_tile(int64_t k, int64_t m, int64_t ncols, const void* a, size_t a_stride, const void* b, size_t b_stride,
              float* s, size_t s_stride) {
  constexpr int64_t chunk = 64;
  constexpr int max_cols = 6;
  using fn = void (*)(int64_t, int64_t, const char*, size_t, const float* const*, float* const*);
  static constexpr fn by_cols[max_cols] = {mad_cols<LX, 1>, mad_cols<LX, 2>, mad_cols<LX, 3>,
                                           mad_cols<LX, 4>, mad_cols<LX, 5>, mad_cols<LX, 6>};
  const char* ab = static_cast<const char*>(a);
  for (int64_t c0 = 0; c0 < ncols; c0 += max_cols) {
    const int nc = static_cast<int>(std::min<int64_t>(max_cols, ncols - c0));
    for (int64_t i0 = 0; i0 < m; i0 += chunk) {
      const float* bc[max_cols];
      float* out[max_cols];
      for (int c = 0; c < nc; ++c) {
        bc[c] = reinterpret_cast<const float*>(static_cast<const char*>(b) + static_cast<size_t>(c0 + c) * b_stride);
        out[c] = s + static_cast<size_t>(c0 + c) * s_stride + static_cast<size_t>(i0);
      }
      by_cols[nc - 1](k, std::min(chunk, m - i0), ab + static_cast<size_t>(i0) * sizeof(typename LX::T), a_stride, bc, out);
    }
  }
}

}  // namespace

void mad_tile_f32(int64_t k, int64_t m, int64_t ncols, const void* a, size_t a_stride, const void* b, size_t b_stride,
                  float* s, size_t s_stride) {
  mad_tile<f32_loads>(k, m, ncols, a, a_stride, b, b_stride, s, s_stride);
}
void mad_tile_f16(int64_t k, int64_t m, int64_t ncols, const void* a, size_t a_stride, const void* b, size_t b_stride,
                  float* s, size_t s_stride) {
  mad_tile<f16_loads>(k, m, ncols, a, a_stride, b, b_stride, s, s_stride);
}

#define TROUPE_SIMD_FLOAT_GEMM(name, K)                                                                        \
  void name(int64_t n, float* s, const void* x, const void* y) {                                               \
    K::run<1, 1>(n, static_cast<const char*>(x), 0, static_cast<const char*>(y), 0, s, 1);                     \
  }                                                                                                            \
  void name##_rows(int64_t n, int64_t nrows, float* s, const void* x, size_t x_stride, const void* y) {        \
    gemm_tile<K>(n, nrows, 1, s, 1, x, x_stride, y, 0);                                                        \
  }                                                                                                            \
  void name##_tile(int64_t n, int64_t nrows, int64_t ncols, float* s, size_t s_stride, const void* x,          \
                   size_t x_stride, const void* y, size_t y_stride) {                                          \
    gemm_tile<K>(n, nrows, ncols, s, s_stride, x, x_stride, y, y_stride);                                      \
  }
TROUPE_SIMD_FLOAT_GEMM(vec_dot_f32, f32_gemm)
TROUPE_SIMD_FLOAT_GEMM(vec_dot_f16, f16_gemm)
#undef TROUPE_SIMD_FLOAT_GEMM

}  // namespace troupe::cpu::simd::avx512
