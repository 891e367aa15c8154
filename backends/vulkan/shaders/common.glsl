// Pieces the compute shaders share (#include "common.glsl"; glslc -I finds it): the invocation's index
// over a 2-D dispatch, activations as the CPU computes them, and 16-bit float loads and stores.

// One invocation's number: workgroups run in x up to the driver's limit, then in y.
uint invocation_index() {
  return gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * gl_WorkGroupSize.x;
}

// Element number i of a [ne0, ne1, ne2, ne3] tensor as its four coordinates.
uvec4 unravel(uint i, uint ne0, uint ne1, uint ne2) {
  const uint i0 = i % ne0;
  uint r = i / ne0;
  const uint i1 = r % ne1;
  r /= ne1;
  return uvec4(i0, i1, r % ne2, r / ne2);
}

float silu(float x) {
  precise float y = x / (1.0f + exp(-x));
  return y;
}

// The tanh approximation; tanh(u) is 1 to float precision beyond |u| = 10 (and some drivers' tanh
// overflows there).
float gelu(float x) {
  const float sqrt_2_over_pi = 0.79788456080286535587989211986876f;
  const float gelu_coef_a = 0.044715f;
  const float u = clamp(sqrt_2_over_pi * x * (1.0f + gelu_coef_a * x * x), -10.0f, 10.0f);
  precise float y = 0.5f * x * (1.0f + tanh(u));
  return y;
}

// A 16-bit value (half `upper` of a word) as f32: type 1 f16, 2 bf16.
float from16(uint word, bool upper, uint type) {
  const uint h = upper ? (word >> 16) : (word & 0xffffu);
  return type == 1u ? unpackHalf2x16(h).x : uintBitsToFloat(h << 16);
}

// f32 as 16 bits: type 1 f16, 2 bf16 (rounded to nearest even; a NaN stays a quiet NaN).
uint to16(float x, uint type) {
  if (type == 1u) return packHalf2x16(vec2(x, 0.0f)) & 0xffffu;
  const uint b = floatBitsToUint(x);
  if ((b & 0x7fffffffu) > 0x7f800000u) return (b >> 16) | 0x40u;
  return (b + 0x7fffu + ((b >> 16) & 1u)) >> 16;
}
