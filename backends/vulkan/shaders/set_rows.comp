// dst[:, idx[i, j % ne1i, k % ne2i], j, k] = src[:, i, j, k]: f32 source rows of any strides written into a
// destination of f32, f16 or bf16 rows (a KV cache), by i32 or i64 indices. A row index outside the
// destination writes nothing. A 32-bit destination: one invocation per element; a 16-bit one (even row
// length, rows starting on words): one per word of two elements, so no two invocations write the same word.
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

void main() {
  const uint t = invocation_index();
  const uint per_row = p.d_type == 0u ? p.ne0 : p.ne0 / 2u;  // elements, or words of two
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
  const uint d_row = p.d_off + row * p.d_nb1 + j * p.d_nb2 + k * p.d_nb3;  // in destination elements
  if (p.d_type == 0u) {
    d[d_row + c] = floatBitsToUint(s[s_row + c * p.s_nb0]);
    return;
  }
  const uint lo = to16(s[s_row + 2u * c * p.s_nb0], p.d_type);
  const uint hi = to16(s[s_row + (2u * c + 1u) * p.s_nb0], p.d_type);
  d[(d_row >> 1) + c] = lo | (hi << 16);
}
