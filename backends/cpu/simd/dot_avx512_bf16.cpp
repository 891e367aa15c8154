// bf16 . bf16 with AVX512_BF16's vdpbf16ps: 32 pairs per instruction, each pair's two products added in
// f32 into one lane. Compiled with the avx512 flags plus -mavx512bf16.
//
// vdpbf16ps does not round the products (bf16 x bf16 is exact in f32) but flushes denormal inputs and
// outputs; bf16 values below 2^-126 are far outside what model weights and activations hold, and the sum
// stays within the conformance bounds.
#include "backends/cpu/simd/x86_common.h"
#include "backends/cpu/simd/x86_kernels.h"

namespace troupe::cpu::simd::avx512bf16 {

namespace {
// Same 64 bytes, seen as 32 bf16 (a vector cast, no instruction).
inline __m512bh as_bh(__m512i v) { return (__m512bh)v; }
}  // namespace

void vec_dot_bf16(int64_t n, float* s, const void* vx, const void* vy) {
  const uint16_t* x = static_cast<const uint16_t*>(vx);
  const uint16_t* y = static_cast<const uint16_t*>(vy);
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  int64_t i = 0;
  for (; i + 128 <= n; i += 128) {
    for (int j = 0; j < 4; ++j) {
      const __m512i a = _mm512_loadu_si512(x + i + 32 * j);
      const __m512i b = _mm512_loadu_si512(y + i + 32 * j);
      acc[j] = _mm512_dpbf16_ps(acc[j], as_bh(a), as_bh(b));
    }
  }
  for (; i < n; i += 32) {  // masked: the last pairs may be partial (zeros add nothing)
    const int64_t left = n - i;
    const __mmask32 m = left >= 32 ? ~__mmask32{0} : static_cast<__mmask32>((1u << left) - 1);
    const __m512i a = _mm512_maskz_loadu_epi16(m, x + i);
    const __m512i b = _mm512_maskz_loadu_epi16(m, y + i);
    acc[0] = _mm512_dpbf16_ps(acc[0], as_bh(a), as_bh(b));
  }
  *s = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
}

TROUPE_SIMD_ROWS(vec_dot_bf16)

}  // namespace troupe::cpu::simd::avx512bf16
