#include "tests/backends/conformance_runner.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>

#include "backends/cpu/cpu_backend.h"
#include "runtime/fp16.h"
#include "runtime/graph.h"
#include "tests/support/random_blocks.h"

namespace troupe::testing {

// Bytes of one input, generated from (case, input) so every backend sees the same data.
std::vector<uint8_t> make_input_bytes(const case_input& in, uint32_t seed) {
  const tensor& t = *in.t;
  std::mt19937 rng(seed);
  const size_t n = static_cast<size_t>(nelements(t));
  std::vector<uint8_t> bytes(nbytes(t));
  if (t.type == type::i32 || t.type == type::i64) {
    std::vector<int64_t> v(n);
    if (in.how == fill::unique_rows) {
      const size_t row = static_cast<size_t>(t.ne[0]);
      for (size_t r = 0; r < n / row; ++r) {
        std::vector<int64_t> perm(static_cast<size_t>(in.range));
        for (size_t i = 0; i < perm.size(); ++i) perm[i] = static_cast<int64_t>(i);
        std::shuffle(perm.begin(), perm.end(), rng);
        for (size_t i = 0; i < row; ++i) v[r * row + i] = perm[i];
      }
    } else {
      std::uniform_int_distribution<int64_t> d(0, in.range - 1);
      for (auto& x : v) x = d(rng);
    }
    for (size_t i = 0; i < n; ++i) {
      if (t.type == type::i32) {
        const auto x = static_cast<int32_t>(v[i]);
        std::memcpy(bytes.data() + i * 4, &x, 4);
      } else {
        std::memcpy(bytes.data() + i * 8, &v[i], 8);
      }
    }
    return bytes;
  }
  if (traits(t.type).is_quantized && traits(t.type).from_float_ref == nullptr) {
    // A type troupe reads but does not write (the i-quants below 4 bits): random valid blocks.
    return test::random_blocks(t.type, static_cast<int64_t>(bytes.size() / type_size(t.type)), rng);
  }
  std::vector<float> f(n);
  if (in.how == fill::causal_mask) {
    const int64_t ne0 = t.ne[0], ne1 = t.ne[1];
    for (size_t i = 0; i < n; ++i) {
      const int64_t col = static_cast<int64_t>(i) % ne0;
      const int64_t row = (static_cast<int64_t>(i) / ne0) % ne1;
      f[i] = col <= row + (ne0 - ne1) ? 0.0f : -INFINITY;
    }
  } else if (in.how == fill::shared_mask) {
    const int64_t ne0 = t.ne[0], ne1 = t.ne[1];
    for (size_t i = 0; i < n; ++i) {
      const int64_t col = static_cast<int64_t>(i) % ne0;
      const int64_t row = (static_cast<int64_t>(i) / ne0) % ne1;
      f[i] = (col / 5) % 2 == row % 2 && col <= row + (ne0 - ne1) / 2 ? 0.0f : -INFINITY;
    }
  } else {
    std::uniform_real_distribution<float> d(in.how == fill::positive ? 0.1f : -1.0f, in.how == fill::positive ? 2.0f : 1.0f);
    for (auto& x : f) x = d(rng);
  }
  const type_traits& tr = traits(t.type);
  const size_t row_bytes = row_size(t.type, t.ne[0]);
  for (int64_t r = 0; r < nrows(t); ++r) {
    tr.from_float_ref(f.data() + r * t.ne[0], bytes.data() + static_cast<size_t>(r) * row_bytes, t.ne[0]);
  }
  return bytes;
}

uint32_t input_seed(size_t case_index, size_t input) { return static_cast<uint32_t>(case_index * 131 + input * 7 + 1); }

std::vector<float> to_f32(const tensor& t, const std::vector<uint8_t>& bytes) {
  const size_t n = static_cast<size_t>(nelements(t));
  std::vector<float> out(n);
  if (t.type == type::i32) {
    for (size_t i = 0; i < n; ++i) {
      int32_t v;
      std::memcpy(&v, bytes.data() + i * 4, 4);
      out[i] = static_cast<float>(v);
    }
    return out;
  }
  const size_t row_bytes = row_size(t.type, t.ne[0]);
  for (int64_t r = 0; r < nrows(t); ++r) {
    traits(t.type).to_float(bytes.data() + static_cast<size_t>(r) * row_bytes, out.data() + r * t.ne[0], t.ne[0]);
  }
  return out;
}

// Runs one case on one backend; empty when the device does not support one of the case's nodes.
std::optional<std::vector<float>> run_case(const op_case& c, size_t case_index, backend_i& be, std::string* unsupported) {
  device_i& dev = be.device();
  context ctx({.max_tensors = 256, .no_alloc = true});
  case_builder b(ctx);
  tensor* out = c.build(b);
  out->flags |= flag_output;
  graph g;
  g.build_forward_expand(out);
  for (tensor* node : g.nodes()) {
    if (!dev.supports_op(*node)) {
      if (unsupported) *unsupported = describe(*node) + " (" + std::string(op_name(node->op)) + ")";
      return std::nullopt;
    }
  }
  buffer_ptr buf = alloc_ctx_tensors(ctx, dev.buffer_type());
  REQUIRE(buf != nullptr);
  for (size_t i = 0; i < b.inputs().size(); ++i) {
    const case_input& in = b.inputs()[i];
    const auto bytes = make_input_bytes(in, input_seed(case_index, i));
    tensor_set(*in.t, bytes.data(), 0, bytes.size());
  }
  be.graph_compute(g);
  REQUIRE(is_contiguous(*out));
  std::vector<uint8_t> bytes(nbytes(*out));
  tensor_get(*out, bytes.data(), 0, bytes.size());
  return to_f32(*out, bytes);
}

double nmse(const std::vector<float>& x, const std::vector<float>& ref) {
  double err = 0.0, norm = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = static_cast<double>(x[i]) - static_cast<double>(ref[i]);
    err += d * d;
    norm += static_cast<double>(ref[i]) * static_cast<double>(ref[i]);
  }
  return norm > 0.0 ? err / norm : err;
}

bool all_finite(const std::vector<float>& v) {
  for (float x : v) {
    if (!std::isfinite(x)) return false;
  }
  return true;
}

// ---- per-element bounds ----
//
// A backend's result and the reference's both differ from the exact result of the op on the input values;
// a bound on |result - reference| is the sum of what each may carry, over every path a backend takes
// (u = 2^-24, f32's unit roundoff; a dot product of k terms summed in f32, in any order, with or without fma,
// is within gamma_k = k u / (1 - k u) ~ k u of the sum of its terms' magnitudes).
//
// Matrix products (mul_mat, mul_mat_id), element (i, j): the dot product of weight row x (its dequantized
// values: every backend reads the same quantized bytes) and activation row y, k values. The paths:
//   - CPU (reference and optimized): y converted to the weight type's vec_dot_type, then f32 (or integer,
//     then f32) sums. q8_0 / q8_1 / q8_K rows: y ~ d q, d = amax(block) / 127, q rounded to nearest, so
//     |dy| <= d / 2 plus the f16 rounding of d (q8_0, q8_1: 127 d 2^-11 <= 0.07 d): <= 0.57 amax / 127.
//     bf16: |dy| <= 2^-9 |y|; f16 and f32 weights meet y as it is. Above the BLAS crossover the optimized
//     path multiplies f32 y by dequantized weights (dy = 0).
//   - Vulkan (mul_mat_vec, mul_mat_mm, mul_mat_id): f32 weights and y, f32 sums; quantized weights as
//     d * (sum q y) + m * (sum y) per 16-value group, whose rounding is relative to |d q| + |m| <= |x| + 2
//     max|x| instead of |x|.
//   - CUDA: the dp4a kernels quantize y to q8_1-like 32-value blocks (as the CPU's q8); cuBLAS takes f16 or bf16
//     copies of y and of dequantized weights (|dx| <= 2^-12 |x|, |dy| <= 2^-12 |y|; bf16 2^-9) and sums in f32.
// So, with amax the largest |y| of the row (a bound on every block's), each side's error is within
//   quantized weights: 0.57 amax / 127 * sum|x| + 2^-12 sum|x y| + gamma_k sum (|x| + 2 max|x|) |y|
//   f16 / bf16 weights: 2^-12 (2^-9) sum|x y| + gamma_k sum|x y| (y rounded to the weights' type: CUDA's
//   cuBLAS, the CPU's bf16 dot);  f32 weights: gamma_k sum|x y|,
// and the bound below, summed over both sides, keeps a margin of at least 1.75 on each term:
//   quantized: 2/127 amax sum|x| + 2^-11 sum|x y| + 4 k u sum (|x| + 2 max|x|)|y| + 1e-6;
//   f16: 2^-10 sum|x y|, bf16: 2^-7 sum|x y|, plus 4 k u sum|x y| + 1e-6 for every float type.
// No backend accumulates a product in f16 (Vulkan's shaders and CUDA's kernels sum in f32, cuBLAS with
// CUBLAS_COMPUTE_32F); one that did would need 2^-11 k sum|x y| instead. Magnitudes, for a 256-wide q4_0
// product of values in [-1, 1]: sum|x| ~ 128, so ~2.0 against results of rms ~5.3 (a column 30% off moves a
// fifth of its elements by more); f32 1280-wide: ~0.1 against rms ~12; f16 256-wide: ~0.07.
//
// flash_attn (the CPU's only: its optimized path against its reference), output (e, head h, token t):
// scores s_c = scale q.k_c + mask_c, p = softmax(s), o_e = sum_c p_c v_ec. A score error of at most D on every
// cell moves each p_c by at most p_c (e^{2D} - 1); exp is within 5e-7 of std::exp (test_cpu_simd.cpp) and the
// sums round within gamma. Per side D <= scale sum|q k_c| (2^-12 when K is f16 and q is rounded to it, plus
// gamma_hd), and o within sum_c p_c |v_ec| (|dp_c| / p_c + 2^-12 when V is f16 and p is rounded to it +
// gamma_nkv); the bound sums both sides with 2x margin.
//
// Any other case (element-wise ops, copies, rows, reductions, rope, soft_max, the attention chain whose
// intermediate error a worst-case bound would overstate a hundredfold): 16 sqrt(max_nmse) (rms(ref) +
// |ref_i|), so that one element may carry 16 times the root-mean-square error the NMSE bound allows, no more
// (plus two quantization steps where the output is of a quantized type, see nmse_derived_bounds).

namespace {

constexpr double f32_u = 0x1p-24;

// The tensor's values come from the case's inputs, directly or through views (no op computed them).
bool on_inputs(const tensor* t) {
  if (t == nullptr) return true;
  const tensor* root = t->view_src != nullptr ? t->view_src : t;
  return root->op == op::none && (root->flags & flag_input) != 0;
}

const char* address(const tensor& t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
  return static_cast<const char*>(t.data) + i0 * static_cast<int64_t>(t.nb[0]) + i1 * static_cast<int64_t>(t.nb[1]) +
         i2 * static_cast<int64_t>(t.nb[2]) + i3 * static_cast<int64_t>(t.nb[3]);
}

// One element of a host tensor of a plain type, through its strides.
double element(const tensor& t, int64_t i0, int64_t i1 = 0, int64_t i2 = 0, int64_t i3 = 0) {
  const char* p = address(t, i0, i1, i2, i3);
  switch (t.type) {
    case type::f32: {
      float v;
      std::memcpy(&v, p, 4);
      return v;
    }
    case type::f16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return fp16_to_fp32(h);
    }
    case type::bf16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return bf16_to_fp32(h);
    }
    case type::i32: {
      int32_t v;
      std::memcpy(&v, p, 4);
      return v;
    }
    default:
      throw std::logic_error("element_bounds: no element reader for type " + std::string(type_name(t.type)));
  }
}

// Row (i1, i2, i3) of t, quantized rows dequantized.
std::vector<double> row_of(const tensor& t, int64_t i1, int64_t i2, int64_t i3) {
  const auto n = static_cast<size_t>(t.ne[0]);
  std::vector<double> out(n);
  if (is_quantized(t.type)) {
    if (t.nb[0] != type_size(t.type)) throw std::logic_error("element_bounds: a quantized row that is not dense");
    std::vector<float> f(n);
    traits(t.type).to_float(address(t, 0, i1, i2, i3), f.data(), t.ne[0]);
    std::copy(f.begin(), f.end(), out.begin());
  } else {
    for (size_t l = 0; l < n; ++l) out[l] = element(t, static_cast<int64_t>(l), i1, i2, i3);
  }
  return out;
}

// dst[i, j, i2, i3] = row i of a's plane (i2 / r2, i3 / r3) . row j of b's plane (i2, i3).
std::vector<double> mul_mat_bounds(const tensor& a, const tensor& b) {
  const int64_t m = a.ne[1], n = b.ne[1], ne2 = b.ne[2], ne3 = b.ne[3];
  const int64_t r2 = ne2 / a.ne[2], r3 = ne3 / a.ne[3];
  std::vector<abs_row> rows_a(static_cast<size_t>(m * a.ne[2] * a.ne[3]));
  for (int64_t p3 = 0; p3 < a.ne[3]; ++p3)
    for (int64_t p2 = 0; p2 < a.ne[2]; ++p2)
      for (int64_t i = 0; i < m; ++i) rows_a[static_cast<size_t>(i + m * (p2 + a.ne[2] * p3))] = abs_row_of(row_of(a, i, p2, p3));
  std::vector<double> out;
  out.reserve(static_cast<size_t>(m * n * ne2 * ne3));
  for (int64_t i3 = 0; i3 < ne3; ++i3)
    for (int64_t i2 = 0; i2 < ne2; ++i2)
      for (int64_t j = 0; j < n; ++j) {
        const abs_row y = abs_row_of(row_of(b, j, i2, i3));
        for (int64_t i = 0; i < m; ++i) {
          out.push_back(dot_bound(a.type, rows_a[static_cast<size_t>(i + m * (i2 / r2 + a.ne[2] * (i3 / r3)))], y));
        }
      }
  return out;
}

// dst[:, s, t] = as[:, :, ids[s, t]]^T b[:, s % n_b, t].
std::vector<double> mul_mat_id_bounds(const tensor& as, const tensor& b, const tensor& ids) {
  const int64_t m = as.ne[1], n_expert = as.ne[2], n_used = ids.ne[0], n_tok = ids.ne[1], n_b = b.ne[1];
  std::vector<abs_row> rows_a(static_cast<size_t>(m * n_expert));
  for (int64_t e = 0; e < n_expert; ++e)
    for (int64_t i = 0; i < m; ++i) rows_a[static_cast<size_t>(i + m * e)] = abs_row_of(row_of(as, i, e, 0));
  std::vector<double> out;
  out.reserve(static_cast<size_t>(m * n_used * n_tok));
  for (int64_t t = 0; t < n_tok; ++t)
    for (int64_t s = 0; s < n_used; ++s) {
      const auto e = static_cast<int64_t>(element(ids, s, t));
      const abs_row y = abs_row_of(row_of(b, s % n_b, t, 0));
      for (int64_t i = 0; i < m; ++i) {
        // An id outside the experts gives zeros everywhere: nothing to bound but the exact 0.
        out.push_back(e >= 0 && e < n_expert ? dot_bound(as.type, rows_a[static_cast<size_t>(i + m * e)], y) : 1e-6);
      }
    }
  return out;
}

// dst [hd_v, n_head, n_tok]: softmax(scale q k^T + mask) v, per query head and token.
std::vector<double> flash_attn_bounds(const tensor& node) {
  const tensor& q = *node.src[0];
  const tensor& k = *node.src[1];
  const tensor& v = *node.src[2];
  const tensor* mask = node.src[3];
  const double scale = node.param<float>(0);
  const int64_t hd_k = q.ne[0], n_tok = q.ne[1], n_head = q.ne[2], n_kv = k.ne[1], hd_v = v.ne[0];
  const int64_t group = n_head / k.ne[2];
  const double e_k = k.type == type::f16 ? 0x1p-10 : 0.0;  // q rounded to f16 on each side: 2^-12 each, x2
  const double e_v = v.type == type::f16 ? 0x1p-10 : 0.0;  // p rounded to f16 on each side
  const double gamma_hd = 4 * static_cast<double>(hd_k) * f32_u, gamma_kv = 4 * static_cast<double>(n_kv) * f32_u;
  std::vector<double> out(static_cast<size_t>(hd_v * n_head * n_tok));
  std::vector<double> s(static_cast<size_t>(n_kv)), mag(s.size());
  std::vector<bool> live(s.size());
  for (int64_t t = 0; t < n_tok; ++t)
    for (int64_t h = 0; h < n_head; ++h) {
      const int64_t g = h / group;
      double smax = -INFINITY;
      for (int64_t c = 0; c < n_kv; ++c) {
        const auto ci = static_cast<size_t>(c);
        const double mv = mask != nullptr ? element(*mask, c, t) : 0.0;
        live[ci] = mv != -INFINITY;
        if (!live[ci]) continue;
        double dot = 0, a = 0;
        for (int64_t d = 0; d < hd_k; ++d) {
          const double x = element(q, d, t, h), y = element(k, d, c, g);
          dot += x * y;
          a += std::fabs(x * y);
        }
        s[ci] = scale * dot + mv;
        mag[ci] = std::fabs(scale) * a;
        smax = std::max(smax, s[ci]);
      }
      double* o = out.data() + static_cast<size_t>(hd_v * (h + n_head * t));
      if (smax == -INFINITY) {  // every cell masked: zeros on every path
        std::fill(o, o + hd_v, 1e-6);
        continue;
      }
      double sum = 0, d_max = 0;
      for (int64_t c = 0; c < n_kv; ++c) {
        const auto ci = static_cast<size_t>(c);
        if (!live[ci]) continue;
        sum += std::exp(s[ci] - smax);
        // The score's products, and its f32 rounding next to the row's largest.
        d_max = std::max(d_max, mag[ci] * (e_k + gamma_hd) + 4 * f32_u * (std::fabs(s[ci]) + std::fabs(smax)));
      }
      const double rho = std::expm1(2 * d_max + 4e-6 + gamma_kv);  // scores, exp (5e-7 a side, x4), the sum
      for (int64_t e = 0; e < hd_v; ++e) {
        double a = 0;  // sum_c p_c |v_ec|
        for (int64_t c = 0; c < n_kv; ++c) {
          const auto ci = static_cast<size_t>(c);
          if (live[ci]) a += std::exp(s[ci] - smax) / sum * std::fabs(element(v, e, c, g));
        }
        o[e] = a * (rho + e_v + gamma_kv) + 1e-6;
      }
    }
  return out;
}

// out_type: the output's type; a quantized one (a quantizing cpy or set_rows, read back dequantized) may also
// land one quantization step away where two backends round a value next to a step's midpoint differently
// (x / d against x * (1 / d)): each element may be off by two steps of its block, a step being at most the
// block's range over 2^bits - 1 levels.
std::vector<double> nmse_derived_bounds(const op_case& c, const std::vector<float>& ref, type out_type) {
  double ss = 0;
  for (float r : ref) ss += static_cast<double>(r) * r;
  const double rms = ref.empty() ? 0.0 : std::sqrt(ss / static_cast<double>(ref.size()));
  const double f = 16 * std::sqrt(c.max_nmse);
  std::vector<double> out(ref.size());
  for (size_t i = 0; i < ref.size(); ++i) out[i] = f * (rms + std::fabs(static_cast<double>(ref[i]))) + 1e-30;
  if (is_quantized(out_type)) {
    const auto block = static_cast<size_t>(block_size(out_type));
    const auto bits = static_cast<int>(8 * type_size(out_type) / block);
    const double levels = std::ldexp(1.0, std::max(bits, 1)) - 1;
    for (size_t b0 = 0; b0 < ref.size(); b0 += block) {
      const size_t b1 = std::min(ref.size(), b0 + block);
      const auto [lo, hi] = std::minmax_element(ref.begin() + static_cast<std::ptrdiff_t>(b0), ref.begin() + static_cast<std::ptrdiff_t>(b1));
      const double step = (static_cast<double>(*hi) - static_cast<double>(*lo)) / levels;
      for (size_t i = b0; i < b1; ++i) out[i] += 2 * step;
    }
  }
  return out;
}

}  // namespace

abs_row abs_row_of(const std::vector<double>& values) {
  abs_row r;
  r.v.resize(values.size());
  for (size_t l = 0; l < values.size(); ++l) {
    r.v[l] = std::fabs(values[l]);
    r.sum += r.v[l];
    r.max = std::max(r.max, r.v[l]);
  }
  return r;
}

double dot_bound(type weight_type, const abs_row& x, const abs_row& y) {
  const size_t k = std::min(x.v.size(), y.v.size());
  const double gamma = 4 * static_cast<double>(k) * f32_u;
  double xy = 0;
  for (size_t l = 0; l < k; ++l) xy += x.v[l] * y.v[l];
  if (is_quantized(weight_type)) {
    // Vulkan's grouped sums round relative to |d q| + |m| <= |x| + 2 max|x|.
    return 2.0 / 127 * y.max * x.sum + 0x1p-11 * xy + gamma * (xy + 2 * x.max * y.sum) + 1e-6;
  }
  // y (and, on cuBLAS, nothing else) rounded to the weights' f16 / bf16 on either side.
  const double rel = weight_type == type::bf16 ? 0x1p-7 : weight_type == type::f16 ? 0x1p-10 : 0.0;
  return (rel + gamma) * xy + 1e-6;
}

std::vector<double> element_bounds(const op_case& c, size_t ci, const std::vector<float>& ref) {
  // The case again, on host memory: its inputs as run_case fills them, read through the op's own views.
  // (The table's largest case, its inputs and results, takes under 2 MiB.)
  context ctx({.max_tensors = 256, .mem_size = size_t{64} << 20, .no_alloc = false});
  case_builder b(ctx);
  const tensor* out = c.build(b);
  for (size_t i = 0; i < b.inputs().size(); ++i) {
    const case_input& in = b.inputs()[i];
    const auto data = make_input_bytes(in, input_seed(ci, i));
    REQUIRE(data.size() == nbytes(*in.t));
    std::memcpy(in.t->data, data.data(), data.size());
  }
  REQUIRE(static_cast<size_t>(nelements(*out)) == ref.size());
  REQUIRE(is_contiguous(*out));
  const auto& src = out->src;
  if (out->op == op::mul_mat && on_inputs(src[0]) && on_inputs(src[1])) return mul_mat_bounds(*src[0], *src[1]);
  if (out->op == op::mul_mat_id && on_inputs(src[0]) && on_inputs(src[1]) && on_inputs(src[2])) {
    return mul_mat_id_bounds(*src[0], *src[1], *src[2]);
  }
  if (out->op == op::flash_attn && on_inputs(src[0]) && on_inputs(src[1]) && on_inputs(src[2]) && on_inputs(src[3])) {
    return flash_attn_bounds(*out);
  }
  return nmse_derived_bounds(c, ref, out->type);
}

size_t elements_outside(const std::vector<float>& got, const std::vector<float>& ref, const std::vector<double>& bound) {
  size_t n = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = std::fabs(static_cast<double>(got[i]) - static_cast<double>(ref[i]));
    if (d <= bound[i]) continue;  // NaN fails here too
    if (n < 8) UNSCOPED_INFO("element " << i << ": " << got[i] << ", reference " << ref[i] << ", off by " << d << " > bound " << bound[i]);
    ++n;
  }
  return n;
}

void check_result(const op_case& c, const std::vector<float>& got, const std::vector<float>& ref,
                  const std::vector<double>& bound) {
  REQUIRE(got.size() == ref.size());
  REQUIRE(bound.size() == ref.size());
  REQUIRE(all_finite(got));
  const double e = nmse(got, ref);
  INFO("nmse " << e << " (bound " << c.max_nmse << ")");
  CHECK(e <= c.max_nmse);
  CHECK(elements_outside(got, ref, bound) == 0);
}

bool check_case(const op_case& c, size_t ci, const std::vector<float>& ref, const std::vector<double>& bound,
                backend_i& be, const std::string& label, bool must_support, std::string* unsupported) {
  INFO("backend: " << label);
  std::string why;
  const auto got = run_case(c, ci, be, &why);
  if (!got) {
    if (must_support) FAIL("the CPU must support every case; unsupported: " << why);
    if (unsupported) *unsupported = why;
    return false;
  }
  check_result(c, *got, ref, bound);
  return true;
}

bool check_case(const op_case& c, size_t ci, const std::vector<float>& ref, backend_i& be, const std::string& label,
                bool must_support, std::string* unsupported) {
  return check_case(c, ci, ref, element_bounds(c, ci, ref), be, label, must_support, unsupported);
}

std::map<std::string, int> compare_supported_cases(backend_i& be) {
  auto reference = cpu::make_cpu_backend({.reference = true});
  const auto cases = conformance_cases();
  std::map<std::string, int> compared;
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    const op_case& c = cases[ci];
    INFO("case: " << c.name);
    const auto got = run_case(c, ci, be, nullptr);
    if (!got) continue;  // a node this device does not compute (supports_op said so)
    const auto ref = run_case(c, ci, *reference, nullptr);
    REQUIRE(ref.has_value());
    check_result(c, *got, *ref, element_bounds(c, ci, *ref));
    ++compared[c.name.substr(0, c.name.find(' '))];
  }
  return compared;
}

bool is_gpu_mul_mat_case(const op_case& c) {
  if (c.name.rfind("mul_mat ", 0) != 0) return false;
  const auto wt = type_from_name(c.name.substr(8, c.name.find(' ', 8) - 8));
  return wt && is_gpu_weight_type(*wt);
}

void check_gpu_coverage(std::map<std::string, int>& compared) {
  // Every case of every op it claims, with broadcasting and strided inputs among them.
  for (const char* o : {"add", "sub", "mul", "div"}) {
    INFO("op " << o);
    CHECK(compared[o] >= 5);
  }
  CHECK(compared["soft_max"] >= 4);                    // plain, f32 and f16 causal masks, ALiBi
  CHECK(compared["swiglu"] + compared["geglu"] >= 6);  // split, split swapped, with b: each kind
  CHECK(compared["get_rows"] == 14);                   // f32, f16, bf16, q4_0, q8_0, q4_K, q6_K; i32 and i64
  CHECK(compared["cpy"] >= 6);                         // f32 -> f32 / f16 / bf16, back, transposed
  CHECK(compared["cont"] >= 2);
  CHECK(compared["set_rows"] == 18);  // into f32, f16, bf16 rows and the KV cache's block types; i32 and i64 indices
  CHECK(compared["rope"] == 7);      // normal, neox, partial, linear scaling, YaRN, freq_factors
  for (const char* o : {"scale", "silu", "gelu", "rms_norm", "norm", "concat", "pad", "sum_rows", "mean", "argmax"}) {
    INFO("op " << o);
    CHECK(compared[o] >= 1);
  }
  // mul_mat: every case of the table whose weight type the GPU backends compute (f32, f16, bf16, the classic
  // and K quants) at every shape (matrix-vector and tiled, broadcast, row lengths with tails, a permuted b, a
  // KV cache view). The i-quants, ternary and MXFP4 types are CPU-only: their weights stay in host buffers.
  size_t mul_mat_cases = 0;
  for (const auto& c : conformance_cases()) mul_mat_cases += is_gpu_mul_mat_case(c) ? 1 : 0;
  CHECK(compared["mul_mat"] == static_cast<int>(mul_mat_cases));
  CHECK(mul_mat_cases >= 13 * (3 + 1 + 8) + 3 * 4 + 2);
}

}  // namespace troupe::testing
