// dst[:, idx[i, j % ne1i, k % ne2i], j, k] = src[:, i, j, k]: f32 source rows of any strides written into a
// destination of f32, f16 or bf16 rows (a KV cache), by i32 or i64 indices. A row index outside the
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
  uint d_type;  // 0 f32, 1 f16, 2 bf16
} p;

void store16(uint e, uint h) {
  const uint shift = (e & 1u) * 16u;
  atomicAnd(d[e >> 1], ~(0xffffu << shift));
  atomicOr(d[e >> 1], h << shift);
}

void main() {
  const uint t = invocation_index();
  if (t >= p.ne0 * p.n * p.ne2 * p.ne3) return;
  const uint c = t % p.ne0;
  uint r = t / p.ne0;
  const uint i = r % p.n;
  r /= p.n;
  const uint j = r % p.ne2;
  const uint k = r / p.ne2;
  const uint ie = p.i_off + i * p.i_nb0 + (j % p.i_ne1) * p.i_nb1 + (k % p.i_ne2) * p.i_nb2;
  const uint row = idx[p.i_64 != 0u ? 2u * ie : ie];
  if ((p.i_64 != 0u && idx[2u * ie + 1u] != 0u) || row >= p.d_rows) return;
  const uint s_row = p.s_off + i * p.s_nb1 + j * p.s_nb2 + k * p.s_nb3;
  const uint d_row = p.d_off + row * p.d_nb1 + j * p.d_nb2 + k * p.d_nb3;  // in destination elements
  const float x = s[s_row + c * p.s_nb0];
  if (p.d_type == 0u) {
    d[d_row + c] = floatBitsToUint(x);
  } else {
    store16(d_row + c, to16(x, p.d_type));
  }
}
