// The CPU kernels (backends/cpu/kernels*.cpp) that compute values, each against a naive double-precision
// implementation written here: binary ops broadcasting over non-contiguous (permuted / transposed) sources,
// norms, soft_max with -inf masks and ALiBi, the activations and glu forms, partial, neox and YaRN rope,
// reductions, and the nodes the kernels reject. (Copies and row gathers: test_cpu_kernels_copy.cpp; mul_mat:
// test_cpu_kernels_mul_mat.cpp; attention: test_cpu_kernels_attention.cpp.)
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <vector>

#include "backends/cpu/kernels.h"
#include "runtime/context.h"
#include "runtime/error.h"
#include "runtime/ops.h"
#include "tests/backends/kernel_fixture.h"

using namespace troupe;
using namespace troupe::test::kernel_fixture;

TEST_CASE("kernels: binary ops broadcast b over a permuted a", "[cpu][kernels]") {
  context ctx(arena());
  tensor* base = ctx.new_tensor_4d(type::f32, 6, 4, 3, 2);
  fill_random(*base, 1);
  tensor* a = permute(ctx, base, 1, 0, 2, 3);  // [4, 6, 3, 2], nb[0] = 24 bytes
  tensor* b_row = ctx.new_tensor_4d(type::f32, 4, 1, 3, 1);
  fill_random(*b_row, 2, 0.5, 2.0);
  tensor* bt_base = ctx.new_tensor_2d(type::f32, 2, 4);
  fill_random(*bt_base, 3, 0.5, 2.0);
  tensor* b_t = transpose(ctx, bt_base);  // [4, 2]: broadcast over dim 1 (6 = 3 * 2), 2 and 3
  tensor* b_scalar = ctx.new_tensor_1d(type::f32, 1);
  set(*b_scalar, 1.5, 0);

  for (tensor* b : {b_row, b_t, b_scalar}) {
    for (int o = 0; o < 4; ++o) {
      tensor* d = o == 0 ? add(ctx, a, b) : o == 1 ? sub(ctx, a, b) : o == 2 ? mul(ctx, a, b) : div(ctx, a, b);
      std::vector<double> want;
      for_each(*d, [&](int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
        const double x = get(*a, i0, i1, i2, i3);
        const double y = get(*b, i0 % b->ne[0], i1 % b->ne[1], i2 % b->ne[2], i3 % b->ne[3]);
        want.push_back(o == 0 ? x + y : o == 1 ? x - y : o == 2 ? x * y : x / y);
      });
      for (int nth : {1, 3}) {
        compute(*d, nth);
        CHECK(max_diff(*d, want) < 1e-6);
      }
    }
  }

  tensor* s = scale(ctx, transpose(ctx, base), 0.5f, -2.0f);  // [4, 6, 3, 2] through a transpose
  std::vector<double> want;
  for_each(*s, [&](int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
    want.push_back(get(*base, i1, i0, i2, i3) * 0.5 - 2.0);
  });
  compute(*s, 2);
  CHECK(max_diff(*s, want) < 1e-6);
}

TEST_CASE("kernels: rms_norm and norm of contiguous and transposed rows", "[cpu][kernels]") {
  context ctx(arena());
  tensor* dense = ctx.new_tensor_3d(type::f32, 16, 5, 2);
  fill_random(*dense, 4, -2.0, 3.0);
  tensor* tb = ctx.new_tensor_2d(type::f32, 7, 16);
  fill_random(*tb, 5, -2.0, 3.0);
  for (tensor* a : {dense, transpose(ctx, tb)}) {
    for (bool rms : {true, false}) {
      const float eps = 1e-5f;
      tensor* d = rms ? rms_norm(ctx, a, eps) : norm(ctx, a, eps);
      std::vector<double> want;
      for (int64_t i2 = 0; i2 < a->ne[2]; ++i2) {
        for (int64_t i1 = 0; i1 < a->ne[1]; ++i1) {
          double mean = 0, sq = 0;
          for (int64_t i0 = 0; i0 < a->ne[0]; ++i0) mean += get(*a, i0, i1, i2);
          mean /= static_cast<double>(a->ne[0]);
          for (int64_t i0 = 0; i0 < a->ne[0]; ++i0) {
            const double x = get(*a, i0, i1, i2) - (rms ? 0.0 : mean);
            sq += x * x;
          }
          const double s = 1.0 / std::sqrt(sq / static_cast<double>(a->ne[0]) + eps);
          for (int64_t i0 = 0; i0 < a->ne[0]; ++i0) want.push_back((get(*a, i0, i1, i2) - (rms ? 0.0 : mean)) * s);
        }
      }
      compute(*d, 3);
      CHECK(max_diff(*d, want) < 1e-5);
    }
  }
}

TEST_CASE("kernels: soft_max with scale, -inf masks broadcast over dims 2 and 3, and ALiBi", "[cpu][kernels]") {
  context ctx(arena());
  tensor* a = ctx.new_tensor_4d(type::f32, 7, 4, 3, 2);  // [n_kv, n_q, heads, seqs]
  fill_random(*a, 6, -3.0, 3.0);
  tensor* mask32 = ctx.new_tensor_2d(type::f32, 7, 5);  // causal-like; row 3 fully masked
  for_each(*mask32, [&](int64_t i0, int64_t i1, int64_t, int64_t) {
    set(*mask32, i1 == 3 || i0 > i1 + 2 ? -INFINITY : 0.25 * static_cast<double>(i0 % 3), i0, i1);
  });
  tensor* mask16 = ctx.new_tensor_3d(type::f16, 7, 4, 3);
  fill_random(*mask16, 7, -1.0, 1.0);
  set(*mask16, -INFINITY, 0, 0, 1);

  struct variant {
    tensor* mask;
    float scale;
    float max_bias;
  };
  for (const variant& v : {variant{nullptr, 0.7f, 0.0f}, variant{mask32, 0.5f, 0.0f}, variant{mask16, 1.0f, 0.0f},
                           variant{mask32, 0.5f, 8.0f}}) {
    tensor* d = soft_max(ctx, a, v.mask, v.scale, v.max_bias);
    const int64_t n_head = a->ne[2];
    const double n_log2 = std::exp2(std::floor(std::log2(static_cast<double>(n_head))));  // 2 for 3 heads
    std::vector<double> want;
    for (int64_t i3 = 0; i3 < a->ne[3]; ++i3) {
      for (int64_t h = 0; h < n_head; ++h) {
        double slope = 1.0;
        if (v.max_bias > 0.0f) {
          const double m0 = std::pow(2.0, -v.max_bias / n_log2);
          const double m1 = std::pow(2.0, -(v.max_bias / 2.0) / n_log2);
          slope = static_cast<double>(h) < n_log2 ? std::pow(m0, static_cast<double>(h + 1))
                                                  : std::pow(m1, 2.0 * (static_cast<double>(h) - n_log2) + 1.0);
        }
        for (int64_t i1 = 0; i1 < a->ne[1]; ++i1) {
          std::vector<double> l(static_cast<size_t>(a->ne[0]));
          double mx = -INFINITY;
          for (int64_t i0 = 0; i0 < a->ne[0]; ++i0) {
            double x = get(*a, i0, i1, h, i3) * v.scale;
            if (v.mask) x += slope * get(*v.mask, i0, i1, h % v.mask->ne[2], i3 % v.mask->ne[3]);
            l[static_cast<size_t>(i0)] = x;
            mx = std::max(mx, x);
          }
          double sum = 0;
          for (double& x : l) sum += (x = mx == -INFINITY ? 0.0 : std::exp(x - mx));
          for (double x : l) want.push_back(sum > 0 ? x / sum : 0.0);  // fully masked rows: zeros
        }
      }
    }
    compute(*d, 3);
    CHECK(max_diff(*d, want) < 1e-6);
  }
}

TEST_CASE("kernels: silu, gelu and the glu forms (split, swapped, with b)", "[cpu][kernels]") {
  context ctx(arena());
  auto silu_d = [](double x) { return x / (1.0 + std::exp(-x)); };
  auto gelu_d = [](double x) {
    return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / std::numbers::pi) * x * (1.0 + 0.044715 * x * x)));
  };
  tensor* base = ctx.new_tensor_3d(type::f32, 5, 8, 2);
  fill_random(*base, 8, -6.0, 6.0);
  tensor* a = permute(ctx, base, 1, 0, 2, 3);  // [8, 5, 2]
  for (bool is_silu : {true, false}) {
    tensor* d = is_silu ? silu(ctx, a) : gelu(ctx, a);
    std::vector<double> want;
    for (double x : values(*a)) want.push_back(is_silu ? silu_d(x) : gelu_d(x));
    compute(*d, 3);
    CHECK(max_diff(*d, want) < 1e-5);
  }

  tensor* b = ctx.new_tensor_3d(type::f32, 8, 5, 2);
  fill_random(*b, 9, -2.0, 2.0);
  for (glu_kind kind : {glu_kind::swiglu, glu_kind::geglu}) {
    auto act = [&](double x) { return kind == glu_kind::swiglu ? silu_d(x) : gelu_d(x); };
    for (bool swapped : {false, true}) {
      // Split form: rows of a are [x | g] halves of 4.
      tensor* d = glu(ctx, a, nullptr, kind, swapped);
      REQUIRE(d->ne[0] == 4);
      std::vector<double> want;
      for_each(*d, [&](int64_t i0, int64_t i1, int64_t i2, int64_t) {
        const double x = get(*a, i0, i1, i2), g = get(*a, i0 + 4, i1, i2);
        want.push_back(swapped ? act(g) * x : act(x) * g);
      });
      compute(*d, 2);
      CHECK(max_diff(*d, want) < 1e-5);

      // Two tensors: act(a) * b, or act(b) * a when swapped.
      tensor* d2 = glu(ctx, a, b, kind, swapped);
      want.clear();
      for_each(*d2, [&](int64_t i0, int64_t i1, int64_t i2, int64_t) {
        const double x = get(*a, i0, i1, i2), g = get(*b, i0, i1, i2);
        want.push_back(swapped ? act(g) * x : act(x) * g);
      });
      compute(*d2, 3);
      CHECK(max_diff(*d2, want) < 1e-5);
    }
  }
}

namespace {

// rope in double, from the definitions (ggml's YaRN): returns dst's values in row-major order.
std::vector<double> rope_ref(const tensor& a, const std::vector<int32_t>& pos, const tensor* ff,
                             const rope_params& p) {
  const int64_t nd = p.n_dims;
  auto corr = [&](double n_rot) {
    return static_cast<double>(nd) * std::log(p.n_ctx_orig / (n_rot * 2 * std::numbers::pi)) /
           (2 * std::log(p.freq_base));
  };
  const double low = std::max(0.0, std::floor(corr(p.beta_fast)));
  const double high = std::min(static_cast<double>(nd - 1), std::ceil(corr(p.beta_slow)));
  std::vector<double> out;
  for (int64_t i3 = 0; i3 < a.ne[3]; ++i3)
    for (int64_t i2 = 0; i2 < a.ne[2]; ++i2)
      for (int64_t i1 = 0; i1 < a.ne[1]; ++i1) {
        std::vector<double> y(static_cast<size_t>(a.ne[0]));
        for (int64_t i0 = 0; i0 < a.ne[0]; ++i0) y[static_cast<size_t>(i0)] = get(a, i0, i1, i2, i3);
        for (int64_t ic = 0; ic < nd / 2; ++ic) {
          const double f = ff ? get(*ff, ic) : 1.0;
          const double extrap = pos[static_cast<size_t>(i2)] * std::pow(p.freq_base, -2.0 * ic / nd) / f;
          double theta = p.freq_scale * extrap;
          double mscale = p.attn_factor;
          if (p.ext_factor != 0.0f) {
            const double ramp =
                1 - std::clamp((static_cast<double>(ic) - low) / std::max(0.001, high - low), 0.0, 1.0);
            const double mix = ramp * p.ext_factor;
            theta = theta * (1 - mix) + extrap * mix;
            mscale *= 1.0 + 0.1 * std::log(1.0 / p.freq_scale);
          }
          const int64_t j0 = p.mode == rope_mode::neox ? ic : 2 * ic;
          const int64_t j1 = p.mode == rope_mode::neox ? ic + nd / 2 : 2 * ic + 1;
          const double x0 = get(a, j0, i1, i2, i3), x1 = get(a, j1, i1, i2, i3);
          y[static_cast<size_t>(j0)] = (x0 * std::cos(theta) - x1 * std::sin(theta)) * mscale;
          y[static_cast<size_t>(j1)] = (x0 * std::sin(theta) + x1 * std::cos(theta)) * mscale;
        }
        out.insert(out.end(), y.begin(), y.end());
      }
  return out;
}

}  // namespace

TEST_CASE("kernels: rope normal vs neox on known values", "[cpu][kernels]") {
  context ctx(arena());
  tensor* a = ctx.new_tensor_3d(type::f32, 4, 1, 1);  // one head of 4, one token at position 1
  fill(*a, {1, 2, 3, 4});
  tensor* pos = ctx.new_tensor_1d(type::i32, 1);
  set(*pos, 1, 0);
  rope_params p;
  p.n_dims = 4;
  p.freq_base = 10000.0f;  // thetas: 1 and 1 / 100
  const double c1 = std::cos(1.0), s1 = std::sin(1.0), c2 = std::cos(0.01), s2 = std::sin(0.01);

  p.mode = rope_mode::normal;  // pairs (0, 1), (2, 3)
  tensor* n = rope(ctx, a, pos, nullptr, p);
  compute(*n);
  CHECK(max_diff(*n, {1 * c1 - 2 * s1, 1 * s1 + 2 * c1, 3 * c2 - 4 * s2, 3 * s2 + 4 * c2}) < 1e-6);

  p.mode = rope_mode::neox;  // pairs (0, 2), (1, 3)
  tensor* x = rope(ctx, a, pos, nullptr, p);
  compute(*x);
  CHECK(max_diff(*x, {1 * c1 - 3 * s1, 2 * c2 - 4 * s2, 1 * s1 + 3 * c1, 2 * s2 + 4 * c2}) < 1e-6);
}

TEST_CASE("kernels: rope partial, YaRN, freq_factors, permuted input", "[cpu][kernels]") {
  context ctx(arena());
  const int64_t head_dim = 12, n_head = 3, n_tok = 5;
  tensor* base = ctx.new_tensor_3d(type::f32, head_dim, n_tok, n_head);
  fill_random(*base, 10, -2.0, 2.0);
  tensor* a = permute(ctx, base, 0, 2, 1, 3);  // [head_dim, n_head, n_tok], strided heads
  tensor* pos = ctx.new_tensor_1d(type::i32, n_tok);
  const std::vector<int32_t> positions = {0, 3, 17, 64, 130};
  for (int64_t i = 0; i < n_tok; ++i) set(*pos, positions[static_cast<size_t>(i)], i);
  tensor* ff = ctx.new_tensor_1d(type::f32, 4);
  fill(*ff, {1.0, 2.0, 4.0, 8.0});

  for (rope_mode mode : {rope_mode::normal, rope_mode::neox}) {
    for (int variant = 0; variant < 3; ++variant) {
      rope_params p;
      p.mode = mode;
      p.n_dims = 8;  // partial: dims 8..11 pass through
      p.freq_base = 500.0f;
      tensor* f = nullptr;
      if (variant == 1) {  // YaRN
        p.n_ctx_orig = 64;
        p.freq_scale = 0.25f;
        p.ext_factor = 1.0f;
        p.attn_factor = 0.9f;
        p.beta_fast = 32.0f;
        p.beta_slow = 1.0f;
      } else if (variant == 2) {
        f = ff;
        p.freq_scale = 0.5f;
      }
      tensor* d = rope(ctx, a, pos, f, p);
      compute(*d, 3);
      const std::vector<double> want = rope_ref(*a, positions, f, p);
      CHECK(max_diff(*d, want) < 2e-4);
      for (int64_t i0 = 8; i0 < head_dim; ++i0) CHECK(get(*d, i0, 1, 2) == get(*a, i0, 1, 2));
    }
  }
}

TEST_CASE("kernels: sum_rows, mean, argmax (ties give the first index)", "[cpu][kernels]") {
  context ctx(arena());
  tensor* base = ctx.new_tensor_3d(type::f32, 4, 9, 2);
  fill_random(*base, 20, -5.0, 5.0);
  tensor* a = permute(ctx, base, 1, 0, 2, 3);  // [9, 4, 2]
  tensor* s = sum_rows(ctx, a);
  tensor* m = mean(ctx, a);
  std::vector<double> ws, wm;
  for (int64_t i2 = 0; i2 < 2; ++i2)
    for (int64_t i1 = 0; i1 < 4; ++i1) {
      double sum = 0;
      for (int64_t i0 = 0; i0 < 9; ++i0) sum += get(*a, i0, i1, i2);
      ws.push_back(sum);
      wm.push_back(sum / 9);
    }
  compute(*s, 3);
  compute(*m, 3);
  CHECK(max_diff(*s, ws) < 1e-5);
  CHECK(max_diff(*m, wm) < 1e-6);

  tensor* x = ctx.new_tensor_2d(type::f32, 4, 5);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  fill(*x, {1, 3, 3, 2, 5, 5, 5, 5, -INFINITY, -INFINITY, -INFINITY, -INFINITY, nan, 1, 1, 0, -1, -2, 7, 7});
  tensor* am = argmax(ctx, x);
  compute(*am, 2);
  CHECK(values(*am) == std::vector<double>{1, 0, 0, 1, 2});
}

TEST_CASE("kernels: unsupported nodes are rejected by supports_op and throw backend_error", "[cpu][kernels]") {
  context ctx(arena());
  tensor* a = ctx.new_tensor_3d(type::f32, 8, 2, 3);
  tensor* pos = ctx.new_tensor_1d(type::i32, 3);
  rope_params p;
  p.n_dims = 8;
  tensor* r = rope(ctx, a, pos, nullptr, p);
  r->set_name("q_rope");
  CHECK(cpu::supports_op(*r));
  r->set_param(1, int32_t{8});  // multi-section rope: not implemented
  CHECK_FALSE(cpu::supports_op(*r));
  CHECK_THROWS_WITH(compute(*r), Catch::Contains("rope") && Catch::Contains("q_rope"));

  tensor* w = ctx.new_tensor_2d(type::f64, 256, 2);  // known by size only
  w->set_name("w_f64");
  tensor* x = ctx.new_tensor_2d(type::f32, 256, 1);
  tensor mm;  // built by hand: op construction would refuse it
  mm.op = op::mul_mat;
  mm.ne = {2, 1, 1, 1};
  mm.nb = dense_strides(type::f32, mm.ne);
  mm.src = {w, x, nullptr, nullptr};
  float out[2];
  mm.data = out;
  CHECK_FALSE(cpu::supports_op(mm));
  CHECK_THROWS_AS(compute(mm), backend_error);
  CHECK_THROWS_WITH(compute(mm), Catch::Contains("mul_mat") && Catch::Contains("w_f64"));

  tensor* q = ctx.new_tensor_2d(type::q4_0, 32, 2);
  tensor* d = mul_mat(ctx, q, ctx.new_tensor_2d(type::f32, 32, 1));
  cpu::compute_params small;  // no work buffer for b's q8_0 rows
  CHECK_THROWS_WITH(cpu::compute_forward(small, *d), Catch::Contains("work buffer"));

  for (op o : {op::none, op::view, op::reshape, op::permute, op::transpose}) {
    tensor t;
    t.op = o;
    CHECK(cpu::supports_op(t));
    CHECK_NOTHROW(cpu::compute_forward(cpu::compute_params{}, t));
  }
}
