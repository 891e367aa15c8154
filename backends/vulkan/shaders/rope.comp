// Rotary position embedding, normal (pairs 2i, 2i + 1) and neox (pairs i, i + n_dims / 2) modes, partial
// rotation (dimensions from n_dims on pass through), linear scaling, YaRN and freq_factors, as the CPU computes it
// (theta of pair i is pos * theta_scale^i by repeated multiplication). a: [head_dim, n_head, n_tokens, ne3]
// f32 of any strides; pos: i32 per token. One invocation per pair (it writes both elements, so the op may
// run in place) or per passed-through element.
#version 450

layout(local_size_x = 256, local_size_y = 1, local_size_z = 1) in;

#include "common.glsl"

layout(std430, set = 0, binding = 0) readonly buffer A { float a[]; };
layout(std430, set = 0, binding = 1) readonly buffer P { int pos[]; };
layout(std430, set = 0, binding = 2) readonly buffer F { float ff[]; };
layout(std430, set = 0, binding = 3) buffer D { float d[]; };

layout(push_constant) uniform params {
  uint ne0, ne1, ne2, ne3;
  uint a_off, a_nb0, a_nb1, a_nb2, a_nb3;
  uint d_off, d_nb0, d_nb1, d_nb2, d_nb3;
  uint p_off, f_off, has_ff;
  uint n_dims, neox;
  float theta_scale, freq_scale, attn_factor;
  float ext_factor, corr0, corr1, yarn_mscale;  // YaRN (ext_factor 0: off); corr: rope_yarn_corr_dims
} p;

void main() {
  const uint t = invocation_index();
  const uint half_dims = p.n_dims / 2u;
  const uint per_row = half_dims + (p.ne0 - p.n_dims);
  if (t >= per_row * p.ne1 * p.ne2 * p.ne3) return;
  const uint c = t % per_row;
  uint r = t / per_row;
  const uint i1 = r % p.ne1;
  r /= p.ne1;
  const uint i2 = r % p.ne2;
  const uint i3 = r / p.ne2;
  const uint x_row = p.a_off + i1 * p.a_nb1 + i2 * p.a_nb2 + i3 * p.a_nb3;
  const uint y_row = p.d_off + i1 * p.d_nb1 + i2 * p.d_nb2 + i3 * p.d_nb3;
  if (c >= half_dims) {  // not rotated: passed through
    const uint i = p.n_dims + (c - half_dims);
    d[y_row + i * p.d_nb0] = a[x_row + i * p.a_nb0];
    return;
  }
  float theta = float(pos[p.p_off + i2]);
  for (uint k = 0u; k < c; ++k) theta *= p.theta_scale;
  const float f = p.has_ff != 0u ? ff[p.f_off + c] : 1.0f;
  const float theta_extrap = theta / f;
  const float theta_interp = p.freq_scale * theta_extrap;
  float th = theta_interp;
  float mscale = p.attn_factor;
  if (p.ext_factor != 0.0f) {  // YaRN: extrapolated below corr0, interpolated above corr1, a ramp between
    const float y = (float(c) - p.corr0) / max(0.001f, p.corr1 - p.corr0);
    const float ramp_mix = (1.0f - min(1.0f, max(0.0f, y))) * p.ext_factor;
    th = theta_interp * (1.0f - ramp_mix) + theta_extrap * ramp_mix;
    mscale *= p.yarn_mscale;
  }
  const float cs = cos(th) * mscale;
  const float sn = sin(th) * mscale;
  const uint i = p.neox != 0u ? c : 2u * c;
  const uint j = i + (p.neox != 0u ? half_dims : 1u);
  const float x0 = a[x_row + i * p.a_nb0];
  const float x1 = a[x_row + j * p.a_nb0];
  precise float y0 = x0 * cs - x1 * sn;
  precise float y1 = x0 * sn + x1 * cs;
  d[y_row + i * p.d_nb0] = y0;
  d[y_row + j * p.d_nb0] = y1;
}
