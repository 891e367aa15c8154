// AVX2 + FMA + F16C dot products of the plain float types and the 32-value block types against their
// activation formats (f32 / f16 / bf16 as is, q8_0, q8_1). Compiled with -mavx2 -mfma -mf16c only.
#include <type_traits>

#include "backends/cpu/simd/x86_common.h"
#include "backends/cpu/simd/x86_kernels.h"

namespace troupe::cpu::simd::avx2 {

#include "backends/cpu/simd/dot_blocks_x86.inc"  // q4_0, q4_1, q5_0, q5_1, q8_0

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

template <class T, __m256 (*load)(const T*), float (*scalar)(T)>
float dot_floats(int64_t n, const void* vx, const void* vy) {
  const T* x = static_cast<const T*>(vx);
  const T* y = static_cast<const T*>(vy);
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    for (int j = 0; j < 4; ++j) acc[j] = _mm256_fmadd_ps(load(x + i + 8 * j), load(y + i + 8 * j), acc[j]);
  }
  for (; i + 8 <= n; i += 8) acc[0] = _mm256_fmadd_ps(load(x + i), load(y + i), acc[0]);
  float sum = hsum(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
  for (; i < n; ++i) sum += scalar(x[i]) * scalar(y[i]);
  return sum;
}

}  // namespace

void vec_dot_f32(int64_t n, float* s, const void* x, const void* y) {
  *s = dot_floats<float, load_f32, scalar_f32>(n, x, y);
}
void vec_dot_f16(int64_t n, float* s, const void* x, const void* y) {
  *s = dot_floats<uint16_t, load_f16, scalar_f16>(n, x, y);
}
void vec_dot_bf16(int64_t n, float* s, const void* x, const void* y) {
  *s = dot_floats<uint16_t, load_bf16, scalar_bf16>(n, x, y);
}

TROUPE_SIMD_ROWS(vec_dot_f32)
TROUPE_SIMD_ROWS(vec_dot_f16)
TROUPE_SIMD_ROWS(vec_dot_bf16)

}  // namespace troupe::cpu::simd::avx2
