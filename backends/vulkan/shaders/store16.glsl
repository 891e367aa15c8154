// A 16-bit store into a buffer of 32-bit words: element e's half of its word, written with two atomics
// (clear, set), so an invocation never disturbs the neighbouring element another one writes. The includer
// names the buffer: `#define STORE16_BUFFER d` before `#include "store16.glsl"`, after the buffer.
void store16(uint e, uint h) {
  const uint shift = (e & 1u) * 16u;
  atomicAnd(STORE16_BUFFER[e >> 1], ~(0xffffu << shift));
  atomicOr(STORE16_BUFFER[e >> 1], h << shift);
}
