// Quantized formats against ggml's and gguf-py's references: quantizers byte for byte, dequantizers against
// an independent decoder on patterned blocks (mxfp4 included), and the i-quant grids.
//
// Every hex string and checksum below is printed, as these initializers, by scripts/reference/gguf_quants.py
// (gguf-py and numpy at the versions pinned in scripts/reference/requirements.txt); `scripts/reference/run`
// recomputes them and checks that this file holds exactly those values.
#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
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
#include "tests/runtime/quant_fixture.h"

using namespace troupe;
using namespace troupe::test::quant_fixture;

namespace {

std::vector<uint8_t> from_hex(const std::string& hex) {
  std::vector<uint8_t> out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) out.push_back(static_cast<uint8_t>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

}  // namespace

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
