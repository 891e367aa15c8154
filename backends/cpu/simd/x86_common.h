// Helpers shared by the x86 SIMD translation units (dot_*.cpp, quantize_*.cpp). Include only from files
// compiled with at least -mavx2 -mfma -mf16c.
//
// ODR hazard, and why everything here is in an anonymous namespace: these files are compiled with target
// flags the rest of the program is not. An inline function with external linkage (a header's inline helper,
// a std:: template) that is instantiated here may be emitted with AVX-512 instructions and then picked by
// the linker for *every* caller, including scalar code on a CPU without AVX-512. So SIMD files define their
// helpers with internal linkage, convert fp16 with F16C intrinsics rather than runtime/fp16.h, and call no
// std:: functions except memcpy (a builtin).
#pragma once

#if !defined(__x86_64__)
#error "x86_common.h is for x86-64 SIMD translation units only"
#endif

// GCC 12's AVX-512 headers initialize "undefined" registers from themselves (_mm512_undefined_*), which
// -Wuninitialized reports at every use after inlining (GCC bug 105593, fixed in GCC 13).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#include <array>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "runtime/quants.h"     // block layouts only; their inline functions are not used here (compiled
#include "runtime/quants_iq.h"  // with this file's -m flags, the linker could keep that copy for every caller)
#include "runtime/quants_iq_low.h"
#include "runtime/quants_mx.h"

namespace troupe::cpu::simd {
namespace {

inline float h2f(uint16_t h) { return _cvtsh_ss(h); }

// Sum of the 8 floats of v.
inline float hsum(__m256 v) {
  __m128 r = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  r = _mm_add_ps(r, _mm_movehl_ps(r, r));
  r = _mm_add_ss(r, _mm_movehdup_ps(r));
  return _mm_cvtss_f32(r);
}

// Sum of the 8 int32 of v.
inline int32_t hsum_i32(__m256i v) {
  __m128i r = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  r = _mm_add_epi32(r, _mm_shuffle_epi32(r, _MM_SHUFFLE(1, 0, 3, 2)));
  r = _mm_add_epi32(r, _mm_shuffle_epi32(r, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(r);
}

inline __m256i load256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
inline __m128i load128(const void* p) { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }

// The 32 4-bit quants of a q4_0 / q4_1 block (16 bytes) as 32 bytes in value order: byte j < 16 is the low
// nibble of qs[j], byte j + 16 its high nibble.
inline __m256i nibbles_32(const uint8_t* qs) {
  const __m128i t = load128(qs);
  const __m256i b = _mm256_set_m128i(_mm_srli_epi16(t, 4), t);  // 16-bit shift: the mask drops what crosses
  return _mm256_and_si256(b, _mm256_set1_epi8(0x0F));
}

// The 32 bits of a q5 qh field as 32 bytes, 0xFF where bit j is set. Each byte j first gets byte j / 8 of
// the field (shuffle), then all bits but bit j % 8 are forced to 1 (or with a per-byte mask); a byte is all
// ones exactly when its bit was set.
inline __m256i bytes_from_bits_32(const uint8_t* qh) {
  uint32_t x32;
  std::memcpy(&x32, qh, sizeof x32);
  const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
  __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(x32)), shuf);
  bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
  return _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1));
}

// The iq4_nl / iq4_xs codebook in both 128-bit lanes: _mm256_shuffle_epi8(codebook, nibbles) decodes quants.
inline __m256i iq4_codebook() {
  return _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(iq4nl_values)));
}

// The mxfp4 values (E2M1 doubled) in both 128-bit lanes, and the scale of an E8M0 byte (mxfp4_scale).
inline __m256i mxfp4_codebook() {
  return _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(mxfp4_values)));
}
inline float e8m0_half(uint8_t e) {
  const uint32_t bits = e < 2 ? (0x00200000u << e) : (static_cast<uint32_t>(e - 1) << 23);
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Sums of u[i] * s[i] (u unsigned bytes, s signed bytes) over groups of 4 bytes: 8 int32. Exact for our
// operands: maddubs adds two products into a saturating int16, and |u * s| * 2 stays below 2^15 for every
// quant range used here (u <= 128 with |s| <= 127, or u <= 63 with |s| <= 128).
inline __m256i dot_us8(__m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

// Byte shuffles that broadcast 16-bit scales for the K-quant kernels (see dot_avx2.cpp).
// shuffle_i16(i): a 128-bit shuffle that copies int16 element i of a lane into all 8 int16 of the lane.
inline __m128i shuffle_i16(int i) {
  const char lo = static_cast<char>(2 * i), hi = static_cast<char>(2 * i + 1);
  return _mm_set_epi8(hi, lo, hi, lo, hi, lo, hi, lo, hi, lo, hi, lo, hi, lo, hi, lo);
}

// k4_shuffle(i): int16 element i into all 16 int16 of a 256-bit register (both lanes hold the same scales).
inline __m256i k4_shuffle(int i) { return _mm256_set_m128i(shuffle_i16(i), shuffle_i16(i)); }

// k16_shuffle(i): int16 element 2i into the low lane and element 2i + 1 into the high lane: the scales of two
// consecutive 16-value sub-blocks against the 32 values (16 int16 pair sums) of one 256-bit register.
inline __m256i k16_shuffle(int i) { return _mm256_set_m128i(shuffle_i16(2 * i + 1), shuffle_i16(2 * i)); }

// The 8 6-bit scales and 8 6-bit mins of a q4_K / q5_K block as 16 int16 (scales 0..7, then mins 0..7).
// Rearranges the 12 packed bytes so that each group of 4 bytes holds 4 whole values (see
// get_scale_min_k4 in runtime/quants.h for the packing).
inline __m256i k4_scales_mins(const uint8_t packed[12]) {
  constexpr uint32_t kmask1 = 0x3f3f3f3f, kmask2 = 0x0f0f0f0f, kmask3 = 0x03030303;
  uint32_t u[4];
  std::memcpy(u, packed, 12);
  u[3] = ((u[2] >> 4) & kmask2) | (((u[1] >> 6) & kmask3) << 4);  // mins 4..7
  const uint32_t mins_lo = u[1] & kmask1;                           // mins 0..3
  u[1] = (u[2] & kmask2) | (((u[0] >> 6) & kmask3) << 4);           // scales 4..7
  u[2] = mins_lo;
  u[0] &= kmask1;                                                   // scales 0..3
  return _mm256_cvtepu8_epi16(_mm_set_epi32(static_cast<int>(u[3]), static_cast<int>(u[2]), static_cast<int>(u[1]),
                                            static_cast<int>(u[0])));
}

// Software prefetch for weights streamed from memory (matrix-vector products): a kernel that has just read
// the `bytes` bytes at p asks for the lines stream_distance bytes further on, about one prefetch per 64 bytes.
// On the development machine's Zen 3 cores one core reads an f16 stream at ~12.5 GB/s with the hardware
// prefetchers alone and at ~17 GB/s with this (a plain convert-and-FMA loop over 256 MiB); the rows of a
// weight matrix lie one after another, so the lines asked for are the next rows' once a row ends. A kernel
// may ask from further on (distance).
constexpr int stream_distance = 1024;

template <int bytes, int distance = stream_distance>
inline void stream_ahead(const void* p) {
  constexpr int lines = bytes + 32 < 64 ? 1 : (bytes + 32) / 64;  // bytes / 64, rounded
  const char* c = static_cast<const char*>(p) + distance;
  for (int l = 0; l < lines; ++l) _mm_prefetch(c + 64 * l, _MM_HINT_T0);
}

// Software prefetch of one strided row (the mad kernels' V rows, a head's slice of each cell's row, a few lines
// per page, which the stream prefetchers do not run ahead of): every line of [p, p + bytes).
inline void prefetch_span(const char* p, size_t bytes) {
  for (size_t off = 0; off < bytes; off += 64) _mm_prefetch(p + off, _MM_HINT_T0);
  _mm_prefetch(p + bytes - 1, _MM_HINT_T0);
}
// Cells (rows) ahead that the mad kernels (dot_avx2.cpp, dot_avx512_float.cpp) fetch.
constexpr int64_t mad_prefetch = 24;

// Register-tile GEMMs of float weights (float_gemm in dot_avx2.cpp and dot_avx512_float.cpp): K::run<rm, rn>(n, x,
// x_stride, y, y_stride, s, s_stride) computes rm weight rows x rn activation rows.
// gemm_table<K, RM, RN>[rm - 1][rn - 1] is K::run<rm, rn> for rm <= RM, rn <= RN.
using gemm_fn = void (*)(int64_t, const char*, size_t, const char*, size_t, float*, size_t);

template <class K, int RM, int... RN>
constexpr std::array<gemm_fn, sizeof...(RN)> gemm_row_of(std::integer_sequence<int, RN...>) {
  return {&K::template run<RM, RN + 1>...};
}
template <class K, int NRN, int... RM>
constexpr std::array<std::array<gemm_fn, NRN>, sizeof...(RM)> gemm_table_of(std::integer_sequence<int, RM...>) {
  return {gemm_row_of<K, RM + 1>(std::make_integer_sequence<int, NRN>{})...};
}
template <class K, int RM, int RN>
constexpr auto gemm_table = gemm_table_of<K, RN>(std::make_integer_sequence<int, RM>{});

// s[c * s_stride + r] = dot(row r of x, row c of y) for r < nrows, c < ncols, by K's register tiles: for each
// group of rows_per (<= RM) weight rows, every group of RN activation rows.
template <class K, int RM, int RN>
void gemm_tiles(int64_t n, int64_t nrows, int64_t ncols, int64_t rows_per, float* s, size_t s_stride, const void* x,
                size_t x_stride, const void* y, size_t y_stride) {
  const char* xb = static_cast<const char*>(x);
  const char* yb = static_cast<const char*>(y);
  for (int64_t r0 = 0; r0 < nrows; r0 += rows_per) {
    const int64_t rm = nrows - r0 < rows_per ? nrows - r0 : rows_per;
    for (int64_t c0 = 0; c0 < ncols; c0 += RN) {
      const int64_t rn = ncols - c0 < RN ? ncols - c0 : RN;
      gemm_table<K, RM, RN>[static_cast<size_t>(rm - 1)][static_cast<size_t>(rn - 1)](
          n, xb + static_cast<size_t>(r0) * x_stride, x_stride, yb + static_cast<size_t>(c0) * y_stride, y_stride,
          s + static_cast<size_t>(c0) * s_stride + static_cast<size_t>(r0), s_stride);
    }
  }
}

// s[r] = dot(row r of x, y) for r < nrows, rows x_stride bytes apart. flatten is meant to inline the dot
// function into the loop, so that the per-row call and the setup of its constants go away (that matters for
// short rows, k = 576: 18 blocks per row); GCC 12 keeps the call through the function-pointer argument,
// though. dot_rows_k below, for the types with tile kernels, does inline its kernel.
template <void (*dot)(int64_t, float*, const void*, const void*)>
__attribute__((flatten)) void dot_rows(int64_t n, int64_t nrows, float* s, const void* x, size_t x_stride,
                                       const void* y) {
  const char* row = static_cast<const char*>(x);
  for (int64_t r = 0; r < nrows; ++r, row += x_stride) dot(n, s + r, row, y);
}

// Batched dot products, for matrix products with a few activation rows (token generation of several
// sequences at once): K::run<NC>(n, x, ys, out) sets out[c] = dot(n, x, ys[c]) for NC (1..4) activation rows,
// a register tile of NC dot products of one weight row: each weight block is loaded and decoded once for
// the NC rows. Per element it performs exactly the floating-point operations of K::run<1>, which is what the
// one-row vec_dot calls, so every element is bit-identical to vec_dot's whatever the batch. (Tiles over
// several weight rows as well computed faster from cache but read weights streamed from memory at a
// fraction of the speed; see the pair kernels in dot_avx512.cpp.)
//
// dot_tile<K>: s[c * s_stride + r] = dot(row r of x, row c of y) for r < nrows, c < ncols; rows of x
// x_stride bytes apart, rows of y y_stride bytes apart. Each row of x is read once from memory and reused
// (from L1) for every group of up to 4 columns (see the blocks below).
constexpr int tile_max_cols = 4;
constexpr size_t tile_x_block = 16 * 1024;  // bytes of x's rows reused from L1 over the groups of columns

// A kernel struct may take 8 columns at once instead of 4: K::max_cols where it says so.
template <class K, class = void>
struct tile_cols_of {
  static constexpr int value = tile_max_cols;
};
template <class K>
struct tile_cols_of<K, std::void_t<decltype(K::max_cols)>> {
  static constexpr int value = K::max_cols;
};

template <class K>
__attribute__((flatten)) void dot_tile(int64_t n, int64_t nrows, int64_t ncols, float* s, size_t s_stride,
                                       const void* x, size_t x_stride, const void* y, size_t y_stride) {
  const char* yb = static_cast<const char*>(y);
  // Rows of x in blocks of about tile_x_block bytes; within a block, each group of columns runs over all its
  // rows, so the block's rows come from memory once and from L1 for the next groups, and a group's rows of y
  // are read from L1 for every row of the block (row by row over every group, y's rows came from L2 each time).
  constexpr int max_cols = tile_cols_of<K>::value;
  static_assert(max_cols == 4 || max_cols == 8);
  const int64_t block = x_stride >= tile_x_block ? 1 : static_cast<int64_t>(tile_x_block / x_stride);
  for (int64_t r0 = 0; r0 < nrows; r0 += block) {
    const int64_t r1 = nrows - r0 < block ? nrows : r0 + block;
    for (int64_t c0 = 0; c0 < ncols; c0 += max_cols) {
      const int nc = static_cast<int>(ncols - c0 < max_cols ? ncols - c0 : max_cols);
      const void* ys[max_cols] = {};
      for (int c = 0; c < nc; ++c) ys[c] = yb + static_cast<size_t>(c0 + c) * y_stride;
      const char* row = static_cast<const char*>(x) + static_cast<size_t>(r0) * x_stride;
      for (int64_t r = r0; r < r1; ++r, row += x_stride) {
        float out[max_cols];
        if constexpr (max_cols > 4) {
          switch (nc) {
            case 1: K::template run<1>(n, row, ys, out); break;
            case 2: K::template run<2>(n, row, ys, out); break;
            case 3: K::template run<3>(n, row, ys, out); break;
            case 4: K::template run<4>(n, row, ys, out); break;
            case 5: K::template run<5>(n, row, ys, out); break;
            case 6: K::template run<6>(n, row, ys, out); break;
            case 7: K::template run<7>(n, row, ys, out); break;
            default: K::template run<8>(n, row, ys, out); break;
          }
        } else {
          switch (nc) {
            case 1: K::template run<1>(n, row, ys, out); break;
            case 2: K::template run<2>(n, row, ys, out); break;
            case 3: K::template run<3>(n, row, ys, out); break;
            default: K::template run<4>(n, row, ys, out); break;
          }
        }
        for (int c = 0; c < nc; ++c) s[static_cast<size_t>(c0 + c) * s_stride + static_cast<size_t>(r)] = out[c];
      }
    }
  }
}

// s[r] = dot(row r of x, y) for r < nrows with K's one-row kernel (K::run<1>), for the types that have tile
// kernels: the name_rows of those types.
template <class K>
__attribute__((flatten)) void dot_rows_k(int64_t n, int64_t nrows, float* s, const void* x, size_t x_stride,
                                         const void* y) {
  const char* row = static_cast<const char*>(x);
  for (int64_t r = 0; r < nrows; ++r, row += x_stride) K::template run<1>(n, row, &y, s + r);
}

}  // namespace
}  // namespace troupe::cpu::simd

// Defines name(n, s, x, y), name_rows(...) and name_tile(n, nrows, ncols, s, s_stride, x, x_stride, y,
// y_stride) from the kernel struct K (see dot_tile), in the current namespace; TROUPE_SIMD_TILE_BY takes
// the tile function (a template instance with dot_tile's parameters) instead of dot_tile<K>.
#define TROUPE_SIMD_TILE_BY(name, K, tile_fn)                                                                \
  void name(int64_t n, float* s, const void* x, const void* y) { K::template run<1>(n, x, &y, s); }         \
  void name##_rows(int64_t n, int64_t nrows, float* s, const void* x, size_t x_stride, const void* y) {     \
    dot_rows_k<K>(n, nrows, s, x, x_stride, y);                                                             \
  }                                                                                                          \
  void name##_tile(int64_t n, int64_t nrows, int64_t ncols, float* s, size_t s_stride, const void* x,       \
                   size_t x_stride, const void* y, size_t y_stride) {                                      \
    tile_fn(n, nrows, ncols, s, s_stride, x, x_stride, y, y_stride);                                        \
  }
#define TROUPE_SIMD_TILE(name, K) TROUPE_SIMD_TILE_BY(name, K, dot_tile<K>)

// Defines name_rows(n, nrows, s, x, x_stride, y) from name(n, s, x, y), both in the current namespace.
#define TROUPE_SIMD_ROWS(name)                                                                            \
  void name##_rows(int64_t n, int64_t nrows, float* s, const void* x, size_t x_stride, const void* y) { \
    dot_rows<name>(n, nrows, s, x, x_stride, y);                                                          \
  }
