// dst = softmax(a * scale + slope * mask) per row (dim 0), as the CPU computes it: the mask row is row i1 of
// the mask plane (i2 % mask.ne2, i3 % mask.ne3), f32 or f16; slope is 1, or with max_bias > 0 the ALiBi
// slope of head i2; a fully masked row comes out all zeros. One workgroup per row, max and sum reduced in
// shared memory; the destination row (dense f32) holds the intermediate values.
#version 450

layout(local_size_x = 256, local_size_y = 1, local_size_z = 1) in;

#include "common.glsl"

layout(std430, set = 0, binding = 0) readonly buffer A { float a[]; };
layout(std430, set = 0, binding = 1) readonly buffer M { uint mask[]; };  // f32 bits, or two f16 per word
layout(std430, set = 0, binding = 2) buffer D { float d[]; };

layout(push_constant) uniform params {
  uint ne0, ne1, ne2, ne3;
  uint a_off, a_nb0, a_nb1, a_nb2, a_nb3;
  uint m_off, m_nb1, m_nb2, m_nb3;
  uint m_ne2, m_ne3, m_f16, has_mask;
  uint d_off, d_nb1, d_nb2, d_nb3;
  float scale, max_bias, m0, m1;
  uint n_head_log2;
} p;

shared float red[256];

float load_mask(uint e) {
  return p.m_f16 != 0u ? from16(mask[e >> 1], (e & 1u) != 0u, 1u) : uintBitsToFloat(mask[e]);
}

void main() {
  const uint row = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
  if (row >= p.ne1 * p.ne2 * p.ne3) return;  // uniform per workgroup
  const uint i1 = row % p.ne1;
  const uint i2 = (row / p.ne1) % p.ne2;
  const uint i3 = row / (p.ne1 * p.ne2);
  const uint a_row = p.a_off + i1 * p.a_nb1 + i2 * p.a_nb2 + i3 * p.a_nb3;
  const uint d_row = p.d_off + i1 * p.d_nb1 + i2 * p.d_nb2 + i3 * p.d_nb3;
  const uint m_row = p.m_off + i1 * p.m_nb1 + (i2 % p.m_ne2) * p.m_nb2 + (i3 % p.m_ne3) * p.m_nb3;
  const uint tid = gl_LocalInvocationID.x;
  float slope = 1.0f;
  if (p.max_bias > 0.0f) {
    slope = i2 < p.n_head_log2 ? pow(p.m0, float(i2 + 1u)) : pow(p.m1, float(2u * (i2 - p.n_head_log2) + 1u));
  }

  float mx = -1.0f / 0.0f;
  for (uint i = tid; i < p.ne0; i += 256u) {
    float v = a[a_row + i * p.a_nb0] * p.scale;
    if (p.has_mask != 0u) v += slope * load_mask(m_row + i);
    d[d_row + i] = v;
    mx = max(mx, v);
  }
  red[tid] = mx;
  barrier();
  for (uint w = 128u; w > 0u; w >>= 1) {
    if (tid < w) red[tid] = max(red[tid], red[tid + w]);
    barrier();
  }
  mx = red[0];
  barrier();
  if (isinf(mx) && mx < 0.0f) {  // fully masked row: exp(-inf - -inf) would be NaN
    for (uint i = tid; i < p.ne0; i += 256u) d[d_row + i] = 0.0f;
    return;
  }
  float s = 0.0f;
  for (uint i = tid; i < p.ne0; i += 256u) {
    const float e = exp(d[d_row + i] - mx);
    d[d_row + i] = e;
    s += e;
  }
  red[tid] = s;
  barrier();
  for (uint w = 128u; w > 0u; w >>= 1) {
    if (tid < w) red[tid] += red[tid + w];
    barrier();
  }
  const float inv = 1.0f / red[0];
  for (uint i = tid; i < p.ne0; i += 256u) d[d_row + i] *= inv;
}
