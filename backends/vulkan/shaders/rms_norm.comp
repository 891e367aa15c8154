// dst = a / sqrt(mean(a^2) + eps) per row (dim 0), f32 of any strides: one workgroup per row, the sum of
// squares reduced in shared memory.
#version 450

layout(local_size_x = 256, local_size_y = 1, local_size_z = 1) in;

layout(std430, set = 0, binding = 0) readonly buffer A { float a[]; };
layout(std430, set = 0, binding = 1) writeonly buffer D { float d[]; };

layout(push_constant) uniform params {
  uint ne0, ne1, ne2, ne3;
  uint a_off, a_nb0, a_nb1, a_nb2, a_nb3;
  uint d_off, d_nb0, d_nb1, d_nb2, d_nb3;
  float eps;
} p;

shared float partial[256];

void main() {
  const uint row = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
  if (row >= p.ne1 * p.ne2 * p.ne3) return;  // uniform per workgroup: no barrier is skipped by some only
  const uint i1 = row % p.ne1;
  const uint i2 = (row / p.ne1) % p.ne2;
  const uint i3 = row / (p.ne1 * p.ne2);
  const uint a_row = p.a_off + i1 * p.a_nb1 + i2 * p.a_nb2 + i3 * p.a_nb3;
  const uint d_row = p.d_off + i1 * p.d_nb1 + i2 * p.d_nb2 + i3 * p.d_nb3;
  const uint tid = gl_LocalInvocationID.x;
  float s = 0.0f;
  for (uint i = tid; i < p.ne0; i += 256u) {
    const float x = a[a_row + i * p.a_nb0];
    s += x * x;
  }
  partial[tid] = s;
  barrier();
  for (uint w = 128u; w > 0u; w >>= 1) {
    if (tid < w) partial[tid] += partial[tid + w];
    barrier();
  }
  const float scale = 1.0f / sqrt(partial[0] / float(p.ne0) + p.eps);
  for (uint i = tid; i < p.ne0; i += 256u) d[d_row + i * p.d_nb0] = a[a_row + i * p.a_nb0] * scale;
}
