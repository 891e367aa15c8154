// dst = a (op) b for f32 tensors of any strides, b broadcast over a (each a.ne[i] a multiple of b.ne[i]):
// add, sub, mul, div as the CPU computes them. One invocation per destination element.
#version 450

layout(local_size_x = 256, local_size_y = 1, local_size_z = 1) in;

#include "common.glsl"

layout(std430, set = 0, binding = 0) readonly buffer A { float a[]; };
layout(std430, set = 0, binding = 1) readonly buffer B { float b[]; };
layout(std430, set = 0, binding = 2) writeonly buffer D { float d[]; };

// Offsets and strides in elements (f32).
layout(push_constant) uniform params {
  uint ne0, ne1, ne2, ne3;  // destination (= a) shape
  uint a_off, a_nb0, a_nb1, a_nb2, a_nb3;
  uint b_ne0, b_ne1, b_ne2, b_ne3;
  uint b_off, b_nb0, b_nb1, b_nb2, b_nb3;
  uint d_off, d_nb0, d_nb1, d_nb2, d_nb3;
  uint op;  // 0 add, 1 sub, 2 mul, 3 div
} p;

void main() {
  const uint i = invocation_index();
  if (i >= p.ne0 * p.ne1 * p.ne2 * p.ne3) return;
  const uvec4 c = unravel(i, p.ne0, p.ne1, p.ne2);
  const uint i0 = c.x, i1 = c.y, i2 = c.z, i3 = c.w;
  const float x = a[p.a_off + i0 * p.a_nb0 + i1 * p.a_nb1 + i2 * p.a_nb2 + i3 * p.a_nb3];
  const float y = b[p.b_off + (i0 % p.b_ne0) * p.b_nb0 + (i1 % p.b_ne1) * p.b_nb1 + (i2 % p.b_ne2) * p.b_nb2 +
                    (i3 % p.b_ne3) * p.b_nb3];
  precise float z;
  if (p.op == 0u) {
    z = x + y;
  } else if (p.op == 1u) {
    z = x - y;
  } else if (p.op == 2u) {
    z = x * y;
  } else {
    z = x / y;
  }
  d[p.d_off + i0 * p.d_nb0 + i1 * p.d_nb1 + i2 * p.d_nb2 + i3 * p.d_nb3] = z;
}
