// What the two matrix-product shaders share (mul_mat_vec.comp, mul_mat_mm.comp): dst = a^T b, dst[i, j] =
// dot(row i of a, row j of b). a: weights of any type weights.glsl reads (rows of k values; quantized rows a
// whole number of blocks), broadcast over b's dims 2 and 3; b: f32 of any strides; dst: f32, rows contiguous.
layout(std430, set = 0, binding = 0) readonly buffer A { uint a[]; };
layout(std430, set = 0, binding = 1) readonly buffer B { float b[]; };
layout(std430, set = 0, binding = 2) writeonly buffer D { float d[]; };

#define WEIGHTS a
#include "weights.glsl"

// a's type, blocks of a_qk values in a_bsize bytes.
const uint a_type = A_TYPE;
#define a_qk block_len(a_type)
#define a_bsize block_bytes(a_type)

// a in bytes; b and dst in floats.
layout(push_constant) uniform params {
  uint m, n, k, ne2, ne3;  // dst [m, n, ne2, ne3]
  uint a_off, a_nb1, a_nb2, a_nb3, a_ne2, a_ne3;
  uint b_off, b_nb0, b_nb1, b_nb2, b_nb3;
  uint d_off, d_nb1, d_nb2, d_nb3;
} p;

bool float_weights() { return a_type == t_f32 || a_type == t_f16 || a_type == t_bf16; }

// Byte offset of row i of the a plane that dst plane (i2, i3) reads.
uint a_row(uint i, uint i2, uint i3) {
  return p.a_off + i * p.a_nb1 + (i2 / (p.ne2 / p.a_ne2)) * p.a_nb2 + (i3 / (p.ne3 / p.a_ne3)) * p.a_nb3;
}

uint b_row(uint j, uint i2, uint i3) { return p.b_off + j * p.b_nb1 + i2 * p.b_nb2 + i3 * p.b_nb3; }

uint d_at(uint i, uint j, uint i2, uint i3) { return p.d_off + i + j * p.d_nb1 + i2 * p.d_nb2 + i3 * p.d_nb3; }
