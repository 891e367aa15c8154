// How the CUDA kernels read weights: value i of a row of any weight type (get_rows, the float matrix-vector
// kernel, dequantization for cuBLAS), and the dot product of 32 values of a quantized row with 32 activations
// quantized to 8 bits (the quantized matrix-vector kernel: integer products with dp4a). The blocks are
// runtime/quants.h's structs, the CPU's own definitions, byte-identical to GGUF.
//
//   float w = load_weight<type::q4_K>(row, i);               // value i of the row
//   float s = dot32<type::q6_K>(row, j, act[j]);             // values 32 j .. 32 j + 31 times act block j
//
// Activations for dot32 are an act_block per 32 values (quantize_act): d = max |x| / 127, q = round(x / d),
// and sum = d * sum(q) for the types whose values carry an offset (q4_1, q5_1, the mins of the K-quants).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "backends/cuda/kernels/hd.h"
#include "runtime/error.h"
#include "runtime/quants.h"
#include "runtime/types.h"

namespace troupe::cuda::kern {

// 32 activations quantized to 8 bits (the device's scratch format, 4-byte aligned for integer loads).
struct act_block {
  float d;       // scale
  float sum;     // d * sum of the quants
  int32_t q[8];  // 32 int8 quants, four per word, little-endian
};
static_assert(sizeof(act_block) == 40, "act_block must be 40 bytes");

// The layouts the kernels index into, checked against GGUF's block sizes.
static_assert(sizeof(block_q4_0) == 18 && sizeof(block_q4_1) == 20 && sizeof(block_q5_0) == 22 &&
                  sizeof(block_q5_1) == 24 && sizeof(block_q8_0) == 34,
              "32-value blocks as GGUF stores them");
static_assert(sizeof(block_q2_K) == 84 && sizeof(block_q3_K) == 110 && sizeof(block_q4_K) == 144 &&
                  sizeof(block_q5_K) == 176 && sizeof(block_q6_K) == 210,
              "K-quant super-blocks as GGUF stores them");
static_assert(offsetof(block_q4_0, qs) == 2 && offsetof(block_q5_0, qs) == 6 && offsetof(block_q8_0, qs) == 2,
              "quants at even offsets: read with load_i32_2");
static_assert(offsetof(block_q4_K, qs) == 16 && offsetof(block_q5_K, qh) == 16 && offsetof(block_q5_K, qs) == 48 &&
                  offsetof(block_q6_K, qh) == 128 && offsetof(block_q6_K, scales) == 192 && offsetof(block_q6_K, d) == 208 &&
                  offsetof(block_q2_K, qs) == 16 && offsetof(block_q2_K, d) == 80 && offsetof(block_q3_K, qs) == 32 &&
                  offsetof(block_q3_K, scales) == 96 && offsetof(block_q3_K, d) == 108,
              "K-quant fields where GGUF puts them");

// The weight types the kernels read (runtime/types.h: the Vulkan backend's too).
constexpr bool is_weight_type(type t) { return is_gpu_weight_type(t); }

constexpr bool is_float_type(type t) { return t == type::f32 || t == type::f16 || t == type::bf16; }

// Host code: calls f with weight type t as a compile-time constant (std::integral_constant<type, T>), for
// picking a kernel's instantiation. Throws backend_error for a type no kernel reads.
template <class F>
void with_weight_type(type t, F&& f) {
  switch (t) {
    case type::f32: return f(std::integral_constant<type, type::f32>{});
    case type::f16: return f(std::integral_constant<type, type::f16>{});
    case type::bf16: return f(std::integral_constant<type, type::bf16>{});
    case type::q4_0: return f(std::integral_constant<type, type::q4_0>{});
    case type::q4_1: return f(std::integral_constant<type, type::q4_1>{});
    case type::q5_0: return f(std::integral_constant<type, type::q5_0>{});
    case type::q5_1: return f(std::integral_constant<type, type::q5_1>{});
    case type::q8_0: return f(std::integral_constant<type, type::q8_0>{});
    case type::q2_K: return f(std::integral_constant<type, type::q2_K>{});
    case type::q3_K: return f(std::integral_constant<type, type::q3_K>{});
    case type::q4_K: return f(std::integral_constant<type, type::q4_K>{});
    case type::q5_K: return f(std::integral_constant<type, type::q5_K>{});
    case type::q6_K: return f(std::integral_constant<type, type::q6_K>{});
    default: throw backend_error("CUDA: no kernel reads weights of type " + std::string(type_name(t)));
  }
}

// The (scale, min) pair of sub-block j of a q4_K / q5_K block (runtime/quants.h's get_scale_min_k4).
TROUPE_HD inline void scale_min_k4(int j, const uint8_t* q, int& sc, int& m) {
  if (j < 4) {
    sc = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// The signed scale of sub-block j (of 16 values) of a q3_K block (runtime/quants.h's q3_K_scale - 32).
TROUPE_HD inline int scale_q3_K(const uint8_t* scales, int j) {
  const int lo = j < 8 ? (scales[j] & 0xF) : (scales[j - 8] >> 4);
  const int hi = (scales[8 + j % 4] >> (2 * (j / 4))) & 3;
  return (lo | (hi << 4)) - 32;
}

// Value i of a row of weights of type T (the row starts at a block; 16-bit fields at even addresses).
template <type T>
TROUPE_HD inline float load_weight(const uint8_t* row, int64_t i) {
  if constexpr (T == type::f32) {
    return reinterpret_cast<const float*>(row)[i];
  } else if constexpr (T == type::f16) {
    return half_to_float(reinterpret_cast<const uint16_t*>(row)[i]);
  } else if constexpr (T == type::bf16) {
    return bf16_to_float(reinterpret_cast<const uint16_t*>(row)[i]);
  } else if constexpr (T == type::q4_0 || T == type::q4_1) {
    const int v = static_cast<int>(i % 32);
    const uint8_t* b = row + (i / 32) * (T == type::q4_0 ? 18 : 20);
    const auto* h = reinterpret_cast<const uint16_t*>(b);
    const uint8_t* qs = b + (T == type::q4_0 ? 2 : 4);
    const int q = v < 16 ? (qs[v] & 0xF) : (qs[v - 16] >> 4);
    if constexpr (T == type::q4_0) return half_to_float(h[0]) * static_cast<float>(q - 8);
    return half_to_float(h[0]) * static_cast<float>(q) + half_to_float(h[1]);
  } else if constexpr (T == type::q5_0 || T == type::q5_1) {
    const int v = static_cast<int>(i % 32);
    const uint8_t* b = row + (i / 32) * (T == type::q5_0 ? 22 : 24);
    const auto* h = reinterpret_cast<const uint16_t*>(b);
    const uint8_t* qh = b + (T == type::q5_0 ? 2 : 4);
    const uint8_t* qs = qh + 4;
    const int hb = (qh[v / 8] >> (v % 8)) & 1;
    const int q = (v < 16 ? (qs[v] & 0xF) : (qs[v - 16] >> 4)) | (hb << 4);
    if constexpr (T == type::q5_0) return half_to_float(h[0]) * static_cast<float>(q - 16);
    return half_to_float(h[0]) * static_cast<float>(q) + half_to_float(h[1]);
  } else if constexpr (T == type::q8_0) {
    const uint8_t* b = row + (i / 32) * 34;
    return half_to_float(*reinterpret_cast<const uint16_t*>(b)) * static_cast<float>(static_cast<int8_t>(b[2 + i % 32]));
  } else {
    // K-quants: super-blocks of 256, value v = 128 h + 32 k + l where it helps.
    const int v = static_cast<int>(i % 256);
    const int h = v / 128, k = (v % 128) / 32, l = v % 32;
    if constexpr (T == type::q2_K) {
      const auto* b = reinterpret_cast<const block_q2_K*>(row) + i / 256;
      const int q = (b->qs[32 * h + l] >> (2 * k)) & 3;
      const int sc = b->scales[v / 16];
      return half_to_float(b->d) * static_cast<float>((sc & 0xF) * q) - half_to_float(b->dmin) * static_cast<float>(sc >> 4);
    } else if constexpr (T == type::q3_K) {
      const auto* b = reinterpret_cast<const block_q3_K*>(row) + i / 256;
      const int lo = (b->qs[32 * h + l] >> (2 * k)) & 3;
      const int q = ((b->hmask[l] >> (4 * h + k)) & 1) != 0 ? lo : lo - 4;
      return half_to_float(b->d) * static_cast<float>(scale_q3_K(b->scales, v / 16) * q);
    } else if constexpr (T == type::q4_K || T == type::q5_K) {
      const int c = v / 64;
      const int hi = (v % 64) / 32;
      const uint8_t* b = row + (i / 256) * (T == type::q4_K ? 144 : 176);
      const auto* dd = reinterpret_cast<const uint16_t*>(b);
      const uint8_t* scales = b + 4;
      const uint8_t* qs = b + (T == type::q4_K ? 16 : 48);
      int q = hi != 0 ? (qs[32 * c + l] >> 4) : (qs[32 * c + l] & 0xF);
      if constexpr (T == type::q5_K) q |= ((b[16 + l] >> (2 * c + hi)) & 1) << 4;
      int sc = 0, m = 0;
      scale_min_k4(v / 32, scales, sc, m);
      return half_to_float(dd[0]) * static_cast<float>(sc * q) - half_to_float(dd[1]) * static_cast<float>(m);
    } else {
      static_assert(T == type::q6_K, "a weight type load_weight reads");
      const auto* b = reinterpret_cast<const block_q6_K*>(row) + i / 256;
      const uint8_t lq = b->ql[64 * h + 32 * (k % 2) + l];
      const int lo = k < 2 ? (lq & 0xF) : (lq >> 4);
      const int q = lo | (((b->qh[32 * h + l] >> (2 * k)) & 3) << 4);
      return half_to_float(b->d) * static_cast<float>(b->scales[v / 16] * (q - 32));
    }
  }
}

// Sum of the 4 quants packed in word w (signed bytes).
TROUPE_HD inline int sum4(int w) { return dp4a(w, 0x01010101, 0); }

// 32 values (block j of 32) of a quantized row of type T times an act_block of 32 activations.
template <type T>
TROUPE_HD inline float dot32(const uint8_t* row, int64_t j, const act_block& a) {
  if constexpr (T == type::q4_0 || T == type::q4_1) {
    constexpr int bytes = T == type::q4_0 ? 18 : 20;
    const uint8_t* b = row + j * bytes;
    const uint8_t* qs = b + (T == type::q4_0 ? 2 : 4);
    int s = 0;
    for (int k = 0; k < 4; ++k) {
      const int w = load_i32_2(qs + 4 * k);
      s = dp4a(w & 0x0F0F0F0F, a.q[k], s);             // values 4k .. 4k + 3
      s = dp4a((w >> 4) & 0x0F0F0F0F, a.q[k + 4], s);  // values 16 + 4k ..
    }
    const auto* h = reinterpret_cast<const uint16_t*>(b);
    if constexpr (T == type::q4_0) return half_to_float(h[0]) * (a.d * static_cast<float>(s) - 8.0f * a.sum);
    return half_to_float(h[0]) * a.d * static_cast<float>(s) + half_to_float(h[1]) * a.sum;
  } else if constexpr (T == type::q5_0 || T == type::q5_1) {
    constexpr int bytes = T == type::q5_0 ? 22 : 24;
    const uint8_t* b = row + j * bytes;
    const uint8_t* qhp = b + (T == type::q5_0 ? 2 : 4);
    const uint8_t* qs = qhp + 4;
    const auto qh = static_cast<uint32_t>(load_i32_2(qhp));
    int s = 0;
    for (int k = 0; k < 4; ++k) {
      const int w = load_i32_2(qs + 4 * k);
      const uint32_t lo_bits = qh >> (4 * k);         // bit 4 of values 4k .. 4k + 3
      const uint32_t hi_bits = qh >> (16 + 4 * k);    // of values 16 + 4k ..
      const auto spread = [](uint32_t bits) {
        return static_cast<int>(((bits & 1u) << 4) | ((bits & 2u) << 11) | ((bits & 4u) << 18) | ((bits & 8u) << 25));
      };
      s = dp4a((w & 0x0F0F0F0F) | spread(lo_bits), a.q[k], s);
      s = dp4a(((w >> 4) & 0x0F0F0F0F) | spread(hi_bits), a.q[k + 4], s);
    }
    const auto* h = reinterpret_cast<const uint16_t*>(b);
    if constexpr (T == type::q5_0) return half_to_float(h[0]) * (a.d * static_cast<float>(s) - 16.0f * a.sum);
    return half_to_float(h[0]) * a.d * static_cast<float>(s) + half_to_float(h[1]) * a.sum;
  } else if constexpr (T == type::q8_0) {
    const uint8_t* b = row + j * 34;
    int s = 0;
    for (int k = 0; k < 8; ++k) s = dp4a(load_i32_2(b + 2 + 4 * k), a.q[k], s);
    return half_to_float(*reinterpret_cast<const uint16_t*>(b)) * a.d * static_cast<float>(s);
  } else {
    const int64_t sb = j / 8;  // super-block
    const int sub = static_cast<int>(j % 8);  // values 32 sub .. 32 sub + 31 of it
    const int h = sub / 4, k = sub % 4;
    if constexpr (T == type::q2_K) {
      const auto* b = reinterpret_cast<const block_q2_K*>(row) + sb;
      int s[2] = {0, 0}, sa[2] = {0, 0};  // per 16 values: quants' dot, activations' sum
      for (int w = 0; w < 8; ++w) {
        const int q = (load_i32_2(b->qs + 32 * h + 4 * w) >> (2 * k)) & 0x03030303;
        s[w / 4] = dp4a(q, a.q[w], s[w / 4]);
        sa[w / 4] += sum4(a.q[w]);
      }
      const int sc0 = b->scales[2 * sub], sc1 = b->scales[2 * sub + 1];
      const float dot = static_cast<float>((sc0 & 0xF) * s[0] + (sc1 & 0xF) * s[1]);
      const float mins = static_cast<float>((sc0 >> 4) * sa[0] + (sc1 >> 4) * sa[1]);
      return a.d * (half_to_float(b->d) * dot - half_to_float(b->dmin) * mins);
    } else if constexpr (T == type::q3_K) {
      const auto* b = reinterpret_cast<const block_q3_K*>(row) + sb;
      int s[2] = {0, 0};
      for (int w = 0; w < 8; ++w) {
        const int lo = (load_i32_2(b->qs + 32 * h + 4 * w) >> (2 * k)) & 0x03030303;
        const int hb = (~load_i32_2(b->hmask + 4 * w) >> (4 * h + k)) & 0x01010101;  // 1: minus 4
        s[w / 4] = dp4a(vsub4(lo, hb << 2), a.q[w], s[w / 4]);
      }
      const int dot = scale_q3_K(b->scales, 2 * sub) * s[0] + scale_q3_K(b->scales, 2 * sub + 1) * s[1];
      return half_to_float(b->d) * a.d * static_cast<float>(dot);
    } else if constexpr (T == type::q4_K || T == type::q5_K) {
      constexpr int bytes = T == type::q4_K ? 144 : 176;
      const uint8_t* b = row + sb * bytes;
      const uint8_t* qs = b + (T == type::q4_K ? 16 : 48);
      const int c = sub / 2, hi = sub % 2;
      int s = 0;
      for (int w = 0; w < 8; ++w) {
        int q = (load_i32_2(qs + 32 * c + 4 * w) >> (4 * hi)) & 0x0F0F0F0F;
        if constexpr (T == type::q5_K) q |= ((load_i32_2(b + 16 + 4 * w) >> (2 * c + hi)) & 0x01010101) << 4;
        s = dp4a(q, a.q[w], s);
      }
      int sc = 0, m = 0;
      scale_min_k4(sub, b + 4, sc, m);
      const auto* dd = reinterpret_cast<const uint16_t*>(b);
      return half_to_float(dd[0]) * static_cast<float>(sc) * a.d * static_cast<float>(s) -
             half_to_float(dd[1]) * static_cast<float>(m) * a.sum;
    } else {
      static_assert(T == type::q6_K, "a quantized type dot32 reads");
      const auto* b = reinterpret_cast<const block_q6_K*>(row) + sb;
      int s[2] = {0, 0};
      for (int w = 0; w < 8; ++w) {
        const int lq = load_i32_2(b->ql + 64 * h + 32 * (k % 2) + 4 * w);
        const int lo = (k < 2 ? lq : (lq >> 4)) & 0x0F0F0F0F;
        const int hq = ((load_i32_2(b->qh + 32 * h + 4 * w) >> (2 * k)) & 0x03030303) << 4;
        s[w / 4] = dp4a(vsub4(lo | hq, 0x20202020), a.q[w], s[w / 4]);
      }
      const int dot = b->scales[2 * sub] * s[0] + b->scales[2 * sub + 1] * s[1];
      return half_to_float(b->d) * a.d * static_cast<float>(dot);
    }
  }
}

// q = round(x / d) (halves away from zero), the int8 the activation quantizer stores; id = 1 / d (0 for d 0).
TROUPE_HD inline int quantize_act_value(float x, float id) {
  const float v = x * id;
  return static_cast<int>(v < 0.0f ? -floorf(-v + 0.5f) : floorf(v + 0.5f));
}

}  // namespace troupe::cuda::kern
