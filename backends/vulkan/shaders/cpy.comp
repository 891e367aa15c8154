// cpy and cont: the destination's elements in order are the source's elements in order (shapes may differ,
// the element count is the same), converted between f32, f16 and bf16. One invocation per element, of a
// destination of any strides; a contiguous 16-bit destination that starts on a word (the common case) goes
// a word of two elements per invocation instead, others write their half of a word with two atomics
// (clear, set), so no invocation disturbs the element next to its own.
#version 450

layout(local_size_x = 256, local_size_y = 1, local_size_z = 1) in;

#include "common.glsl"

layout(std430, set = 0, binding = 0) readonly buffer S { uint s[]; };
layout(std430, set = 0, binding = 1) buffer D { uint d[]; };

// Offsets and strides in elements of each tensor's type; types: 0 f32, 1 f16, 2 bf16.
layout(push_constant) uniform params {
  uint s_ne0, s_ne1, s_ne2, s_ne3;
  uint s_off, s_nb0, s_nb1, s_nb2, s_nb3;
  uint d_ne0, d_ne1, d_ne2, d_ne3;
  uint d_off, d_nb0, d_nb1, d_nb2, d_nb3;
  uint s_type, d_type, n;
  uint by_word;  // a 16-bit destination, contiguous and word-aligned: one invocation per word
} p;

#define STORE16_BUFFER d
#include "store16.glsl"

// Source element number i (in the source's element order).
float source(uint i) {
  const uvec4 c = unravel(i, p.s_ne0, p.s_ne1, p.s_ne2);
  const uint e = p.s_off + c.x * p.s_nb0 + c.y * p.s_nb1 + c.z * p.s_nb2 + c.w * p.s_nb3;
  return p.s_type == 0u ? uintBitsToFloat(s[e]) : from16(s[e >> 1], (e & 1u) != 0u, p.s_type);
}

void main() {
  const uint t = invocation_index();
  if (p.by_word == 0u) {
    if (t >= p.n) return;
    const uvec4 c = unravel(t, p.d_ne0, p.d_ne1, p.d_ne2);
    const uint e = p.d_off + c.x * p.d_nb0 + c.y * p.d_nb1 + c.z * p.d_nb2 + c.w * p.d_nb3;
    if (p.d_type == 0u) {
      d[e] = floatBitsToUint(source(t));
    } else {
      store16(e, to16(source(t), p.d_type));
    }
    return;
  }
  const uint first = 2u * t;  // the word's first element
  if (first >= p.n) return;
  const uint word = (p.d_off >> 1) + t;
  const uint lo = to16(source(first), p.d_type);
  const uint hi = first + 1u < p.n ? to16(source(first + 1u), p.d_type) : (d[word] >> 16);
  d[word] = lo | (hi << 16);
}
