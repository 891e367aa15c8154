// Matrix-matrix products without shared memory, for devices that are CPUs (lavapipe): every invocation
// computes a 4 x 4 block of dst from a and b in memory (the CPU's caches do what shared memory does on a
// GPU), stepping over the rows 16 values at a time with a's 16-value groups dequantized once per step. No
// barrier, which a CPU driver runs by switching between its invocations' stacks.
#version 450

layout(local_size_x = 64, local_size_y = 1, local_size_z = 1) in;

#include "common.glsl"
#include "mul_mat.glsl"

void main() {
  const uint blocks_m = (p.m + 3u) / 4u;
  const uint blocks_n = (p.n + 3u) / 4u;
  const uint t = invocation_index();
  if (t >= blocks_m * blocks_n * p.ne2 * p.ne3) return;
  const uint i0 = (t % blocks_m) * 4u;
  const uint j0 = ((t / blocks_m) % blocks_n) * 4u;
  const uint plane = t / (blocks_m * blocks_n);
  const uint i2 = plane % p.ne2;
  const uint i3 = plane / p.ne2;
  uint arow[4];
  uint brow[4];
  for (uint r = 0u; r < 4u; ++r) arow[r] = a_row(min(i0 + r, p.m - 1u), i2, i3);  // rows past the end: computed, not stored
  for (uint c = 0u; c < 4u; ++c) brow[c] = b_row(min(j0 + c, p.n - 1u), i2, i3);
  float acc[4][4];
  for (uint r = 0u; r < 4u; ++r) {
    for (uint c = 0u; c < 4u; ++c) acc[r][c] = 0.0f;
  }
  const bool quantized = !float_weights();
  for (uint k0 = 0u; k0 < p.k; k0 += 16u) {
    const uint len = min(16u, p.k - k0);
    float x[4][16];  // b's 4 columns, loaded once per step (the same for the neighbouring invocations)
    for (uint c = 0u; c < 4u; ++c) {
      for (uint e = 0u; e < 16u; ++e) x[c][e] = e < len ? b[brow[c] + (k0 + e) * p.b_nb0] : 0.0f;
    }
    for (uint r = 0u; r < 4u; ++r) {
      float w[16];
      if (quantized) {  // k is a whole number of blocks, so of 16-value groups
        const uint blk = arow[r] + (k0 / a_qk) * a_bsize;
        const uint v0 = k0 % a_qk;
        const vec2 so = group_scale(a_type, blk, v0 / 16u);
        for (uint e = 0u; e < 16u; ++e) w[e] = so.x * block_q(a_type, blk, v0 + e) + so.y;
      } else {
        for (uint e = 0u; e < 16u; ++e) w[e] = e < len ? w_float(a_type, arow[r], k0 + e) : 0.0f;
      }
      for (uint c = 0u; c < 4u; ++c) {
        float s = 0.0f;
        for (uint e = 0u; e < 16u; ++e) s += w[e] * x[c][e];
        acc[r][c] += s;
      }
    }
  }
  for (uint r = 0u; r < 4u; ++r) {
    if (i0 + r >= p.m) break;
    for (uint c = 0u; c < 4u; ++c) {
      if (j0 + c < p.n) d[d_at(i0 + r, j0 + c, i2, i3)] = acc[r][c];
    }
  }
}
