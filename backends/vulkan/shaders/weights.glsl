// Reading weights of any type troupe computes with from a buffer of 32-bit words (no 8- or 16-bit storage
// needed): f32, f16, bf16 and the quantized blocks of runtime/quants.h, byte-identical to GGUF. The includer
// declares the buffer and names it: `#define WEIGHTS a` before `#include "weights.glsl"`.
//
// Type codes are GGUF's ids (runtime/types.h); the weight shaders are compiled once per type with A_TYPE
// defined to it (CMakeLists.txt), so every switch on it folds away. A quantized block of qk values is read in groups of 16
// consecutive values that share one scale and offset: value i of group g = scale * q_i + offset.

const uint t_f32 = 0u, t_f16 = 1u, t_q4_0 = 2u, t_q4_1 = 3u, t_q5_0 = 6u, t_q5_1 = 7u, t_q8_0 = 8u;
const uint t_q2_K = 10u, t_q3_K = 11u, t_q4_K = 12u, t_q5_K = 13u, t_q6_K = 14u, t_bf16 = 30u;

// Values per block and bytes per block of a type (constants once the type is).
uint block_len(uint type) {
  if (type == t_f32 || type == t_f16 || type == t_bf16) return 1u;
  return type >= t_q2_K ? 256u : 32u;
}

uint block_bytes(uint type) {
  switch (type) {
    case t_f32: return 4u;
    case t_f16:
    case t_bf16: return 2u;
    case t_q4_0: return 18u;
    case t_q4_1: return 20u;
    case t_q5_0: return 22u;
    case t_q5_1: return 24u;
    case t_q8_0: return 34u;
    case t_q2_K: return 84u;
    case t_q3_K: return 110u;
    case t_q4_K: return 144u;
    case t_q5_K: return 176u;
    default: return 210u;  // t_q6_K
  }
}

uint w_byte(uint off) { return (WEIGHTS[off >> 2] >> ((off & 3u) << 3)) & 0xffu; }
int w_int8(uint off) { return int(w_byte(off) << 24) >> 24; }
// A 16-bit field at an even byte offset.
uint w_u16(uint off) {
  const uint w = WEIGHTS[off >> 2];
  return (off & 2u) != 0u ? (w >> 16) : (w & 0xffffu);
}
float w_f16(uint off) { return unpackHalf2x16(w_u16(off)).x; }
// A 32-bit field at an even byte offset.
uint w_u32(uint off) { return w_u16(off) | (w_u16(off + 2u) << 16); }

// Element e of a float row starting at byte `row`.
float w_float(uint type, uint row, uint e) {
  if (type == t_f32) return uintBitsToFloat(WEIGHTS[(row >> 2) + e]);
  const uint h = w_u16(row + 2u * e);
  return type == t_f16 ? unpackHalf2x16(h).x : uintBitsToFloat(h << 16);
}

// The 6-bit (scale, min) of sub-block j of a q4_K / q5_K block whose 12 packed scale bytes start at `s`.
uvec2 scale_min_k4(uint s, uint j) {
  if (j < 4u) return uvec2(w_byte(s + j) & 63u, w_byte(s + j + 4u) & 63u);
  return uvec2((w_byte(s + j + 4u) & 0xfu) | ((w_byte(s + j - 4u) >> 6) << 4),
               (w_byte(s + j + 4u) >> 4) | ((w_byte(s + j) >> 6) << 4));
}

// Scale and offset of group g (values 16 g .. 16 g + 15) of the block at byte `blk`.
vec2 group_scale(uint type, uint blk, uint g) {
  switch (type) {
    case t_q4_0:
    case t_q5_0:
    case t_q8_0:
      return vec2(w_f16(blk), 0.0f);
    case t_q4_1:
    case t_q5_1:
      return vec2(w_f16(blk), w_f16(blk + 2u));
    case t_q2_K: {
      const uint sc = w_byte(blk + g);
      return vec2(w_f16(blk + 80u) * float(sc & 0xfu), -w_f16(blk + 82u) * float(sc >> 4));
    }
    case t_q3_K: {
      const uint s = blk + 96u;
      const uint lo = g < 8u ? (w_byte(s + g) & 0xfu) : (w_byte(s + g - 8u) >> 4);
      const uint hi = (w_byte(s + 8u + g % 4u) >> (2u * (g / 4u))) & 3u;
      return vec2(w_f16(blk + 108u) * float(int(lo | (hi << 4)) - 32), 0.0f);
    }
    case t_q4_K:
    case t_q5_K: {
      const uvec2 sm = scale_min_k4(blk + 4u, g / 2u);
      return vec2(w_f16(blk) * float(sm.x), -w_f16(blk + 2u) * float(sm.y));
    }
    default:  // t_q6_K
      return vec2(w_f16(blk + 208u) * float(w_int8(blk + 192u + g)), 0.0f);
  }
}

// The quant q of value v (in [0, qk)) of the block at byte `blk`: the value is scale * q + offset of its group.
float block_q(uint type, uint blk, uint v) {
  switch (type) {
    case t_q4_0:
      return float(int((w_byte(blk + 2u + v % 16u) >> (4u * (v / 16u))) & 0xfu) - 8);
    case t_q4_1:
      return float((w_byte(blk + 4u + v % 16u) >> (4u * (v / 16u))) & 0xfu);
    case t_q5_0: {
      const uint lo = (w_byte(blk + 6u + v % 16u) >> (4u * (v / 16u))) & 0xfu;
      return float(int(lo | (((w_u32(blk + 2u) >> v) & 1u) << 4)) - 16);
    }
    case t_q5_1: {
      const uint lo = (w_byte(blk + 8u + v % 16u) >> (4u * (v / 16u))) & 0xfu;
      return float(lo | (((w_u32(blk + 4u) >> v) & 1u) << 4));
    }
    case t_q8_0:
      return float(w_int8(blk + 2u + v));
    case t_q2_K: {
      const uint h = v / 128u, k = (v % 128u) / 32u, l = v % 32u;
      return float((w_byte(blk + 16u + 32u * h + l) >> (2u * k)) & 3u);
    }
    case t_q3_K: {
      const uint h = v / 128u, k = (v % 128u) / 32u, l = v % 32u;
      const uint lo = (w_byte(blk + 32u + 32u * h + l) >> (2u * k)) & 3u;
      const bool high = ((w_byte(blk + l) >> (4u * h + k)) & 1u) != 0u;
      return float(int(lo) - (high ? 0 : 4));
    }
    case t_q4_K: {
      const uint c = v / 64u, l = v % 32u;
      return float((w_byte(blk + 16u + 32u * c + l) >> (4u * ((v / 32u) % 2u))) & 0xfu);
    }
    case t_q5_K: {
      const uint c = v / 64u, l = v % 32u, half_ = (v / 32u) % 2u;
      const uint lo = (w_byte(blk + 48u + 32u * c + l) >> (4u * half_)) & 0xfu;
      const uint hi = (w_byte(blk + 16u + l) >> (2u * c + half_)) & 1u;
      return float(lo | (hi << 4));
    }
    default: {  // t_q6_K
      const uint h = v / 128u, k = (v % 128u) / 32u, l = v % 32u;
      const uint lo = (w_byte(blk + 64u * h + 32u * (k % 2u) + l) >> (4u * (k / 2u))) & 0xfu;
      const uint hi = (w_byte(blk + 128u + 32u * h + l) >> (2u * k)) & 3u;
      return float(int(lo | (hi << 4)) - 32);
    }
  }
}

// Value e of a row of `type` starting at byte `row`.
float w_value(uint type, uint row, uint e) {
  if (type == t_f32 || type == t_f16 || type == t_bf16) return w_float(type, row, e);
  const uint blk = row + (e / block_len(type)) * block_bytes(type);
  const uint v = e % block_len(type);
  const vec2 so = group_scale(type, blk, v / 16u);
  return so.x * block_q(type, blk, v) + so.y;
}
