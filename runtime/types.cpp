// The type table: every GGUF type id with its name, block size and block bytes (as ggml defines them), and
// for the types troupe computes with, their reference conversions and dot kernels (runtime/quants.h).
#include "runtime/types.h"

#include <array>
#include <string>

#include "runtime/error.h"
#include "runtime/quants.h"
#include "runtime/quants_iq.h"
#include "runtime/quants_iq_low.h"
#include "runtime/quants_mx.h"
#include "runtime/quants_tq.h"

namespace troupe {

namespace {

using table = std::array<type_traits, type_id_count>;

// A type known by its size only: troupe can skip it but not compute with it.
type_traits known_only(std::string_view name, int64_t block_size, size_t type_size, bool is_quantized) {
  type_traits t;
  t.name = name;
  t.block_size = block_size;
  t.type_size = type_size;
  t.is_quantized = is_quantized;
  t.known = true;
  t.supported = false;
  return t;
}

type_traits computable(std::string_view name, int64_t block_size, size_t type_size, bool is_quantized,
                       to_float_fn to_float, from_float_fn from_float, vec_dot_fn vec_dot, type vec_dot_type) {
  type_traits t;
  t.name = name;
  t.block_size = block_size;
  t.type_size = type_size;
  t.is_quantized = is_quantized;
  t.known = true;
  t.supported = true;
  t.to_float = to_float;
  t.from_float_ref = from_float;
  t.vec_dot = vec_dot;
  t.vec_dot_type = vec_dot_type;
  return t;
}

table make_table() {
  table tt{};
  for (auto& t : tt) {  // retired ids (4, 5, 31..33, 36..38) stay unknown
    t.name = "unknown";
    t.block_size = 1;
  }

  auto set = [&tt](type id, const type_traits& t) { tt[static_cast<uint32_t>(id)] = t; };

  // Plain types.
  set(type::f32, computable("f32", 1, sizeof(float), false, dequantize_row_f32, quantize_row_f32_ref,
                            vec_dot_f32_f32, type::f32));
  set(type::f16, computable("f16", 1, sizeof(fp16_t), false, dequantize_row_f16, quantize_row_f16_ref,
                            vec_dot_f16_f32, type::f32));
  set(type::bf16, computable("bf16", 1, sizeof(bf16_t), false, dequantize_row_bf16, quantize_row_bf16_ref,
                             vec_dot_bf16_bf16, type::bf16));

  // 32-value blocks.
  set(type::q4_0, computable("q4_0", qk4_0, sizeof(block_q4_0), true, dequantize_row_q4_0, quantize_row_q4_0_ref,
                             vec_dot_q4_0_q8_0, type::q8_0));
  set(type::q4_1, computable("q4_1", qk4_1, sizeof(block_q4_1), true, dequantize_row_q4_1, quantize_row_q4_1_ref,
                             vec_dot_q4_1_q8_1, type::q8_1));
  set(type::q5_0, computable("q5_0", qk5_0, sizeof(block_q5_0), true, dequantize_row_q5_0, quantize_row_q5_0_ref,
                             vec_dot_q5_0_q8_0, type::q8_0));
  set(type::q5_1, computable("q5_1", qk5_1, sizeof(block_q5_1), true, dequantize_row_q5_1, quantize_row_q5_1_ref,
                             vec_dot_q5_1_q8_1, type::q8_1));
  set(type::q8_0, computable("q8_0", qk8_0, sizeof(block_q8_0), true, dequantize_row_q8_0, quantize_row_q8_0_ref,
                             vec_dot_q8_0_q8_0, type::q8_0));
  set(type::q8_1, computable("q8_1", qk8_1, sizeof(block_q8_1), true, dequantize_row_q8_1, quantize_row_q8_1_ref,
                             vec_dot_q8_1_q8_1, type::q8_1));

  // K-quants.
  set(type::q2_K, computable("q2_K", qk_k, sizeof(block_q2_K), true, dequantize_row_q2_K, quantize_row_q2_K_ref,
                             vec_dot_q2_K_q8_K, type::q8_K));
  set(type::q3_K, computable("q3_K", qk_k, sizeof(block_q3_K), true, dequantize_row_q3_K, quantize_row_q3_K_ref,
                             vec_dot_q3_K_q8_K, type::q8_K));
  set(type::q4_K, computable("q4_K", qk_k, sizeof(block_q4_K), true, dequantize_row_q4_K, quantize_row_q4_K_ref,
                             vec_dot_q4_K_q8_K, type::q8_K));
  set(type::q5_K, computable("q5_K", qk_k, sizeof(block_q5_K), true, dequantize_row_q5_K, quantize_row_q5_K_ref,
                             vec_dot_q5_K_q8_K, type::q8_K));
  set(type::q6_K, computable("q6_K", qk_k, sizeof(block_q6_K), true, dequantize_row_q6_K, quantize_row_q6_K_ref,
                             vec_dot_q6_K_q8_K, type::q8_K));
  set(type::q8_K, computable("q8_K", qk_k, sizeof(block_q8_K), true, dequantize_row_q8_K, quantize_row_q8_K_ref,
                             vec_dot_q8_K_q8_K, type::q8_K));

  // i-quants with the 4-bit codebook.
  set(type::iq4_nl, computable("iq4_nl", qk4_nl, sizeof(block_iq4_nl), true, dequantize_row_iq4_nl,
                               quantize_row_iq4_nl_ref, vec_dot_iq4_nl_q8_0, type::q8_0));
  set(type::iq4_xs, computable("iq4_xs", qk_k, sizeof(block_iq4_xs), true, dequantize_row_iq4_xs,
                               quantize_row_iq4_xs_ref, vec_dot_iq4_xs_q8_K, type::q8_K));

  // Ternary types and MXFP4.
  set(type::tq1_0, computable("tq1_0", qk_k, sizeof(block_tq1_0), true, dequantize_row_tq1_0, quantize_row_tq1_0_ref,
                              vec_dot_tq1_0_q8_K, type::q8_K));
  set(type::tq2_0, computable("tq2_0", qk_k, sizeof(block_tq2_0), true, dequantize_row_tq2_0, quantize_row_tq2_0_ref,
                              vec_dot_tq2_0_q8_K, type::q8_K));
  set(type::mxfp4, computable("mxfp4", qk_mxfp4, sizeof(block_mxfp4), true, dequantize_row_mxfp4, quantize_row_mxfp4_ref,
                              vec_dot_mxfp4_q8_0, type::q8_0));

  // Index types troupe uses (get_rows, set_rows, argmax...): supported, with no conversions.
  set(type::i32, computable("i32", 1, 4, false, nullptr, nullptr, nullptr, type::i32));
  set(type::i64, computable("i64", 1, 8, false, nullptr, nullptr, nullptr, type::i64));

  // i-quants below 4 bits: computed, never written (no quantizer: they need an importance matrix).
  set(type::iq2_xxs, computable("iq2_xxs", qk_k, sizeof(block_iq2_xxs), true, dequantize_row_iq2_xxs, nullptr,
                                vec_dot_iq2_xxs_q8_K, type::q8_K));
  set(type::iq2_xs, computable("iq2_xs", qk_k, sizeof(block_iq2_xs), true, dequantize_row_iq2_xs, nullptr,
                               vec_dot_iq2_xs_q8_K, type::q8_K));
  set(type::iq2_s, computable("iq2_s", qk_k, sizeof(block_iq2_s), true, dequantize_row_iq2_s, nullptr,
                              vec_dot_iq2_s_q8_K, type::q8_K));
  set(type::iq3_xxs, computable("iq3_xxs", qk_k, sizeof(block_iq3_xxs), true, dequantize_row_iq3_xxs, nullptr,
                                vec_dot_iq3_xxs_q8_K, type::q8_K));
  set(type::iq3_s, computable("iq3_s", qk_k, sizeof(block_iq3_s), true, dequantize_row_iq3_s, nullptr,
                              vec_dot_iq3_s_q8_K, type::q8_K));
  set(type::iq1_s, computable("iq1_s", qk_k, sizeof(block_iq1_s), true, dequantize_row_iq1_s, nullptr,
                              vec_dot_iq1_s_q8_K, type::q8_K));
  set(type::iq1_m, computable("iq1_m", qk_k, sizeof(block_iq1_m), true, dequantize_row_iq1_m, nullptr,
                              vec_dot_iq1_m_q8_K, type::q8_K));

  // Known by size only.
  set(type::i8, known_only("i8", 1, 1, false));
  set(type::i16, known_only("i16", 1, 2, false));
  set(type::f64, known_only("f64", 1, 8, false));
  return tt;
}

const table& the_table() {
  static const table tt = make_table();
  return tt;
}

const type_traits& unknown_traits() {
  static const type_traits t = [] {
    type_traits u;
    u.name = "unknown";
    u.block_size = 1;  // so that row_size() of an unknown type is 0 rather than a division by zero
    u.type_size = 0;
    return u;
  }();
  return t;
}

char lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (lower(a[i]) != lower(b[i])) return false;
  }
  return true;
}

}  // namespace

const type_traits& traits(type t) {
  const uint32_t id = static_cast<uint32_t>(t);
  if (id >= type_id_count) return unknown_traits();
  const type_traits& tt = the_table()[id];
  return tt.known ? tt : unknown_traits();
}

std::optional<type> type_from_id(uint32_t id) {
  if (id >= type_id_count || !the_table()[id].known) return std::nullopt;
  return static_cast<type>(id);
}

std::optional<type> type_from_name(std::string_view name) {
  const table& tt = the_table();
  for (uint32_t id = 0; id < type_id_count; ++id) {
    if (tt[id].known && iequals(tt[id].name, name)) return static_cast<type>(id);
  }
  return std::nullopt;
}

void require_supported(type t, std::string_view what) {
  const type_traits& tr = traits(t);
  if (tr.supported) return;
  const uint32_t id = static_cast<uint32_t>(t);
  std::string msg = "tensor '" + std::string(what) + "' has ";
  if (tr.known) {
    msg += "type " + std::string(tr.name) + " (id " + std::to_string(id) + "), which troupe does not support";
  } else {
    msg += "unknown type id " + std::to_string(id);
  }
  throw type_error(msg);
}

}  // namespace troupe
