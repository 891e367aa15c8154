// Matrix-vector products for 1..8 activation rows (generation, small batches): one workgroup per output row
// of a and dst plane; its invocations stride over the row (16-value groups of quantized blocks, or single
// values of float rows), each reading a weight once for all of b's rows, then reduce in shared memory.
#version 450

layout(local_size_x = 64, local_size_y = 1, local_size_z = 1) in;

#include "mul_mat.glsl"

const uint max_cols = 8u;
shared float partial[max_cols * 64u];

void main() {
  const uint wg = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
  if (wg >= p.m * p.ne2 * p.ne3) return;  // uniform per workgroup: no barrier is skipped by some only
  const uint tid = gl_LocalInvocationID.x;
  const uint i = wg % p.m;
  const uint i2 = (wg / p.m) % p.ne2;
  const uint i3 = wg / (p.m * p.ne2);
  const uint row = a_row(i, i2, i3);
  const uint cols = min(p.n, max_cols);
  float acc[max_cols];
  for (uint j = 0u; j < max_cols; ++j) acc[j] = 0.0f;
  if (float_weights()) {
    for (uint e = tid; e < p.k; e += 64u) {
      const float w = w_float(p.a_type, row, e);
      for (uint j = 0u; j < cols; ++j) acc[j] += w * b[b_row(j, i2, i3) + e * p.b_nb0];
    }
  } else {
    for (uint gi = tid; gi < p.k / 16u; gi += 64u) {
      const uint e0 = gi * 16u;
      const uint blk = row + (e0 / p.a_qk) * p.a_bsize;
      const uint v0 = e0 % p.a_qk;
      const vec2 so = group_scale(p.a_type, blk, v0 / 16u);
      float q[16];
      for (uint t = 0u; t < 16u; ++t) q[t] = block_q(p.a_type, blk, v0 + t);
      for (uint j = 0u; j < cols; ++j) {
        const uint bj = b_row(j, i2, i3) + e0 * p.b_nb0;
        float qb = 0.0f;
        float sb = 0.0f;
        for (uint t = 0u; t < 16u; ++t) {
          const float x = b[bj + t * p.b_nb0];
          qb += q[t] * x;
          sb += x;
        }
        acc[j] += so.x * qb + so.y * sb;
      }
    }
  }
  for (uint j = 0u; j < cols; ++j) partial[j * 64u + tid] = acc[j];
  barrier();
  for (uint w = 32u; w > 0u; w >>= 1) {
    if (tid < w) {
      for (uint j = 0u; j < cols; ++j) partial[j * 64u + tid] += partial[j * 64u + tid + w];
    }
    barrier();
  }
  if (tid < cols) d[d_at(i, tid, i2, i3)] = partial[tid * 64u];
}
