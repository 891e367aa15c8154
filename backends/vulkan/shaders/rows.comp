// Per-row ops over f32 rows (dim 0) of any strides, one invocation per row (none of the model graphs uses
// them; they are here so that every op of the conformance table runs on the device):
//   op 0 norm: dst = (a - mean) / sqrt(var + eps)     op 1 sum_rows: dst[0] = sum
//   op 2 mean: dst[0] = sum / ne0                     op 3 argmax: dst (i32) at flat index r = first index
//                                                      of the row's maximum (NaN never wins)
#version 450

layout(local_size_x = 256, local_size_y = 1, local_size_z = 1) in;

#include "common.glsl"

layout(std430, set = 0, binding = 0) readonly buffer A { float a[]; };
layout(std430, set = 0, binding = 1) writeonly buffer D { uint d[]; };  // f32 bits, or i32

layout(push_constant) uniform params {
  uint ne0, ne1, ne2, ne3;  // a
  uint a_off, a_nb0, a_nb1, a_nb2, a_nb3;
  uint d_ne0, d_ne1, d_ne2;  // dst's shape (argmax: its flat index r is walked through it)
  uint d_off, d_nb0, d_nb1, d_nb2, d_nb3;
  uint op;
  float eps;
} p;

void main() {
  const uint r = invocation_index();
  if (r >= p.ne1 * p.ne2 * p.ne3) return;
  const uvec4 c = unravel(r, p.ne1, p.ne2, p.ne3);  // (i1, i2, i3, -)
  const uint row = p.a_off + c.x * p.a_nb1 + c.y * p.a_nb2 + c.z * p.a_nb3;
  if (p.op == 3u) {
    uint best = 0u;
    float mx = -1.0f / 0.0f;
    for (uint i = 0u; i < p.ne0; ++i) {
      const float v = a[row + i * p.a_nb0];
      if (v > mx) {  // strict: ties keep the first index
        mx = v;
        best = i;
      }
    }
    const uvec4 o = unravel(r, p.d_ne0, p.d_ne1, p.d_ne2);
    d[p.d_off + o.x * p.d_nb0 + o.y * p.d_nb1 + o.z * p.d_nb2 + o.w * p.d_nb3] = best;
    return;
  }
  const uint drow = p.d_off + c.x * p.d_nb1 + c.y * p.d_nb2 + c.z * p.d_nb3;
  float sum = 0.0f;
  for (uint i = 0u; i < p.ne0; ++i) sum += a[row + i * p.a_nb0];
  if (p.op != 0u) {
    d[drow] = floatBitsToUint(p.op == 2u ? sum / float(p.ne0) : sum);
    return;
  }
  const float mean = sum / float(p.ne0);
  float sum2 = 0.0f;
  for (uint i = 0u; i < p.ne0; ++i) {
    const float v = a[row + i * p.a_nb0] - mean;
    sum2 += v * v;
  }
  const float s = 1.0f / sqrt(sum2 / float(p.ne0) + p.eps);
  for (uint i = 0u; i < p.ne0; ++i) d[drow + i * p.d_nb0] = floatBitsToUint((a[row + i * p.a_nb0] - mean) * s);
}
