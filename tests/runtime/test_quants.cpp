// Quantized formats: round-trip accuracy, dot kernels and quantizer invariants. (Golden bit layouts:
// test_quants_golden.cpp; ggml reference vectors: test_quants_ggml.cpp; the type table: test_type_table.cpp.)
//
// Round-trip bound: normalized MSE = sum (x - dequant(quant(x)))^2 / sum x^2 over 4096 values, per input
// distribution. "typical" applies to gaussian, uniform, offset (3 + 0.5 N), large (1000 N), small
// (0.01 N) and mixed (zero / constant / gaussian blocks) inputs; "heavy" to gaussian data with 1% of the
// values scaled by 20, where a block's scale follows its outlier. Measured maxima (seeded, this code):
//
//   type   typical bound (measured)   heavy bound (measured)
//   f16    1e-7    (4.4e-8)           1e-7    (3.5e-8)
//   bf16   5e-6    (2.9e-6)           5e-6    (2.7e-6)
//   q8_0   5e-5    (2.9e-5)           2e-4    (1.1e-4)
//   q8_1   5e-5    (2.9e-5)           2e-4    (1.1e-4)
//   q8_K   8e-5    (4.4e-5)           1e-3    (7.6e-4)
//   q6_K   5e-4    (3.1e-4)           1.5e-3  (1.0e-3)
//   q5_0   2.5e-3  (1.8e-3)           1e-2    (7.5e-3)
//   q5_1   2e-3    (1.5e-3)           4e-3    (2.8e-3)
//   q5_K   1.6e-3  (1.3e-3)           4e-3    (2.8e-3)
//   q4_0   9e-3    (7.5e-3)           3e-2    (2.1e-2)
//   q4_1   8e-3    (6.2e-3)           1.6e-2  (1.2e-2)
//   q4_K   6.5e-3  (5.1e-3)           1.3e-2  (9.9e-3)
//   iq4_nl 7.5e-3  (5.8e-3)           1.8e-2  (1.4e-2)
//   iq4_xs 7.5e-3  (5.9e-3)           1.9e-2  (1.4e-2)
//   mxfp4  4.5e-2  (3.6e-2: mixed)    3.5e-2  (2.7e-2)   power-of-two scales
//   tq1_0  0.7     (0.60)             0.35    (0.29)     ternary: for ternary-trained weights, not these
//   tq2_0  0.7     (0.60)             0.35    (0.29)     (same values as tq1_0, packed differently)
//   q3_K   3e-2    (2.3e-2)           3e-2    (2.4e-2)
//   q2_K   0.1     (8.3e-2)           0.1     (6.5e-2)
//
// Dot kernels: vec_dot(quant(x), quant_vt(y)) must equal the double dot of the two dequantized rows to
// 1e-6 of sum |x_i y_i| (the kernels are exact up to the final float), and the double dot of the original
// floats to 4 sqrt((b_x + b_y) / n) |x| |y| with b the typical bounds above.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "runtime/error.h"
#include "runtime/quants.h"
#include "runtime/quants_iq.h"
#include "runtime/quants_iq_low.h"
#include "runtime/quants_mx.h"
#include "runtime/quants_tq.h"
#include "runtime/types.h"
#include "tests/runtime/quant_fixture.h"
#include "tests/support/random_blocks.h"

using namespace troupe;
using namespace troupe::test::quant_fixture;

namespace {

struct accuracy_bound {
  type t;
  double typical;
  double heavy;
};

const accuracy_bound bounds[] = {
    {type::f16, 1e-7, 1e-7},      {type::bf16, 5e-6, 5e-6},     {type::q8_0, 5e-5, 2e-4},
    {type::q8_1, 5e-5, 2e-4},     {type::q8_K, 8e-5, 1e-3},     {type::q6_K, 5e-4, 1.5e-3},
    {type::q5_0, 2.5e-3, 1e-2},   {type::q5_1, 2e-3, 4e-3},     {type::q5_K, 1.6e-3, 4e-3},
    {type::q4_0, 9e-3, 3e-2},     {type::q4_1, 8e-3, 1.6e-2},   {type::q4_K, 6.5e-3, 1.3e-2},
    {type::q3_K, 3e-2, 3e-2},     {type::q2_K, 0.1, 0.1},       {type::iq4_nl, 7.5e-3, 1.8e-2},
    {type::iq4_xs, 7.5e-3, 1.9e-2}, {type::mxfp4, 4.5e-2, 3.5e-2}, {type::tq1_0, 0.7, 0.35},
    {type::tq2_0, 0.7, 0.35},
};

double typical_bound(type t) {
  if (t == type::f32) return 0.0;
  for (const auto& b : bounds) {
    if (b.t == t) return b.typical;
  }
  FAIL("no bound for " << type_name(t));
  return 0.0;
}

double nmse(const std::vector<float>& x, const std::vector<float>& y) {
  double err = 0, sum = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double e = static_cast<double>(x[i]) - y[i];
    err += e * e;
    sum += static_cast<double>(x[i]) * x[i];
  }
  return sum > 0 ? err / sum : err;
}

const type quantized_types[] = {type::q4_0, type::q4_1, type::q5_0, type::q5_1, type::q8_0, type::q8_1, type::q2_K,
                                type::q3_K, type::q4_K, type::q5_K, type::q6_K, type::q8_K, type::iq4_nl, type::iq4_xs,
                                type::mxfp4, type::tq1_0, type::tq2_0};

}  // namespace

// ============================== round trips ==============================

TEST_CASE("quantize -> dequantize round trip stays within the per-type bound", "[quants]") {
  const int n = 4096;
  for (const auto& b : bounds) {
    for (const auto& d : distributions()) {
      const std::vector<float> x = make_data(d, n, 1234);
      const std::vector<float> y = dequantize(b.t, quantize(b.t, x), n);
      const double e = nmse(x, y);
      INFO("type " << type_name(b.t) << ", " << d.name << ": nmse " << e);
      CHECK(e <= (d.heavy ? b.heavy : b.typical));
      CHECK(e > 0.0);  // the data are not all representable: a zero error would mean no quantization
    }
  }
}

TEST_CASE("all-zero blocks decode to exact zeros and constant blocks stay close", "[quants]") {
  for (const auto& b : bounds) {
    const type t = b.t;
    const int n = 512;
    INFO("type " << type_name(t));
    const std::vector<float> zero(static_cast<size_t>(n), 0.0f);
    for (float v : dequantize(t, quantize(t, zero), n)) REQUIRE(v == 0.0f);

    // A constant block's error is one value's rounding error, not an average: allow a worst-case fp16
    // (bf16) rounding of the value on top of the type's bound.
    const double one_rounding = t == type::bf16 ? 1.6e-5 : 2.5e-7;
    for (float c : {0.37f, -2.5f, 1000.0f}) {
      const std::vector<float> x(static_cast<size_t>(n), c);
      const std::vector<float> y = dequantize(t, quantize(t, x), n);
      INFO("constant " << c);
      CHECK(nmse(x, y) <= std::max(b.typical, one_rounding));
      for (float v : y) REQUIRE(std::isfinite(v));
    }
    // Tiny values: the fp16 block scales become subnormal (d ~ 1e-3 / 4096 for q6_K) and lose relative
    // precision, as in ggml; the values still come back within a few percent.
    const std::vector<float> x(static_cast<size_t>(n), 1e-3f);
    const std::vector<float> y = dequantize(t, quantize(t, x), n);
    CHECK(nmse(x, y) <= std::max(b.typical, 1e-3));
  }
}

TEST_CASE("quantizers handle a lone value per block and sign extremes", "[quants]") {
  // One non-zero value per 32 with alternating signs: the symmetric types map it to an end of their range.
  for (const auto& b : bounds) {
    const type t = b.t;
    const int n = 256;
    std::vector<float> x(static_cast<size_t>(n), 0.0f);
    for (int i = 0; i < n; i += 32) x[static_cast<size_t>(i + 5)] = (i / 32) % 2 ? -1.5f : 2.25f;
    const std::vector<float> y = dequantize(t, quantize(t, x), n);
    INFO("type " << type_name(t));
    CHECK(nmse(x, y) <= b.typical);
  }
}

// ============================== dot products ==============================

TEST_CASE("vec_dot equals the double dot of the dequantized rows", "[quants][vec_dot]") {
  const type all[] = {type::f32,  type::f16,  type::bf16, type::q4_0, type::q4_1, type::q5_0, type::q5_1, type::q8_0,
                      type::q8_1, type::q2_K, type::q3_K, type::q4_K, type::q5_K, type::q6_K, type::q8_K,
                      type::iq4_nl, type::iq4_xs, type::mxfp4, type::tq1_0, type::tq2_0};
  for (type t : all) {
    const type_traits& tr = traits(t);
    const type vt = tr.vec_dot_type;
    REQUIRE(tr.vec_dot != nullptr);
    for (int n : {256, 1024, 4096}) {
      for (const auto& d : distributions()) {
        if (d.heavy) continue;
        const std::vector<float> x = make_data(d, n, 99);
        const std::vector<float> y = make_data(distributions()[0], n, 7);
        const auto qx = quantize(t, x);
        const auto qy = quantize(vt, y);
        const std::vector<float> dx = dequantize(t, qx, n);
        const std::vector<float> dy = dequantize(vt, qy, n);

        double ref = 0, abs_sum = 0, exact = 0, nx = 0, ny = 0;
        for (size_t i = 0; i < static_cast<size_t>(n); ++i) {
          ref += static_cast<double>(dx[i]) * dy[i];
          abs_sum += std::fabs(static_cast<double>(dx[i]) * dy[i]);
          exact += static_cast<double>(x[i]) * y[i];
          nx += static_cast<double>(x[i]) * x[i];
          ny += static_cast<double>(y[i]) * y[i];
        }
        float s = -12345.0f;
        tr.vec_dot(n, &s, qx.data(), qy.data());

        INFO("type " << type_name(t) << " . " << type_name(vt) << ", n " << n << ", x " << d.name << ": got " << s
                     << ", dequantized dot " << ref << ", exact dot " << exact);
        CHECK(std::fabs(s - ref) <= 1e-6 * abs_sum + 1e-30);
        const double loose = 4 * std::sqrt((typical_bound(t) + typical_bound(vt)) / n) * std::sqrt(nx * ny);
        CHECK(std::fabs(s - exact) <= loose + 1e-6 * abs_sum);
      }
    }
  }
}

TEST_CASE("vec_dot of single hand-made blocks", "[quants][vec_dot]") {
  // q4_0 (d = 0.5, all quants 9 -> values 0.5) . q8_0 (d = 2, qs[v] = v - 16 -> values 2 (v - 16)).
  block_q4_0 x = zeroed<block_q4_0>();
  x.d = fp32_to_fp16(0.5f);
  std::memset(x.qs, 0x99, sizeof x.qs);
  block_q8_0 y = zeroed<block_q8_0>();
  y.d = fp32_to_fp16(2.0f);
  for (int v = 0; v < 32; ++v) y.qs[v] = static_cast<int8_t>(v - 16);
  float s = 0;
  vec_dot_q4_0_q8_0(32, &s, &x, &y);
  CHECK(s == Approx(0.5 * 2 * (-16)).epsilon(0));  // sum (v - 16) = -16

  // q4_1 with m = 1: x = 0.5 * 9 + 1 = 5.5 for every value; y as above via q8_1 (s deliberately wrong: the
  // kernel sums y.qs itself).
  block_q4_1 x1 = zeroed<block_q4_1>();
  x1.d = fp32_to_fp16(0.5f);
  x1.m = fp32_to_fp16(1.0f);
  std::memset(x1.qs, 0x99, sizeof x1.qs);
  block_q8_1 y1 = zeroed<block_q8_1>();
  y1.d = fp32_to_fp16(2.0f);
  y1.s = fp32_to_fp16(1000.0f);
  for (int v = 0; v < 32; ++v) y1.qs[v] = static_cast<int8_t>(v - 16);
  vec_dot_q4_1_q8_1(32, &s, &x1, &y1);
  CHECK(s == Approx(5.5 * 2 * (-16)).epsilon(0));
}

// ============================== quantizer invariants ==============================

TEST_CASE("q4_0 / q5_0 scales come from the signed max-abs value, q8_1 stores s = d * sum", "[quants]") {
  // The largest-magnitude value is negative here: d = max / -8 > 0 and it decodes to (0 - 8) d = max.
  std::vector<float> x(32);
  for (int i = 0; i < 32; ++i) x[static_cast<size_t>(i)] = 0.1f * static_cast<float>(i % 7) - 0.3f;
  x[9] = -3.0f;
  auto q = quantize(type::q4_0, x);
  const auto* b = reinterpret_cast<const block_q4_0*>(q.data());
  CHECK(fp16_to_fp32(b->d) == Approx(3.0 / 8));
  CHECK((b->qs[9] & 0xF) == 0);
  CHECK(dequantize(type::q4_0, q, 32)[9] == -3.0f);

  q = quantize(type::q5_0, x);
  CHECK(fp16_to_fp32(reinterpret_cast<const block_q5_0*>(q.data())->d) == Approx(3.0 / 16));
  CHECK(dequantize(type::q5_0, q, 32)[9] == -3.0f);

  q = quantize(type::q8_1, x);
  const auto* c = reinterpret_cast<const block_q8_1*>(q.data());
  int sum = 0;
  for (int v = 0; v < 32; ++v) sum += c->qs[v];
  CHECK(fp16_to_fp32(c->s) == Approx(sum * 3.0 / 127).epsilon(1e-3));
  CHECK(c->qs[9] == -127);
}

TEST_CASE("quantizers are deterministic and dequantizers read only their own blocks", "[quants]") {
  const std::vector<float> x = make_data(distributions()[0], 1024, 3);
  for (type t : quantized_types) {
    INFO("type " << type_name(t));
    CHECK(quantize(t, x) == quantize(t, x));
    // Row of 4 blocks (q*_0 / q*_1) or 1 super-block (K): decoding the first half alone gives the same values.
    const int64_t n = 4 * block_size(t);
    const std::vector<float> xs(x.begin(), x.begin() + n);
    const auto q = quantize(t, xs);
    const std::vector<float> full = dequantize(t, q, n);
    std::vector<float> part(static_cast<size_t>(n / 2));
    traits(t).to_float(q.data(), part.data(), n / 2);
    for (size_t i = 0; i < part.size(); ++i) REQUIRE(part[i] == full[i]);
  }
}

TEST_CASE("the i-quants below 4 bits: dot products with q8_K match the dequantized values' dot, and a row of any length", "[quants]") {
  std::mt19937 rng(7);
  for (type t : {type::iq2_xxs, type::iq2_xs, type::iq2_s, type::iq3_xxs, type::iq3_s, type::iq1_s, type::iq1_m}) {
    INFO("type " << type_name(t));
    const int64_t n = 4 * qk_k;
    const std::vector<uint8_t> x = test::random_blocks(t, n / qk_k, rng);
    const std::vector<float> xf = dequantize(t, x, n);
    std::vector<float> yf(static_cast<size_t>(n));
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (float& v : yf) v = u(rng);
    const std::vector<uint8_t> y = quantize(type::q8_K, yf);
    const std::vector<float> yq = dequantize(type::q8_K, y, n);
    double want = 0, mag = 0;
    for (size_t i = 0; i < xf.size(); ++i) {
      want += static_cast<double>(xf[i]) * yq[i];
      mag += std::fabs(static_cast<double>(xf[i]) * yq[i]);
    }
    float got = 0;
    traits(t).vec_dot(n, &got, x.data(), y.data());
    CHECK(std::abs(got - want) <= 1e-5 * mag + 1e-6);
    CHECK(traits(t).vec_dot_type == type::q8_K);
    CHECK(traits(t).from_float_ref == nullptr);  // read, never written
  }
}
