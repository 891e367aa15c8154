// dst[:, idx[i, j % ne1i, k % ne2i], j, k] = src[:, i, j, k]: f32 source rows of any strides written into a
// destination of f32, f16, bf16 rows or rows of q8_0, q4_0, q4_1, q5_0, q5_1 or iq4_nl blocks (a KV cache),
// quantized as the CPU's reference quantizers do (runtime/quants.cpp), by i32 or i64 indices. A row index outside the
// destination writes nothing. One invocation per element; a 16-bit element is written into its half of a
// word with two atomics (clear, set), so rows of any length and offset (a transposed V cache's rows of one)
// never disturb the neighbouring element another invocation writes.
#version 450

layout(local_size_x = 256, local_size_y = 1, local_size_z = 1) in;

#include "common.glsl"

layout(std430, set = 0, binding = 0) readonly buffer S { float s[]; };
layout(std430, set = 0, binding = 1) readonly buffer I { uint idx[]; };  // i32, or i64 as two words (low first)
layout(std430, set = 0, binding = 2) buffer D { uint d[]; };

layout(push_constant) uniform params {
  uint ne0, n, ne2, ne3;  // src [ne0, n, ne2, ne3]
  uint s_off, s_nb0, s_nb1, s_nb2, s_nb3;
  uint i_off, i_nb0, i_nb1, i_nb2, i_ne1, i_ne2, i_64;
  uint d_off, d_nb1, d_nb2, d_nb3, d_rows;
  uint d_type;  // 0 f32, 1 f16, 2 bf16 (offsets and strides in elements); in bytes: 3 q8_0, 4 q4_0, 5 q4_1,
                // 6 q5_0, 7 q5_1, 8 iq4_nl
} p;

#define STORE16_BUFFER d
#include "store16.glsl"

// q8_0 as the CPU's reference quantizes it: d = amax / 127, q = round(x / d) (halves away from zero).
int q8(float v) {
  if (!(v > -127.0f)) return isnan(v) ? 0 : -127;
  if (v >= 127.0f) return 127;
  float t = trunc(v);
  if (abs(v - t) >= 0.5f) t += sign(v);
  return int(t);
}

// Bytes of a block of 32 values, by d_type (3 and up).
uint block_bytes(uint t) {
  return t == 3u ? 34u : t == 4u ? 18u : t == 5u ? 20u : t == 6u ? 22u : t == 7u ? 24u : 18u;
}

const int iq4nl_values[16] = int[16](-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113);

// The codebook entry nearest to v (ties to the lower one), as runtime/quants_iq.cpp's nearest_iq4.
uint nearest_iq4(float v) {
  if (v <= float(iq4nl_values[0])) return 0u;
  if (v >= float(iq4nl_values[15])) return 15u;
  uint lo = 0u, hi = 15u;
  while (hi - lo > 1u) {
    const uint mid = (lo + hi) / 2u;
    if (v < float(iq4nl_values[mid])) hi = mid; else lo = mid;
  }
  return v - float(iq4nl_values[lo]) <= float(iq4nl_values[hi]) - v ? lo : hi;
}

float x[32];  // the block's values
uint qn[32];  // their 4-bit (or 5-bit) indices

// Writes the 4-bit indices qn as 16 bytes, two a byte (j and j + 16), at 16-bit element h.
void store_nibbles(uint h) {
  for (uint m = 0u; m < 8u; ++m) {
    const uint b0 = (qn[2u * m] & 15u) | ((qn[2u * m + 16u] & 15u) << 4);
    const uint b1 = (qn[2u * m + 1u] & 15u) | ((qn[2u * m + 17u] & 15u) << 4);
    store16(h + m, b0 | (b1 << 8));
  }
}

// The fifth bits of qn as a 32-bit mask (q5_0, q5_1's qh), at 16-bit element h.
void store_high_bits(uint h) {
  uint qh = 0u;
  for (uint j = 0u; j < 32u; ++j) qh |= ((qn[j] >> 4) & 1u) << j;
  store16(h, qh & 0xffffu);
  store16(h + 1u, qh >> 16);
}

// q4_0 .. iq4_nl: the block of x at 16-bit element h, as runtime/quants.cpp and quants_iq.cpp quantize it.
void store_block(uint t, uint h) {
  if (t == 4u || t == 6u) {  // q4_0, q5_0: d = signed max / -8 (-16), q = trunc(x / d + 8.5 (16.5))
    float amax = 0.0f, mx = 0.0f;
    for (uint j = 0u; j < 32u; ++j) {
      if (amax < abs(x[j])) { amax = abs(x[j]); mx = x[j]; }
    }
    const float levels = t == 4u ? 8.0f : 16.0f;
    const float dd = mx / -levels;
    const float id = dd != 0.0f ? 1.0f / dd : 0.0f;
    const int top = t == 4u ? 15 : 31;
    for (uint j = 0u; j < 32u; ++j) qn[j] = uint(min(top, int(x[j] * id + levels + 0.5f)));
    store16(h, to16(dd, 1u));
    if (t == 4u) {
      store_nibbles(h + 1u);
    } else {
      store_high_bits(h + 1u);
      store_nibbles(h + 3u);
    }
    return;
  }
  if (t == 5u || t == 7u) {  // q4_1, q5_1: d = (max - min) / 15 (31), m = min, q = trunc((x - min) / d + 0.5)
    float lo = x[0], hi = x[0];
    for (uint j = 1u; j < 32u; ++j) { lo = min(lo, x[j]); hi = max(hi, x[j]); }
    const float steps = t == 5u ? 15.0f : 31.0f;
    const float dd = (hi - lo) / steps;
    const float id = dd != 0.0f ? 1.0f / dd : 0.0f;
    const int top = int(steps);
    for (uint j = 0u; j < 32u; ++j) qn[j] = uint(min(top, int((x[j] - lo) * id + 0.5f)));
    store16(h, to16(dd, 1u));
    store16(h + 1u, to16(lo, 1u));
    if (t == 5u) {
      store_nibbles(h + 2u);
    } else {
      store_high_bits(h + 2u);
      store_nibbles(h + 4u);
    }
    return;
  }
  // iq4_nl: the weighted least-squares scale of the best of 15 candidates (runtime/quants_iq.cpp's fit_group,
  // in float), then the indices for the scale as stored.
  float amax = 0.0f, mx = 0.0f;
  for (uint j = 0u; j < 32u; ++j) {
    if (abs(x[j]) > amax) { amax = abs(x[j]); mx = x[j]; }
  }
  float best_d = 0.0f;
  if (amax >= 1e-30f) {
    float best = -1.0f;
    for (int tr = -7; tr <= 7; ++tr) {
      const float id = float(iq4nl_values[0] + tr) / mx;
      float sumqx = 0.0f, sumq2 = 0.0f;
      for (uint j = 0u; j < 32u; ++j) {
        const float q = float(iq4nl_values[nearest_iq4(id * x[j])]);
        const float w = abs(x[j]);
        sumqx += w * q * x[j];
        sumq2 += w * q * q;
      }
      if (sumq2 > 0.0f && sumqx * sumqx / sumq2 > best) {
        best = sumqx * sumqx / sumq2;
        best_d = sumqx / sumq2;
      }
    }
  }
  const uint dh = to16(best_d, 1u);
  const float ds = unpackHalf2x16(dh).x;
  const float id = ds != 0.0f ? 1.0f / ds : 0.0f;
  for (uint j = 0u; j < 32u; ++j) qn[j] = ds != 0.0f ? nearest_iq4(id * x[j]) : 0u;
  store16(h, dh);
  store_nibbles(h + 1u);
}

void main() {
  const uint t = invocation_index();
  const bool blocks = p.d_type >= 3u;               // an invocation per block of 32 values
  const uint per_row = blocks ? p.ne0 / 32u : p.ne0;  // or per element
  if (t >= per_row * p.n * p.ne2 * p.ne3) return;
  const uint c = t % per_row;
  uint r = t / per_row;
  const uint i = r % p.n;
  r /= p.n;
  const uint j = r % p.ne2;
  const uint k = r / p.ne2;
  const uint ie = p.i_off + i * p.i_nb0 + (j % p.i_ne1) * p.i_nb1 + (k % p.i_ne2) * p.i_nb2;
  const uint row = idx[p.i_64 != 0u ? 2u * ie : ie];
  if ((p.i_64 != 0u && idx[2u * ie + 1u] != 0u) || row >= p.d_rows) return;
  const uint s_row = p.s_off + i * p.s_nb1 + j * p.s_nb2 + k * p.s_nb3;
  const uint d_row = p.d_off + row * p.d_nb1 + j * p.d_nb2 + k * p.d_nb3;  // in destination elements (q8_0: bytes)
  if (blocks && p.d_type != 3u) {  // the block at byte d_row + block_bytes c
    for (uint e = 0u; e < 32u; ++e) x[e] = s[s_row + (32u * c + e) * p.s_nb0];
    store_block(p.d_type, (d_row + block_bytes(p.d_type) * c) / 2u);
    return;
  }
  if (blocks) {  // the block at byte d_row + 34 c: d, then 32 quants, written as 17 16-bit pieces
    const uint e0 = 32u * c;
    float amax = 0.0f;
    for (uint e = 0u; e < 32u; ++e) amax = max(amax, abs(s[s_row + (e0 + e) * p.s_nb0]));
    const float dd = amax / 127.0f;
    const float id = dd != 0.0f ? 1.0f / dd : 0.0f;
    const uint half_ = (d_row + 34u * c) / 2u;
    store16(half_, to16(dd, 1u));
    for (uint m = 0u; m < 16u; ++m) {
      const int q0 = q8(s[s_row + (e0 + 2u * m) * p.s_nb0] * id);
      const int q1 = q8(s[s_row + (e0 + 2u * m + 1u) * p.s_nb0] * id);
      store16(half_ + 1u + m, (uint(q0) & 0xffu) | ((uint(q1) & 0xffu) << 8));
    }
    return;
  }
  const float x = s[s_row + c * p.s_nb0];
  if (p.d_type == 0u) {
    d[d_row + c] = floatBitsToUint(x);
  } else {
    store16(d_row + c, to16(x, p.d_type));
  }
}
