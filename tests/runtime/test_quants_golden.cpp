// Quantized formats bit by bit: hand-made golden blocks of every layout (f16 / bf16, the 32-value types, the
// K-quants, iq4_nl / iq4_xs, tq1_0 / tq2_0, q8_K) decode to the values the format defines.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <vector>

#include "runtime/error.h"
#include "runtime/quants.h"
#include "runtime/quants_iq.h"
#include "runtime/quants_iq_low.h"
#include "runtime/quants_mx.h"
#include "runtime/quants_tq.h"
#include "runtime/types.h"
#include "tests/runtime/quant_fixture.h"

using namespace troupe;
using namespace troupe::test::quant_fixture;

namespace {

std::vector<float> decode(type t, const void* block) {
  std::vector<float> y(static_cast<size_t>(block_size(t)));
  traits(t).to_float(block, y.data(), block_size(t));
  return y;
}

}  // namespace

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
