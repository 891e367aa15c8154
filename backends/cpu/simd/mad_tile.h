// Products with a column-major matrix (a row per value of the summed dimension), computed as scaled row
// additions: s[c * s_stride + i] = sum over l < k of a_l[i] * b_c[l], where a_l is row l of a (a_stride bytes
// apart, m values of type T) and b_c column c of b (f32, b_stride bytes apart). The attention's V times the
// softmax weights, with V in a row per cell.
//
// Each element is one chain over l in order, starting from +0, and terms whose b value is 0 are skipped
// (they would add exactly nothing: V is finite and the chain is never -0), so an element depends only on the
// nonzero b values and their rows, in order: a sequence's attention output does not change with where its
// cells lie in the cache or with the masked cells of other sequences around them.
//
// mad_tile_generic is the portable version (the scalar table); the AVX2 and AVX-512 ones (register tiles,
// FMA chains) are in dot_avx2.cpp and dot_avx512_float.cpp.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace troupe::cpu::simd {

// Acc: each element's chain starts from s's value instead of +0 (mad_tile_acc: the chain of one call continued
// by the next over the following rows of a, the same bits as one call over all of them).
template <class T, float (*to_f32)(T), bool Acc = false>
void mad_tile_generic(int64_t k, int64_t m, int64_t ncols, const void* a, size_t a_stride, const void* b,
                      size_t b_stride, float* s, size_t s_stride) {
  constexpr int64_t chunk = 64;
  float acc[chunk];
  const char* ab = static_cast<const char*>(a);
  for (int64_t c = 0; c < ncols; ++c) {
    const float* bc = reinterpret_cast<const float*>(static_cast<const char*>(b) + static_cast<size_t>(c) * b_stride);
    for (int64_t i0 = 0; i0 < m; i0 += chunk) {
      const int64_t w = std::min(chunk, m - i0);
      float* out = s + static_cast<size_t>(c) * s_stride + static_cast<size_t>(i0);
      if (Acc) {
        std::copy(out, out + w, acc);
      } else {
        std::fill(acc, acc + w, 0.0f);
      }
      for (int64_t l = 0; l < k; ++l) {
        const float bv = bc[l];
        if (bv == 0.0f) continue;
        const T* row = reinterpret_cast<const T*>(ab + static_cast<size_t>(l) * a_stride) + i0;
        for (int64_t i = 0; i < w; ++i) acc[i] += to_f32(row[i]) * bv;
      }
      std::memcpy(out, acc, static_cast<size_t>(w) * sizeof(float));
    }
  }
}

}  // namespace troupe::cpu::simd
