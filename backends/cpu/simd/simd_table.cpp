// Builds the per-level kernel tables. Compiled with the project's default flags (no -mavx*): it only stores
// function addresses, so it is safe to run on any CPU; the SIMD functions themselves are called only through
// a table whose level the CPU supports.
#include "backends/cpu/simd/simd.h"

#include <cmath>

#include "backends/cpu/simd/mad_tile.h"
#include "runtime/fp16.h"
#include <utility>

#if defined(__x86_64__)
#include "backends/cpu/simd/x86_kernels.h"
#endif

namespace troupe::cpu::simd {

namespace {

float exp_row_scalar(int64_t n, float* y, float max) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    y[i] = std::exp(y[i] - max);
    sum += y[i];
  }
  return static_cast<float>(sum);
}

float scale_mask_max_scalar(int64_t n, float* y, const float* m, float scale) {
  float lanes[8] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int l = 0; l < 8; ++l) {
      const float x = y[i + l] * scale + m[i + l];
      y[i + l] = x;
      lanes[l] = x > lanes[l] ? x : lanes[l];
    }
  }
  float mx = -INFINITY;
  for (; i < n; ++i) {
    const float x = y[i] * scale + m[i];
    y[i] = x;
    if (x > mx) mx = x;
  }
  for (float l : lanes) mx = l > mx ? l : mx;
  return mx;
}

void lane_add_each(const float* y, int64_t n, float* lanes, unsigned* lane) {
  for (int64_t i = 0; i < n; ++i) {
    if (y[i] != 0.0f) {
      lanes[*lane] += y[i];
      *lane = (*lane + 1) & 15u;
    }
  }
}

void exp_lane_sum_scalar(int64_t n, float* y, float max, float* lanes, unsigned* lane) {
  for (int64_t i = 0; i < n; ++i) y[i] = std::exp(y[i] - max);
  lane_add_each(y, n, lanes, lane);
}

void scale_row_scalar(int64_t n, float* y, float s) {
  for (int64_t i = 0; i < n; ++i) y[i] *= s;
}

void silu_row_scalar(int64_t n, const float* x, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] / (1.0f + std::exp(-x[i]));
}

void swiglu_row_scalar(int64_t n, const float* x, const float* g, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] / (1.0f + std::exp(-x[i])) * g[i];
}

float f32_value(float v) { return v; }
float f16_value(uint16_t h) { return fp16_to_fp32(h); }

// The reference vec_dot of type id over several rows.
template <uint32_t id>
void reference_rows(int64_t n, int64_t nrows, float* s, const void* x, size_t x_stride, const void* y) {
  const vec_dot_fn dot = traits(static_cast<type>(id)).vec_dot;
  const char* row = static_cast<const char*>(x);
  for (int64_t r = 0; r < nrows; ++r, row += x_stride) dot(n, s + r, row, y);
}

template <uint32_t... ids>
std::array<vec_dot_rows_fn, type_id_count> reference_rows_table(std::integer_sequence<uint32_t, ids...>) {
  return {{reference_rows<ids>...}};
}

kernel_table reference_table() {
  kernel_table t;
  t.level = isa::scalar;
  for (uint32_t id = 0; id < type_id_count; ++id) {
    const type_traits& tr = traits(static_cast<type>(id));
    t.vec_dot[id] = tr.vec_dot;
    t.from_float[id] = tr.from_float_ref;
    t.to_float[id] = tr.to_float;
  }
  t.vec_dot_rows = reference_rows_table(std::make_integer_sequence<uint32_t, type_id_count>{});
  t.mad_tile[static_cast<size_t>(type::f32)] = mad_tile_generic<float, f32_value>;
  t.mad_tile[static_cast<size_t>(type::f16)] = mad_tile_generic<uint16_t, f16_value>;
  t.mad_acc_f32 = mad_tile_generic<float, f32_value, true>;
  t.exp_row = exp_row_scalar;
  t.scale_mask_max = scale_mask_max_scalar;
  t.exp_lane_sum = exp_lane_sum_scalar;
  t.scale_row = scale_row_scalar;
  t.silu_row = silu_row_scalar;
  t.swiglu_row = swiglu_row_scalar;
  return t;
}

#if defined(__x86_64__)

void set_dot(kernel_table& k, type t, vec_dot_fn f, vec_dot_rows_fn rows) {
  k.vec_dot[static_cast<size_t>(t)] = f;
  k.vec_dot_rows[static_cast<size_t>(t)] = rows;
}
void set_tile(kernel_table& k, type t, vec_dot_tile_fn f, vec_dot_tile_fn prepared = nullptr,
              tile_prepare_fn prepare = nullptr, tile_size_fn prepared_size = nullptr) {
  const auto i = static_cast<size_t>(t);
  k.vec_dot_tile[i] = f;
  k.vec_dot_tile_prepared[i] = prepared;
  k.tile_prepare[i] = prepare;
  k.tile_prepared_size[i] = prepared_size;
}
void set_gemm(kernel_table& k, type t, vec_dot_tile_fn f, tile_prepare_fn prepare, tile_size_fn prepared_size) {
  const auto i = static_cast<size_t>(t);
  k.gemm[i] = f;
  k.gemm_prepare[i] = prepare;
  k.gemm_prepared_size[i] = prepared_size;
}
void set(std::array<from_float_fn, type_id_count>& a, type t, from_float_fn f) { a[static_cast<size_t>(t)] = f; }
void set(std::array<to_float_fn, type_id_count>& a, type t, to_float_fn f) { a[static_cast<size_t>(t)] = f; }

kernel_table avx2_table() {
  kernel_table t = reference_table();
  t.level = isa::avx2;
  using namespace avx2;
  set_dot(t, type::f32, vec_dot_f32, vec_dot_f32_rows);
  set_dot(t, type::f16, vec_dot_f16, vec_dot_f16_rows);
  set_dot(t, type::bf16, vec_dot_bf16, vec_dot_bf16_rows);
  set_dot(t, type::q4_0, vec_dot_q4_0, vec_dot_q4_0_rows);
  set_dot(t, type::q4_1, vec_dot_q4_1, vec_dot_q4_1_rows);
  set_dot(t, type::q5_0, vec_dot_q5_0, vec_dot_q5_0_rows);
  set_dot(t, type::q5_1, vec_dot_q5_1, vec_dot_q5_1_rows);
  set_dot(t, type::q8_0, vec_dot_q8_0, vec_dot_q8_0_rows);
  set_dot(t, type::q2_K, vec_dot_q2_K, vec_dot_q2_K_rows);
  set_dot(t, type::q3_K, vec_dot_q3_K, vec_dot_q3_K_rows);
  set_dot(t, type::q4_K, vec_dot_q4_K, vec_dot_q4_K_rows);
  set_dot(t, type::q5_K, vec_dot_q5_K, vec_dot_q5_K_rows);
  set_dot(t, type::q6_K, vec_dot_q6_K, vec_dot_q6_K_rows);
  set_dot(t, type::iq4_nl, vec_dot_iq4_nl, vec_dot_iq4_nl_rows);
  set_dot(t, type::iq4_xs, vec_dot_iq4_xs, vec_dot_iq4_xs_rows);
  set_dot(t, type::iq3_s, vec_dot_iq3_s, vec_dot_iq3_s_rows);
  set_dot(t, type::mxfp4, vec_dot_mxfp4, vec_dot_mxfp4_rows);
  set_tile(t, type::f32, vec_dot_f32_tile);
  set_tile(t, type::f16, vec_dot_f16_tile);
  set_tile(t, type::bf16, vec_dot_bf16_tile);
  t.mad_tile[static_cast<size_t>(type::f32)] = mad_tile_f32;
  t.mad_tile[static_cast<size_t>(type::f16)] = mad_tile_f16;
  t.mad_acc_f32 = mad_tile_acc_f32;
  set_tile(t, type::q4_0, vec_dot_q4_0_tile, vec_dot_q4_0_prepared_tile, tile_prepare_q4_0, tile_prepared_size_s);
  set_tile(t, type::q4_1, vec_dot_q4_1_tile, vec_dot_q4_1_prepared_tile, tile_prepare_q4_1, tile_prepared_size_u);
  set_tile(t, type::q5_0, vec_dot_q5_0_tile, vec_dot_q5_0_prepared_tile, tile_prepare_q5_0, tile_prepared_size_s);
  set_tile(t, type::q5_1, vec_dot_q5_1_tile, vec_dot_q5_1_prepared_tile, tile_prepare_q5_1, tile_prepared_size_u);
  set_tile(t, type::q8_0, vec_dot_q8_0_tile);
  set_gemm(t, type::q8_0, gemm_q8_0, gemm_prepare_q8_0, gemm_prepared_size_q8_0);
  set_tile(t, type::q4_K, vec_dot_q4_K_tile);
  set_gemm(t, type::q4_K, gemm_q4_K, gemm_prepare_q4_K, gemm_prepared_size_q4_K);
  set_tile(t, type::q5_K, vec_dot_q5_K_tile);
  set_tile(t, type::q6_K, vec_dot_q6_K_tile);
  set_gemm(t, type::q6_K, gemm_q6_K, gemm_prepare_q6_K, gemm_prepared_size_q6_K);
  set_tile(t, type::iq4_nl, vec_dot_iq4_nl_tile, vec_dot_iq4_nl_prepared_tile, tile_prepare_iq4_nl, tile_prepared_size_s);
  set_tile(t, type::iq4_xs, vec_dot_iq4_xs_tile);
  set_tile(t, type::iq3_s, vec_dot_iq3_s_tile);
  set_tile(t, type::mxfp4, vec_dot_mxfp4_tile, vec_dot_mxfp4_prepared_tile, tile_prepare_mxfp4, tile_prepared_size_s);

  set(t.from_float, type::q8_0, quantize_row_q8_0);
  set(t.from_float, type::q8_1, quantize_row_q8_1);
  set(t.from_float, type::q8_K, quantize_row_q8_K);
  set(t.from_float, type::f16, quantize_row_f16);
  set(t.from_float, type::bf16, quantize_row_bf16);

  set(t.to_float, type::f16, dequantize_row_f16);
  set(t.to_float, type::bf16, dequantize_row_bf16);
  set(t.to_float, type::q4_0, dequantize_row_q4_0);
  set(t.to_float, type::q4_1, dequantize_row_q4_1);
  set(t.to_float, type::q5_0, dequantize_row_q5_0);
  set(t.to_float, type::q5_1, dequantize_row_q5_1);
  set(t.to_float, type::q8_0, dequantize_row_q8_0);
  set(t.to_float, type::q4_K, dequantize_row_q4_K);
  set(t.to_float, type::q6_K, dequantize_row_q6_K);

  t.exp_row = exp_row;
  t.scale_mask_max = scale_mask_max;
  t.exp_lane_sum = exp_lane_sum;
  t.scale_row = scale_row;
  t.silu_row = silu_row;
  t.swiglu_row = swiglu_row;
  return t;
}

kernel_table avx512_table() {
  kernel_table t = avx2_table();
  t.level = isa::avx512;
  using namespace avx512;
  set_dot(t, type::f32, vec_dot_f32, vec_dot_f32_rows);
  set_dot(t, type::f16, vec_dot_f16, vec_dot_f16_rows);
  set_dot(t, type::q4_0, vec_dot_q4_0, vec_dot_q4_0_rows);
  set_dot(t, type::q4_1, vec_dot_q4_1, vec_dot_q4_1_rows);
  set_dot(t, type::q5_0, vec_dot_q5_0, vec_dot_q5_0_rows);
  set_dot(t, type::q5_1, vec_dot_q5_1, vec_dot_q5_1_rows);
  set_dot(t, type::q8_0, vec_dot_q8_0, vec_dot_q8_0_rows);
  set_dot(t, type::q4_K, vec_dot_q4_K, vec_dot_q4_K_rows);
  set_dot(t, type::q6_K, vec_dot_q6_K, vec_dot_q6_K_rows);
  // Every tile of a type whose dot this level replaces (q5_K keeps the AVX2 one, with its dot).
  set_tile(t, type::f32, vec_dot_f32_tile);
  set_tile(t, type::f16, vec_dot_f16_tile);
  t.mad_tile[static_cast<size_t>(type::f32)] = mad_tile_f32;
  t.mad_tile[static_cast<size_t>(type::f16)] = mad_tile_f16;
  t.mad_acc_f32 = mad_tile_acc_f32;
  set_tile(t, type::q4_0, vec_dot_q4_0_tile, vec_dot_q4_0_prepared_tile, tile_prepare_q4_0, tile_prepared_size);
  set_tile(t, type::q4_1, vec_dot_q4_1_tile, vec_dot_q4_1_prepared_tile, tile_prepare_q4_1, tile_prepared_size);
  set_tile(t, type::q5_0, vec_dot_q5_0_tile, vec_dot_q5_0_prepared_tile, tile_prepare_q5_0, tile_prepared_size);
  set_tile(t, type::q5_1, vec_dot_q5_1_tile, vec_dot_q5_1_prepared_tile, tile_prepare_q5_1, tile_prepared_size);
  set_tile(t, type::q8_0, vec_dot_q8_0_tile);
  set_gemm(t, type::q8_0, gemm_q8_0, gemm_prepare_q8_0, gemm_prepared_size_q8_0);
  set_tile(t, type::q4_K, vec_dot_q4_K_tile);
  set_gemm(t, type::q4_K, gemm_q4_K, gemm_prepare_q4_K, gemm_prepared_size_q4_K);
  set_tile(t, type::q6_K, vec_dot_q6_K_tile);
  set_gemm(t, type::q6_K, gemm_q6_K, gemm_prepare_q6_K, gemm_prepared_size_q6_K);
  if (host_cpu_features().avx512bf16) {
    set_dot(t, type::bf16, avx512bf16::vec_dot_bf16, avx512bf16::vec_dot_bf16_rows);
    set_tile(t, type::bf16, nullptr);  // the AVX2 tile is not bit-identical to vdpbf16ps
    t.bf16_native = true;
  }
  return t;
}

#endif

}  // namespace

const kernel_table& table(isa level) {
  static const kernel_table scalar = reference_table();
#if defined(__x86_64__)
  static const kernel_table avx2 = avx2_table();
  static const kernel_table avx512 = avx512_table();
  if (level == isa::avx512) return avx512;
  if (level == isa::avx2) return avx2;
#else
  (void)level;
#endif
  return scalar;
}

const kernel_table& active_table() {
  static const kernel_table& t = table(active_isa());
  return t;
}

}  // namespace troupe::cpu::simd
