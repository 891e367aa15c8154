// Reference dequantization and dot products of the i-quants below 4 bits (see quants_iq_low.h). Each type
// decodes a block into 32 groups of 8 values (grid values with their signs, the group's odd scale numerator
// and iq1's shift), and the dequantizer and the dot product share that decoding.
#include "runtime/quants_iq_low.h"

#include <cstring>

#include "runtime/quants.h"

namespace troupe {

namespace {

struct group8 {
  int8_t v[8];
  int num;     // odd scale numerator
  int delta;   // iq1's shift in eighths: -1, 0 or +1
};

struct decoded {
  float d;      // the block's scale
  float unit;   // the type's constant factor
  group8 g[qk_k / 8];
};

void signed_values(const uint8_t* grid, int n, uint8_t signs, int first_bit, int8_t* out) {
  for (int j = 0; j < n; ++j) {
    const int v = grid[j];
    out[j] = static_cast<int8_t>((signs >> (first_bit + j)) & 1 ? -v : v);
  }
}

uint32_t u32_at(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

uint16_t u16_at(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

void decode(const block_iq2_xxs& b, decoded& o) {
  o.d = fp16_to_fp32(b.d);
  o.unit = 0.125f;
  const auto* q = reinterpret_cast<const uint8_t*>(b.qs);
  for (int ib = 0; ib < qk_k / 32; ++ib) {
    const uint8_t* idx = q + 8 * ib;
    const uint32_t aux = u32_at(q + 8 * ib + 4);
    for (int l = 0; l < 4; ++l) {
      group8& g = o.g[4 * ib + l];
      signed_values(iq_grids::iq2xxs[idx[l]], 8, iq_grids::ksigns_iq2xs[(aux >> (7 * l)) & 127], 0, g.v);
      g.num = 2 * static_cast<int>(aux >> 28) + 1;
      g.delta = 0;
    }
  }
}

void decode(const block_iq2_xs& b, decoded& o) {
  o.d = fp16_to_fp32(b.d);
  o.unit = 0.125f;
  const auto* q = reinterpret_cast<const uint8_t*>(b.qs);
  for (int l = 0; l < qk_k / 8; ++l) {
    const uint16_t v = u16_at(q + 2 * l);
    group8& g = o.g[l];
    signed_values(iq_grids::iq2xs[v & 511], 8, iq_grids::ksigns_iq2xs[v >> 9], 0, g.v);
    g.num = 2 * ((b.scales[l / 4] >> (4 * ((l % 4) / 2))) & 0xF) + 1;
    g.delta = 0;
  }
}

void decode(const block_iq2_s& b, decoded& o) {
  o.d = fp16_to_fp32(b.d);
  o.unit = 0.125f;
  for (int l = 0; l < qk_k / 8; ++l) {
    const int ib = l / 4, k = l % 4;
    const int idx = b.qs[l] | (((b.qh[ib] >> (2 * k)) & 3) << 8);
    group8& g = o.g[l];
    signed_values(iq_grids::iq2s[idx], 8, b.signs[l], 0, g.v);
    g.num = 2 * ((b.scales[ib] >> (4 * (k / 2))) & 0xF) + 1;
    g.delta = 0;
  }
}

void decode(const block_iq3_xxs& b, decoded& o) {
  o.d = fp16_to_fp32(b.d);
  o.unit = 0.25f;
  for (int ib = 0; ib < qk_k / 32; ++ib) {
    const uint32_t aux = u32_at(b.qs + qk_k / 4 + 4 * ib);
    for (int l = 0; l < 4; ++l) {
      group8& g = o.g[4 * ib + l];
      const uint8_t signs = iq_grids::ksigns_iq2xs[(aux >> (7 * l)) & 127];
      signed_values(iq_grids::iq3xxs[b.qs[8 * ib + 2 * l]], 4, signs, 0, g.v);
      signed_values(iq_grids::iq3xxs[b.qs[8 * ib + 2 * l + 1]], 4, signs, 4, g.v + 4);
      g.num = 2 * static_cast<int>(aux >> 28) + 1;
      g.delta = 0;
    }
  }
}

void decode(const block_iq3_s& b, decoded& o) {
  o.d = fp16_to_fp32(b.d);
  o.unit = 1.0f;
  for (int l = 0; l < qk_k / 8; ++l) {
    group8& g = o.g[l];
    for (int h = 0; h < 2; ++h) {
      const int e = 2 * l + h;  // grid entry: 4 values
      const int idx = b.qs[e] | (((b.qh[e / 8] >> (e % 8)) & 1) << 8);
      signed_values(iq_grids::iq3s[idx], 4, b.signs[l], 4 * h, g.v + 4 * h);
    }
    const int ib = l / 4;
    g.num = 2 * ((b.scales[ib / 2] >> (4 * (ib % 2))) & 0xF) + 1;
    g.delta = 0;
  }
}

void decode(const block_iq1_s& b, decoded& o) {
  o.d = fp16_to_fp32(b.d);
  o.unit = 1.0f;
  for (int l = 0; l < qk_k / 8; ++l) {
    const int ib = l / 4, k = l % 4;
    const uint16_t qh = b.qh[ib];
    const int idx = b.qs[l] | (((qh >> (3 * k)) & 7) << 8);
    group8& g = o.g[l];
    std::memcpy(g.v, iq_grids::iq1s[idx], 8);
    g.num = 2 * ((qh >> 12) & 7) + 1;
    g.delta = qh & 0x8000 ? -1 : 1;
  }
}

void decode(const block_iq1_m& b, decoded& o) {
  o.d = iq1_m_scale(b);
  o.unit = 1.0f;
  for (int l = 0; l < qk_k / 8; ++l) {
    const int nib = (b.qh[l / 2] >> (4 * (l % 2))) & 0xF;
    const int idx = b.qs[l] | ((nib & 7) << 8);
    group8& g = o.g[l];
    std::memcpy(g.v, iq_grids::iq1s[idx], 8);
    const int h = l / 2;  // 16 values per scale
    g.num = 2 * ((u16_at(b.scales + 2 * (h / 4)) >> (3 * (h % 4))) & 7) + 1;
    g.delta = nib & 8 ? -1 : 1;
  }
}

template <class Block>
void dequantize(const void* x, float* y, int64_t n) {
  const auto* blocks = static_cast<const Block*>(x);
  decoded o;
  for (int64_t i = 0; i < n / qk_k; ++i) {
    decode(blocks[i], o);
    for (int l = 0; l < qk_k / 8; ++l) {
      const group8& g = o.g[l];
      const float scale = o.d * o.unit * static_cast<float>(g.num);
      const float delta = static_cast<float>(g.delta) * iq1_delta;
      for (int j = 0; j < 8; ++j) y[i * qk_k + 8 * l + j] = scale * (static_cast<float>(g.v[j]) + delta);
    }
  }
}

// Per group: num * (sum v q + delta / 8 * sum q) in integers (the shift's eighths exact in double), per
// block times d * unit * the activations' scale.
template <class Block>
void dot(int64_t n, float* s, const void* x, const void* y) {
  const auto* xb = static_cast<const Block*>(x);
  const auto* yb = static_cast<const block_q8_K*>(y);
  double sum = 0.0;
  decoded o;
  for (int64_t i = 0; i < n / qk_k; ++i) {
    decode(xb[i], o);
    const int8_t* q = yb[i].qs;
    int64_t isum = 0;   // sum over groups of num * (sum v q)
    int64_t dsum = 0;   // sum over groups of num * delta * (sum q)
    for (int l = 0; l < qk_k / 8; ++l) {
      const group8& g = o.g[l];
      int32_t vq = 0, sq = 0;
      for (int j = 0; j < 8; ++j) {
        vq += g.v[j] * q[8 * l + j];
        sq += q[8 * l + j];
      }
      isum += static_cast<int64_t>(g.num) * vq;
      dsum += static_cast<int64_t>(g.num) * g.delta * sq;
    }
    const double block = static_cast<double>(isum) + static_cast<double>(dsum) * iq1_delta;
    sum += static_cast<double>(o.d) * o.unit * yb[i].d * block;
  }
  *s = static_cast<float>(sum);
}

}  // namespace

float iq1_m_scale(const block_iq1_m& b) {
  uint16_t sc[4];
  std::memcpy(sc, b.scales, sizeof sc);
  const uint16_t bits = static_cast<uint16_t>((sc[0] >> 12) | ((sc[1] >> 8) & 0x00F0) | ((sc[2] >> 4) & 0x0F00) | (sc[3] & 0xF000));
  fp16_t h;
  std::memcpy(&h, &bits, sizeof h);
  return fp16_to_fp32(h);
}

void dequantize_row_iq2_xxs(const void* x, float* y, int64_t n) { dequantize<block_iq2_xxs>(x, y, n); }
void dequantize_row_iq2_xs(const void* x, float* y, int64_t n) { dequantize<block_iq2_xs>(x, y, n); }
void dequantize_row_iq2_s(const void* x, float* y, int64_t n) { dequantize<block_iq2_s>(x, y, n); }
void dequantize_row_iq3_xxs(const void* x, float* y, int64_t n) { dequantize<block_iq3_xxs>(x, y, n); }
void dequantize_row_iq3_s(const void* x, float* y, int64_t n) { dequantize<block_iq3_s>(x, y, n); }
void dequantize_row_iq1_s(const void* x, float* y, int64_t n) { dequantize<block_iq1_s>(x, y, n); }
void dequantize_row_iq1_m(const void* x, float* y, int64_t n) { dequantize<block_iq1_m>(x, y, n); }

void vec_dot_iq2_xxs_q8_K(int64_t n, float* s, const void* x, const void* y) { dot<block_iq2_xxs>(n, s, x, y); }
void vec_dot_iq2_xs_q8_K(int64_t n, float* s, const void* x, const void* y) { dot<block_iq2_xs>(n, s, x, y); }
void vec_dot_iq2_s_q8_K(int64_t n, float* s, const void* x, const void* y) { dot<block_iq2_s>(n, s, x, y); }
void vec_dot_iq3_xxs_q8_K(int64_t n, float* s, const void* x, const void* y) { dot<block_iq3_xxs>(n, s, x, y); }
void vec_dot_iq3_s_q8_K(int64_t n, float* s, const void* x, const void* y) { dot<block_iq3_s>(n, s, x, y); }
void vec_dot_iq1_s_q8_K(int64_t n, float* s, const void* x, const void* y) { dot<block_iq1_s>(n, s, x, y); }
void vec_dot_iq1_m_q8_K(int64_t n, float* s, const void* x, const void* y) { dot<block_iq1_m>(n, s, x, y); }

}  // namespace troupe
