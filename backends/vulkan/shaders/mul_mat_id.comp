// Mixture of experts: dst[:, s, t] = as[:, :, ids[s, t]]^T b[:, s % n_b, t] (runtime/ops.h mul_mat_id).
// Each subgroup computes one output row (i, s, t) at a time: its invocations stride over the chosen
// expert's row i (16-value groups of quantized blocks, or single values of float rows) against the token's
// row of b, and subgroupAdd sums them, as mul_mat_vec.comp does for one column. An id out of range (only a
// malformed graph has one) gives 0.
#version 450
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require

layout(local_size_x = 64, local_size_y = 1, local_size_z = 1) in;

layout(std430, set = 0, binding = 0) readonly buffer A { uint a[]; };
layout(std430, set = 0, binding = 1) readonly buffer B { float b[]; };
layout(std430, set = 0, binding = 2) writeonly buffer D { float d[]; };
layout(std430, set = 0, binding = 3) readonly buffer I { int ids[]; };

#define WEIGHTS a
#include "weights.glsl"

const uint a_type = A_TYPE;
#define a_qk block_len(a_type)
#define a_bsize block_bytes(a_type)

// as in bytes; b, dst and ids in elements.
layout(push_constant) uniform params {
  uint m, n_used, n_tokens, k, n_expert;
  uint a_off, a_nb1, a_nb2;  // as: row and expert strides
  uint b_off, b_nb0, b_nb1, b_nb2, n_b;
  uint d_off, d_nb1, d_nb2;
  uint i_off, i_nb0, i_nb1;
} p;

void main() {
  const uint rows = p.m * p.n_used * p.n_tokens;
  const uint lane = gl_SubgroupInvocationID;
  const uint width = gl_SubgroupSize;
  const uint wg = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
  const uint stride = gl_NumWorkGroups.x * gl_NumWorkGroups.y * gl_NumSubgroups;
  for (uint wr = wg * gl_NumSubgroups + gl_SubgroupID; wr < rows; wr += stride) {  // uniform per subgroup
    const uint i = wr % p.m;
    const uint s = (wr / p.m) % p.n_used;
    const uint t = wr / (p.m * p.n_used);
    const int e = ids[p.i_off + s * p.i_nb0 + t * p.i_nb1];
    float acc = 0.0f;
    if (e >= 0 && uint(e) < p.n_expert) {
      const uint row = p.a_off + i * p.a_nb1 + uint(e) * p.a_nb2;
      const uint bj = p.b_off + (p.n_b == 1u ? 0u : s) * p.b_nb1 + t * p.b_nb2;
      if (a_type == t_f32 || a_type == t_f16 || a_type == t_bf16) {
        for (uint x = lane; x < p.k; x += width) acc += w_float(a_type, row, x) * b[bj + x * p.b_nb0];
      } else {
        for (uint gi = lane; gi < p.k / 16u; gi += width) {
          const uint e0 = gi * 16u;
          const uint blk = row + (e0 / a_qk) * a_bsize;
          const uint v0 = e0 % a_qk;
          const vec2 so = group_scale(a_type, blk, v0 / 16u);
          float qb = 0.0f;
          float sb = 0.0f;
          for (uint u = 0u; u < 16u; ++u) {
            const float x = b[bj + (e0 + u) * p.b_nb0];
            qb += block_q(a_type, blk, v0 + u) * x;
            sb += x;
          }
          acc += so.x * qb + so.y * sb;
        }
      }
    }
    const float sum = subgroupAdd(acc);
    if (lane == 0u) d[p.d_off + i + s * p.d_nb1 + t * p.d_nb2] = sum;
  }
}
