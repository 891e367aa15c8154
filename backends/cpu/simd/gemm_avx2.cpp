// q8_0, q4_K and q6_K dot products, tiles and GEMMs for the avx2 level: AVX2 + FMA + F16C (maddubs + madd; 8 weight
// rows per GEMM tile).
// The kernels are in q8_0_x86.inc, q4_K_x86.inc and q6_K_x86.inc, shared with the other level, so both compute every element
// the same way.
#include <array>
#include <utility>

#include "backends/cpu/simd/x86_common.h"
#include "backends/cpu/simd/x86_kernels.h"

namespace troupe::cpu::simd::avx2 {

#include "backends/cpu/simd/q8_0_x86.inc"
#include "backends/cpu/simd/q4_K_x86.inc"
#include "backends/cpu/simd/q6_K_x86.inc"

}  // namespace troupe::cpu::simd::avx2
