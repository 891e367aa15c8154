// concat (op 0: dst = a then b along dimension `dim`) and pad (op 1: dst = a, zeros past a's end in every
// dimension), f32 of any strides: one invocation per destination element.
#version 450

layout(local_size_x = 256, local_size_y = 1, local_size_z = 1) in;

#include "common.glsl"

layout(std430, set = 0, binding = 0) readonly buffer A { float a[]; };
layout(std430, set = 0, binding = 1) readonly buffer B { float b[]; };
layout(std430, set = 0, binding = 2) writeonly buffer D { float d[]; };

layout(push_constant) uniform params {
  uint ne[4];  // dst
  uint a_ne[4];
  uint a_off, a_nb0, a_nb1, a_nb2, a_nb3;
  uint b_off, b_nb0, b_nb1, b_nb2, b_nb3;
  uint d_off, d_nb0, d_nb1, d_nb2, d_nb3;
  uint op, dim;
} p;

void main() {
  const uint e = invocation_index();
  if (e >= p.ne[0] * p.ne[1] * p.ne[2] * p.ne[3]) return;
  const uvec4 c = unravel(e, p.ne[0], p.ne[1], p.ne[2]);
  const uint out_at = p.d_off + c.x * p.d_nb0 + c.y * p.d_nb1 + c.z * p.d_nb2 + c.w * p.d_nb3;
  const bool in_a = c.x < p.a_ne[0] && c.y < p.a_ne[1] && c.z < p.a_ne[2] && c.w < p.a_ne[3];
  if (in_a) {
    d[out_at] = a[p.a_off + c.x * p.a_nb0 + c.y * p.a_nb1 + c.z * p.a_nb2 + c.w * p.a_nb3];
  } else if (p.op == 1u) {
    d[out_at] = 0.0f;
  } else {
    uvec4 bc = c;
    bc[p.dim] -= p.a_ne[p.dim];
    d[out_at] = b[p.b_off + bc.x * p.b_nb0 + bc.y * p.b_nb1 + bc.z * p.b_nb2 + bc.w * p.b_nb3];
  }
}
