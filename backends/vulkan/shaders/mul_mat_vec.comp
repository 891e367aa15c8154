// Matrix-vector products for 1..8 activation rows (generation, small batches): each subgroup computes one
// output row of a (and dst plane) at a time; its invocations stride over the row (16-value groups of
// quantized blocks, or single values of float rows), each reading a weight once for all of b's rows, and
// subgroupAdd sums them: no shared memory, no barrier (which CPU drivers such as lavapipe pay dearly for).
// Any subgroup size: a workgroup's subgroups take consecutive rows, and every subgroup loops until the
// rows run out, so a driver whose subgroups are wider than the host assumed still covers them all.
#version 450
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require

layout(local_size_x = 64, local_size_y = 1, local_size_z = 1) in;

#include "mul_mat.glsl"

const uint max_cols = 8u;

void main() {
  const uint rows = p.m * p.ne2 * p.ne3;
  const uint lane = gl_SubgroupInvocationID;
  const uint width = gl_SubgroupSize;
  const uint wg = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
  const uint stride = gl_NumWorkGroups.x * gl_NumWorkGroups.y * gl_NumSubgroups;
  const uint cols = min(p.n, max_cols);
  for (uint wr = wg * gl_NumSubgroups + gl_SubgroupID; wr < rows; wr += stride) {  // uniform per subgroup
    const uint i = wr % p.m;
    const uint i2 = (wr / p.m) % p.ne2;
    const uint i3 = wr / (p.m * p.ne2);
    const uint row = a_row(i, i2, i3);
    float acc[max_cols];
    for (uint j = 0u; j < max_cols; ++j) acc[j] = 0.0f;
    if (float_weights()) {
      for (uint e = lane; e < p.k; e += width) {
        const float w = w_float(a_type, row, e);
        for (uint j = 0u; j < max_cols; ++j) {  // a constant trip count: acc stays in registers
          if (j < cols) acc[j] += w * b[b_row(j, i2, i3) + e * p.b_nb0];
        }
      }
    } else {
      for (uint gi = lane; gi < p.k / 16u; gi += width) {
        const uint e0 = gi * 16u;
        const uint blk = row + (e0 / a_qk) * a_bsize;
        const uint v0 = e0 % a_qk;
        const vec2 so = group_scale(a_type, blk, v0 / 16u);
        float q[16];
        for (uint t = 0u; t < 16u; ++t) q[t] = block_q(a_type, blk, v0 + t);
        for (uint j = 0u; j < max_cols; ++j) {
          if (j >= cols) break;
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
    for (uint j = 0u; j < max_cols; ++j) {
      if (j >= cols) break;  // uniform: every lane of the subgroup leaves together
      const float s = subgroupAdd(acc[j]);
      if (lane == 0u) d[d_at(i, j, i2, i3)] = s;
    }
  }
}
