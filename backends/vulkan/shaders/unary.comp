// dst = f(a) for f32 tensors of any strides: scale (a * s + bias), silu, gelu (tanh approximation), as the
// CPU computes them. One invocation per destination element.
#version 450

layout(local_size_x = 256, local_size_y = 1, local_size_z = 1) in;

layout(std430, set = 0, binding = 0) readonly buffer A { float a[]; };
layout(std430, set = 0, binding = 1) writeonly buffer D { float d[]; };

// Offsets and strides in elements (f32).
layout(push_constant) uniform params {
  uint ne0, ne1, ne2, ne3;
  uint a_off, a_nb0, a_nb1, a_nb2, a_nb3;
  uint d_off, d_nb0, d_nb1, d_nb2, d_nb3;
  uint op;  // 0 scale, 1 silu, 2 gelu
  float s;
  float bias;
} p;

const float sqrt_2_over_pi = 0.79788456080286535587989211986876f;
const float gelu_coef_a = 0.044715f;

void main() {
  const uint i = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * gl_WorkGroupSize.x;
  if (i >= p.ne0 * p.ne1 * p.ne2 * p.ne3) return;
  const uint i0 = i % p.ne0;
  uint r = i / p.ne0;
  const uint i1 = r % p.ne1;
  r /= p.ne1;
  const uint i2 = r % p.ne2;
  const uint i3 = r / p.ne2;
  const float x = a[p.a_off + i0 * p.a_nb0 + i1 * p.a_nb1 + i2 * p.a_nb2 + i3 * p.a_nb3];
  precise float y;
  if (p.op == 0u) {
    y = x * p.s + p.bias;
  } else if (p.op == 1u) {
    y = x / (1.0f + exp(-x));
  } else {
    // tanh(u) is 1 to float precision beyond |u| = 10 (and some drivers' tanh overflows there).
    const float u = clamp(sqrt_2_over_pi * x * (1.0f + gelu_coef_a * x * x), -10.0f, 10.0f);
    y = 0.5f * x * (1.0f + tanh(u));
  }
  d[p.d_off + i0 * p.d_nb0 + i1 * p.d_nb1 + i2 * p.d_nb2 + i3 * p.d_nb3] = y;
}
