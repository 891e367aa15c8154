// Quantized formats: round-trip accuracy, dot kernels, bit layouts (golden blocks), ggml reference vectors,
// and the type table.
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
#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "runtime/error.h"
#include "runtime/quants.h"
#include "runtime/quants_iq.h"
#include "runtime/quants_iq_low.h"
#include "runtime/quants_mx.h"
#include "runtime/quants_tq.h"
#include "runtime/types.h"
#include "tests/support/random_blocks.h"

using namespace troupe;

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

// mt19937 is specified exactly by the standard; the gaussian is our own Box-Muller, so the data are the
// same with every standard library.
struct rng {
  std::mt19937 gen;
  explicit rng(uint32_t seed) : gen(seed) {}
  double uniform() { return (static_cast<double>(gen()) + 0.5) / 4294967296.0; }  // (0, 1)
  double gauss() { return std::sqrt(-2.0 * std::log(uniform())) * std::cos(6.283185307179586 * uniform()); }
};

struct distribution {
  const char* name;
  bool heavy;
  std::function<float(rng&, int)> gen;
};

const std::vector<distribution>& distributions() {
  static const std::vector<distribution> d = {
      {"gaussian", false, [](rng& r, int) { return static_cast<float>(r.gauss()); }},
      {"uniform", false, [](rng& r, int) { return static_cast<float>(2 * r.uniform() - 1); }},
      {"offset", false, [](rng& r, int) { return static_cast<float>(3 + 0.5 * r.gauss()); }},
      {"large", false, [](rng& r, int) { return static_cast<float>(1000 * r.gauss()); }},
      {"small", false, [](rng& r, int) { return static_cast<float>(0.01 * r.gauss()); }},
      {"mixed", false,
       [](rng& r, int i) {
         switch ((i / 256) % 4) {  // whole blocks of every type: zero, constant, negative constant, gaussian
           case 0: return 0.0f;
           case 1: return 0.37f;
           case 2: return -2.5f;
           default: return static_cast<float>(r.gauss());
         }
       }},
      {"heavy", true,
       [](rng& r, int) {
         double v = r.gauss();
         if (r.uniform() < 0.01) v *= 20;
         return static_cast<float>(v);
       }},
  };
  return d;
}

std::vector<float> make_data(const distribution& d, int n, uint32_t seed) {
  rng r(seed);
  std::vector<float> x(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) x[static_cast<size_t>(i)] = d.gen(r, i);
  return x;
}

std::vector<uint8_t> quantize(type t, const std::vector<float>& x) {
  std::vector<uint8_t> q(row_size(t, static_cast<int64_t>(x.size())));
  traits(t).from_float_ref(x.data(), q.data(), static_cast<int64_t>(x.size()));
  return q;
}

std::vector<float> dequantize(type t, const std::vector<uint8_t>& q, int64_t n) {
  std::vector<float> y(static_cast<size_t>(n));
  traits(t).to_float(q.data(), y.data(), n);
  return y;
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

std::vector<uint8_t> from_hex(const std::string& hex) {
  std::vector<uint8_t> out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) out.push_back(static_cast<uint8_t>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

template <class block>
block zeroed() {
  block b;
  std::memset(&b, 0, sizeof b);
  return b;
}

std::vector<float> decode(type t, const void* block) {
  std::vector<float> y(static_cast<size_t>(block_size(t)));
  traits(t).to_float(block, y.data(), block_size(t));
  return y;
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

// ============================== golden layouts ==============================

TEST_CASE("f16 and bf16 decode known bit patterns", "[quants][golden]") {
  const fp16_t h[4] = {0x3C00, 0xC000, 0x3555, 0x0001};  // 1, -2, 0.33325195, smallest subnormal
  float out[4];
  dequantize_row_f16(h, out, 4);
  CHECK(out[0] == 1.0f);
  CHECK(out[1] == -2.0f);
  CHECK(out[2] == 0.333251953125f);
  CHECK(out[3] == std::ldexp(1.0f, -24));
  const bf16_t b[2] = {0x3F80, 0x4049};  // 1, 3.140625
  dequantize_row_bf16(b, out, 2);
  CHECK(out[0] == 1.0f);
  CHECK(out[1] == 3.140625f);
}

TEST_CASE("q4_0 golden block: low nibbles are values 0..15, high nibbles 16..31", "[quants][golden]") {
  block_q4_0 b = zeroed<block_q4_0>();
  b.d = 0x3C00;  // 1.0
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  std::vector<float> y = decode(type::q4_0, &b);
  for (int j = 0; j < 16; ++j) {
    CHECK(y[static_cast<size_t>(j)] == static_cast<float>(j - 8));
    CHECK(y[static_cast<size_t>(j + 16)] == static_cast<float>(7 - j));
  }
  b.d = 0xB800;  // -0.5
  y = decode(type::q4_0, &b);
  CHECK(y[0] == 4.0f);    // (0 - 8) * -0.5
  CHECK(y[31] == 4.0f);   // high nibble of qs[15] = 0
  CHECK(y[16] == -3.5f);  // high nibble of qs[0] = 15
}

TEST_CASE("q4_1, q5_0, q5_1 and q8_0 golden blocks", "[quants][golden]") {
  block_q4_1 a = zeroed<block_q4_1>();
  a.d = 0x4000;  // 2
  a.m = 0xBC00;  // -1
  a.qs[3] = 0xA5;  // value 3: 5, value 19: 10
  std::vector<float> y = decode(type::q4_1, &a);
  CHECK(y[3] == 9.0f);
  CHECK(y[19] == 19.0f);
  CHECK(y[0] == -1.0f);

  // q5_0: qh is a little-endian uint32, bit v = bit 4 of value v.
  block_q5_0 b = zeroed<block_q5_0>();
  b.d = 0x3C00;
  b.qh[0] = 0x01;  // value 0
  b.qh[1] = 0x80;  // value 15
  b.qh[3] = 0x81;  // values 24 and 31
  b.qs[0] = 0x3F;  // value 0: low 15, value 16: low 3
  b.qs[8] = 0x70;  // value 8: 0, value 24: 7
  y = decode(type::q5_0, &b);
  CHECK(y[0] == 15.0f);    // 31 - 16
  CHECK(y[16] == -13.0f);  // 3 - 16 (bit 16 clear)
  CHECK(y[15] == 0.0f);    // 16 - 16
  CHECK(y[8] == -16.0f);
  CHECK(y[24] == 7.0f);    // 7 + 16 - 16
  CHECK(y[31] == 0.0f);    // 0 + 16 - 16
  CHECK(y[30] == -16.0f);

  block_q5_1 c = zeroed<block_q5_1>();
  c.d = 0x3800;  // 0.5
  c.m = 0x4200;  // 3
  c.qh[2] = 0x04;  // value 18
  c.qs[2] = 0x21;  // value 2: 1, value 18: 2 + 16
  y = decode(type::q5_1, &c);
  CHECK(y[2] == 3.5f);
  CHECK(y[18] == 12.0f);  // 0.5 * 18 + 3
  CHECK(y[1] == 3.0f);

  block_q8_0 e = zeroed<block_q8_0>();
  e.d = 0x3400;  // 0.25
  e.qs[0] = -128;
  e.qs[31] = 127;
  y = decode(type::q8_0, &e);
  CHECK(y[0] == -32.0f);
  CHECK(y[31] == 31.75f);
}

TEST_CASE("q2_K golden block", "[quants][golden]") {
  block_q2_K b = zeroed<block_q2_K>();
  b.d = 0x3C00;     // 1
  b.dmin = 0x3800;  // 0.5
  for (int j = 0; j < 16; ++j) b.scales[j] = static_cast<uint8_t>(j | ((15 - j) << 4));  // sc = j, m = 15 - j
  b.qs[33] = 0xE4;  // half 1, l = 1: values 129, 161, 193, 225 get quants 0, 1, 2, 3
  const std::vector<float> y = decode(type::q2_K, &b);
  CHECK(y[0] == -7.5f);    // sub 0: 0 * 0 - 0.5 * 15
  CHECK(y[129] == -3.5f);  // sub 8: 8 * 0 - 0.5 * 7
  CHECK(y[161] == 7.5f);   // sub 10: 10 * 1 - 0.5 * 5
  CHECK(y[193] == 22.5f);  // sub 12: 12 * 2 - 0.5 * 3
  CHECK(y[225] == 41.5f);  // sub 14: 14 * 3 - 0.5 * 1
  CHECK(y[255] == 0.0f);   // sub 15: 15 * 0 - 0.5 * 0
}

TEST_CASE("q3_K golden block: hmask, 2-bit quants and the 12-byte scale packing", "[quants][golden]") {
  block_q3_K b = zeroed<block_q3_K>();
  b.d = 0x3C00;
  std::memset(b.hmask, 0xFF, sizeof b.hmask);  // high bit set everywhere: q = low 2 bits
  // Scales (6-bit, minus 32): low nibbles in bytes 0..7 (two per byte), top 2 bits in bytes 8..11.
  b.scales[0] = 0x21;  // scale 0 low 1, scale 8 low 2
  b.scales[8] = 0xE4;  // top bits of scales 0, 4, 8, 12: 0, 1, 2, 3
  // -> scale 0 = 1 - 32 = -31, scale 4 = 16 - 32 = -16, scale 8 = 34 - 32 = 2, scale 12 = 48 - 32 = 16,
  //    all others 0 - 32 = -32.
  CHECK(q3_K_scale(b.scales, 0) == 1);
  CHECK(q3_K_scale(b.scales, 4) == 16);
  CHECK(q3_K_scale(b.scales, 8) == 34);
  CHECK(q3_K_scale(b.scales, 12) == 48);
  CHECK(q3_K_scale(b.scales, 3) == 0);

  b.qs[0] = 0x03;              // value 0 (h 0, k 0, l 0): low 3, high bit set -> q 3
  b.hmask[0] = 0xFD;           // value 32 (k 1, l 0): high bit clear -> q 0 - 4
  b.qs[32 + 8] = 0x02;         // value 136 (h 1, k 0, l 8): low 2 ...
  b.hmask[8] = 0xEF;           // ... bit 4 (4 h + k) clear -> q -2
  b.qs[32 + 3] = 0x10;         // value 195 (h 1, k 2, l 3): low 1, high set -> q 1
  b.qs[5] = 0x30;              // value 69 (h 0, k 2, l 5): low 3 ...
  b.hmask[5] = 0xFB;           // ... bit 2 clear -> q -1
  const std::vector<float> y = decode(type::q3_K, &b);
  CHECK(y[0] == -93.0f);   // -31 * 3
  CHECK(y[32] == 128.0f);  // -32 * -4 (sub 2)
  CHECK(y[136] == -4.0f);  // 2 * -2 (sub 8)
  CHECK(y[195] == 16.0f);  // 16 * 1 (sub 12)
  CHECK(y[69] == 16.0f);   // -16 * -1 (sub 4)
  CHECK(y[1] == 0.0f);
  CHECK(y[255] == 0.0f);
}

TEST_CASE("q4_K / q5_K golden blocks: get_scale_min_k4 packing and nibble order", "[quants][golden]") {
  block_q4_K b = zeroed<block_q4_K>();
  b.d = 0x3800;     // 0.5
  b.dmin = 0x3C00;  // 1
  // Sub-block 0: scale 5, min 3. Sub-block 5: scale 42 (0b10'1010), min 23 (0b01'0111): low 4 bits in
  // byte 9, top 2 bits in the top bits of byte 1 (scale) and byte 5 (min).
  b.scales[0] = 5;
  b.scales[4] = 3;
  b.scales[9] = 0x7A;
  b.scales[1] = 0x80;  // sub-block 1 scale 0, plus scale 5's top bits
  b.scales[5] = 0x40;  // sub-block 1 min 0, plus min 5's top bits
  uint8_t sc = 0, m = 0;
  get_scale_min_k4(0, b.scales, &sc, &m);
  CHECK((sc == 5 && m == 3));
  get_scale_min_k4(1, b.scales, &sc, &m);
  CHECK((sc == 0 && m == 0));
  get_scale_min_k4(5, b.scales, &sc, &m);
  CHECK((sc == 42 && m == 23));

  uint8_t packed[12];
  const uint8_t scs[8] = {5, 0, 0, 0, 0, 42, 0, 0};
  const uint8_t mins[8] = {3, 0, 0, 0, 0, 23, 0, 0};
  pack_scale_min_k4(scs, mins, packed);
  CHECK(std::memcmp(packed, b.scales, 12) == 0);

  b.qs[0] = 0x09;       // value 0: 9 (sub-block 0)
  b.qs[64 + 7] = 0xC0;  // chunk 2, l 7: high nibble 12 -> value 64 * 2 + 32 + 7 = 167 (sub-block 5)
  std::vector<float> y = decode(type::q4_K, &b);
  CHECK(y[0] == 19.5f);     // 0.5 * 5 * 9 - 3
  CHECK(y[167] == 229.0f);  // 0.5 * 42 * 12 - 23
  CHECK(y[135] == 0.0f);    // low nibble of the same byte: sub-block 4, scale 0 min 0
  CHECK(y[1] == -3.0f);
  CHECK(y[160] == -23.0f);

  // q5_K: same scales and low bits; bit 4 of value 64 c + l is bit 2c of qh[l], of 64 c + 32 + l bit 2c + 1.
  block_q5_K c = zeroed<block_q5_K>();
  c.d = b.d;
  c.dmin = b.dmin;
  std::memcpy(c.scales, b.scales, sizeof c.scales);
  std::memcpy(c.qs, b.qs, sizeof c.qs);
  c.qh[0] = 0x01;  // value 0
  c.qh[7] = 0x20;  // bit 5 = 2 * 2 + 1: value 167
  c.qh[1] = 0x80;  // bit 7 = 2 * 3 + 1: value 64 * 3 + 32 + 1 = 225 (sub-block 7: 0, 0)
  y = decode(type::q5_K, &c);
  CHECK(y[0] == 59.5f);     // 0.5 * 5 * 25 - 3
  CHECK(y[167] == 565.0f);  // 0.5 * 42 * 28 - 23
  CHECK(y[225] == 0.0f);
  CHECK(y[1] == -3.0f);
}

TEST_CASE("q6_K golden block: ql / qh split and signed scales", "[quants][golden]") {
  block_q6_K b = zeroed<block_q6_K>();
  b.d = 0x3C00;
  for (int j = 0; j < 16; ++j) b.scales[j] = static_cast<int8_t>(j - 8);
  b.ql[64 + 32 + 4] = 0x50;  // value 228 (h 1, k 3, l 4): low 4 bits 5 ...
  b.qh[32 + 4] = 0x80;       // ... top bits 2 (bits 6..7) -> q = 37 - 32 = 5
  b.ql[1] = 0x0F;            // value 1 (h 0, k 0): low 15 ...
  b.qh[1] = 0x03;            // ... top 3 -> q = 63 - 32 = 31
  b.ql[2] = 0x30;            // value 66 (h 0, k 2, l 2): low 3 ...
  b.qh[2] = 0x10;            // ... top 1 (bits 4..5) -> q = 19 - 32 = -13
  const std::vector<float> y = decode(type::q6_K, &b);
  CHECK(y[228] == 30.0f);   // scale 14 - 8 = 6, times 5
  CHECK(y[1] == -248.0f);   // scale -8, times 31
  CHECK(y[66] == 52.0f);    // scale 4 - 8 = -4, times -13
  CHECK(y[2] == 256.0f);    // scale -8, q -32
  CHECK(y[65] == 128.0f);   // value 65 (k 2, l 1): high nibble of ql[1] 0, qh[1] bits 4..5 0 -> -4 * -32
}

TEST_CASE("iq4_nl / iq4_xs codebook: the format's 16 values, and golden blocks", "[quants][golden]") {
  // The codebook as the format defines it (ggml-common.h's kvalues_iq4nl; gguf-py decodes with the same).
  const int8_t defined[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
  for (int i = 0; i < 16; ++i) CHECK(iq4nl_values[i] == defined[i]);

  // iq4_nl: d = 0.5, qs[j] = j | (15 - j) << 4: values 0..15 are the codebook in order, 16..31 reversed.
  block_iq4_nl b = zeroed<block_iq4_nl>();
  b.d = 0x3800;
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | (15 - j) << 4);
  std::vector<float> y = decode(type::iq4_nl, &b);
  for (int j = 0; j < 16; ++j) {
    CHECK(y[static_cast<size_t>(j)] == 0.5f * defined[j]);
    CHECK(y[static_cast<size_t>(j + 16)] == 0.5f * defined[15 - j]);
  }

  // iq4_xs: d = 0.25; sub-block j has the 6-bit scale 32 + (j - 4) * 5 (-20 .. 15 after the -32, high bits
  // in scales_h), and in sub-block j every nibble is j (low) and 15 - j (high).
  block_iq4_xs x = zeroed<block_iq4_xs>();
  x.d = 0x3400;
  for (int j = 0; j < 8; ++j) {
    const int ls = 32 + (j - 4) * 5;
    x.scales_l[j / 2] = static_cast<uint8_t>(x.scales_l[j / 2] | (ls & 0xF) << (4 * (j % 2)));
    x.scales_h = static_cast<uint16_t>(x.scales_h | (ls >> 4) << (2 * j));
    for (int l = 0; l < 16; ++l) x.qs[16 * j + l] = static_cast<uint8_t>(j | (15 - j) << 4);
    CHECK(iq4_xs_scale(x, j) == ls);
  }
  y = decode(type::iq4_xs, &x);
  for (int j = 0; j < 8; ++j) {
    const float dl = 0.25f * static_cast<float>((j - 4) * 5);
    INFO("sub-block " << j);
    for (int l = 0; l < 16; ++l) {
      CHECK(y[static_cast<size_t>(32 * j + l)] == dl * defined[j]);
      CHECK(y[static_cast<size_t>(32 * j + 16 + l)] == dl * defined[15 - j]);
    }
  }

  // Each quantizer keeps a block that is exactly a scaled codebook row (the fit can always find it).
  std::vector<float> row(256);
  for (int i = 0; i < 256; ++i) row[static_cast<size_t>(i)] = 0.125f * defined[(i * 7) % 16];
  for (type t : {type::iq4_nl, type::iq4_xs}) {
    INFO("type " << type_name(t));
    CHECK(dequantize(t, quantize(t, row), 256) == row);
  }
}

TEST_CASE("mxfp4 decodes patterned blocks as gguf-py does, and its E8M0 scales", "[quants][ggml]") {
  // Bytes (73 i + 11) mod 256 with the exponent bytes set to 127 and 128 (scales 0.5 and 1); checksums from
  // gguf-py's numpy dequantizer, as in the test above.
  std::vector<uint8_t> raw(2 * sizeof(block_mxfp4));
  for (size_t i = 0; i < raw.size(); ++i) raw[i] = static_cast<uint8_t>((i * 73 + 11) % 256);
  raw[0] = 127;
  raw[sizeof(block_mxfp4)] = 128;
  const std::vector<float> y = dequantize(type::mxfp4, raw, 64);
  double weighted = 0, abs_sum = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    weighted += static_cast<double>(i + 1) * y[i];
    abs_sum += std::fabs(static_cast<double>(y[i]));
  }
  CHECK(weighted == 2037.5);
  CHECK(abs_sum == 222.5);
  CHECK(y.front() == 2.0f);
  CHECK(y.back() == 12.0f);
  // E2M1's values doubled, and the halved power-of-two scales (subnormal below e = 2).
  const int8_t e2m1_doubled[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
  for (int i = 0; i < 16; ++i) CHECK(mxfp4_values[i] == e2m1_doubled[i]);
  CHECK(mxfp4_scale(127) == 0.5f);
  CHECK(mxfp4_scale(130) == 4.0f);
  CHECK(mxfp4_scale(1) == std::ldexp(1.0f, -127));
  CHECK(mxfp4_scale(0) == std::ldexp(1.0f, -128));
}

TEST_CASE("tq1_0 and tq2_0: every ternary pattern of a byte, and ternary data round-trip exactly", "[quants][golden]") {
  // tq1_0's bytes: the digits of all 243 five-digit numbers come back from the packed byte.
  for (int v = 0; v < 243; ++v) {
    uint8_t t[5];
    for (int n = 4, r = v; n >= 0; --n, r /= 3) t[n] = static_cast<uint8_t>(r % 3);
    const uint8_t b = static_cast<uint8_t>((v * 256 + 242) / 243);
    for (int n = 0; n < 5; ++n) REQUIRE(tq1_digit(b, n) == t[n]);
  }
  // Ternary weights times a power of two are exactly what both types hold.
  std::vector<float> x(512);
  for (size_t i = 0; i < x.size(); ++i) x[i] = 0.25f * static_cast<float>(static_cast<int>((i * 7 + i / 3) % 3) - 1);
  x[0] = 0.25f;  // each block's largest magnitude is the scale
  x[256] = -0.25f;
  for (type t : {type::tq1_0, type::tq2_0}) {
    INFO("type " << type_name(t));
    CHECK(dequantize(t, quantize(t, x), 512) == x);
  }
}

TEST_CASE("q8_K golden block and quantizer invariants", "[quants][golden]") {
  block_q8_K b = zeroed<block_q8_K>();
  b.d = 0.125f;
  b.qs[0] = -127;
  b.qs[255] = 100;
  std::vector<float> y = decode(type::q8_K, &b);
  CHECK(y[0] == -15.875f);
  CHECK(y[255] == 12.5f);

  // The value of largest magnitude maps to -127; bsums are the sums of 16 quants.
  const std::vector<float> x = make_data(distributions()[0], 512, 5);
  const auto q = quantize(type::q8_K, x);
  const auto* blocks = reinterpret_cast<const block_q8_K*>(q.data());
  for (int i = 0; i < 2; ++i) {
    int amax_at = 0;
    for (int v = 0; v < 256; ++v) {
      if (std::fabs(x[static_cast<size_t>(256 * i + v)]) > std::fabs(x[static_cast<size_t>(256 * i + amax_at)])) amax_at = v;
    }
    CHECK(blocks[i].qs[amax_at] == -127);
    for (int j = 0; j < 16; ++j) {
      int sum = 0;
      for (int l = 0; l < 16; ++l) sum += blocks[i].qs[16 * j + l];
      CHECK(blocks[i].bsums[j] == sum);
    }
  }
}

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

TEST_CASE("32-value quantizers match ggml's reference output byte for byte", "[quants][ggml]") {
  // 64 values ((37 i mod 64) - 29) / 16, quantized by ggml's quantize_row_*_ref (via gguf-py, which
  // implements the same algorithms); includes exact rounding ties.
  std::vector<float> x(64);
  for (int i = 0; i < 64; ++i) x[static_cast<size_t>(i)] = static_cast<float>((i * 37) % 64 - 29) / 16.0f;
  const struct {
    type t;
    const char* hex;
  } expected[] = {
      {type::q4_0, "40b4bf269c046ad148ae258ce369c137ad1520b437ae158be259c0379d047bd248bf268c"},
      {type::q4_1, "333440bf40d962fb952eb751da730c953ec851ea113400bfc851ea731da63fc862fb841db740d962"},
      {type::q5_0, "40b0d54aa5566e5c1908d493805c3b08d6b3817e3b2920b02ab552a97f4c2af7c5a2705d2a08e5b3906e4c19"},
      {type::q5_1, "113040bf2ab55aa980a2d5f72a4c7f91c4e6193b6e80b3d5df2f00bfd54aa55680a2d5f72a4c7f91c4e6193b6e80b3d5"},
      {type::q8_0,
       "4924941eb943de69049f29c44eea740faa34cf5af57f1ab540db65009b25c04be67028240ca432ca59f17f17af3ed664fc9423bb49e1"
       "7008a02ec655ed7b13ab3ad260f8"},
  };
  for (const auto& e : expected) {
    INFO("type " << type_name(e.t));
    CHECK(quantize(e.t, x) == from_hex(e.hex));
  }
}

TEST_CASE("dequantizers agree with an independent decoder on every bit of patterned blocks", "[quants][ggml]") {
  // Two blocks of bytes (73 i + 11) mod 256, fp16 fields d = 0.5 and dmin / m = 0.25, decoded by gguf-py's
  // numpy dequantizers (an implementation independent of ggml's C code and of this one). Every bit of
  // quants, high bits and scales is exercised; the checksums sum_i (i + 1) y_i and sum_i |y_i| are exact.
  const struct {
    type t;
    std::vector<size_t> fp16_offsets;
    double weighted_sum;
    double abs_sum;
    float first, last;
  } cases[] = {
      {type::q4_0, {0}, -951.5, 130.0, 2.5f, -4.0f},
      {type::q4_1, {0, 2}, 7906.0, 245.0, 7.75f, 1.25f},
      {type::q5_0, {0}, 457.5, 238.0, 0.5f, 2.0f},
      {type::q5_1, {0, 2}, 14407.0, 459.0, 9.75f, 11.75f},
      {type::q8_0, {0}, 4736.0, 2052.0, -49.5f, 19.0f},
      {type::q2_K, {80, 82}, 461111.0, 2618.5, 16.5f, 5.0f},
      {type::q3_K, {108}, -21047.5, 8639.5, 40.5f, -28.0f},
      {type::q4_K, {0, 2}, 10747144.0, 45004.0, 253.75f, 12.5f},
      {type::q5_K, {0, 2}, 30625984.0, 115343.0, 629.75f, 12.0f},
      {type::q6_K, {208}, -3908730.0, 269853.0, -715.5f, 84.0f},
      {type::iq4_nl, {0}, -13679.0, 1834.5, 34.5f, -63.5f},
      {type::iq4_xs, {0}, -2536346.5, 122355.5, 32.5f, -227.5f},
      {type::tq1_0, {52}, -459.5, 175.0, -0.5f, 0.0f},
      {type::tq2_0, {64}, 33719.5, 252.0, 1.0f, 1.0f},
      // The i-quants below 4 bits: every grid row these bytes index, sign pattern and scale nibble as
      // gguf-py's decoder reads them (iq1_m keeps its scale in the patterned bytes' top nibbles).
      {type::iq2_xxs, {0}, -141883.5625, 9216.8125, -9.5f, 6.5f},
      {type::iq2_xs, {0}, 131085.5625, 9391.625, -13.5f, -15.5f},
      {type::iq2_s, {0}, 99243.9375, 9503.6875, -5.5f, -8.5f},
      {type::iq3_xxs, {0}, 77438.5, 25120.0, -126.5f, -52.5f},
      {type::iq3_s, {0}, -384427.0, 24900.0, -38.5f, 37.5f},
      {type::iq1_s, {0}, -14825.0, 1281.125, -0.4375f, 0.5625f},
      {type::iq1_m, {}, -4075.557373046875, 491.07281494140625, 0.179443359375f, -0.6917266845703125f},
  };
  for (const auto& c : cases) {
    INFO("type " << type_name(c.t));
    const size_t ts = type_size(c.t);
    std::vector<uint8_t> raw(2 * ts);
    for (size_t i = 0; i < raw.size(); ++i) raw[i] = static_cast<uint8_t>((i * 73 + 11) % 256);
    const fp16_t values[2] = {0x3800, 0x3400};  // 0.5, 0.25
    for (size_t b = 0; b < 2; ++b) {
      for (size_t k = 0; k < c.fp16_offsets.size(); ++k) std::memcpy(&raw[b * ts + c.fp16_offsets[k]], &values[k], 2);
    }
    const int64_t n = 2 * block_size(c.t);
    const std::vector<float> y = dequantize(c.t, raw, n);
    double weighted = 0, abs_sum = 0;
    for (size_t i = 0; i < y.size(); ++i) {
      weighted += static_cast<double>(i + 1) * y[i];
      abs_sum += std::fabs(static_cast<double>(y[i]));
    }
    CHECK(weighted == c.weighted_sum);
    CHECK(abs_sum == c.abs_sum);
    CHECK(y.front() == c.first);
    CHECK(y.back() == c.last);
  }
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

// ============================== type table ==============================

TEST_CASE("type table: ids, names, block sizes, supported flags", "[types]") {
  const struct {
    type t;
    uint32_t id;
    const char* name;
    int64_t block;
    size_t bytes;
    bool quantized;
    bool supported;
  } rows[] = {
      {type::f32, 0, "f32", 1, 4, false, true},          {type::f16, 1, "f16", 1, 2, false, true},
      {type::q4_0, 2, "q4_0", 32, 18, true, true},       {type::q4_1, 3, "q4_1", 32, 20, true, true},
      {type::q5_0, 6, "q5_0", 32, 22, true, true},       {type::q5_1, 7, "q5_1", 32, 24, true, true},
      {type::q8_0, 8, "q8_0", 32, 34, true, true},       {type::q8_1, 9, "q8_1", 32, 36, true, true},
      {type::q2_K, 10, "q2_K", 256, 84, true, true},     {type::q3_K, 11, "q3_K", 256, 110, true, true},
      {type::q4_K, 12, "q4_K", 256, 144, true, true},    {type::q5_K, 13, "q5_K", 256, 176, true, true},
      {type::q6_K, 14, "q6_K", 256, 210, true, true},    {type::q8_K, 15, "q8_K", 256, 292, true, true},
      {type::iq2_xxs, 16, "iq2_xxs", 256, 66, true, true}, {type::iq2_xs, 17, "iq2_xs", 256, 74, true, true},
      {type::iq3_xxs, 18, "iq3_xxs", 256, 98, true, true}, {type::iq1_s, 19, "iq1_s", 256, 50, true, true},
      {type::iq4_nl, 20, "iq4_nl", 32, 18, true, true}, {type::iq3_s, 21, "iq3_s", 256, 110, true, true},
      {type::iq2_s, 22, "iq2_s", 256, 82, true, true},  {type::iq4_xs, 23, "iq4_xs", 256, 136, true, true},
      {type::i8, 24, "i8", 1, 1, false, false},          {type::i16, 25, "i16", 1, 2, false, false},
      {type::i32, 26, "i32", 1, 4, false, true},         {type::i64, 27, "i64", 1, 8, false, true},
      {type::f64, 28, "f64", 1, 8, false, false},        {type::iq1_m, 29, "iq1_m", 256, 56, true, true},
      {type::bf16, 30, "bf16", 1, 2, false, true},       {type::tq1_0, 34, "tq1_0", 256, 54, true, true},
      {type::tq2_0, 35, "tq2_0", 256, 66, true, true},   {type::mxfp4, 39, "mxfp4", 32, 17, true, true},
  };
  size_t known = 0;
  for (const auto& r : rows) {
    const type_traits& tr = traits(r.t);
    INFO("type " << r.name);
    CHECK(static_cast<uint32_t>(r.t) == r.id);
    CHECK(tr.name == r.name);
    CHECK(tr.block_size == r.block);
    CHECK(tr.type_size == r.bytes);
    CHECK(tr.is_quantized == r.quantized);
    CHECK(tr.known);
    CHECK(tr.supported == r.supported);
    CHECK(type_from_id(r.id) == r.t);
    CHECK(type_from_name(r.name) == r.t);
    const bool computes = r.supported && r.t != type::i32 && r.t != type::i64;
    CHECK((tr.to_float != nullptr) == computes);
    // The i-quants below 4 bits are read, never written (their quantizers need an importance matrix).
    const std::string name(r.name);
    const bool writes = computes && !(name.rfind("iq", 0) == 0 && name != "iq4_xs" && name != "iq4_nl");
    CHECK((tr.from_float_ref != nullptr) == writes);
    CHECK((tr.vec_dot != nullptr) == computes);
    if (computes) CHECK(traits(tr.vec_dot_type).vec_dot != nullptr);
    ++known;
  }
  uint32_t n_known = 0;
  for (uint32_t id = 0; id < type_id_count; ++id) n_known += type_from_id(id).has_value();
  CHECK(n_known == known);

  CHECK(traits(type::q4_0).vec_dot_type == type::q8_0);
  CHECK(traits(type::q5_0).vec_dot_type == type::q8_0);
  CHECK(traits(type::q8_0).vec_dot_type == type::q8_0);
  CHECK(traits(type::q4_1).vec_dot_type == type::q8_1);
  CHECK(traits(type::q5_1).vec_dot_type == type::q8_1);
  for (type t : {type::q2_K, type::q3_K, type::q4_K, type::q5_K, type::q6_K, type::q8_K, type::iq4_xs}) CHECK(traits(t).vec_dot_type == type::q8_K);
  CHECK(traits(type::iq4_nl).vec_dot_type == type::q8_0);
  CHECK(traits(type::mxfp4).vec_dot_type == type::q8_0);
  CHECK(traits(type::tq1_0).vec_dot_type == type::q8_K);
  CHECK(traits(type::tq2_0).vec_dot_type == type::q8_K);
  CHECK(traits(type::f16).vec_dot_type == type::f32);  // activations stay f32 against f16 weights
  CHECK(traits(type::bf16).vec_dot_type == type::bf16);
  CHECK(traits(type::f32).vec_dot_type == type::f32);
  CHECK(row_size(type::q4_K, 4096) == 16 * 144);
  CHECK(row_size(type::q8_0, 4096) == 128 * 34);
}

TEST_CASE("type table: unknown ids and names", "[types]") {
  for (uint32_t id : {4u, 5u, 31u, 32u, 33u, 36u, 37u, 38u, 40u, 99u, 0xFFFFFFFFu}) {
    INFO("id " << id);
    CHECK_FALSE(type_from_id(id).has_value());
    const type_traits& tr = traits(static_cast<type>(id));
    CHECK_FALSE(tr.known);
    CHECK_FALSE(tr.supported);
    CHECK(tr.name == "unknown");
    CHECK(row_size(static_cast<type>(id), 256) == 0);  // no division by zero
    CHECK_THROWS_AS(require_supported(static_cast<type>(id), "t"), type_error);
  }
  CHECK(type_from_name("Q4_K") == type::q4_K);
  CHECK(type_from_name("q4_k") == type::q4_K);
  CHECK(type_from_name("BF16") == type::bf16);
  CHECK(type_from_name("IQ2_XXS") == type::iq2_xxs);
  CHECK_FALSE(type_from_name("unknown").has_value());
  CHECK_FALSE(type_from_name("q4").has_value());
  CHECK_FALSE(type_from_name("").has_value());
}

TEST_CASE("require_supported names the tensor and the type", "[types]") {
  CHECK_NOTHROW(require_supported(type::q4_K, "blk.0.attn_q.weight"));
  CHECK_NOTHROW(require_supported(type::i32, "positions"));
  try {
    require_supported(type::i16, "blk.0.attn_q.weight");
    FAIL("require_supported did not throw for i16");
  } catch (const type_error& e) {
    const std::string msg = e.what();
    CHECK(msg.find("blk.0.attn_q.weight") != std::string::npos);
    CHECK(msg.find("i16") != std::string::npos);
    CHECK(msg.find("25") != std::string::npos);
  }
  CHECK_THROWS_AS(require_supported(type::f64, "w"), type_error);
  CHECK_NOTHROW(require_supported(type::iq3_s, "w"));
}

TEST_CASE("the i-quant grids are the format's: their values, distinct rows, sign patterns and checksums", "[quants][ggml]") {
  // Checksums sum_i (i + 1) v_i over each table's values in order, computed from gguf-py's packed grids
  // (an independent copy of the format's definition) with numpy.
  auto check = [](const auto& grid, std::initializer_list<int> values, int64_t checksum) {
    std::set<std::vector<int>> rows;
    int64_t sum = 0, i = 0;
    for (const auto& row : grid) {
      std::vector<int> r(std::begin(row), std::end(row));
      for (int v : r) {
        CHECK(std::find(values.begin(), values.end(), v) != values.end());
        sum += ++i * v;
      }
      rows.insert(r);
    }
    CHECK(rows.size() == std::size(grid));  // no two codes decode alike
    CHECK(sum == checksum);
  };
  check(iq_grids::iq2xxs, {8, 25, 43}, 42100955);
  check(iq_grids::iq2xs, {8, 25, 43}, 182044374);
  check(iq_grids::iq2s, {8, 25, 43}, 720245922);
  check(iq_grids::iq3xxs, {4, 12, 20, 28, 36, 44, 52, 62}, 14912868);
  check(iq_grids::iq3s, {1, 3, 5, 7, 9, 11, 13, 15}, 14404362);
  check(iq_grids::iq1s, {-1, 0, 1}, 10703429);
  int64_t sum = 0;
  for (int i = 0; i < 128; ++i) {
    const uint8_t s = iq_grids::ksigns_iq2xs[i];
    CHECK((s & 127) == i);                      // the 7 stored signs
    CHECK(std::popcount(static_cast<unsigned>(s)) % 2 == 0);  // the eighth makes the count of minus signs even
    sum += (i + 1) * static_cast<int64_t>(s);
  }
  CHECK(sum == 1227392);
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
