// Element types, with ids and block layouts byte-identical to GGUF's, so a GGUF tensor is used in place.
//
//   const type_traits& t = traits(type::q4_K);   // name "q4_K", 256 values per 144-byte block
//   size_t bytes = row_size(type::q4_K, 4096);   // 16 blocks * 144 bytes
//   if (!t.supported) throw type_error(...);     // the i-quants below 4 bits: known by size only
//
// Every type GGUF defines is known here (name, block size, block bytes), so a loader can size and skip a
// tensor it cannot compute with and report it by name; `supported` says whether troupe can convert it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace troupe {

// GGUF / ggml type ids. Gaps are ids GGUF retired; they are unknown types.
enum class type : uint32_t {
  f32 = 0,
  f16 = 1,
  q4_0 = 2,
  q4_1 = 3,
  q5_0 = 6,
  q5_1 = 7,
  q8_0 = 8,
  q8_1 = 9,
  q2_K = 10,
  q3_K = 11,
  q4_K = 12,
  q5_K = 13,
  q6_K = 14,
  q8_K = 15,
  iq2_xxs = 16,
  iq2_xs = 17,
  iq3_xxs = 18,
  iq1_s = 19,
  iq4_nl = 20,
  iq3_s = 21,
  iq2_s = 22,
  iq4_xs = 23,
  i8 = 24,
  i16 = 25,
  i32 = 26,
  i64 = 27,
  f64 = 28,
  iq1_m = 29,
  bf16 = 30,
  tq1_0 = 34,
  tq2_0 = 35,
  mxfp4 = 39,
};

constexpr uint32_t type_id_count = 40;  // ids are < this

constexpr int64_t qk_k = 256;  // values per K-quant super-block

// Converts a row of n values (n a multiple of block_size) to f32.
using to_float_fn = void (*)(const void* src, float* dst, int64_t n);
// Converts a row of n f32 values to this type (reference code: portable, deterministic).
using from_float_fn = void (*)(const float* src, void* dst, int64_t n);
// Dot product of a row of this type with a row of vec_dot_type, n values: *s = sum x[i] * y[i].
using vec_dot_fn = void (*)(int64_t n, float* s, const void* x, const void* y);

struct type_traits {
  std::string_view name;   // "f32", "q4_K", ...: GGUF's names, lowercase but for the K
  int64_t block_size = 0;  // values per block (1 for plain types)
  size_t type_size = 0;    // bytes per block
  bool is_quantized = false;
  bool known = false;      // a type id GGUF defines
  bool supported = false;  // troupe can convert and compute with it
  to_float_fn to_float = nullptr;        // null for i32/i64/... and unsupported types
  from_float_fn from_float_ref = nullptr;
  vec_dot_fn vec_dot = nullptr;          // x: this type, y: vec_dot_type
  type vec_dot_type = type::f32;         // what activations are converted to for vec_dot
};

// The weight types troupe's GPU kernels read (Vulkan, CUDA): f32, f16, bf16, q4_0 .. q8_0 and q2_K .. q6_K.
constexpr bool is_gpu_weight_type(type t) {
  switch (t) {
    case type::f32:
    case type::f16:
    case type::bf16:
    case type::q4_0:
    case type::q4_1:
    case type::q5_0:
    case type::q5_1:
    case type::q8_0:
    case type::q2_K:
    case type::q3_K:
    case type::q4_K:
    case type::q5_K:
    case type::q6_K:
      return true;
    default:
      return false;
  }
}

// Traits of a type; for an unknown id, a traits object with known == false and the name "unknown".
const type_traits& traits(type t);

// Type of a raw id (GGUF's tensor type field) when it names a type GGUF defines.
std::optional<type> type_from_id(uint32_t id);

// Type by its name ("q4_K", case-insensitive); empty when there is none.
std::optional<type> type_from_name(std::string_view name);

inline std::string_view type_name(type t) { return traits(t).name; }
inline int64_t block_size(type t) { return traits(t).block_size; }
inline size_t type_size(type t) { return traits(t).type_size; }
inline bool is_quantized(type t) { return traits(t).is_quantized; }

// Bytes of a row of ne0 values; ne0 must be a multiple of the block size.
inline size_t row_size(type t, int64_t ne0) {
  return type_size(t) * static_cast<size_t>(ne0 / block_size(t));
}

// Throws type_error naming `what` (a tensor name) and the type when troupe cannot compute with the type.
void require_supported(type t, std::string_view what);

}  // namespace troupe
