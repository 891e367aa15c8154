// Reference decoding of the K-quants (q2_K, q3_K, q4_K, q5_K, q6_K) and of q8_K, their activation format:
// dequantizers and exact integer dot products with q8_K.
//
// Layouts are documented in quants.h. Decoding goes through one unpack_* function per type (quants in value
// order, one scale per sub-block), shared by the dequantizer and the dot product, so both read the bits the
// same way. The quantizers, which share nothing with the decoders, are in quants_k_quantize.cpp.
#include <cassert>
#include <cstdint>

#include "runtime/quants.h"

namespace troupe {

namespace {

constexpr int qk = static_cast<int>(qk_k);  // 256

// ---- 2-bit fields of q2_K and q3_K: value 128 h + 32 k + l in bits 2k of qs[32 h + l]

inline void unpack_2bit(const uint8_t* qs, int8_t* q) {
  for (int h = 0; h < 2; ++h) {
    for (int k = 0; k < 4; ++k) {
      for (int l = 0; l < 32; ++l) q[128 * h + 32 * k + l] = static_cast<int8_t>((qs[32 * h + l] >> (2 * k)) & 3);
    }
  }
}

// ---- unpackers: quants in value order, per-sub-block integer scales ----

// q2_K: q in [0, 3]; sc, m: 16 sub-blocks of 16.
inline void unpack_q2_K(const block_q2_K& b, int8_t q[qk], int sc[16], int m[16]) {
  unpack_2bit(b.qs, q);
  for (int j = 0; j < 16; ++j) {
    sc[j] = b.scales[j] & 0xF;
    m[j] = b.scales[j] >> 4;
  }
}

// q3_K: q in [-4, 3]; sc in [-32, 31]: 16 sub-blocks of 16.
inline void unpack_q3_K(const block_q3_K& b, int8_t q[qk], int sc[16]) {
  unpack_2bit(b.qs, q);
  for (int v = 0; v < qk; ++v) {
    const int bit = (b.hmask[v % 32] >> (v / 32)) & 1;
    q[v] = static_cast<int8_t>(q[v] - (bit ? 0 : 4));
  }
  for (int j = 0; j < 16; ++j) sc[j] = q3_K_scale(b.scales, j) - 32;
}

// q4_K / q5_K scales and mins: 8 sub-blocks of 32.
inline void unpack_scale_min_k4(const uint8_t* scales, int sc[8], int m[8]) {
  for (int j = 0; j < 8; ++j) {
    uint8_t s8, m8;
    get_scale_min_k4(j, scales, &s8, &m8);
    sc[j] = s8;
    m[j] = m8;
  }
}

// q4_K: q in [0, 15].
void unpack_q4_K(const block_q4_K& b, int8_t* q, int* sc, int* m) {
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      q[64 * c + l] = static_cast<int8_t>(b.qs[32 * c + l] & 0xF);
      q[64 * c + 32 + l] = static_cast<int8_t>(b.qs[32 * c + l] >> 4);
    }
  }
  unpack_scale_min_k4(b.scales, sc, m);
}

// q5_K: q in [0, 31].
void unpack_q5_K(const block_q5_K& b, int8_t* q, int* sc, int* m) {
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      const int lo = b.qs[32 * c + l];
      const int hi = b.qh[l] >> (2 * c);
      q[64 * c + l] = static_cast<int8_t>((lo & 0xF) | ((hi & 1) << 4));
      q[64 * c + 32 + l] = static_cast<int8_t>((lo >> 4) | ((hi & 2) << 3));
    }
  }
  unpack_scale_min_k4(b.scales, sc, m);
}

// q6_K: q in [-32, 31].
inline void unpack_q6_K(const block_q6_K& b, int8_t q[qk]) {
  for (int h = 0; h < 2; ++h) {
    const uint8_t* ql = b.ql + 64 * h;
    const uint8_t* qh = b.qh + 32 * h;
    int8_t* out = q + 128 * h;
    for (int l = 0; l < 32; ++l) {
      out[l] = static_cast<int8_t>(((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32);
      out[l + 32] = static_cast<int8_t>(((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
      out[l + 64] = static_cast<int8_t>(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
      out[l + 96] = static_cast<int8_t>(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
    }
  }
}

// Sum of q[i] * r[i] over `len` values, exact.
inline int32_t int_dot(const int8_t* q, const int8_t* r, int len) {
  int32_t sum = 0;
  for (int i = 0; i < len; ++i) sum += static_cast<int32_t>(q[i]) * r[i];
  return sum;
}

}  // namespace

// ===================================== q2_K =============================================================

void dequantize_row_q2_K(const void* vx, float* y, int64_t n) {
  assert(n % qk == 0);
  const block_q2_K* x = static_cast<const block_q2_K*>(vx);
  const int64_t nb = n / qk;
  int8_t q[qk];
  int sc[16], m[16];
  for (int64_t i = 0; i < nb; ++i) {
    const float d = fp16_to_fp32(x[i].d);
    const float dmin = fp16_to_fp32(x[i].dmin);
    unpack_q2_K(x[i], q, sc, m);
    for (int j = 0; j < 16; ++j) {
      const float dl = d * sc[j];
      const float ml = dmin * m[j];
      for (int l = 0; l < 16; ++l) *y++ = dl * q[16 * j + l] - ml;
    }
  }
}

void vec_dot_q2_K_q8_K(int64_t n, float* s, const void* vx, const void* vy) {
  assert(n % qk == 0);
  const block_q2_K* x = static_cast<const block_q2_K*>(vx);
  const block_q8_K* y = static_cast<const block_q8_K*>(vy);
  const int64_t nb = n / qk;
  int8_t q[qk];
  int sc[16], m[16];
  double sum = 0.0;
  for (int64_t i = 0; i < nb; ++i) {
    unpack_q2_K(x[i], q, sc, m);
    int64_t isum = 0;  // sum_j sc_j * sum(q r)
    int64_t msum = 0;  // sum_j m_j * sum(r), the sums of r from bsums
    for (int j = 0; j < 16; ++j) {
      isum += static_cast<int64_t>(sc[j]) * int_dot(q + 16 * j, y[i].qs + 16 * j, 16);
      msum += static_cast<int64_t>(m[j]) * y[i].bsums[j];
    }
    const double dy = y[i].d;
    sum += dy * fp16_to_fp32(x[i].d) * static_cast<double>(isum) - dy * fp16_to_fp32(x[i].dmin) * static_cast<double>(msum);
  }
  *s = static_cast<float>(sum);
}

// ===================================== q3_K =============================================================

void dequantize_row_q3_K(const void* vx, float* y, int64_t n) {
  assert(n % qk == 0);
  const block_q3_K* x = static_cast<const block_q3_K*>(vx);
  const int64_t nb = n / qk;
  int8_t q[qk];
  int sc[16];
  for (int64_t i = 0; i < nb; ++i) {
    const float d = fp16_to_fp32(x[i].d);
    unpack_q3_K(x[i], q, sc);
    for (int j = 0; j < 16; ++j) {
      const float dl = d * sc[j];
      for (int l = 0; l < 16; ++l) *y++ = dl * q[16 * j + l];
    }
  }
}

void vec_dot_q3_K_q8_K(int64_t n, float* s, const void* vx, const void* vy) {
  assert(n % qk == 0);
  const block_q3_K* x = static_cast<const block_q3_K*>(vx);
  const block_q8_K* y = static_cast<const block_q8_K*>(vy);
  const int64_t nb = n / qk;
  int8_t q[qk];
  int sc[16];
  double sum = 0.0;
  for (int64_t i = 0; i < nb; ++i) {
    unpack_q3_K(x[i], q, sc);
    int64_t isum = 0;
    for (int j = 0; j < 16; ++j) isum += static_cast<int64_t>(sc[j]) * int_dot(q + 16 * j, y[i].qs + 16 * j, 16);
    sum += static_cast<double>(y[i].d) * fp16_to_fp32(x[i].d) * static_cast<double>(isum);
  }
  *s = static_cast<float>(sum);
}

// ===================================== q4_K / q5_K ======================================================

namespace {

// q4_K and q5_K share everything but the unpacking of the quants.
template <class block, void (*unpack)(const block&, int8_t*, int*, int*)>
void dequantize_k4(const void* vx, float* y, int64_t n) {
  assert(n % qk == 0);
  const block* x = static_cast<const block*>(vx);
  const int64_t nb = n / qk;
  int8_t q[qk];
  int sc[8], m[8];
  for (int64_t i = 0; i < nb; ++i) {
    const float d = fp16_to_fp32(x[i].d);
    const float dmin = fp16_to_fp32(x[i].dmin);
    unpack(x[i], q, sc, m);
    for (int j = 0; j < 8; ++j) {
      const float d1 = d * sc[j];
      const float m1 = dmin * m[j];
      for (int l = 0; l < 32; ++l) *y++ = d1 * q[32 * j + l] - m1;
    }
  }
}

// x = d sc_j q - dmin m_j per sub-block j of 32:  sum x r dy = dy (d sum_j sc_j sum(q r) - dmin sum_j m_j sum(r)).
template <class block, void (*unpack)(const block&, int8_t*, int*, int*)>
void vec_dot_k4(int64_t n, float* s, const void* vx, const void* vy) {
  assert(n % qk == 0);
  const block* x = static_cast<const block*>(vx);
  const block_q8_K* y = static_cast<const block_q8_K*>(vy);
  const int64_t nb = n / qk;
  int8_t q[qk];
  int sc[8], m[8];
  double sum = 0.0;
  for (int64_t i = 0; i < nb; ++i) {
    unpack(x[i], q, sc, m);
    int64_t isum = 0;
    int64_t msum = 0;
    for (int j = 0; j < 8; ++j) {
      isum += static_cast<int64_t>(sc[j]) * int_dot(q + 32 * j, y[i].qs + 32 * j, 32);
      msum += static_cast<int64_t>(m[j]) * (y[i].bsums[2 * j] + y[i].bsums[2 * j + 1]);
    }
    const double dy = y[i].d;
    sum += dy * fp16_to_fp32(x[i].d) * static_cast<double>(isum) - dy * fp16_to_fp32(x[i].dmin) * static_cast<double>(msum);
  }
  *s = static_cast<float>(sum);
}

}  // namespace

void dequantize_row_q4_K(const void* x, float* y, int64_t n) { dequantize_k4<block_q4_K, unpack_q4_K>(x, y, n); }
void dequantize_row_q5_K(const void* x, float* y, int64_t n) { dequantize_k4<block_q5_K, unpack_q5_K>(x, y, n); }

void vec_dot_q4_K_q8_K(int64_t n, float* s, const void* x, const void* y) { vec_dot_k4<block_q4_K, unpack_q4_K>(n, s, x, y); }
void vec_dot_q5_K_q8_K(int64_t n, float* s, const void* x, const void* y) { vec_dot_k4<block_q5_K, unpack_q5_K>(n, s, x, y); }

// ===================================== q6_K =============================================================

void dequantize_row_q6_K(const void* vx, float* y, int64_t n) {
  assert(n % qk == 0);
  const block_q6_K* x = static_cast<const block_q6_K*>(vx);
  const int64_t nb = n / qk;
  int8_t q[qk];
  for (int64_t i = 0; i < nb; ++i) {
    const float d = fp16_to_fp32(x[i].d);
    unpack_q6_K(x[i], q);
    for (int j = 0; j < 16; ++j) {
      const float dl = d * x[i].scales[j];
      for (int l = 0; l < 16; ++l) *y++ = dl * q[16 * j + l];
    }
  }
}

void vec_dot_q6_K_q8_K(int64_t n, float* s, const void* vx, const void* vy) {
  assert(n % qk == 0);
  const block_q6_K* x = static_cast<const block_q6_K*>(vx);
  const block_q8_K* y = static_cast<const block_q8_K*>(vy);
  const int64_t nb = n / qk;
  int8_t q[qk];
  double sum = 0.0;
  for (int64_t i = 0; i < nb; ++i) {
    unpack_q6_K(x[i], q);
    int64_t isum = 0;
    for (int j = 0; j < 16; ++j) isum += static_cast<int64_t>(x[i].scales[j]) * int_dot(q + 16 * j, y[i].qs + 16 * j, 16);
    sum += static_cast<double>(y[i].d) * fp16_to_fp32(x[i].d) * static_cast<double>(isum);
  }
  *s = static_cast<float>(sum);
}

// ===================================== q8_K =============================================================

void dequantize_row_q8_K(const void* vx, float* y, int64_t n) {
  assert(n % qk == 0);
  const block_q8_K* x = static_cast<const block_q8_K*>(vx);
  const int64_t nb = n / qk;
  for (int64_t i = 0; i < nb; ++i) {
    for (int v = 0; v < qk; ++v) *y++ = x[i].d * x[i].qs[v];
  }
}

void vec_dot_q8_K_q8_K(int64_t n, float* s, const void* vx, const void* vy) {
  assert(n % qk == 0);
  const block_q8_K* x = static_cast<const block_q8_K*>(vx);
  const block_q8_K* y = static_cast<const block_q8_K*>(vy);
  const int64_t nb = n / qk;
  double sum = 0.0;
  for (int64_t i = 0; i < nb; ++i) {
    sum += static_cast<double>(x[i].d) * y[i].d * static_cast<double>(int_dot(x[i].qs, y[i].qs, qk));
  }
  *s = static_cast<float>(sum);
}

}  // namespace troupe
