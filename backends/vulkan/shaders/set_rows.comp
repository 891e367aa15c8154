// dst[:, idx[i, j % ne1i, k % ne2i], j, k] = src[:, i, j, k]: f32 source rows of any strides written into a
// destination of f32, f16, bf16 or q8_0 rows (a KV cache), by i32 or i64 indices. A row index outside the
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
  uint d_type;  // 0 f32, 1 f16, 2 bf16 (offsets and strides in elements), 3 q8_0 (in bytes)
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

void main() {
  const uint t = invocation_index();
  const bool blocks = p.d_type == 3u;               // an invocation per q8_0 block of 32 values
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
