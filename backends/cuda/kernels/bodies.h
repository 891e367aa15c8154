// The CUDA kernels' bodies: what one thread (element-wise kernels) or one group of threads (row and
// matrix-vector kernels) computes, written once for the device and the host. A kernel (kernels.cuh) maps its
// threads onto a body; the host tests run those kernels with every thread of every block (CUDA's thread model
// emulated on the CPU), so every index computation, every split of the work between a group's threads and
// every formula here runs in CI without a GPU. Formulas are the CPU reference's (backends/cpu).
//
// A group G provides lane() and size() (the thread's rank, the group's threads) and sum(x) / max(x) over the
// group (every thread gets the result); bodies call them from every thread of the group.
#pragma once

#include "backends/cuda/kernels/args.h"

namespace troupe::cuda::kern {

TROUPE_HD inline void unravel(int64_t i, const int64_t* ne, int64_t* c) {
  c[0] = i % ne[0];
  i /= ne[0];
  c[1] = i % ne[1];
  i /= ne[1];
  c[2] = i % ne[2];
  c[3] = i / ne[2];
}

TROUPE_HD inline uint8_t* at(const view& v, const int64_t* c) {
  return v.p + c[0] * v.nb[0] + c[1] * v.nb[1] + c[2] * v.nb[2] + c[3] * v.nb[3];
}

TROUPE_HD inline float& f32_at(const view& v, const int64_t* c) { return *reinterpret_cast<float*>(at(v, c)); }

TROUPE_HD inline float load_float(const uint8_t* p, int code) {
  if (code == f32_code) return *reinterpret_cast<const float*>(p);
  const uint16_t h = *reinterpret_cast<const uint16_t*>(p);
  return code == f16_code ? half_to_float(h) : bf16_to_float(h);
}

TROUPE_HD inline void store_float(uint8_t* p, int code, float x) {
  if (code == f32_code) {
    *reinterpret_cast<float*>(p) = x;
  } else {
    *reinterpret_cast<uint16_t*>(p) = code == f16_code ? float_to_half(x) : float_to_bf16(x);
  }
}

// ---- one thread per element ----

TROUPE_HD inline int64_t count(const int64_t* ne) { return ne[0] * ne[1] * ne[2] * ne[3]; }

TROUPE_HD inline void binary_at(const binary_args& p, int64_t i) {
  int64_t c[4], cb[4];
  unravel(i, p.ne, c);
  for (int k = 0; k < 4; ++k) cb[k] = c[k] % p.b_ne[k];
  const float x = f32_at(p.a, c), y = f32_at(p.b, cb);
  f32_at(p.d, c) = p.op == 0 ? x + y : p.op == 1 ? x - y : p.op == 2 ? x * y : x / y;
}

TROUPE_HD inline void unary_at(const unary_args& p, int64_t i) {
  int64_t c[4];
  unravel(i, p.ne, c);
  const float x = f32_at(p.a, c);
  f32_at(p.d, c) = p.op == 0 ? x * p.s + p.bias : p.op == 1 ? silu(x) : gelu(x);
}

TROUPE_HD inline void glu_at(const glu_args& p, int64_t i) {
  int64_t c[4];
  unravel(i, p.ne, c);
  const float x = f32_at(p.x, c);
  f32_at(p.d, c) = (p.kind == 0 ? silu(x) : gelu(x)) * f32_at(p.g, c);
}

TROUPE_HD inline void concat_pad_at(const concat_pad_args& p, int64_t i) {
  int64_t c[4];
  unravel(i, p.ne, c);
  const bool in_a = c[0] < p.a_ne[0] && c[1] < p.a_ne[1] && c[2] < p.a_ne[2] && c[3] < p.a_ne[3];
  float v = 0.0f;
  if (in_a) {
    v = f32_at(p.a, c);
  } else if (p.op == 0) {
    int64_t cb[4] = {c[0], c[1], c[2], c[3]};
    cb[p.dim] -= p.a_ne[p.dim];
    v = f32_at(p.b, cb);
  }
  f32_at(p.d, c) = v;
}

// Units of work of a rope: per row, one per rotated pair and one per passed-through element.
TROUPE_HD inline int64_t rope_units(const rope_args& p) {
  return (p.n_dims / 2 + (p.ne[0] - p.n_dims)) * p.ne[1] * p.ne[2] * p.ne[3];
}

TROUPE_HD inline void rope_at(const rope_args& p, int64_t t) {
  const int64_t half_dims = p.n_dims / 2;
  const int64_t per_row = half_dims + (p.ne[0] - p.n_dims);
  const int64_t cc = t % per_row;
  int64_t r = t / per_row;
  int64_t c[4] = {0, r % p.ne[1], 0, 0};
  r /= p.ne[1];
  c[2] = r % p.ne[2];
  c[3] = r / p.ne[2];
  if (cc >= half_dims) {  // passed through
    c[0] = p.n_dims + (cc - half_dims);
    f32_at(p.d, c) = f32_at(p.a, c);
    return;
  }
  // theta of pair i is pos * theta_scale^i by repeated multiplication, as the CPU computes it.
  float theta = static_cast<float>(p.pos[c[2]]);
  for (int64_t k = 0; k < cc; ++k) theta *= p.theta_scale;
  const float f = p.ff != nullptr ? p.ff[cc] : 1.0f;
  const float theta_extrap = theta / f;
  const float theta_interp = p.freq_scale * theta_extrap;
  float th = theta_interp;
  float mscale = p.attn_factor;
  if (p.ext_factor != 0.0f) {
    const float y = (static_cast<float>(cc) - p.corr0) / fmaxf(0.001f, p.corr1 - p.corr0);
    const float ramp_mix = (1.0f - fminf(1.0f, fmaxf(0.0f, y))) * p.ext_factor;
    th = theta_interp * (1.0f - ramp_mix) + theta_extrap * ramp_mix;
    mscale *= p.yarn_mscale;
  }
  const float cs = cosf(th) * mscale;
  const float sn = sinf(th) * mscale;
  const int64_t i = p.neox != 0 ? cc : 2 * cc;
  const int64_t j = i + (p.neox != 0 ? half_dims : 1);
  int64_t ci[4] = {i, c[1], c[2], c[3]}, cj[4] = {j, c[1], c[2], c[3]};
  const float x0 = f32_at(p.a, ci), x1 = f32_at(p.a, cj);
  f32_at(p.d, ci) = x0 * cs - x1 * sn;
  f32_at(p.d, cj) = x0 * sn + x1 * cs;
}

TROUPE_HD inline void cpy_at(const cpy_args& p, int64_t i) {
  int64_t cs[4], cd[4];
  unravel(i, p.s_ne, cs);
  unravel(i, p.d_ne, cd);
  store_float(at(p.d, cd), p.d_type, load_float(at(p.s, cs), p.s_type));
}

TROUPE_HD inline int64_t load_index(const uint8_t* p, int i64) {
  return i64 != 0 ? *reinterpret_cast<const int64_t*>(p) : *reinterpret_cast<const int32_t*>(p);
}

template <type T>
TROUPE_HD inline void get_rows_at(const get_rows_args& p, int64_t e) {
  const int64_t i0 = e % p.ne0;
  const int64_t r = e / p.ne0;
  const int64_t i = r % p.n, j = r / p.n;
  const int64_t row = load_index(p.idx.p + i * p.idx.nb[0] + j * p.idx.nb[1], p.i64);
  const float v = row >= 0 && row < p.a_rows ? load_weight<T>(p.a + row * p.a_nb1 + j * p.a_nb2, i0) : 0.0f;
  *reinterpret_cast<float*>(p.d.p + i0 * 4 + i * p.d.nb[1] + j * p.d.nb[2]) = v;
}

// q8_0's rounding as the CPU's reference quantizer: halves away from zero, clamped to [-127, 127].
TROUPE_HD inline int8_t q8_0_value(float v) {
  if (!(v > -127.0f)) return static_cast<int8_t>(v != v ? 0 : -127);
  if (v >= 127.0f) return 127;
  return static_cast<int8_t>(quantize_act_value(v, 1.0f));
}

// Units of a set_rows: an element each, or a block of 32 each for rows of blocks.
TROUPE_HD inline int64_t set_rows_units(const set_rows_args& p) { return count(p.ne) / (p.d_type >= q8_0_code ? 32 : 1); }

// Bytes of a block of 32 values of a set_rows destination code (q8_0_code and up).
TROUPE_HD inline int block_bytes_of(int code) {
  return code == q8_0_code ? 34 : code == q4_0_code ? 18 : code == q4_1_code ? 20 : code == q5_0_code ? 22 : code == q5_1_code ? 24 : 18;
}

// iq4_nl's codebook and its nearest entry (ties to the lower), as runtime/quants_iq.cpp.
TROUPE_HD inline int iq4nl_value(int i) {
  constexpr int8_t v[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
  return v[i];
}
TROUPE_HD inline int nearest_iq4(float v) {
  if (v <= iq4nl_value(0)) return 0;
  if (v >= iq4nl_value(15)) return 15;
  int lo = 0, hi = 15;
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (v < iq4nl_value(mid)) hi = mid; else lo = mid;
  }
  return v - iq4nl_value(lo) <= iq4nl_value(hi) - v ? lo : hi;
}

// One block of 32 values x into b, as runtime/quants.cpp's (and quants_iq.cpp's) reference quantizers.
TROUPE_HD inline void quantize_block(int code, const float* x, uint8_t* b) {
  int q[32];
  if (code == q4_0_code || code == q5_0_code) {  // d = signed max / -8 (-16)
    float amax = 0.0f, mx = 0.0f;
    for (int j = 0; j < 32; ++j) {
      if (amax < fabsf(x[j])) { amax = fabsf(x[j]); mx = x[j]; }
    }
    const float levels = code == q4_0_code ? 8.0f : 16.0f;
    const float dd = mx / -levels;
    const float id = dd != 0.0f ? 1.0f / dd : 0.0f;
    const int top = code == q4_0_code ? 15 : 31;
    for (int j = 0; j < 32; ++j) {
      const int v = static_cast<int>(x[j] * id + levels + 0.5f);
      q[j] = v < top ? v : top;
    }
    *reinterpret_cast<uint16_t*>(b) = float_to_half(dd);
    b += 2;
  } else if (code == q4_1_code || code == q5_1_code) {  // d = (max - min) / 15 (31), m = min
    float lo = 3.402823466e38f, hi = -3.402823466e38f;
    for (int j = 0; j < 32; ++j) { lo = fminf(lo, x[j]); hi = fmaxf(hi, x[j]); }
    const float steps = code == q4_1_code ? 15.0f : 31.0f;
    const float dd = (hi - lo) / steps;
    const float id = dd != 0.0f ? 1.0f / dd : 0.0f;
    for (int j = 0; j < 32; ++j) {
      const int v = static_cast<int>((x[j] - lo) * id + 0.5f);
      q[j] = v < static_cast<int>(steps) ? v : static_cast<int>(steps);
    }
    *reinterpret_cast<uint16_t*>(b) = float_to_half(dd);
    *reinterpret_cast<uint16_t*>(b + 2) = float_to_half(lo);
    b += 4;
  } else {  // iq4_nl: the weighted least-squares scale of the best of 15 candidates, then the indices for it
    float amax = 0.0f, mx = 0.0f;
    for (int j = 0; j < 32; ++j) {
      if (fabsf(x[j]) > amax) { amax = fabsf(x[j]); mx = x[j]; }
    }
    float best_d = 0.0f;
    if (amax >= 1e-30f) {
      double best = -1.0;
      for (int tr = -7; tr <= 7; ++tr) {
        const float id = static_cast<float>(iq4nl_value(0) + tr) / mx;
        double sumqx = 0.0, sumq2 = 0.0;
        for (int j = 0; j < 32; ++j) {
          const double qv = iq4nl_value(nearest_iq4(id * x[j]));
          const double w = fabs(static_cast<double>(x[j]));
          sumqx += w * qv * x[j];
          sumq2 += w * qv * qv;
        }
        if (sumq2 > 0.0 && sumqx * sumqx / sumq2 > best) {
          best = sumqx * sumqx / sumq2;
          best_d = static_cast<float>(sumqx / sumq2);
        }
      }
    }
    const uint16_t dh = float_to_half(best_d);
    const float ds = half_to_float(dh);
    const float id = ds != 0.0f ? 1.0f / ds : 0.0f;
    for (int j = 0; j < 32; ++j) q[j] = ds != 0.0f ? nearest_iq4(id * x[j]) : 0;
    *reinterpret_cast<uint16_t*>(b) = dh;
    b += 2;
  }
  if (code == q5_0_code || code == q5_1_code) {  // the fifth bits, little-endian
    uint32_t qh = 0;
    for (int j = 0; j < 32; ++j) qh |= static_cast<uint32_t>((q[j] >> 4) & 1) << j;
    for (int k = 0; k < 4; ++k) b[k] = static_cast<uint8_t>(qh >> (8 * k));
    b += 4;
  }
  for (int j = 0; j < 16; ++j) b[j] = static_cast<uint8_t>((q[j] & 15) | ((q[j + 16] & 15) << 4));
}

TROUPE_HD inline void set_rows_at(const set_rows_args& p, int64_t t) {
  const bool blocks = p.d_type >= q8_0_code;
  const int64_t per_row = blocks ? p.ne[0] / 32 : p.ne[0];
  const int64_t cc = t % per_row;
  int64_t r = t / per_row;
  const int64_t i = r % p.ne[1];
  r /= p.ne[1];
  const int64_t j = r % p.ne[2], k = r / p.ne[2];
  const int64_t row = load_index(p.idx.p + i * p.idx.nb[0] + (j % p.i_ne1) * p.idx.nb[1] + (k % p.i_ne2) * p.idx.nb[2], p.i64);
  if (row < 0 || row >= p.d_rows) return;
  const uint8_t* s = p.s.p + i * p.s.nb[1] + j * p.s.nb[2] + k * p.s.nb[3];
  uint8_t* d = p.d.p + row * p.d.nb[1] + j * p.d.nb[2] + k * p.d.nb[3];
  if (!blocks) {
    store_float(d + cc * p.d.nb[0], p.d_type, *reinterpret_cast<const float*>(s + cc * p.s.nb[0]));
    return;
  }
  const int64_t e0 = 32 * cc;
  if (p.d_type != q8_0_code) {
    float x[32];
    for (int e = 0; e < 32; ++e) x[e] = *reinterpret_cast<const float*>(s + (e0 + e) * p.s.nb[0]);
    quantize_block(p.d_type, x, d + block_bytes_of(p.d_type) * cc);
    return;
  }
  float amax = 0.0f;
  for (int e = 0; e < 32; ++e) amax = fmaxf(amax, fabsf(*reinterpret_cast<const float*>(s + (e0 + e) * p.s.nb[0])));
  const float dd = amax / 127.0f;
  const float id = dd != 0.0f ? 1.0f / dd : 0.0f;
  uint8_t* b = d + 34 * cc;
  *reinterpret_cast<uint16_t*>(b) = float_to_half(dd);
  for (int e = 0; e < 32; ++e) {
    b[2 + e] = static_cast<uint8_t>(q8_0_value(*reinterpret_cast<const float*>(s + (e0 + e) * p.s.nb[0]) * id));
  }
}

template <type T>
TROUPE_HD inline void dequant_at(const dequant_args& p, int64_t e) {
  const int64_t i = e % p.k;
  const int64_t r = e / p.k;
  const int64_t row = r % p.m, plane = r / p.m;
  const uint8_t* src = p.a + row * p.a_nb1 + (plane % p.ne2) * p.a_nb2 + (plane / p.ne2) * p.a_nb3;
  p.out[e] = float_to_half(load_weight<T>(src, i));
}

// ---- one group per row ----

TROUPE_HD inline int64_t rows_of(const int64_t* ne) { return ne[1] * ne[2] * ne[3]; }

TROUPE_HD inline void row_coords(int64_t row, const int64_t* ne, int64_t* c) {
  c[0] = 0;
  c[1] = row % ne[1];
  c[2] = (row / ne[1]) % ne[2];
  c[3] = row / (ne[1] * ne[2]);
}

template <class G>
TROUPE_HD inline void rows_row(const rows_args& p, int64_t row, G& g) {
  int64_t c[4];
  row_coords(row, p.ne, c);
  const uint8_t* a = at(p.a, c);
  const int64_t n = p.ne[0];
  const auto x = [&](int64_t i) { return *reinterpret_cast<const float*>(a + i * p.a.nb[0]); };
  if (p.op == 3) {  // argmax: first index of the maximum (NaN never wins), one thread
    if (g.lane() != 0) return;
    int32_t best = 0;
    float mx = -INFINITY;
    for (int64_t i = 0; i < n; ++i) {
      if (x(i) > mx) {
        mx = x(i);
        best = static_cast<int32_t>(i);
      }
    }
    int64_t o[4];
    unravel(row, p.d_ne, o);
    *reinterpret_cast<int32_t*>(at(p.d, o)) = best;
    return;
  }
  uint8_t* d = at(p.d, c);
  float s = 0.0f;
  for (int64_t i = g.lane(); i < n; i += g.size()) s += p.op == 4 ? x(i) * x(i) : x(i);
  s = g.sum(s);
  if (p.op == 1 || p.op == 2) {
    if (g.lane() == 0) *reinterpret_cast<float*>(d) = p.op == 2 ? s / static_cast<float>(n) : s;
    return;
  }
  float scale = 0.0f, mean = 0.0f;
  if (p.op == 4) {
    scale = 1.0f / sqrtf(s / static_cast<float>(n) + p.eps);
  } else {
    mean = s / static_cast<float>(n);
    float s2 = 0.0f;
    for (int64_t i = g.lane(); i < n; i += g.size()) s2 += (x(i) - mean) * (x(i) - mean);
    s2 = g.sum(s2);
    scale = 1.0f / sqrtf(s2 / static_cast<float>(n) + p.eps);
  }
  for (int64_t i = g.lane(); i < n; i += g.size()) *reinterpret_cast<float*>(d + i * p.d.nb[0]) = (x(i) - mean) * scale;
}

// The destination row (dense f32) holds the intermediate values: each thread reads back only what it wrote.
template <class G>
TROUPE_HD inline void soft_max_row(const soft_max_args& p, int64_t row, G& g) {
  int64_t c[4];
  row_coords(row, p.ne, c);
  const uint8_t* a = at(p.a, c);
  auto* d = reinterpret_cast<float*>(at(p.d, c));
  const uint8_t* m = p.m != nullptr ? p.m + c[1] * p.m_nb1 + (c[2] % p.m_ne2) * p.m_nb2 + (c[3] % p.m_ne3) * p.m_nb3 : nullptr;
  float slope = 1.0f;
  if (p.max_bias > 0.0f) {
    const auto h = static_cast<int>(c[2]);
    slope = h < p.n_head_log2 ? powf(p.m0, static_cast<float>(h + 1)) : powf(p.m1, static_cast<float>(2 * (h - p.n_head_log2) + 1));
  }
  const int64_t n = p.ne[0];
  float mx = -INFINITY;
  for (int64_t i = g.lane(); i < n; i += g.size()) {
    float v = *reinterpret_cast<const float*>(a + i * p.a.nb[0]) * p.scale;
    if (m != nullptr) {
      v += slope * (p.m_f16 != 0 ? half_to_float(reinterpret_cast<const uint16_t*>(m)[i]) : reinterpret_cast<const float*>(m)[i]);
    }
    d[i] = v;
    mx = fmaxf(mx, v);
  }
  mx = g.max(mx);
  if (mx == -INFINITY) {  // a fully masked row: zeros (exp(-inf - -inf) would be NaN)
    for (int64_t i = g.lane(); i < n; i += g.size()) d[i] = 0.0f;
    return;
  }
  float s = 0.0f;
  for (int64_t i = g.lane(); i < n; i += g.size()) {
    const float e = expf(d[i] - mx);
    d[i] = e;
    s += e;
  }
  const float inv = 1.0f / g.sum(s);
  for (int64_t i = g.lane(); i < n; i += g.size()) d[i] *= inv;
}

// Block blk of 32 activations (quantize_args' order).
template <class G>
TROUPE_HD inline void quantize_block(const quantize_args& p, int64_t blk, G& g) {
  const int64_t nb32 = p.k / 32;
  const int64_t j = blk % nb32;
  int64_t r = blk / nb32;
  const int64_t i1 = r % p.n;
  r /= p.n;
  const uint8_t* src = p.b.p + 32 * j * p.b.nb[0] + i1 * p.b.nb[1] + (r % p.ne2) * p.b.nb[2] + (r / p.ne2) * p.b.nb[3];
  const auto x = [&](int t) { return *reinterpret_cast<const float*>(src + t * p.b.nb[0]); };
  float amax = 0.0f;
  for (int t = g.lane(); t < 32; t += g.size()) amax = fmaxf(amax, fabsf(x(t)));
  amax = g.max(amax);
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  act_block& out = p.q[blk];
  float qsum = 0.0f;
  for (int t = g.lane(); t < 32; t += g.size()) {
    const int q = quantize_act_value(x(t), id);
    reinterpret_cast<int8_t*>(out.q)[t] = static_cast<int8_t>(q);
    qsum += static_cast<float>(q);
  }
  qsum = g.sum(qsum);
  if (g.lane() == 0) {
    out.d = d;
    out.sum = d * qsum;
  }
}

// Output row `row` of plane `plane` for N activation columns (c0 ..): quantized weights (dot32 over the
// act_blocks), a thread of the group per 32 values.
template <type T, int N, class G>
TROUPE_HD inline void mat_vec_q_row(const mat_vec_args& p, int64_t row, int64_t plane, G& g) {
  const int64_t i2 = plane % p.ne2, i3 = plane / p.ne2;
  const uint8_t* a = p.a + row * p.a_nb1 + (i2 / p.r2) * p.a_nb2 + (i3 / p.r3) * p.a_nb3;
  const int64_t nb32 = p.k / 32;
  const act_block* q = p.q + (plane * p.n_all + p.c0) * nb32;
  float s[N];
  for (int c = 0; c < N; ++c) s[c] = 0.0f;
  for (int64_t j = g.lane(); j < nb32; j += g.size()) {
    for (int c = 0; c < N; ++c) s[c] += dot32<T>(a, j, q[c * nb32 + j]);
  }
  for (int c = 0; c < N; ++c) {
    const float v = g.sum(s[c]);
    if (g.lane() == 0) *reinterpret_cast<float*>(p.d.p + row * 4 + (p.c0 + c) * p.d.nb[1] + i2 * p.d.nb[2] + i3 * p.d.nb[3]) = v;
  }
}

// The same for float weights and f32 activations (b), a thread of the group per value.
template <type T, int N, class G>
TROUPE_HD inline void mat_vec_f_row(const mat_vec_args& p, int64_t row, int64_t plane, G& g) {
  const int64_t i2 = plane % p.ne2, i3 = plane / p.ne2;
  const uint8_t* a = p.a + row * p.a_nb1 + (i2 / p.r2) * p.a_nb2 + (i3 / p.r3) * p.a_nb3;
  const uint8_t* b = p.b.p + p.c0 * p.b.nb[1] + i2 * p.b.nb[2] + i3 * p.b.nb[3];
  float s[N];
  for (int c = 0; c < N; ++c) s[c] = 0.0f;
  for (int64_t i = g.lane(); i < p.k; i += g.size()) {
    const float w = load_weight<T>(a, i);
    for (int c = 0; c < N; ++c) s[c] += w * *reinterpret_cast<const float*>(b + i * p.b.nb[0] + c * p.b.nb[1]);
  }
  for (int c = 0; c < N; ++c) {
    const float v = g.sum(s[c]);
    if (g.lane() == 0) *reinterpret_cast<float*>(p.d.p + row * 4 + (p.c0 + c) * p.d.nb[1] + i2 * p.d.nb[2] + i3 * p.d.nb[3]) = v;
  }
}

}  // namespace troupe::cuda::kern
