// dst[:, j, k] = row idx[j, k] of plane k of a, converted to f32: a of any type weights.glsl reads (f32, f16,
// bf16, the quantized blocks; one variant per type, A_TYPE), rows contiguous; idx i32 or i64. An index outside a's rows gives a zero row
// (never a read outside the buffer). One invocation per destination element.
#version 450

layout(local_size_x = 256, local_size_y = 1, local_size_z = 1) in;

#include "common.glsl"

layout(std430, set = 0, binding = 0) readonly buffer A { uint a[]; };
layout(std430, set = 0, binding = 1) readonly buffer I { uint idx[]; };  // i32, or i64 as two words (low first)
layout(std430, set = 0, binding = 2) writeonly buffer D { float d[]; };

#define WEIGHTS a
#include "weights.glsl"

layout(push_constant) uniform params {
  uint ne0, n, ne2;  // destination [ne0, n, ne2, 1]
  uint a_off, a_nb1, a_nb2, a_rows;  // bytes; a's type: A_TYPE
  uint i_off, i_nb0, i_nb1, i_64;  // in idx elements
  uint d_off, d_nb1, d_nb2;
} p;

void main() {
  const uint e = invocation_index();
  if (e >= p.ne0 * p.n * p.ne2) return;
  const uint i0 = e % p.ne0;
  const uint j = (e / p.ne0) % p.n;
  const uint k = e / (p.ne0 * p.n);
  const uint ie = p.i_off + j * p.i_nb0 + k * p.i_nb1;
  const uint lo = idx[p.i_64 != 0u ? 2u * ie : ie];
  const bool inside = (p.i_64 == 0u || idx[2u * ie + 1u] == 0u) && lo < p.a_rows;
  d[p.d_off + i0 + j * p.d_nb1 + k * p.d_nb2] =
      inside ? w_value(A_TYPE, p.a_off + lo * p.a_nb1 + k * p.a_nb2, i0) : 0.0f;
}
