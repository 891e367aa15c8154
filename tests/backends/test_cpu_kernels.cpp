// The CPU kernels (backends/cpu/kernels*.cpp), each against a naive double-precision implementation written
// here: broadcasting, non-contiguous (permuted / transposed) sources, partial and neox rope, masks with
// -inf, type conversions, row gathers / scatters, and mul_mat for every weight type on 1 and 3 threads.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <barrier>
#include <cmath>
#include <cstring>
#include <exception>
#include <functional>
#include <limits>
#include <numbers>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backends/cpu/cpu_features.h"
#include "backends/cpu/kernels.h"
#include "backends/cpu/simd/simd.h"
#include "runtime/context.h"
#include "runtime/error.h"
#include "runtime/fp16.h"
#include "runtime/ops.h"
#include "tests/support/random_blocks.h"

using namespace troupe;

namespace {

context_params arena(size_t mb = 16) { return {.max_tensors = 256, .mem_size = mb << 20, .no_alloc = false}; }

// Runs node on nth threads (std::barrier for syncs) with a fresh, 64-byte aligned work buffer.
void compute(tensor& node, int nth = 1, bool reference = true) {
  const size_t ws = cpu::work_size(node, nth, reference);
  std::vector<uint8_t> storage(ws + 64);
  uint8_t* wdata = storage.data() + (64 - reinterpret_cast<uintptr_t>(storage.data()) % 64) % 64;
  auto params_for = [&](int ith) {
    cpu::compute_params p;
    p.ith = ith;
    p.nth = nth;
    p.wdata = ws > 0 ? wdata : nullptr;
    p.wsize = ws;
    p.reference = reference;
    return p;
  };
  if (nth == 1) {
    cpu::compute_forward(params_for(0), node);
    return;
  }
  std::barrier sync(nth);
  std::vector<std::exception_ptr> errors(static_cast<size_t>(nth));
  std::vector<std::thread> threads;
  for (int ith = 0; ith < nth; ++ith) {
    threads.emplace_back([&, ith] {
      cpu::compute_params p = params_for(ith);
      p.barrier = [&sync] { sync.arrive_and_wait(); };
      try {
        cpu::compute_forward(p, node);
      } catch (...) {
        errors[static_cast<size_t>(ith)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

char* at(const tensor& t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
  return static_cast<char*>(t.data) + i0 * static_cast<int64_t>(t.nb[0]) + i1 * static_cast<int64_t>(t.nb[1]) +
         i2 * static_cast<int64_t>(t.nb[2]) + i3 * static_cast<int64_t>(t.nb[3]);
}

double get(const tensor& t, int64_t i0, int64_t i1 = 0, int64_t i2 = 0, int64_t i3 = 0) {
  const char* p = at(t, i0, i1, i2, i3);
  if (t.type == type::f32) {
    float v;
    std::memcpy(&v, p, 4);
    return v;
  }
  if (t.type == type::i32) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return v;
  }
  if (t.type == type::i64) {
    int64_t v;
    std::memcpy(&v, p, 8);
    return static_cast<double>(v);
  }
  uint16_t h;
  std::memcpy(&h, p, 2);
  return t.type == type::f16 ? fp16_to_fp32(h) : bf16_to_fp32(h);
}

void set(const tensor& t, double v, int64_t i0, int64_t i1 = 0, int64_t i2 = 0, int64_t i3 = 0) {
  char* p = at(t, i0, i1, i2, i3);
  if (t.type == type::f32) {
    const float f = static_cast<float>(v);
    std::memcpy(p, &f, 4);
  } else if (t.type == type::i32) {
    const int32_t i = static_cast<int32_t>(v);
    std::memcpy(p, &i, 4);
  } else if (t.type == type::i64) {
    const int64_t i = static_cast<int64_t>(v);
    std::memcpy(p, &i, 8);
  } else {
    const uint16_t h =
        t.type == type::f16 ? fp32_to_fp16(static_cast<float>(v)) : fp32_to_bf16(static_cast<float>(v));
    std::memcpy(p, &h, 2);
  }
}

// Calls f(i0, i1, i2, i3) for every element in row-major order (i0 fastest).
void for_each(const tensor& t, const std::function<void(int64_t, int64_t, int64_t, int64_t)>& f) {
  for (int64_t i3 = 0; i3 < t.ne[3]; ++i3)
    for (int64_t i2 = 0; i2 < t.ne[2]; ++i2)
      for (int64_t i1 = 0; i1 < t.ne[1]; ++i1)
        for (int64_t i0 = 0; i0 < t.ne[0]; ++i0) f(i0, i1, i2, i3);
}

// The tensor's elements in row-major order, as doubles.
std::vector<double> values(const tensor& t) {
  std::vector<double> v;
  for_each(t, [&](int64_t i0, int64_t i1, int64_t i2, int64_t i3) { v.push_back(get(t, i0, i1, i2, i3)); });
  return v;
}

void fill(const tensor& t, const std::vector<double>& v) {
  size_t k = 0;
  for_each(t, [&](int64_t i0, int64_t i1, int64_t i2, int64_t i3) { set(t, v[k++], i0, i1, i2, i3); });
}

std::vector<double> random_values(size_t n, uint32_t seed, double lo = -1.0, double hi = 1.0) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v(n);
  for (auto& x : v) x = static_cast<float>(dist(rng));  // representable in f32
  return v;
}

void fill_random(const tensor& t, uint32_t seed, double lo = -1.0, double hi = 1.0) {
  fill(t, random_values(static_cast<size_t>(nelements(t)), seed, lo, hi));
}

// Largest |got - expected| over the tensor's elements in row-major order (infinite for a NaN or a size
// mismatch; equal infinities count as equal).
double max_diff(const tensor& got, const std::vector<double>& expected) {
  const std::vector<double> g = values(got);
  if (g.size() != expected.size()) return INFINITY;
  double m = 0.0;
  for (size_t i = 0; i < g.size(); ++i) {
    if (g[i] == expected[i]) continue;
    const double d = std::fabs(g[i] - expected[i]);
    m = std::isnan(d) ? INFINITY : std::max(m, d);
  }
  return m;
}

// Quantizes `v` (row-major values of a dense tensor of a block type) into t, row by row.
void quantize_into(const tensor& t, const std::vector<double>& v) {
  const int64_t ne0 = t.ne[0];
  std::vector<float> row(static_cast<size_t>(ne0));
  for (int64_t r = 0; r < nrows(t); ++r) {
    for (int64_t i = 0; i < ne0; ++i)
      row[static_cast<size_t>(i)] = static_cast<float>(v[static_cast<size_t>(r * ne0 + i)]);
    traits(t.type).from_float_ref(row.data(),
                                  at(t, 0, r % t.ne[1], (r / t.ne[1]) % t.ne[2], r / (t.ne[1] * t.ne[2])), ne0);
  }
}

std::vector<float> dequantize_row(const tensor& t, int64_t i1, int64_t i2 = 0, int64_t i3 = 0) {
  std::vector<float> row(static_cast<size_t>(t.ne[0]));
  traits(t.type).to_float(at(t, 0, i1, i2, i3), row.data(), t.ne[0]);
  return row;
}

}  // namespace

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

TEST_CASE("kernels: cpy converts f32 <-> f16 / bf16 and reshapes strided sources", "[cpu][kernels]") {
  context ctx(arena());
  tensor* src_base = ctx.new_tensor_2d(type::f32, 12, 16);
  fill_random(*src_base, 11, -100.0, 100.0);
  tensor* src = transpose(ctx, src_base);  // [16, 12], nb[0] = 48 bytes
  const std::vector<double> sv = values(*src);

  tensor* h = ctx.new_tensor_3d(type::f16, 8, 4, 6);  // other shape, same count
  tensor* c1 = cpy(ctx, src, h);
  compute(*c1, 3);
  tensor* back = ctx.new_tensor_2d(type::f32, 16, 12);
  tensor* c2 = cpy(ctx, h, back);
  compute(*c2, 2);
  const std::vector<double> bv = values(*back);
  double worst = 0;
  for (size_t i = 0; i < sv.size(); ++i) worst = std::max(worst, std::fabs(bv[i] - sv[i]) / std::fabs(sv[i]));
  CHECK(worst <= std::ldexp(1.0, -11));  // round to nearest: half an f16 ulp
  CHECK(values(*h) == bv);               // f16 -> f32 is exact

  tensor* bf = ctx.new_tensor_1d(type::bf16, 192);
  compute(*cpy(ctx, src, bf));
  const std::vector<double> bfv = values(*bf);
  worst = 0;
  for (size_t i = 0; i < sv.size(); ++i) worst = std::max(worst, std::fabs(bfv[i] - sv[i]) / std::fabs(sv[i]));
  CHECK(worst <= std::ldexp(1.0, -8));

  // f32 -> f32 into a strided destination (every other column of a wider tensor).
  tensor* wide = ctx.new_tensor_2d(type::f32, 32, 12);
  tensor* cols = view_2d(ctx, wide, 16, 12, wide->nb[1], 0);
  compute(*cpy(ctx, src, cols), 3);
  CHECK(max_diff(*cols, sv) == 0.0);

  tensor* ct = cont(ctx, src, 4, 4, 12);
  compute(*ct, 3);
  CHECK(max_diff(*ct, sv) == 0.0);
  CHECK(ct->nb[1] == 16);
}

TEST_CASE("kernels: cpy f32 -> q8_0 and q4_0 -> f32, and same-type block copies", "[cpu][kernels]") {
  context ctx(arena());
  tensor* src = ctx.new_tensor_2d(type::f32, 64, 3);
  fill_random(*src, 12, -4.0, 4.0);
  tensor* q = ctx.new_tensor_2d(type::q8_0, 64, 3);
  compute(*cpy(ctx, src, q), 2);
  // Bit-identical to quantizing each row with the reference quantizer, and within q8_0's error.
  tensor* q_ref = ctx.new_tensor_2d(type::q8_0, 64, 3);
  quantize_into(*q_ref, values(*src));
  CHECK(std::memcmp(q->data, q_ref->data, nbytes(*q)) == 0);
  for (int64_t r = 0; r < 3; ++r) {
    const std::vector<float> row = dequantize_row(*q, r);
    for (int64_t i = 0; i < 64; ++i)
      CHECK(std::fabs(row[static_cast<size_t>(i)] - get(*src, i, r)) <= 4.0 / 127 + 1e-6);
  }

  // q4_0 -> f32: dequantized rows land in a transposed destination.
  tensor* q4 = ctx.new_tensor_2d(type::q4_0, 32, 4);
  quantize_into(*q4, random_values(128, 13));
  tensor* out_base = ctx.new_tensor_2d(type::f32, 4, 32);
  tensor* out = transpose(ctx, out_base);  // [32, 4], strided
  // Op construction wants dense rows on both sides of a quantized copy; the kernel takes any destination.
  tensor* c = ctx.view_tensor(out);
  c->op = op::cpy;
  c->src = {q4, out, nullptr, nullptr};
  CHECK(cpu::supports_op(*c));
  compute(*c, 3);
  std::vector<double> want;
  for (int64_t r = 0; r < 4; ++r)
    for (float x : dequantize_row(*q4, r)) want.push_back(x);
  CHECK(max_diff(*out, want) == 0.0);

  // Same-type q8_0 copy into every other row of a bigger tensor.
  tensor* big = ctx.new_tensor_2d(type::q8_0, 64, 6);
  tensor* odd = view_2d(ctx, big, 64, 3, 2 * big->nb[1], big->nb[1]);
  compute(*cpy(ctx, q, odd), 2);
  for (int64_t r = 0; r < 3; ++r)
    CHECK(std::memcmp(at(*big, 0, 2 * r + 1, 0, 0), at(*q, 0, r, 0, 0), q->nb[1]) == 0);
}

TEST_CASE("kernels: get_rows of q4_0, f16 and f32 rows, and out-of-range indices throw", "[cpu][kernels]") {
  context ctx(arena());
  tensor* q4 = ctx.new_tensor_3d(type::q4_0, 64, 5, 2);
  quantize_into(*q4, random_values(640, 14));
  tensor* idx = ctx.new_tensor_2d(type::i32, 3, 2);
  fill(*idx, {4, 0, 4, 1, 3, 1});
  tensor* d = get_rows(ctx, q4, idx);  // [64, 3, 2]
  compute(*d, 2);
  std::vector<double> want;
  for (int64_t k = 0; k < 2; ++k)
    for (int64_t j = 0; j < 3; ++j)
      for (float x : dequantize_row(*q4, static_cast<int64_t>(get(*idx, j, k)), k)) want.push_back(x);
  CHECK(max_diff(*d, want) == 0.0);

  tensor* h = ctx.new_tensor_2d(type::f16, 6, 4);
  fill_random(*h, 15);
  tensor* idx64 = ctx.new_tensor_1d(type::i64, 3);
  fill(*idx64, {3, 3, 0});
  tensor* dh = get_rows(ctx, h, idx64);
  compute(*dh, 3);
  want.clear();
  for (int64_t r : {3, 3, 0})
    for (int64_t i = 0; i < 6; ++i) want.push_back(get(*h, i, r));
  CHECK(max_diff(*dh, want) == 0.0);

  set(*idx64, 4, 1);  // row 4 of a 4-row tensor
  CHECK_THROWS_AS(compute(*dh), backend_error);
  set(*idx64, -1, 1);
  CHECK_THROWS_WITH(compute(*dh), Catch::Contains("get_rows") && Catch::Contains("-1"));
}

TEST_CASE("kernels: set_rows with i64 indices broadcast over dim 2 into f32, f16 and q8_0", "[cpu][kernels]") {
  for (type dt : {type::f32, type::f16, type::q8_0}) {
    context ctx(arena());
    tensor* dst = ctx.new_tensor_3d(dt, 32, 5, 4);  // a KV cache: [ne0, n_rows, heads]
    std::vector<uint8_t> before(nbytes(*dst));
    for (size_t i = 0; i < before.size(); ++i) before[i] = static_cast<uint8_t>(i * 7 + 1);
    std::memcpy(dst->data, before.data(), before.size());
    tensor* src = ctx.new_tensor_3d(type::f32, 32, 2, 4);
    fill_random(*src, 16);
    tensor* idx = ctx.new_tensor_2d(type::i64, 2, 2);  // broadcast: heads 0, 2 use column 0; 1, 3 column 1
    fill(*idx, {4, 0, 1, 2});
    tensor* d = set_rows(ctx, dst, src, idx);
    compute(*d, 3);
    const size_t row_bytes = dst->nb[1];
    for (int64_t k = 0; k < 4; ++k) {
      for (int64_t r = 0; r < 5; ++r) {
        int64_t from = -1;
        for (int64_t i = 0; i < 2; ++i) from = get(*idx, i, k % 2) == static_cast<double>(r) ? i : from;
        const char* got = at(*dst, 0, r, k, 0);
        if (from < 0) {  // untouched
          CHECK(std::memcmp(got, before.data() + (got - static_cast<char*>(dst->data)), row_bytes) == 0);
          continue;
        }
        std::vector<float> row(32);
        for (int64_t i = 0; i < 32; ++i) row[static_cast<size_t>(i)] = static_cast<float>(get(*src, i, from, k));
        std::vector<uint8_t> want(row_bytes);
        traits(dt).from_float_ref(row.data(), want.data(), 32);
        CHECK(std::memcmp(got, want.data(), row_bytes) == 0);
      }
    }
  }
}

TEST_CASE("kernels: concat along every dim, pad with zeros", "[cpu][kernels]") {
  context ctx(arena());
  for (int dim = 0; dim < 4; ++dim) {
    std::array<int64_t, 4> na{3, 2, 2, 2}, nb{3, 2, 2, 2};
    nb[static_cast<size_t>(dim)] = 1 + dim;
    tensor* a = ctx.new_tensor_4d(type::f32, na[0], na[1], na[2], na[3]);
    tensor* b_base = ctx.new_tensor_4d(type::f32, nb[1], nb[0], nb[2], nb[3]);
    tensor* b = transpose(ctx, b_base);  // non-contiguous second source
    fill_random(*a, 17);
    fill_random(*b_base, 18);
    tensor* d = concat(ctx, a, b, dim);
    std::vector<double> want;
    for_each(*d, [&](int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
      int64_t i[4] = {i0, i1, i2, i3};
      if (i[dim] < na[static_cast<size_t>(dim)]) {
        want.push_back(get(*a, i0, i1, i2, i3));
      } else {
        i[dim] -= na[static_cast<size_t>(dim)];
        want.push_back(get(*b, i[0], i[1], i[2], i[3]));
      }
    });
    compute(*d, 3);
    CHECK(max_diff(*d, want) == 0.0);
  }

  tensor* base = ctx.new_tensor_2d(type::f32, 2, 3);
  fill_random(*base, 19);
  tensor* a = transpose(ctx, base);  // [3, 2]
  tensor* d = pad(ctx, a, 2, 1, 1, 0);
  REQUIRE(d->ne == (std::array<int64_t, 4>{5, 3, 2, 1}));
  std::vector<double> want;
  for_each(*d, [&](int64_t i0, int64_t i1, int64_t i2, int64_t) {
    want.push_back(i0 < 3 && i1 < 2 && i2 < 1 ? get(*a, i0, i1) : 0.0);
  });
  std::memset(d->data, 0xff, nbytes(*d));  // NaN garbage that must be overwritten
  compute(*d, 2);
  CHECK(max_diff(*d, want) == 0.0);
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

namespace {

// mul_mat in double over a's dequantized rows, and a per-element bound on the error that converting b to
// a's vec_dot_type (and float accumulation) may add.
struct mm_expect {
  std::vector<double> value;
  std::vector<double> bound;
};

mm_expect mul_mat_ref(const tensor& a, const tensor& b) {
  const type vdt = traits(a.type).vec_dot_type;
  const double eps = vdt == type::f32    ? 0.0
                     : vdt == type::f16  ? std::ldexp(1.0, -11)
                     : vdt == type::bf16 ? std::ldexp(1.0, -8)
                                         : 1.0 / 127;
  const bool block_rel = traits(vdt).block_size > 1;  // quantized: error relative to the block's max
  const int64_t r2 = b.ne[2] / a.ne[2], r3 = b.ne[3] / a.ne[3];
  mm_expect e;
  for (int64_t i3 = 0; i3 < b.ne[3]; ++i3)
    for (int64_t i2 = 0; i2 < b.ne[2]; ++i2)
      for (int64_t j = 0; j < b.ne[1]; ++j) {
        double bmax = 0;
        for (int64_t l = 0; l < b.ne[0]; ++l) bmax = std::max(bmax, std::fabs(get(b, l, j, i2, i3)));
        for (int64_t i = 0; i < a.ne[1]; ++i) {
          const std::vector<float> row = dequantize_row(a, i, i2 / r2, i3 / r3);
          double s = 0, mag = 0, err = 0;
          for (int64_t l = 0; l < a.ne[0]; ++l) {
            const double x = row[static_cast<size_t>(l)], y = get(b, l, j, i2, i3);
            s += x * y;
            mag += std::fabs(x * y);
            err += std::fabs(x) * (block_rel ? bmax : std::fabs(y)) * eps;
          }
          e.value.push_back(s);
          e.bound.push_back(err + 1e-5 * mag + 1e-6);
        }
      }
  return e;
}

bool within(const tensor& got, const mm_expect& e) {
  const std::vector<double> g = values(got);
  if (g.size() != e.value.size()) return false;
  for (size_t i = 0; i < g.size(); ++i) {
    if (!(std::fabs(g[i] - e.value[i]) <= e.bound[i])) {
      UNSCOPED_INFO("element " << i << ": got " << g[i] << ", want " << e.value[i] << " +- " << e.bound[i]);
      return false;
    }
  }
  return true;
}

tensor* weights(context& ctx, type t, int64_t k, int64_t m, int64_t ne2, uint32_t seed) {
  tensor* a = ctx.new_tensor_3d(t, k, m, ne2);
  const std::vector<double> v = random_values(static_cast<size_t>(k * m * ne2), seed);
  if (is_quantized(t) && traits(t).from_float_ref == nullptr) {
    // A type troupe reads but does not write (the i-quants below 4 bits): random valid blocks.
    std::mt19937 rng(seed);
    const std::vector<uint8_t> blocks = test::random_blocks(t, static_cast<int64_t>(nbytes(*a) / type_size(t)), rng);
    std::memcpy(a->data, blocks.data(), blocks.size());
  } else if (is_quantized(t)) {
    quantize_into(*a, v);
  } else {
    fill(*a, v);
  }
  return a;
}

std::vector<uint8_t> bytes_of(const tensor& t) {
  const char* p = static_cast<const char*>(t.data);
  return {p, p + nbytes(t)};
}

}  // namespace

TEST_CASE("kernels: mul_mat for every supported weight type, broadcast over planes", "[cpu][kernels][mul_mat]") {
  const int64_t k = 256;  // a multiple of every block size
  int n_types = 0;
  for (uint32_t id = 0; id < type_id_count; ++id) {
    const std::optional<type> t = type_from_id(id);
    if (!t || !traits(*t).supported || traits(*t).vec_dot == nullptr) continue;
    ++n_types;
    INFO("weights " << type_name(*t));
    context ctx(arena());
    tensor* a = weights(ctx, *t, k, 5, 2, 21 + id);     // [k, 5, 2]
    tensor* b = ctx.new_tensor_3d(type::f32, k, 3, 4);  // [k, 3, 4]: planes 0, 1 use a's plane 0
    fill_random(*b, 22, -2.0, 2.0);
    tensor* d = mul_mat(ctx, a, b);
    REQUIRE(d->ne == (std::array<int64_t, 4>{5, 3, 4, 1}));
    CHECK(cpu::supports_op(*d));
    const mm_expect want = mul_mat_ref(*a, *b);
    compute(*d, 1);
    CHECK(within(*d, want));
    const std::vector<uint8_t> one = bytes_of(*d);
    std::memset(d->data, 0, nbytes(*d));
    compute(*d, 3);
    CHECK(bytes_of(*d) == one);  // each element is one vec_dot call, whatever the thread count
  }
  CHECK(n_types >= 15);  // f32, f16, bf16, q4_0 ... q8_1, q2_K ... q8_K
}

TEST_CASE("kernels: mul_mat of a few rows of b (batched decode) equals each row alone, bit for bit",
          "[cpu][kernels][mul_mat]") {
  // Several sequences decoding at once multiply the weights by 2..8 activation rows; the quantized types
  // have tile kernels for that (each weight block decoded once for several rows). Each column must be
  // within the reference's bound and identical to the product of its row alone, whatever the batch and
  // the thread count, so that a sequence's tokens do not depend on the others in its batch.
  // k = 512: the activation rows prepared for the tile kernels where a type has that (AVX-512 q4_0, q4_1,
  // q5_0, q5_1, q8_0, and f16 against rows converted to f32); k = 4096 with 4 or more rows: too big to prepare, the tiles read the converted rows.
  const int64_t m = 70;  // several chunks per thread, a partial last chunk
  struct shape {
    type t;
    int64_t k;
  };
  std::vector<shape> shapes;
  for (type t : {type::q4_0, type::q4_1, type::q5_0, type::q5_1, type::q8_0, type::q2_K, type::q3_K, type::q4_K,
                 type::q5_K, type::q6_K, type::iq4_nl, type::iq4_xs, type::mxfp4, type::tq1_0, type::tq2_0, type::f16,
                 type::f32}) {
    shapes.push_back({t, 512});
  }
  for (type t : {type::q4_0, type::q4_1, type::q8_0, type::f16}) shapes.push_back({t, 4096});
  for (const auto [t, k] : shapes) {
    context ctx(arena(32));
    tensor* a = weights(ctx, t, k, m, 1, 31);
    for (int64_t n : {2, 3, 4, 5, 8}) {
      INFO("weights " << type_name(t) << ", k " << k << ", batch " << n);
      tensor* b = ctx.new_tensor_2d(type::f32, k, n);
      fill_random(*b, 32 + static_cast<uint32_t>(n), -2.0, 2.0);
      tensor* d = mul_mat(ctx, a, b);
      const mm_expect want = mul_mat_ref(*a, *b);
      std::vector<uint8_t> alone;  // column j: the product of b's row j alone (a matrix-vector product)
      for (int64_t j = 0; j < n; ++j) {
        tensor* dj = mul_mat(ctx, a, view_2d(ctx, b, k, 1, b->nb[1], static_cast<size_t>(j) * b->nb[1]));
        compute(*dj, 1, /*reference=*/false);
        const std::vector<uint8_t> col = bytes_of(*dj);
        alone.insert(alone.end(), col.begin(), col.end());
      }
      for (int nth : {1, 2, 3}) {
        INFO("threads " << nth);
        std::memset(d->data, 0, nbytes(*d));
        compute(*d, nth, /*reference=*/false);
        CHECK(within(*d, want));
        CHECK(bytes_of(*d) == alone);
      }
    }
  }
}

TEST_CASE("kernels: mul_mat with strided a rows and permuted / transposed b", "[cpu][kernels][mul_mat]") {
  for (type t : {type::f32, type::f16, type::q4_0, type::q4_K}) {
    INFO("weights " << type_name(t));
    context ctx(arena());
    const int64_t k = 256;
    tensor* all = weights(ctx, t, k, 10, 1, 23);
    tensor* a = view_3d(ctx, all, k, 5, 1, 2 * all->nb[1], 10 * all->nb[1], all->nb[1]);  // odd rows
    tensor* b_base = ctx.new_tensor_3d(type::f32, k, 2, 3);
    fill_random(*b_base, 24);
    tensor* b_perm = permute(ctx, b_base, 0, 2, 1, 3);  // [k, 3, 2]: rows dense, strided planes
    tensor* bt_base = ctx.new_tensor_2d(type::f32, 4, k);
    fill_random(*bt_base, 25);
    tensor* b_tr = transpose(ctx, bt_base);  // [k, 4], nb[0] = 16 bytes
    for (tensor* b : {b_perm, b_tr}) {
      tensor* d = mul_mat(ctx, a, b);
      const mm_expect want = mul_mat_ref(*a, *b);
      compute(*d, 1);
      const std::vector<uint8_t> one = bytes_of(*d);
      CHECK(within(*d, want));
      compute(*d, 3);
      CHECK(bytes_of(*d) == one);
    }
  }
}

TEST_CASE("kernels: mul_mat work sizes, and the BLAS path where built", "[cpu][kernels][mul_mat]") {
  context ctx(arena(32));
  const int64_t k = 128, m = 96, n = 40;
  tensor* a32 = weights(ctx, type::f32, k, m, 2, 26);
  tensor* aq = weights(ctx, type::q4_0, k, m, 2, 27);
  tensor* b = ctx.new_tensor_3d(type::f32, k, n, 4);
  fill_random(*b, 28);
  tensor* d32 = mul_mat(ctx, a32, b);
  tensor* dq = mul_mat(ctx, aq, b);
  CHECK(cpu::work_size(*d32, 4, true) == 0);  // f32 b with dense rows is used as is
  CHECK(cpu::work_size(*dq, 4, true) >= static_cast<size_t>(n * 4) * row_size(type::q8_0, k));
  // Every path of the optimized kernel: BLAS forced on (where built), forced off, and the default threshold.
  for (int64_t min_batch : {int64_t{1}, int64_t{-1}, int64_t{0}}) {
    INFO("blas_min_batch override " << min_batch);
    cpu::set_blas_min_batch(min_batch);
#ifdef TROUPE_HAVE_BLAS
    if (min_batch == 1) {
      CHECK(cpu::work_size(*d32, 4, false) == 0);  // sgemm reads a in place
      CHECK(cpu::work_size(*dq, 4, false) >= static_cast<size_t>(k * m * 2) * sizeof(float));
    }
#endif
    if (min_batch == -1) {  // SIMD dot products: a chunk counter when threaded, b converted for q4_0
      CHECK(cpu::work_size(*dq, 4, false) >= static_cast<size_t>(n * 4) * row_size(type::q8_0, k));
      CHECK(cpu::work_size(*d32, 1, false) == 0);
    }
    for (tensor* d : {d32, dq}) {
      const mm_expect want = mul_mat_ref(*d->src[0], *b);
      for (int nth : {1, 3}) {
        std::memset(d->data, 0, nbytes(*d));
        compute(*d, nth, /*reference=*/false);
        CHECK(within(*d, want));
      }
    }
  }
  cpu::set_blas_min_batch(0);
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

TEST_CASE("the BLAS crossover follows the kernels OpenBLAS picked and is off unless TROUPE_CPU_BLAS asks for it", "[cpu][blas]") {
  using cpu::blas_kernels;
  constexpr int64_t never = INT64_MAX;
  // Pre-AVX2 sgemm (Prescott, what OpenBLAS 0.3.21 runs on a CPU it does not recognise) loses to the SIMD
  // tiles for every quantized type and bf16; f32 and f16 keep a crossover.
  for (type t : {type::q4_0, type::q4_1, type::q5_0, type::q5_1, type::q8_0, type::q2_K, type::q3_K, type::q4_K, type::q5_K,
                 type::q6_K, type::bf16}) {
    INFO(type_name(t));
    CHECK(cpu::blas_min_batch_for(t, blas_kernels::older, true, false) == never);
  }
  CHECK(cpu::blas_min_batch_for(type::f32, blas_kernels::older, true, false) == 128);
  CHECK(cpu::blas_min_batch_for(type::f16, blas_kernels::older, true, false) == 128);
  // The measured tables for AVX2 and AVX-512 sgemm; scalar kernels keep them whatever OpenBLAS runs.
  CHECK(cpu::blas_min_batch_for(type::q8_0, blas_kernels::avx2, true, false) == 64);
  CHECK(cpu::blas_min_batch_for(type::q4_K, blas_kernels::avx2, true, false) == 256);
  CHECK(cpu::blas_min_batch_for(type::q4_K, blas_kernels::avx512, true, false) == 64);
  CHECK(cpu::blas_min_batch_for(type::q8_0, blas_kernels::older, false, false) == 64);
  CHECK(cpu::blas_min_batch_for(type::bf16, blas_kernels::avx2, true, true) == never);
  // The process's own: never unless TROUPE_CPU_BLAS asks for the crossovers, then what the running
  // OpenBLAS reports.
  for (type t : {type::f32, type::f16, type::q4_1, type::q8_0, type::q4_K}) {
    INFO(type_name(t));
    if (cpu::blas_crossovers_enabled()) {
      CHECK(cpu::blas_min_batch(t) ==
            cpu::blas_min_batch_for(t, cpu::blas_kernel_family(), cpu::simd::active_table().level != cpu::isa::scalar,
                                    cpu::simd::active_table().bf16_native));
    } else {
      CHECK(cpu::blas_min_batch(t) == never);
    }
  }
}

namespace {

// V as the cache keeps it in host memory: a row of hd values per cell (row c of head h at cell_of(c)), read
// transposed as mul_mat's a; b the softmax weights of n_q queries (column j), zero outside `live` cells.
struct column_case {
  tensor* v = nullptr;   // [hd, n_cells, heads]
  tensor* a = nullptr;   // permute(v): [n_cells, hd, heads], a row per cell
  tensor* b = nullptr;   // [n_cells, n_q, heads * 2]
  tensor* d = nullptr;
};

column_case column_product(context& ctx, type t, int64_t hd, int64_t n_cells, int64_t n_live, int64_t n_q,
                           const std::function<int64_t(int64_t)>& cell_of) {
  column_case c;
  const int64_t heads = 2;
  c.v = ctx.new_tensor_3d(t, hd, n_cells, heads);
  fill_random(*c.v, 91, -2.0, 2.0);  // cells nobody attends to hold values too
  c.b = ctx.new_tensor_3d(type::f32, n_cells, n_q, 2 * heads);
  fill(*c.b, std::vector<double>(static_cast<size_t>(n_cells * n_q * 2 * heads), 0.0));
  const std::vector<double> vv = random_values(static_cast<size_t>(hd * n_live * heads), 92, -2.0, 2.0);
  const std::vector<double> bv = random_values(static_cast<size_t>(n_live * n_q * 2 * heads), 93, 0.0, 1.0);
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t l = 0; l < n_live; ++l) {
      for (int64_t i = 0; i < hd; ++i) set(*c.v, vv[static_cast<size_t>((h * n_live + l) * hd + i)], i, cell_of(l), h);
    }
  }
  for (int64_t p = 0; p < 2 * heads; ++p) {
    for (int64_t j = 0; j < n_q; ++j) {
      for (int64_t l = 0; l < n_live; ++l) {
        // Query j attends to the first n_live - j live cells (causal-like), the rest weigh 0.
        const double w = l < n_live - j ? bv[static_cast<size_t>((p * n_q + j) * n_live + l)] : 0.0;
        set(*c.b, w, cell_of(l), j, p);
      }
    }
  }
  c.a = permute(ctx, c.v, 1, 0, 2, 3);
  c.d = mul_mat(ctx, c.a, c.b);
  return c;
}

}  // namespace

TEST_CASE("kernels: mul_mat of V read transposed sums its rows in cell order: the same bits wherever the cells lie", "[cpu][kernels][mul_mat]") {
  for (type t : {type::f32, type::f16}) {
    for (bool reference : {true, false}) {
      for (int nth : {1, 3}) {
        INFO(type_name(t) << (reference ? ", reference" : ", fast") << ", threads " << nth);
        context ctx(arena(32));
        const int64_t hd = 72, n_live = 45, n_q = 9;  // hd: 4 zmm + a tail; n_q: a tile of 6 and one of 3
        // Packed at the front of the cache, then spread out among other sequences' cells (a gap of 2, from
        // cell 7 on, in a longer cache).
        column_case packed = column_product(ctx, t, hd, 64, n_live, n_q, [](int64_t l) { return l; });
        column_case spread = column_product(ctx, t, hd, 112, n_live, n_q, [](int64_t l) { return 7 + 2 * l; });
        REQUIRE(cpu::supports_op(*packed.d));
        CHECK(cpu::work_size(*packed.d, nth, reference) == 0);
        compute(*packed.d, nth, reference);
        compute(*spread.d, nth, reference);
        // Against double sums over the live cells.
        std::vector<double> want, bound;
        for (int64_t p = 0; p < 4; ++p) {
          for (int64_t j = 0; j < n_q; ++j) {
            for (int64_t i = 0; i < hd; ++i) {
              double s = 0, mag = 0;
              for (int64_t l = 0; l < 64; ++l) {
                const double x = get(*packed.v, i, l, p / 2) * get(*packed.b, l, j, p);
                s += x;
                mag += std::fabs(x);
              }
              want.push_back(s);
              bound.push_back(1e-5 * mag + 1e-6);
            }
          }
        }
        CHECK(within(*packed.d, mm_expect{want, bound}));
        CHECK(bytes_of(*packed.d) == bytes_of(*spread.d));
      }
    }
  }
}

TEST_CASE("kernels: soft_max gives a row's live entries the same bits wherever they lie among masked ones", "[cpu][kernels]") {
  context ctx(arena());
  const int64_t n_live = 37;
  const std::vector<double> x = random_values(static_cast<size_t>(n_live), 94, -4.0, 4.0);
  auto row_of = [&](int64_t n, const std::function<int64_t(int64_t)>& pos) {
    tensor* a = ctx.new_tensor_2d(type::f32, n, 1);
    tensor* mask = ctx.new_tensor_2d(type::f32, n, 1);
    fill_random(*a, 95);
    fill(*mask, std::vector<double>(static_cast<size_t>(n), -INFINITY));
    for (int64_t l = 0; l < n_live; ++l) {
      set(*a, x[static_cast<size_t>(l)], pos(l), 0);
      set(*mask, 0.0, pos(l), 0);
    }
    tensor* d = soft_max(ctx, a, mask, 0.5f);
    compute(*d, 1, /*reference=*/false);
    std::vector<double> live;
    for (int64_t l = 0; l < n_live; ++l) live.push_back(get(*d, pos(l), 0));
    return live;
  };
  const std::vector<double> packed = row_of(48, [](int64_t l) { return l; });
  const std::vector<double> spread = row_of(128, [](int64_t l) { return 3 + 3 * l; });
  CHECK(packed == spread);
  double sum = 0;
  for (double v : packed) sum += v;
  CHECK(sum == Approx(1.0).epsilon(1e-6));
}

TEST_CASE("kernels: mul_mat_masked computes every element the mask keeps, bit for bit, and zeros for blocks it hides whole", "[cpu][kernels][mul_mat]") {
  context ctx(arena(32));
  const int64_t hd = 64, n_kv = 96, n_q = 40;
  tensor* k = ctx.new_tensor_3d(type::f16, hd, n_kv, 2);
  fill_random(*k, 101);
  tensor* q = ctx.new_tensor_3d(type::f32, hd, n_q, 4);
  fill_random(*q, 102);
  // Causal: query j sees cells 0 .. 40 + j; f16 like a KV mask could be, padded by 8 rows.
  tensor* mask = ctx.new_tensor_2d(type::f16, n_kv, n_q + 8);
  for_each(*mask, [&](int64_t i0, int64_t i1, int64_t, int64_t) { set(*mask, i0 <= 40 + i1 ? 0.0 : -INFINITY, i0, i1); });
  tensor* full = mul_mat(ctx, k, q);
  tensor* masked = mul_mat_masked(ctx, k, q, mask);
  CHECK(masked->src[2] == mask);
  for (int nth : {1, 3}) {
    INFO("threads " << nth);
    compute(*full, nth, /*reference=*/false);
    fill(*masked, std::vector<double>(static_cast<size_t>(n_kv * n_q * 4), std::nan("")));
    compute(*masked, nth, /*reference=*/false);
    int64_t kept = 0, zeros = 0;
    for_each(*masked, [&](int64_t i, int64_t j, int64_t h, int64_t) {
      const double got = get(*masked, i, j, h);
      if (i <= 40 + j) {
        kept += got == get(*full, i, j, h) ? 1 : 0;
      } else {
        CHECK(std::isfinite(got));
        zeros += got == 0.0 ? 1 : 0;
      }
    });
    CHECK(kept == [&] { int64_t n = 0; for (int64_t j = 0; j < n_q; ++j) n += std::min<int64_t>(n_kv, 41 + j); return n * 4; }());
    CHECK(zeros >= 16 * 16 * 4);  // at least the blocks of cells 80.. against the first queries
  }
  // The mask must cover the product.
  tensor* small = ctx.new_tensor_2d(type::f32, n_kv - 1, n_q);
  CHECK_THROWS_WITH(mul_mat_masked(ctx, k, q, small), Catch::Contains("cover"));
}

namespace {

// Attention of n_q query rows (4 heads over 2 KV heads) against the n_kv cells of k and v, as the unfused
// graph (mul_mat_masked, soft_max, the column-major mul_mat, cont) and as one flash_attn node.
struct attn_case {
  tensor* fused = nullptr;
  tensor* unfused = nullptr;
  std::vector<tensor*> chain;  // the unfused nodes in order
  tensor *q = nullptr, *k = nullptr, *v = nullptr, *mask = nullptr;
};

attn_case attention_of(context& ctx, type kv_type, int64_t hd_k, int64_t hd_v, int64_t n_kv, int64_t n_q,
                       const std::function<bool(int64_t cell, int64_t query)>& visible) {
  attn_case c;
  c.k = ctx.new_tensor_3d(kv_type, hd_k, n_kv, 2);
  c.v = ctx.new_tensor_3d(kv_type, hd_v, n_kv, 2);
  c.q = ctx.new_tensor_3d(type::f32, hd_k, 4, n_q);  // [hd, heads, tokens], as the graph has it
  c.mask = ctx.new_tensor_2d(type::f32, n_kv, n_q + 3);
  fill_random(*c.k, 111);
  fill_random(*c.v, 112);
  fill_random(*c.q, 113, -2.0, 2.0);
  for_each(*c.mask, [&](int64_t i0, int64_t i1, int64_t, int64_t) {
    set(*c.mask, i1 < n_q && visible(i0, i1) ? 0.0 : -INFINITY, i0, i1);
  });
  const float scale = 0.125f;
  tensor* qp = permute(ctx, c.q, 0, 2, 1, 3);
  c.fused = flash_attn(ctx, qp, c.k, c.v, c.mask, scale);
  tensor* kq = mul_mat_masked(ctx, c.k, qp, c.mask);
  tensor* sm = soft_max(ctx, kq, c.mask, scale);
  tensor* kqv = mul_mat(ctx, permute(ctx, c.v, 1, 0, 2, 3), sm);
  c.unfused = cont(ctx, permute(ctx, kqv, 0, 2, 1, 3));
  c.chain = {kq, sm, kqv, c.unfused};
  return c;
}

}  // namespace

TEST_CASE("kernels: flash_attn gives the unfused attention's bits and a sequence's output wherever its cells lie", "[cpu][kernels][attention]") {
  for (type t : {type::f32, type::f16}) {
    for (bool reference : {false, true}) {
      for (int nth : {1, 3}) {
        INFO(type_name(t) << (reference ? ", reference" : ", fast") << ", threads " << nth);
        context ctx(arena(64));
        // Two sequences sharing the cache: cell c is sequence (c / 7) % 2's, query j sequence j % 2's, and
        // sees its sequence's cells up to 60 + j; the last query sees nothing (a fully masked row).
        // hd_v 72: vectors of 16 and one of 8; 13 queries: tiles of 6, 6 and 1; 100 cells: blocks of 16 + 4.
        const int64_t n_kv = 100, n_q = 13;
        auto shared = [](int64_t c, int64_t j) { return j < 12 && (c / 7) % 2 == j % 2 && c <= 60 + j; };
        attn_case a = attention_of(ctx, t, 64, 72, n_kv, n_q, shared);
        REQUIRE(cpu::supports_op(*a.fused));
        CHECK(cpu::work_size(*a.fused, nth, reference) >= static_cast<size_t>(nth * 6 * n_kv) * sizeof(float));
        fill(*a.fused, std::vector<double>(static_cast<size_t>(nelements(*a.fused)), std::nan("")));
        compute(*a.fused, nth, reference);
        for (tensor* n : a.chain) compute(*n, nth, reference);
        CHECK(bytes_of(*a.fused) == bytes_of(*a.unfused));

        // Against softmax and weighted sums in double.
        std::vector<double> want, bound;
        for (int64_t j = 0; j < n_q; ++j) {
          for (int64_t h = 0; h < 4; ++h) {
            std::vector<double> w(static_cast<size_t>(n_kv), 0.0);
            double mx = -INFINITY, sum = 0;
            for (int64_t c = 0; c < n_kv; ++c) {
              if (!shared(c, j)) continue;
              double s = 0;
              for (int64_t d = 0; d < 64; ++d) s += get(*a.k, d, c, h / 2) * get(*a.q, d, h, j);
              w[static_cast<size_t>(c)] = s * 0.125;
              mx = std::max(mx, s * 0.125);
            }
            for (int64_t c = 0; c < n_kv; ++c) {
              if (!shared(c, j)) continue;
              w[static_cast<size_t>(c)] = std::exp(w[static_cast<size_t>(c)] - mx);
              sum += w[static_cast<size_t>(c)];
            }
            for (int64_t d = 0; d < 72; ++d) {
              double o = 0;
              for (int64_t c = 0; c < n_kv; ++c) {
                if (shared(c, j)) o += w[static_cast<size_t>(c)] / sum * get(*a.v, d, c, h / 2);
              }
              want.push_back(o);
              bound.push_back(1e-4);
            }
          }
        }
        CHECK(within(*a.fused, mm_expect{want, bound}));
      }
    }
  }
  // The same sequence (query rows 0, 2, 4, ... of the case above) packed at the front of a cache of its own:
  // its outputs have the same bits.
  for (type t : {type::f32, type::f16}) {
    INFO(type_name(t));
    context ctx(arena(64));
    const int64_t n_kv = 100, n_q = 13;
    attn_case spread = attention_of(ctx, t, 64, 72, n_kv, n_q, [](int64_t c, int64_t j) { return (c / 7) % 2 == 0 && c <= 60 + j; });
    // Sequence 0's cells: 0..6, 14..20, 28..34, ...; packed: cell p holds the p-th of them.
    std::vector<int64_t> cells;
    for (int64_t c = 0; c < n_kv; ++c) {
      if ((c / 7) % 2 == 0) cells.push_back(c);
    }
    const int64_t n_packed = static_cast<int64_t>(cells.size());
    attn_case packed = attention_of(ctx, t, 64, 72, n_packed, n_q, [&](int64_t p, int64_t j) {
      return cells[static_cast<size_t>(p)] <= 60 + j;
    });
    for (int64_t p = 0; p < n_packed; ++p) {
      const int64_t c = cells[static_cast<size_t>(p)];
      for (int64_t g = 0; g < 2; ++g) {
        for (int64_t d = 0; d < 64; ++d) set(*packed.k, get(*spread.k, d, c, g), d, p, g);
        for (int64_t d = 0; d < 72; ++d) set(*packed.v, get(*spread.v, d, c, g), d, p, g);
      }
    }
    std::memcpy(packed.q->data, spread.q->data, nbytes(*spread.q));
    compute(*spread.fused, 2, false);
    compute(*packed.fused, 2, false);
    CHECK(bytes_of(*spread.fused) == bytes_of(*packed.fused));
  }
}

TEST_CASE("flash_attn refuses sources it cannot take, naming the op", "[cpu][kernels][attention]") {
  context ctx(arena());
  tensor* q = ctx.new_tensor_3d(type::f32, 64, 5, 4);
  tensor* k = ctx.new_tensor_3d(type::f16, 64, 32, 2);
  tensor* v = ctx.new_tensor_3d(type::f16, 64, 32, 2);
  tensor* mask = ctx.new_tensor_2d(type::f32, 32, 5);
  CHECK_NOTHROW(flash_attn(ctx, q, k, v, mask, 0.125f));
  CHECK_THROWS_WITH(flash_attn(ctx, q, ctx.new_tensor_3d(type::f16, 32, 32, 2), v, mask, 0.125f), Catch::Contains("flash_attn") && Catch::Contains("head size"));
  CHECK_THROWS_WITH(flash_attn(ctx, q, k, ctx.new_tensor_3d(type::f16, 64, 31, 2), mask, 0.125f), Catch::Contains("same cells"));
  CHECK_THROWS_WITH(flash_attn(ctx, q, ctx.new_tensor_3d(type::f16, 64, 32, 3), ctx.new_tensor_3d(type::f16, 64, 32, 3), mask, 0.125f), Catch::Contains("multiple"));
  CHECK_THROWS_WITH(flash_attn(ctx, q, ctx.new_tensor_3d(type::q8_0, 64, 32, 2), v, mask, 0.125f), Catch::Contains("f32 or f16"));
  CHECK_THROWS_WITH(flash_attn(ctx, q, k, v, ctx.new_tensor_2d(type::f32, 32, 4), 0.125f), Catch::Contains("mask"));
  CHECK_THROWS_WITH(flash_attn(ctx, q, k, v, mask, 0.0f), Catch::Contains("scale"));
}
