// AVX2 + FMA + F16C dot products of the plain float types and the 32-value block types against their
// activation formats (f32 for f32 and f16 weights, bf16, q8_0, q8_1). Compiled with -mavx2 -mfma -mf16c only.
#include <cmath>
#include <type_traits>

#include "backends/cpu/simd/x86_common.h"
#include "backends/cpu/simd/x86_kernels.h"

namespace troupe::cpu::simd::avx2 {

#include "backends/cpu/simd/dot_blocks_x86.inc"  // q4_0, q4_1, q5_0, q5_1 (q8_0: gemm_avx2.cpp)

namespace {

// ---- plain floats: 32 values per iteration in four accumulators, a scalar tail -------------------------

inline __m256 load_f16(const uint16_t* p) { return _mm256_cvtph_ps(load128(p)); }
// bf16 -> f32 is a 16-bit shift into the high half of each 32-bit lane.
inline __m256 load_bf16(const uint16_t* p) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(load128(p)), 16));
}
inline __m256 load_f32(const float* p) { return _mm256_loadu_ps(p); }

inline float scalar_f16(uint16_t h) { return h2f(h); }
inline float scalar_bf16(uint16_t h) {
  const uint32_t w = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &w, sizeof f);
  return f;
}
inline float scalar_f32(float f) { return f; }

// x (one row) against NC rows of y: 32 values per iteration in four accumulators per row of y, x loaded (and
// converted) once for up to 2 of them (16 ymm registers); a scalar tail.
// L: the element type T, load (8 values as floats) and scalar (one value as a float); LY the same for the
// rows of y (f16 weights are multiplied with f32 activations).
template <class L, class LY = L>
struct float_tile {
  using T = typename L::T;
  using TY = typename LY::T;

  template <int NC>
  static void run(int64_t n, const void* vx, const void* const* vy, float* out) {
    if constexpr (NC > 2) {
      run<2>(n, vx, vy, out);
      run<NC - 2>(n, vx, vy + 2, out + 2);
    } else {
      const T* x = static_cast<const T*>(vx);
      const TY* y[NC];
      __m256 acc[NC][4];
      for (int c = 0; c < NC; ++c) {
        y[c] = static_cast<const TY*>(vy[c]);
        for (int j = 0; j < 4; ++j) acc[c][j] = _mm256_setzero_ps();
      }
      int64_t i = 0;
      for (; i + 32 <= n; i += 32) {
        stream_ahead<32 * sizeof(T)>(x + i);
        for (int j = 0; j < 4; ++j) {
          const __m256 xv = L::load(x + i + 8 * j);
          for (int c = 0; c < NC; ++c) acc[c][j] = _mm256_fmadd_ps(xv, LY::load(y[c] + i + 8 * j), acc[c][j]);
        }
      }
      for (; i + 8 <= n; i += 8) {
        const __m256 xv = L::load(x + i);
        for (int c = 0; c < NC; ++c) acc[c][0] = _mm256_fmadd_ps(xv, LY::load(y[c] + i), acc[c][0]);
      }
      for (int c = 0; c < NC; ++c) {
        float sum = hsum(_mm256_add_ps(_mm256_add_ps(acc[c][0], acc[c][1]), _mm256_add_ps(acc[c][2], acc[c][3])));
        for (int64_t t = i; t < n; ++t) sum += L::scalar(x[t]) * LY::scalar(y[c][t]);
        out[c] = sum;
      }
    }
  }
};

struct f32_loads {
  using T = float;
  static __m256 load(const float* p) { return load_f32(p); }
  static float scalar(float v) { return scalar_f32(v); }
};
struct f16_loads {
  using T = uint16_t;
  static __m256 load(const uint16_t* p) { return load_f16(p); }
  static float scalar(uint16_t v) { return scalar_f16(v); }
};
struct bf16_loads {
  using T = uint16_t;
  static __m256 load(const uint16_t* p) { return load_bf16(p); }
  static float scalar(uint16_t v) { return scalar_bf16(v); }
};
using f32_tile = float_tile<f32_loads>;
using f16_tile = float_tile<f16_loads, f32_loads>;  // f16 weights, f32 activations
using bf16_tile = float_tile<bf16_loads>;

// Matrix-matrix tiles of float weights with the same elements as float_tile's: RM weight rows x RN activation
// rows, one ymm accumulator per element. float_tile's element is four FMA chains, chain j over the 8-value
// slices j, j + 4, j + 8 ... of each 32-value group (chain 0 also over the 8-value slices after the last
// group), summed as (c0 + c1) + (c2 + c3), then the scalar tail. A register tile cannot hold four chains
// per element, so it runs them one after another: phase j computes chain j of every element of the tile
// (from the rows in L1), keeps it, and the sums are formed at the end in float_tile's order. Every element
// is bit-identical to float_tile's (vec_dot's) whatever the tile; per step a 3 x 4 tile converts 3 weight
// vectors and loads 4 activation vectors for 12 FMAs, where float_tile's one weight row x 2 activation rows
// does 8 FMAs for 9 loads.
template <class L, class LY = L>
struct float_gemm {
  using T = typename L::T;
  using TY = typename LY::T;

  template <int RM, int RN>
  static void run(int64_t n, const char* x, size_t x_stride, const char* y, size_t y_stride, float* s,
                  size_t s_stride) {
    const T* xr[RM];
    const TY* yr[RN];
    for (int r = 0; r < RM; ++r) xr[r] = reinterpret_cast<const T*>(x + static_cast<size_t>(r) * x_stride);
    for (int c = 0; c < RN; ++c) yr[c] = reinterpret_cast<const TY*>(y + static_cast<size_t>(c) * y_stride);
    const int64_t n32 = n / 32 * 32;
    __m256 chain[4][RM][RN];
    for (int j = 0; j < 4; ++j) {
      __m256 acc[RM][RN];
      for (int r = 0; r < RM; ++r) {
        for (int c = 0; c < RN; ++c) acc[r][c] = _mm256_setzero_ps();
      }
      auto step = [&](int64_t i) {
        __m256 xv[RM];
        for (int r = 0; r < RM; ++r) xv[r] = L::load(xr[r] + i);
        for (int c = 0; c < RN; ++c) {
          const __m256 yv = LY::load(yr[c] + i);
          for (int r = 0; r < RM; ++r) acc[r][c] = _mm256_fmadd_ps(xv[r], yv, acc[r][c]);
        }
      };
      for (int64_t i = 8 * j; i < n32; i += 32) step(i);
      if (j == 0) {
        for (int64_t i = n32; i + 8 <= n; i += 8) step(i);
      }
      for (int r = 0; r < RM; ++r) {
        for (int c = 0; c < RN; ++c) chain[j][r][c] = acc[r][c];
      }
    }
    const int64_t tail = n / 8 * 8;
    for (int c = 0; c < RN; ++c) {
      for (int r = 0; r < RM; ++r) {
        float sum = hsum(_mm256_add_ps(_mm256_add_ps(chain[0][r][c], chain[1][r][c]),
                                       _mm256_add_ps(chain[2][r][c], chain[3][r][c])));
        for (int64_t t = tail; t < n; ++t) sum += L::scalar(xr[r][t]) * LY::scalar(yr[c][t]);
        s[static_cast<size_t>(c) * s_stride + static_cast<size_t>(r)] = sum;
      }
    }
  }
};

// Tile shape of float_gemm (16 ymm: RM x RN accumulators, RM weight vectors and one activation vector).
constexpr int gemm_rm = 3;
constexpr int gemm_rn = 4;

// s[c * s_stride + r] = dot(row r of x, row c of y) for r < nrows, c < ncols. With at least gemm_rn
// activation rows (prompts, attention scores), float_gemm's tiles: for each group of gemm_rm weight rows
// (reused from L1), every group of gemm_rn activation rows. With fewer (matrix-vector products, weights
// streamed from memory) float_tile's: one weight row at a time, one stream, four chains in flight.
template <class L, class LY>
void float_tiles(int64_t n, int64_t nrows, int64_t ncols, float* s, size_t s_stride, const void* x, size_t x_stride,
                 const void* y, size_t y_stride) {
  if (ncols < gemm_rn) return dot_tile<float_tile<L, LY>>(n, nrows, ncols, s, s_stride, x, x_stride, y, y_stride);
  gemm_tiles<float_gemm<L, LY>, gemm_rm, gemm_rn>(n, nrows, ncols, gemm_rm, s, s_stride, x, x_stride, y, y_stride);
}

}  // namespace

namespace {

// ---- products with a column-major a (mad_tile.h): V in a row per cell times the softmax weights ---------

// NC columns x NV vectors of 8 values in registers (at most 12 accumulators, NV for the row of a and one
// broadcast). Each value is one FMA chain over the cells in order, from +0. A cell whose weights are all 0
// is skipped; a single column's 0 is not: its FMA adds exactly +-0 to a chain that is never -0 (V is
// finite), so every column gets the value it would get alone, whatever its neighbours in the tile. Acc: each
// chain starts from out's value instead of +0 (mad_tile_acc_f32).
template <class L, bool Acc, int NC, int NV>
void mad_cols(int64_t k, const char* a, size_t a_stride, const float* const* bc, float* const* out) {
  using T = typename L::T;
  __m256 acc[NC][NV];
  for (int c = 0; c < NC; ++c) {
    for (int v = 0; v < NV; ++v) acc[c][v] = Acc ? _mm256_loadu_ps(out[c] + 8 * v) : _mm256_setzero_ps();
  }
  constexpr size_t row_bytes = 8 * NV * sizeof(T);
  for (int64_t l = 0; l < k; ++l) {
    // The rows mad_prefetch ahead, fetched on the way (see prefetch_span: V's rows are a head's slice
    // of each cell's row).
    if (l + mad_prefetch < k) prefetch_span(a + static_cast<size_t>(l + mad_prefetch) * a_stride, row_bytes);
    float bv[NC];
    bool any = false;
    for (int c = 0; c < NC; ++c) {
      bv[c] = bc[c][l];
      any |= bv[c] != 0.0f;
    }
    if (!any) continue;
    const T* row = reinterpret_cast<const T*>(a + static_cast<size_t>(l) * a_stride);
    __m256 av[NV];
    for (int v = 0; v < NV; ++v) av[v] = L::load(row + 8 * v);
    for (int c = 0; c < NC; ++c) {
      const __m256 b = _mm256_set1_ps(bv[c]);
      for (int v = 0; v < NV; ++v) acc[c][v] = _mm256_fmadd_ps(av[v], b, acc[c][v]);
    }
  }
  for (int c = 0; c < NC; ++c) {
    for (int v = 0; v < NV; ++v) _mm256_storeu_ps(out[c] + 8 * v, acc[c][v]);
  }
}

// Chunks of 16 values of each row (then one of 8, then single values by the same FMA chain) for up to 6
// columns at a time.
template <class L, bool Acc = false>
void mad_tile(int64_t k, int64_t m, int64_t ncols, const void* a, size_t a_stride, const void* b, size_t b_stride,
              float* s, size_t s_stride) {
  using T = typename L::T;
  constexpr int max_cols = 6;
  using fn = void (*)(int64_t, const char*, size_t, const float* const*, float* const*);
  static constexpr fn wide[max_cols] = {mad_cols<L, Acc, 1, 2>, mad_cols<L, Acc, 2, 2>, mad_cols<L, Acc, 3, 2>,
                                        mad_cols<L, Acc, 4, 2>, mad_cols<L, Acc, 5, 2>, mad_cols<L, Acc, 6, 2>};
  static constexpr fn narrow[max_cols] = {mad_cols<L, Acc, 1, 1>, mad_cols<L, Acc, 2, 1>, mad_cols<L, Acc, 3, 1>,
                                          mad_cols<L, Acc, 4, 1>, mad_cols<L, Acc, 5, 1>, mad_cols<L, Acc, 6, 1>};
  const char* ab = static_cast<const char*>(a);
  for (int64_t c0 = 0; c0 < ncols; c0 += max_cols) {
    const int nc = static_cast<int>(std::min<int64_t>(max_cols, ncols - c0));
    const float* bc[max_cols];
    float* out[max_cols];
    auto columns_at = [&](int64_t i0) {
      for (int c = 0; c < nc; ++c) {
        bc[c] = reinterpret_cast<const float*>(static_cast<const char*>(b) + static_cast<size_t>(c0 + c) * b_stride);
        out[c] = s + static_cast<size_t>(c0 + c) * s_stride + static_cast<size_t>(i0);
      }
    };
    int64_t i0 = 0;
    for (; i0 + 16 <= m; i0 += 16) {
      columns_at(i0);
      wide[nc - 1](k, ab + static_cast<size_t>(i0) * sizeof(T), a_stride, bc, out);
    }
    if (i0 + 8 <= m) {
      columns_at(i0);
      narrow[nc - 1](k, ab + static_cast<size_t>(i0) * sizeof(T), a_stride, bc, out);
      i0 += 8;
    }
    for (; i0 < m; ++i0) {
      columns_at(i0);
      for (int c = 0; c < nc; ++c) {
        float acc = Acc ? *out[c] : 0.0f;
        for (int64_t l = 0; l < k; ++l) {
          const float bv = bc[c][l];
          if (bv == 0.0f) continue;
          acc = std::fma(L::scalar(*reinterpret_cast<const T*>(ab + static_cast<size_t>(l) * a_stride +
                                                                 static_cast<size_t>(i0) * sizeof(T))),
                         bv, acc);
        }
        *out[c] = acc;
      }
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
void mad_tile_acc_f32(int64_t k, int64_t m, int64_t ncols, const void* a, size_t a_stride, const void* b, size_t b_stride,
                      float* s, size_t s_stride) {
  mad_tile<f32_loads, true>(k, m, ncols, a, a_stride, b, b_stride, s, s_stride);
}

// One row: float_tile's one-column kernel (rows one after another: one stream); tiles: float_tiles.
TROUPE_SIMD_TILE_BY(vec_dot_f32, f32_tile, (float_tiles<f32_loads, f32_loads>))
TROUPE_SIMD_TILE_BY(vec_dot_f16, f16_tile, (float_tiles<f16_loads, f32_loads>))
TROUPE_SIMD_TILE_BY(vec_dot_bf16, bf16_tile, (float_tiles<bf16_loads, bf16_loads>))

}  // namespace troupe::cpu::simd::avx2
