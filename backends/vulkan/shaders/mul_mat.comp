// dst = a^T b: dst[i, j] = dot(row i of a, row j of b), a f32 or f16 with contiguous rows (weights, a KV
// cache view) broadcast over b's dims 2 and 3, b f32 of any strides, dst f32 with contiguous rows. One
// invocation per destination element (the first, plain shader: the tiled ones come later).
#version 450

layout(local_size_x = 256, local_size_y = 1, local_size_z = 1) in;

#include "common.glsl"

layout(std430, set = 0, binding = 0) readonly buffer A { uint a[]; };  // f32 bits, or two f16 per word
layout(std430, set = 0, binding = 1) readonly buffer B { float b[]; };
layout(std430, set = 0, binding = 2) writeonly buffer D { float d[]; };

// Offsets and strides in elements of each tensor's type.
layout(push_constant) uniform params {
  uint m, n, k, ne2, ne3;  // dst [m, n, ne2, ne3]; rows of length k
  uint a_off, a_nb1, a_nb2, a_nb3, a_ne2, a_ne3, a_f16;
  uint b_off, b_nb0, b_nb1, b_nb2, b_nb3;
  uint d_off, d_nb1, d_nb2, d_nb3;
} p;

float load_a(uint e) {
  return p.a_f16 != 0u ? from16(a[e >> 1], (e & 1u) != 0u, 1u) : uintBitsToFloat(a[e]);
}

void main() {
  const uint idx = invocation_index();
  if (idx >= p.m * p.n * p.ne2 * p.ne3) return;
  const uint i = idx % p.m;
  uint r = idx / p.m;
  const uint j = r % p.n;
  r /= p.n;
  const uint i2 = r % p.ne2;
  const uint i3 = r / p.ne2;
  const uint a_base = p.a_off + i * p.a_nb1 + (i2 / (p.ne2 / p.a_ne2)) * p.a_nb2 + (i3 / (p.ne3 / p.a_ne3)) * p.a_nb3;
  const uint b_base = p.b_off + j * p.b_nb1 + i2 * p.b_nb2 + i3 * p.b_nb3;
  float acc = 0.0f;
  for (uint t = 0u; t < p.k; ++t) acc += load_a(a_base + t) * b[b_base + t * p.b_nb0];
  d[p.d_off + i + j * p.d_nb1 + i2 * p.d_nb2 + i3 * p.d_nb3] = acc;
}
