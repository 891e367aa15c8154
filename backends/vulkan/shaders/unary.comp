// dst = f(a) for f32 tensors of any strides: scale (a * s + bias), silu, gelu (tanh approximation), sigmoid, as the
// CPU computes them. One invocation per destination element.
#version 450

layout(local_size_x = 256, local_size_y = 1, local_size_z = 1) in;

#include "common.glsl"

layout(std430, set = 0, binding = 0) readonly buffer A { float a[]; };
layout(std430, set = 0, binding = 1) writeonly buffer D { float d[]; };

// Offsets and strides in elements (f32).
layout(push_constant) uniform params {
  uint ne0, ne1, ne2, ne3;
  uint a_off, a_nb0, a_nb1, a_nb2, a_nb3;
  uint d_off, d_nb0, d_nb1, d_nb2, d_nb3;
  uint op;  // 0 scale, 1 silu, 2 gelu, 3 sigmoid
  float s;
  float bias;
} p;

void main() {
  const uint i = invocation_index();
  if (i >= p.ne0 * p.ne1 * p.ne2 * p.ne3) return;
  const uvec4 c = unravel(i, p.ne0, p.ne1, p.ne2);
  const uint i0 = c.x, i1 = c.y, i2 = c.z, i3 = c.w;
  const float x = a[p.a_off + i0 * p.a_nb0 + i1 * p.a_nb1 + i2 * p.a_nb2 + i3 * p.a_nb3];
  precise float y;
  if (p.op == 0u) {
    y = x * p.s + p.bias;
  } else if (p.op == 1u) {
    y = silu(x);
  } else if (p.op == 3u) {
    y = 1.0 / (1.0 + exp(-x));
  } else {
    y = gelu(x);
  }
  d[p.d_off + i0 * p.d_nb0 + i1 * p.d_nb1 + i2 * p.d_nb2 + i3 * p.d_nb3] = y;
}
