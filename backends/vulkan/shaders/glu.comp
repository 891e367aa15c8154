// dst = act(x) * g, the gated units swiglu (act = silu) and geglu (act = gelu, tanh approximation), f32 of any
// strides. The host resolves which tensor (or which half of a's rows) is x and which is g, swapped or not.
#version 450

layout(local_size_x = 256, local_size_y = 1, local_size_z = 1) in;

#include "common.glsl"

layout(std430, set = 0, binding = 0) readonly buffer X { float x[]; };
layout(std430, set = 0, binding = 1) readonly buffer G { float g[]; };
layout(std430, set = 0, binding = 2) writeonly buffer D { float d[]; };

layout(push_constant) uniform params {
  uint ne0, ne1, ne2, ne3;  // destination shape
  uint x_off, x_nb0, x_nb1, x_nb2, x_nb3;
  uint g_off, g_nb0, g_nb1, g_nb2, g_nb3;
  uint d_off, d_nb0, d_nb1, d_nb2, d_nb3;
  uint kind;  // 0 swiglu, 1 geglu
} p;

void main() {
  const uint i = invocation_index();
  if (i >= p.ne0 * p.ne1 * p.ne2 * p.ne3) return;
  const uvec4 c = unravel(i, p.ne0, p.ne1, p.ne2);
  const uint i0 = c.x, i1 = c.y, i2 = c.z, i3 = c.w;
  const float v = x[p.x_off + i0 * p.x_nb0 + i1 * p.x_nb1 + i2 * p.x_nb2 + i3 * p.x_nb3];
  const float w = g[p.g_off + i0 * p.g_nb0 + i1 * p.g_nb1 + i2 * p.g_nb2 + i3 * p.g_nb3];
  const float a = p.kind == 0u ? silu(v) : gelu(v);
  d[p.d_off + i0 * p.d_nb0 + i1 * p.d_nb1 + i2 * p.d_nb2 + i3 * p.d_nb3] = a * w;
}
