// What the CUDA kernels' code and the host share: functions marked TROUPE_HD compile for the device under
// nvcc and for the host under any C++ compiler, so that the host tests run the very code the kernels run
// (tests/backends/cuda: every kernel body on the conformance table, without a GPU).
//
//   TROUPE_HD float f = half_to_float(h);   // __half2float on the device, troupe::fp16_to_fp32 on the host
//   TROUPE_HD int s = dp4a(a, b, c);        // __dp4a on the device, four byte products on the host
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#define TROUPE_HD __host__ __device__
#else
#define TROUPE_HD
#endif

#if !defined(__CUDA_ARCH__)
#include <cmath>
#include <cstring>

#include "runtime/fp16.h"
#endif

namespace troupe::cuda::kern {

TROUPE_HD inline float bits_to_float(uint32_t w) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(w);
#else
  float f;
  std::memcpy(&f, &w, sizeof f);
  return f;
#endif
}

TROUPE_HD inline uint32_t float_to_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t w;
  std::memcpy(&w, &f, sizeof w);
  return w;
#endif
}

// IEEE binary16 <-> f32 (round to nearest even), bit-identical on both sides.
TROUPE_HD inline float half_to_float(uint16_t h) {
#if defined(__CUDA_ARCH__)
  return __half2float(__ushort_as_half(h));
#else
  return fp16_to_fp32(h);
#endif
}

TROUPE_HD inline uint16_t float_to_half(float f) {
#if defined(__CUDA_ARCH__)
  return __half_as_ushort(__float2half_rn(f));
#else
  return fp32_to_fp16(f);
#endif
}

TROUPE_HD inline float bf16_to_float(uint16_t h) { return bits_to_float(static_cast<uint32_t>(h) << 16); }

// Round to nearest even; a NaN stays a quiet NaN (as runtime/fp16.h).
TROUPE_HD inline uint16_t float_to_bf16(float f) {
  const uint32_t u = float_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 64u);
  return static_cast<uint16_t>((u + (0x7fffu + ((u >> 16) & 1u))) >> 16);
}

// Sum of the four signed byte products of a and b, plus c.
TROUPE_HD inline int dp4a(int a, int b, int c) {
#if defined(__CUDA_ARCH__)
  return __dp4a(a, b, c);
#else
  for (int k = 0; k < 4; ++k) {
    c += static_cast<int>(static_cast<int8_t>(static_cast<uint32_t>(a) >> (8 * k))) *
         static_cast<int>(static_cast<int8_t>(static_cast<uint32_t>(b) >> (8 * k)));
  }
  return c;
#endif
}

// Byte-wise a - b, each byte wrapping on its own (no borrow into the next).
TROUPE_HD inline int vsub4(int a, int b) {
#if defined(__CUDA_ARCH__)
  return static_cast<int>(__vsub4(static_cast<unsigned>(a), static_cast<unsigned>(b)));
#else
  uint32_t r = 0;
  for (int k = 0; k < 4; ++k) {
    const uint32_t x = (static_cast<uint32_t>(a) >> (8 * k)) & 0xffu;
    const uint32_t y = (static_cast<uint32_t>(b) >> (8 * k)) & 0xffu;
    r |= ((x - y) & 0xffu) << (8 * k);
  }
  return static_cast<int>(r);
#endif
}

// 32 bits at a 2-byte aligned address (quantized blocks put their quants at even, not 4-aligned, offsets).
TROUPE_HD inline int load_i32_2(const uint8_t* p) {
  const auto* h = reinterpret_cast<const uint16_t*>(p);
  return static_cast<int>(static_cast<uint32_t>(h[0]) | (static_cast<uint32_t>(h[1]) << 16));
}

TROUPE_HD inline float silu(float x) { return x / (1.0f + expf(-x)); }

// The tanh approximation, as the CPU computes it (tanh is 1 to float precision beyond |u| = 10).
TROUPE_HD inline float gelu(float x) {
  const float sqrt_2_over_pi = 0.79788456080286535587989211986876f;
  const float u = fminf(fmaxf(sqrt_2_over_pi * x * (1.0f + 0.044715f * x * x), -10.0f), 10.0f);
  return 0.5f * x * (1.0f + tanhf(u));
}

}  // namespace troupe::cuda::kern
