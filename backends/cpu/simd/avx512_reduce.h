// Horizontal sums of many zmm accumulators at once for the AVX-512 dot-product files (dot_avx512.cpp,
// dot_avx512_float.cpp): every tile kernel there ends with one of these. Include only from
// files compiled with the AVX-512 flags (troupe_avx512_flags in backends/cpu/CMakeLists.txt).
//
// A header of its own because two translation units share it; its functions have internal linkage and are
// always inlined, for the reason given in x86_common.h (an external-linkage copy built with AVX-512 could be
// picked by the linker for callers on other CPUs) and so each kernel keeps its reduction inline.
#pragma once

#include "backends/cpu/simd/x86_common.h"

namespace troupe::cpu::simd::avx512 {
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
    if (N - i0 == 8) {  // (a 4 x 6 tile's last 8: not padded to 16 with zeros)
      _mm256_storeu_ps(out + i0, reduce_add_x8(v + i0));
      break;
    }
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

}  // namespace
}  // namespace troupe::cpu::simd::avx512
