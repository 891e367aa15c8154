// AVX-512 (F) kernels of float weights (f32, f16) against f32 activations: dot products in register tiles
// of up to 4 weight rows x 6 activation rows (float_gemm), one accumulator per element, the tail with
// masked loads; and the column products of mad_tile.h (attention's V times the softmax weights).
// Compiled with -mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni
// (troupe_avx512_flags in backends/cpu/CMakeLists.txt), like the other dot_avx512*.cpp files.
//
// Separate from dot_avx512.cpp (the quantized block types): float weights need no decoding, and these
// kernels share only the horizontal sums of avx512_reduce.h with the others.
#include <algorithm>

#include "backends/cpu/simd/avx512_reduce.h"
#include "backends/cpu/simd/x86_common.h"
#include "backends/cpu/simd/x86_kernels.h"

namespace troupe::cpu::simd::avx512 {

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

// Column products (mad_tile.h): register tiles of up to 6 columns of b x NV vectors of 16 of a's values (up to
// 64: NV zmm accumulators per column, the last one masked to w's tail), a row of a loaded (converted) once for
// the columns, each b value broadcast; rows whose b values of the tile are all 0 are skipped (each would add
// exactly nothing to every element); a single column's 0 is not: its FMA adds exactly +-0 to a chain that is
// never -0 (a is finite), the value the column gets alone. The rows mad_prefetch ahead are fetched on the way:
// the attention's V rows are a head's slice of each cell's row, a few lines per page, which the stream
// prefetchers do not run ahead of. Acc: each chain starts from out's value instead of +0 (mad_tile_acc_f32).
template <class LX, bool Acc, int NC, int NV>
void mad_cols(int64_t k, int64_t w, const char* a, size_t a_stride, const float* const* bc, float* const* out) {
  using T = typename LX::T;
  const __mmask16 tail = static_cast<__mmask16>(w % 16 == 0 ? 0xFFFF : (1u << (w % 16)) - 1);
  const size_t row_bytes = static_cast<size_t>(w) * sizeof(T);
  __m512 acc[NC][NV];
  for (int c = 0; c < NC; ++c) {
    for (int v = 0; v < NV; ++v) {
      if constexpr (Acc) {
        acc[c][v] = v + 1 < NV ? _mm512_loadu_ps(out[c] + 16 * v) : _mm512_maskz_loadu_ps(tail, out[c] + 16 * v);
      } else {
        acc[c][v] = _mm512_setzero_ps();
      }
    }
  }
  for (int64_t l = 0; l < k; ++l) {
    if (l + mad_prefetch < k) prefetch_span(a + static_cast<size_t>(l + mad_prefetch) * a_stride, row_bytes);
    float bv[NC];
    bool any = false;
    for (int c = 0; c < NC; ++c) {
      bv[c] = bc[c][l];
      any |= bv[c] != 0.0f;
    }
    if (!any) continue;
    const T* row = reinterpret_cast<const T*>(a + static_cast<size_t>(l) * a_stride);
    __m512 av[NV];
    for (int v = 0; v < NV; ++v) av[v] = v + 1 < NV ? LX::load(row + 16 * v) : LX::load_tail(row + 16 * v, tail);
    for (int c = 0; c < NC; ++c) {
      const __m512 b = _mm512_set1_ps(bv[c]);
      for (int v = 0; v < NV; ++v) acc[c][v] = _mm512_fmadd_ps(av[v], b, acc[c][v]);
    }
  }
  for (int c = 0; c < NC; ++c) {
    for (int v = 0; v < NV; ++v) {
      if (v + 1 < NV) _mm512_storeu_ps(out[c] + 16 * v, acc[c][v]);
      else _mm512_mask_storeu_ps(out[c] + 16 * v, tail, acc[c][v]);
    }
  }
}

template <class LX, bool Acc, int NC>
void mad_cols_w(int64_t k, int64_t w, const char* a, size_t a_stride, const float* const* bc, float* const* out) {
  switch ((w + 15) / 16) {
    case 1: mad_cols<LX, Acc, NC, 1>(k, w, a, a_stride, bc, out); break;
    case 2: mad_cols<LX, Acc, NC, 2>(k, w, a, a_stride, bc, out); break;
    case 3: mad_cols<LX, Acc, NC, 3>(k, w, a, a_stride, bc, out); break;
    default: mad_cols<LX, Acc, NC, 4>(k, w, a, a_stride, bc, out); break;
  }
}

template <class LX, bool Acc = false>
void mad_tile(int64_t k, int64_t m, int64_t ncols, const void* a, size_t a_stride, const void* b, size_t b_stride,
              float* s, size_t s_stride) {
  constexpr int64_t chunk = 64;
  constexpr int max_cols = 6;
  using fn = void (*)(int64_t, int64_t, const char*, size_t, const float* const*, float* const*);
  static constexpr fn by_cols[max_cols] = {mad_cols_w<LX, Acc, 1>, mad_cols_w<LX, Acc, 2>, mad_cols_w<LX, Acc, 3>,
                                           mad_cols_w<LX, Acc, 4>, mad_cols_w<LX, Acc, 5>, mad_cols_w<LX, Acc, 6>};
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
void mad_tile_acc_f32(int64_t k, int64_t m, int64_t ncols, const void* a, size_t a_stride, const void* b, size_t b_stride,
                      float* s, size_t s_stride) {
  mad_tile<f32_loads, true>(k, m, ncols, a, a_stride, b, b_stride, s, s_stride);
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
