// Matrix-matrix products for more than 8 activation rows (prompts): a workgroup computes a 64 x 64 tile of
// dst, stepping over the rows 16 values at a time; each step dequantizes a 64 x 16 tile of a and loads a
// 64 x 16 tile of b into shared memory, where every invocation's 4 x 4 outputs read them.
#version 450

layout(local_size_x = 256, local_size_y = 1, local_size_z = 1) in;

#include "mul_mat.glsl"

const uint tile = 64u;
const uint step_k = 16u;
shared float as_[step_k][tile];
shared float bs_[step_k][tile];

void main() {
  const uint tiles_m = (p.m + tile - 1u) / tile;
  const uint tiles_n = (p.n + tile - 1u) / tile;
  const uint wg = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
  if (wg >= tiles_m * tiles_n * p.ne2 * p.ne3) return;  // uniform per workgroup
  const uint tid = gl_LocalInvocationID.x;
  const uint i0 = (wg % tiles_m) * tile;
  const uint j0 = ((wg / tiles_m) % tiles_n) * tile;
  const uint plane = wg / (tiles_m * tiles_n);
  const uint i2 = plane % p.ne2;
  const uint i3 = plane / p.ne2;
  // What this invocation loads: 4 values of row `lr` of each tile; what it computes: rows 4 ty.., columns 4 tx..
  const uint lr = tid / 4u;
  const uint lk = (tid % 4u) * 4u;
  const uint tx = tid % 16u;
  const uint ty = tid / 16u;
  const bool a_in = i0 + lr < p.m;
  const bool b_in = j0 + lr < p.n;
  const uint arow = a_in ? a_row(i0 + lr, i2, i3) : 0u;
  const uint brow = b_in ? b_row(j0 + lr, i2, i3) : 0u;
  float acc[4][4];
  for (uint r = 0u; r < 4u; ++r) {
    for (uint c = 0u; c < 4u; ++c) acc[r][c] = 0.0f;
  }
  for (uint k0 = 0u; k0 < p.k; k0 += step_k) {
    if (!a_in) {
      for (uint t = 0u; t < 4u; ++t) as_[lk + t][lr] = 0.0f;
    } else if (float_weights()) {
      for (uint t = 0u; t < 4u; ++t) {
        const uint e = k0 + lk + t;
        as_[lk + t][lr] = e < p.k ? w_float(a_type, arow, e) : 0.0f;
      }
    } else {  // k is a whole number of blocks, so of 16-value groups
      const uint blk = arow + (k0 / a_qk) * a_bsize;
      const uint v0 = k0 % a_qk;
      const vec2 so = group_scale(a_type, blk, v0 / 16u);
      for (uint t = 0u; t < 4u; ++t) as_[lk + t][lr] = so.x * block_q(a_type, blk, v0 + lk + t) + so.y;
    }
    for (uint t = 0u; t < 4u; ++t) {
      const uint e = k0 + lk + t;
      bs_[lk + t][lr] = b_in && e < p.k ? b[brow + e * p.b_nb0] : 0.0f;
    }
    barrier();
    for (uint kk = 0u; kk < step_k; ++kk) {
      float av[4];
      float bv[4];
      for (uint r = 0u; r < 4u; ++r) av[r] = as_[kk][4u * ty + r];
      for (uint c = 0u; c < 4u; ++c) bv[c] = bs_[kk][4u * tx + c];
      for (uint r = 0u; r < 4u; ++r) {
        for (uint c = 0u; c < 4u; ++c) acc[r][c] += av[r] * bv[c];
      }
    }
    barrier();
  }
  for (uint r = 0u; r < 4u; ++r) {
    const uint i = i0 + 4u * ty + r;
    if (i >= p.m) continue;
    for (uint c = 0u; c < 4u; ++c) {
      const uint j = j0 + 4u * tx + c;
      if (j < p.n) d[d_at(i, j, i2, i3)] = acc[r][c];
    }
  }
}
