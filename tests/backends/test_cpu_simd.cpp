// Every SIMD kernel this CPU can run, against the scalar reference of runtime/quants.h on random data:
// activation quantizers and dequantizers bit for bit, dot products within float-accumulation error (their
// integer parts are exact; only the order and precision of the float sums differ).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "backends/cpu/cpu_features.h"
#include "backends/cpu/simd/simd.h"
#include "runtime/quants.h"
#include "tests/support/random_blocks.h"
#include "tests/support/skip.h"

using namespace troupe;
using troupe::cpu::isa;
namespace simd = troupe::cpu::simd;

namespace {

std::vector<isa> simd_levels() {
  std::vector<isa> out;
  for (isa l : {isa::avx2, isa::avx512}) {
    if (cpu::isa_supported(l)) out.push_back(l);
  }
  return out;
}

// The SIMD levels this CPU has by an account other than cpu_features' own cpuid reading: the flags Linux
// lists in /proc/cpuinfo (it leaves out those whose register state the OS does not save), each level
// needing the flags of cpu_features::avx2_level() / avx512_level(). Without /proc/cpuinfo, the levels of
// host_cpu_features()'s flags.
std::vector<isa> expected_levels() {
#if defined(__x86_64__)
  std::set<std::string> flags;
  bool read = false;
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; !read && std::getline(in, line);) {
    if (line.rfind("flags", 0) != 0 || line.find(':') == std::string::npos) continue;
    std::istringstream words(line.substr(line.find(':') + 1));
    flags.insert(std::istream_iterator<std::string>(words), std::istream_iterator<std::string>());
    read = true;
  }
  const cpu::cpu_features& f = cpu::host_cpu_features();
  auto has = [&](std::initializer_list<const char*> names) {
    return std::all_of(names.begin(), names.end(), [&](const char* n) { return flags.count(n) != 0; });
  };
  const bool avx2 = read ? has({"avx2", "fma", "f16c"}) : f.avx2_level();
  const bool avx512 =
      avx2 && (read ? has({"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni"}) : f.avx512_level());
  std::vector<isa> out;
  if (avx2) out.push_back(isa::avx2);
  if (avx512) out.push_back(isa::avx512);
  return out;
#else
  return {};  // no SIMD kernels outside x86-64
#endif
}

std::string names_of(const std::vector<isa>& levels) {
  std::string s;
  for (isa l : levels) s += (s.empty() ? "" : " ") + std::string(cpu::isa_name(l));
  return s.empty() ? "none" : s;
}

// The SIMD levels to compare with the reference: every one this CPU has. A level the CPU has but
// simd_levels() lacks fails the case (a detection that dropped one would leave its kernels untested and the
// case green); none at all skips it, so that ctest reports it Skipped rather than Passed.
std::vector<isa> levels_to_compare() {
  const std::vector<isa> levels = simd_levels();
  INFO("host: " << cpu::host_cpu_features().describe());
  CHECK(names_of(levels) == names_of(expected_levels()));
  if (levels.empty()) test::skip("no SIMD level (AVX2 or AVX-512) on this CPU: no kernel to compare with the reference");
  return levels;
}

std::vector<float> random_floats(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// x quantized by the reference; for a type troupe reads but does not write (iq3_s), random valid blocks
// seeded by x's values instead.
std::vector<uint8_t> quantize_ref(type t, const std::vector<float>& x) {
  if (traits(t).from_float_ref == nullptr) {
    std::mt19937 rng(static_cast<uint32_t>(x.size()) ^ static_cast<uint32_t>(std::abs(x[0]) * 1e6f));
    return test::random_blocks(t, static_cast<int64_t>(x.size()) / block_size(t), rng);
  }
  std::vector<uint8_t> out(row_size(t, static_cast<int64_t>(x.size())));
  traits(t).from_float_ref(x.data(), out.data(), static_cast<int64_t>(x.size()));
  return out;
}

std::vector<double> dequantize(type t, const std::vector<uint8_t>& bytes, int64_t n) {
  std::vector<float> f(static_cast<size_t>(n));
  traits(t).to_float(bytes.data(), f.data(), n);
  return {f.begin(), f.end()};
}

const type weight_types[] = {type::f32,  type::f16,  type::bf16, type::q4_0, type::q4_1, type::q5_0, type::q5_1,
                             type::q8_0, type::q2_K, type::q3_K, type::q4_K, type::q5_K, type::q6_K,
                             type::iq4_nl, type::iq4_xs, type::mxfp4, type::tq1_0, type::tq2_0, type::iq3_s};

// Row lengths: single blocks, odd block counts, and a long row; plain types also get lengths that are not
// multiples of any vector width.
std::vector<int64_t> lengths_for(type t) {
  const int64_t bs = traits(t).block_size > 1 ? traits(t).block_size : 1;
  const int64_t vbs = traits(traits(t).vec_dot_type).block_size;
  const int64_t unit = std::max(bs, vbs);
  std::vector<int64_t> out = {unit, 3 * unit, 4096 / unit * unit + unit, 11008 / unit * unit};
  if (unit == 1) {
    for (int64_t n : {1, 7, 15, 17, 31, 33, 63, 65, 100, 129, 1000}) out.push_back(n);
  }
  return out;
}

}  // namespace

TEST_CASE("cpu features: detection is consistent and the active level is supported", "[cpu][simd]") {
  const cpu::cpu_features& f = cpu::host_cpu_features();
  CHECK_FALSE(f.describe().empty());
  CHECK(cpu::isa_supported(isa::scalar));
  CHECK(cpu::isa_supported(cpu::active_isa()));
  if (f.avx512_level()) CHECK(f.avx2_level());
  if (f.avx2) CHECK(f.avx);
  for (isa l : {isa::scalar, isa::avx2, isa::avx512}) CHECK(cpu::isa_from_name(cpu::isa_name(l)) == l);
  CHECK_FALSE(cpu::isa_from_name("avx9").has_value());
  const simd::kernel_table& t = simd::active_table();
  CHECK(t.level == cpu::active_isa());
  for (type w : weight_types) {
    CHECK(t.dot(w) != nullptr);
    CHECK(t.quantize(traits(w).vec_dot_type) != nullptr);
    CHECK(t.dequantize(w) != nullptr);
  }
  WARN("host: " << f.describe() << "; kernels: " << cpu::isa_name(cpu::active_isa()));
}

TEST_CASE("simd activation quantizers are bit-identical to the reference", "[cpu][simd]") {
  const std::vector<isa> levels = levels_to_compare();
  if (levels.empty()) return;
  const type act_types[] = {type::q8_0, type::q8_1, type::q8_K, type::f16, type::bf16};
  std::vector<isa> compared;  // the levels with a quantizer of their own
  for (isa level : levels) {
    const simd::kernel_table& kt = simd::table(level);
    for (type t : act_types) {
      if (kt.quantize(t) == traits(t).from_float_ref) continue;
      if (compared.empty() || compared.back() != level) compared.push_back(level);
      INFO("level " << cpu::isa_name(level) << ", type " << type_name(t));
      const int64_t bs = traits(t).block_size;
      for (int64_t n : {bs, 8 * bs, 4096 / bs * bs, bs == 1 ? int64_t{13} : 5 * bs}) {
        for (uint32_t seed = 1; seed <= 3; ++seed) {
          std::vector<float> x = random_floats(static_cast<size_t>(n), seed * 7 + static_cast<uint32_t>(n), -3.0f, 3.0f);
          if (seed == 2) {
            // Exact rounding ties for the q8 formats: block maximum 127 (scale 1), values k + 0.5.
            for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(static_cast<int>(i % 50) - 25) + 0.5f;
            for (size_t i = 0; i < x.size(); i += 32) x[i] = (i / 32) % 2 ? 127.0f : -127.0f;
          }
          if (seed == 3) {
            for (size_t i = 0; i < x.size() / 2; ++i) x[i] = 0.0f;  // all-zero blocks
            if (x.size() > 3) x[x.size() - 1] = -x[x.size() - 3] ;  // equal magnitudes, both signs
          }
          const std::vector<uint8_t> want = quantize_ref(t, x);
          std::vector<uint8_t> got(want.size(), 0xAB);
          kt.quantize(t)(x.data(), got.data(), n);
          CHECK(std::memcmp(got.data(), want.data(), want.size()) == 0);
        }
      }
    }
  }
  // Every level has SIMD quantizers (AVX-512 keeps the AVX2 ones): each was compared.
  CHECK(names_of(compared) == names_of(levels));
}

TEST_CASE("simd dequantizers are bit-identical to the reference", "[cpu][simd]") {
  const std::vector<isa> levels = levels_to_compare();
  if (levels.empty()) return;
  std::vector<isa> compared;  // the levels with a dequantizer of their own
  for (isa level : levels) {
    const simd::kernel_table& kt = simd::table(level);
    for (type t : weight_types) {
      if (kt.dequantize(t) == traits(t).to_float) continue;
      if (compared.empty() || compared.back() != level) compared.push_back(level);
      INFO("level " << cpu::isa_name(level) << ", type " << type_name(t));
      const int64_t n = 4 * 256 + (traits(t).block_size == 1 ? 5 : 0);
      const std::vector<uint8_t> q = quantize_ref(t, random_floats(static_cast<size_t>(n), 11, -2.0f, 2.0f));
      std::vector<float> want(static_cast<size_t>(n)), got(static_cast<size_t>(n), -1.0f);
      traits(t).to_float(q.data(), want.data(), n);
      kt.dequantize(t)(q.data(), got.data(), n);
      CHECK(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)) == 0);
    }
  }
  // Every level has SIMD dequantizers (AVX-512 keeps the AVX2 ones): each was compared.
  CHECK(names_of(compared) == names_of(levels));
}

TEST_CASE("simd dot products match the reference within float accumulation error", "[cpu][simd]") {
  const std::vector<isa> levels = levels_to_compare();
  if (levels.empty()) return;
  int checked = 0;
  std::vector<isa> compared;  // the levels with a dot product of their own
  for (isa level : levels) {
    const simd::kernel_table& kt = simd::table(level);
    for (type w : weight_types) {
      if (kt.dot(w) == traits(w).vec_dot) continue;
      if (compared.empty() || compared.back() != level) compared.push_back(level);
      const type vt = traits(w).vec_dot_type;
      for (int64_t n : lengths_for(w)) {
        for (uint32_t seed = 1; seed <= 4; ++seed) {
          INFO("level " << cpu::isa_name(level) << ", weights " << type_name(w) << ", n " << n << ", seed " << seed);
          // Seed 4: larger, skewed values (sums far from zero, scales far from 1).
          const float lo = seed == 4 ? -0.5f : -1.0f, hi = seed == 4 ? 8.0f : 1.0f;
          const std::vector<uint8_t> x = quantize_ref(w, random_floats(static_cast<size_t>(n), seed, lo, hi));
          const std::vector<uint8_t> y = quantize_ref(vt, random_floats(static_cast<size_t>(n), seed + 100, lo, hi));
          float want = 0.0f, got = 0.0f;
          traits(w).vec_dot(n, &want, x.data(), y.data());
          kt.dot(w)(n, &got, x.data(), y.data());
          // Bound: a few float roundings per term of sum |x_i y_i| (block sums are exact integers; the
          // per-block scale product and the float accumulation are not).
          const std::vector<double> dx = dequantize(w, x, n), dy = dequantize(vt, y, n);
          double mag = 0.0;
          for (size_t i = 0; i < dx.size(); ++i) mag += std::fabs(dx[i] * dy[i]);
          const double bound = 4e-7 * mag * std::sqrt(static_cast<double>(n) / 32.0 + 1.0) + 1e-30;
          INFO("want " << want << ", got " << got << ", bound " << bound);
          CHECK(std::fabs(static_cast<double>(got) - static_cast<double>(want)) <= bound);
          ++checked;
        }
      }
    }
  }
  CHECK(names_of(compared) == names_of(levels));
  CHECK(checked > 100);
}

TEST_CASE("simd exp / silu / swiglu rows match std::exp within a few ulp", "[cpu][simd]") {
  const std::vector<isa> levels = levels_to_compare();
  if (levels.empty()) return;
  for (isa level : levels) {
    const simd::kernel_table& kt = simd::table(level);
    INFO("level " << cpu::isa_name(level));
    for (int64_t n : {1, 7, 8, 9, 64, 1000}) {
      INFO("n " << n);
      std::vector<float> x = random_floats(static_cast<size_t>(n), static_cast<uint32_t>(n), -30.0f, 30.0f);
      if (n >= 7) {
        x[0] = 0.0f;
        x[1] = -INFINITY;  // masked logits
        x[2] = -120.0f;    // far below the float range of exp
        x[3] = 95.0f;      // exp overflows (silu: x / (1 + e^-x) = x)
        x[4] = -95.0f;     // silu: x / inf = -0
      }
      // exp_row(y, max): exp(y - max) and the sum.
      std::vector<float> e = x;
      const float max = 2.0f;
      const float sum = kt.exp_row(n, e.data(), max);
      double want_sum = 0.0;
      for (int64_t i = 0; i < n; ++i) {
        // The difference is rounded to float first, as in the kernel (and the reference soft_max).
        const double want = std::exp(static_cast<double>(x[static_cast<size_t>(i)] - max));
        want_sum += want;
        const double got = e[static_cast<size_t>(i)];
        if (want < 1e-37) {
          CHECK(got < 1e-37);
        } else if (std::isinf(static_cast<float>(want))) {
          CHECK(std::isinf(got));
        } else {
          CHECK(std::fabs(got - want) <= 5e-7 * want);
        }
      }
      if (!std::isinf(static_cast<float>(want_sum))) CHECK(std::fabs(sum - want_sum) <= 1e-6 * want_sum);

      std::vector<float> y(static_cast<size_t>(n)), yg(static_cast<size_t>(n));
      const std::vector<float> g = random_floats(static_cast<size_t>(n), 99, -2.0f, 2.0f);
      kt.silu_row(n, x.data(), y.data());
      kt.swiglu_row(n, x.data(), g.data(), yg.data());
      for (size_t i = 0; i < x.size(); ++i) {
        if (std::isinf(x[i])) continue;
        const double v = x[i];
        const double want = v / (1.0 + std::exp(-v));
        CHECK(std::fabs(y[i] - want) <= 5e-7 * std::fabs(want) + 1e-30);
        CHECK(std::fabs(yg[i] - want * g[i]) <= 6e-7 * std::fabs(want * g[i]) + 1e-30);
      }
    }
  }
}

// The attention softmax's steps (scale_mask_max, exp_lane_sum, scale_row) are the same bits as the loops
// they replace: each value as exp_row computes it, the maximum of the scaled and masked values, the nonzero
// exponentials added one at a time to lane after lane from any starting lane.
TEST_CASE("simd attention softmax steps equal their plain loops bit for bit", "[cpu][simd]") {
  for (isa level : {isa::scalar, isa::avx2, isa::avx512}) {
    if (!cpu::isa_supported(level)) continue;
    const simd::kernel_table& kt = simd::table(level);
    INFO("level " << cpu::isa_name(level));
    for (int64_t n : {1, 7, 8, 15, 16, 17, 33, 100, 517}) {
      for (unsigned start : {0u, 5u, 15u}) {
        INFO("n " << n << ", first lane " << start);
        std::vector<float> y = random_floats(static_cast<size_t>(n), static_cast<uint32_t>(n + start), -8.0f, 8.0f);
        std::vector<float> m(static_cast<size_t>(n), 0.0f);
        for (int64_t i = 0; i < n; ++i) {
          if (i % 7 == 3 || (n > 40 && i >= n - 19)) m[static_cast<size_t>(i)] = -INFINITY;  // masked cells
          if (i % 11 == 5) m[static_cast<size_t>(i)] = -0.5f;                                // a bias
        }
        // The plain loops.
        std::vector<float> want = y;
        float want_max = -INFINITY;
        for (int64_t i = 0; i < n; ++i) {
          want[static_cast<size_t>(i)] = want[static_cast<size_t>(i)] * 0.125f + m[static_cast<size_t>(i)];
          want_max = std::max(want_max, want[static_cast<size_t>(i)]);
        }
        std::vector<float> got = y;
        const float got_max = kt.scale_mask_max(n, got.data(), m.data(), 0.125f);
        CHECK(got_max == want_max);
        CHECK(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)) == 0);

        kt.exp_row(n, want.data(), want_max);
        float want_lanes[16], got_lanes[16];
        for (int l = 0; l < 16; ++l) want_lanes[l] = got_lanes[l] = 0.25f * static_cast<float>(l);
        unsigned want_lane = start, got_lane = start;
        for (int64_t i = 0; i < n; ++i) {
          if (want[static_cast<size_t>(i)] == 0.0f) continue;
          want_lanes[want_lane] += want[static_cast<size_t>(i)];
          want_lane = (want_lane + 1) & 15u;
        }
        kt.exp_lane_sum(n, got.data(), got_max, got_lanes, &got_lane);
        CHECK(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)) == 0);
        CHECK(std::memcmp(got_lanes, want_lanes, sizeof want_lanes) == 0);
        CHECK(got_lane == want_lane);

        for (float& v : want) v *= 0.37f;
        kt.scale_row(n, got.data(), 0.37f);
        CHECK(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)) == 0);
      }
    }
  }
}

TEST_CASE("simd mad_acc_f32 over consecutive runs of rows gives mad_tile's bits over all of them", "[cpu][simd]") {
  // The fused attention converts a quantized V a block of cells at a time and continues each output value's
  // chain over the blocks: the result must be one call's, whatever the blocks (the weights include zeros and
  // whole zero rows, which both skip).
  for (isa level : {isa::scalar, isa::avx2, isa::avx512}) {
    if (!cpu::isa_supported(level)) continue;
    const simd::kernel_table& kt = simd::table(level);
    REQUIRE(kt.mad_acc_f32 != nullptr);
    for (int64_t m : {8, 13, 16, 40, 64, 100, 128}) {
      for (int64_t ncols : {1, 4, 6, 7}) {
        const int64_t k = 75;
        const size_t a_stride = static_cast<size_t>(m + 3) * sizeof(float);  // rows need not be adjacent
        std::vector<float> a = random_floats(static_cast<size_t>(k) * (a_stride / sizeof(float)), 7);
        std::vector<float> b = random_floats(static_cast<size_t>(ncols * k), 8);
        for (size_t i = 0; i < b.size(); i += 3) b[i] = 0.0f;
        for (int64_t c = 0; c < ncols; ++c) b[static_cast<size_t>(c * k + 10)] = 0.0f;  // row 10: zero for every column
        const size_t o_stride = static_cast<size_t>(m + 5);
        std::vector<float> want(o_stride * static_cast<size_t>(ncols), -1.0f), got(want.size(), -1.0f);
        kt.mad(type::f32)(k, m, ncols, a.data(), a_stride, b.data(), k * sizeof(float), want.data(), o_stride);
        for (int64_t c = 0; c < ncols; ++c) std::fill_n(got.begin() + c * static_cast<int64_t>(o_stride), m, 0.0f);
        for (int64_t l0 = 0, step = 1; l0 < k; l0 += step, step = step * 2 + 1) {
          const int64_t l1 = std::min(k, l0 + step);
          kt.mad_acc_f32(l1 - l0, m, ncols, reinterpret_cast<const char*>(a.data()) + static_cast<size_t>(l0) * a_stride, a_stride,
                         b.data() + l0, k * sizeof(float), got.data(), o_stride);
        }
        INFO("level " << cpu::isa_name(level) << ", m " << m << ", columns " << ncols);
        CHECK(std::memcmp(got.data(), want.data(), sizeof(float) * got.size()) == 0);
      }
    }
  }
}

TEST_CASE("simd vec_dot_rows equals one vec_dot per row, bit for bit", "[cpu][simd]") {
  for (isa level : {isa::scalar, isa::avx2, isa::avx512}) {
    if (!cpu::isa_supported(level)) continue;
    const simd::kernel_table& kt = simd::table(level);
    for (type w : weight_types) {
      // 37 rows: two groups of 16 (the float kernels' matrix-vector path sums 16 rows at once) and 5 more.
      for (int64_t n : lengths_for(w)) {
        INFO("level " << cpu::isa_name(level) << ", weights " << type_name(w) << ", n " << n);
        const int64_t rows = 37;
        const size_t stride = row_size(w, n) + 64;  // rows need not be adjacent
        std::vector<uint8_t> x(stride * rows);
        for (int64_t r = 0; r < rows; ++r) {
          const std::vector<uint8_t> row = quantize_ref(w, random_floats(static_cast<size_t>(n), 40 + static_cast<uint32_t>(r)));
          std::memcpy(x.data() + stride * static_cast<size_t>(r), row.data(), row.size());
        }
        const std::vector<uint8_t> y = quantize_ref(traits(w).vec_dot_type, random_floats(static_cast<size_t>(n), 50));
        std::vector<float> got(rows, -1.0f), want(rows);
        kt.dot_rows(w)(n, rows, got.data(), x.data(), stride, y.data());
        for (int64_t r = 0; r < rows; ++r) kt.dot(w)(n, &want[static_cast<size_t>(r)], x.data() + stride * static_cast<size_t>(r), y.data());
        CHECK(std::memcmp(got.data(), want.data(), sizeof(float) * rows) == 0);
      }
    }
  }
}

TEST_CASE("simd vec_dot_tile equals one vec_dot per element, bit for bit, for batches 1..19", "[cpu][simd]") {
  const std::vector<isa> levels = levels_to_compare();
  if (levels.empty()) return;
  int checked = 0;
  std::vector<isa> compared;  // the levels with tiles of their own
  for (isa level : levels) {
    const simd::kernel_table& kt = simd::table(level);
    for (type w : weight_types) {
      if (kt.dot_tile(w) == nullptr) continue;
      if (compared.empty() || compared.back() != level) compared.push_back(level);
      const type vt = traits(w).vec_dot_type;
      for (int64_t n : lengths_for(w)) {
        const int64_t rows = 7;
        const size_t x_stride = row_size(w, n) + 32;  // rows need not be adjacent
        const size_t y_stride = row_size(vt, n) + 96;
        std::vector<uint8_t> x(x_stride * rows);
        for (int64_t r = 0; r < rows; ++r) {
          const float hi = r % 3 == 2 ? 8.0f : 1.0f;  // rows of larger, skewed values
          const std::vector<uint8_t> row =
              quantize_ref(w, random_floats(static_cast<size_t>(n), 60 + static_cast<uint32_t>(r), -0.5f, hi));
          std::memcpy(x.data() + x_stride * static_cast<size_t>(r), row.data(), row.size());
        }
        for (int64_t cols : {1, 2, 3, 4, 5, 6, 7, 8, 13, 16, 19}) {
          INFO("level " << cpu::isa_name(level) << ", weights " << type_name(w) << ", n " << n << ", batch " << cols);
          std::vector<uint8_t> y(y_stride * static_cast<size_t>(cols));
          for (int64_t c = 0; c < cols; ++c) {
            const std::vector<uint8_t> col =
                quantize_ref(vt, random_floats(static_cast<size_t>(n), 70 + static_cast<uint32_t>(c)));
            std::memcpy(y.data() + y_stride * static_cast<size_t>(c), col.data(), col.size());
          }
          const size_t s_stride = rows + 2;  // gaps between dst columns stay untouched
          std::vector<float> want(s_stride * static_cast<size_t>(cols), -7.0f);
          for (int64_t c = 0; c < cols; ++c) {
            for (int64_t r = 0; r < rows; ++r) {
              kt.dot(w)(n, &want[static_cast<size_t>(c) * s_stride + static_cast<size_t>(r)],
                        x.data() + x_stride * static_cast<size_t>(r), y.data() + y_stride * static_cast<size_t>(c));
            }
          }
          std::vector<float> got(want.size(), -7.0f);
          kt.dot_tile(w)(n, rows, cols, got.data(), s_stride, x.data(), x_stride, y.data(), y_stride);
          CHECK(std::memcmp(got.data(), want.data(), sizeof(float) * got.size()) == 0);
          if (kt.dot_tile_prepared(w) != nullptr) {
            // The same on rows from tile_prepare: the tile reads exactly tile_prepared_size bytes per row (the
            // bytes between rows are garbage).
            const size_t p_stride = kt.prepared_size(w)(n) + 64;
            std::vector<uint8_t> prepared(p_stride * static_cast<size_t>(cols), 0xAB);
            for (int64_t c = 0; c < cols; ++c) {
              kt.prepare_tile(w)(n, y.data() + y_stride * static_cast<size_t>(c),
                                 prepared.data() + p_stride * static_cast<size_t>(c));
            }
            std::vector<float> got_p(want.size(), -7.0f);
            kt.dot_tile_prepared(w)(n, rows, cols, got_p.data(), s_stride, x.data(), x_stride, prepared.data(),
                                    p_stride);
            CHECK(std::memcmp(got_p.data(), want.data(), sizeof(float) * got_p.size()) == 0);
          }
          ++checked;
        }
      }
    }
  }
  CHECK(names_of(compared) == names_of(levels));
  CHECK(checked >= 8 * 4 * 8);  // q4_0, q4_1, q5_0, q5_1, q8_0, q4_K, q5_K, q6_K at least at one level
}

TEST_CASE("simd gemm equals one vec_dot per element, bit for bit, and gives the same bits on every level", "[cpu][simd][gemm]") {
  const std::vector<isa> levels = levels_to_compare();
  if (levels.empty()) return;
  int gemms = 0;
  const type gemm_types[] = {type::q8_0, type::q4_K, type::q6_K};
  // The types with a GEMM, whose elements are computed the same way on every level (q8_0_x86.inc,
  // q4_K_x86.inc, q6_K_x86.inc): each
  // shape's elements at the first level, to compare the others with.
  std::map<std::pair<type, size_t>, std::vector<float>> first_level;
  for (isa level : levels) {
    const simd::kernel_table& kt = simd::table(level);
    for (type w : gemm_types) {
      const type vt = traits(w).vec_dot_type;
      const int64_t bs = traits(w).block_size;
      // In blocks: one block; several chunks of the GEMM's K and a part of one; rows not a multiple of the tile
      // (8 or 16), a single row; one activation row, rows not a multiple of the pass.
      const std::tuple<int64_t, int64_t, int64_t> shapes[] = {{1, 1, 1},  {1, 17, 9},  {8, 16, 8}, {64 * 2 + 3, 19, 13},
                                                              {18, 40, 33}, {64, 8, 1}, {5, 3, 70}};
      for (size_t shape = 0; shape < std::size(shapes); ++shape) {
        const auto [blocks, rows, cols] = shapes[shape];
        const int64_t n = blocks * bs;
        INFO("level " << cpu::isa_name(level) << ", weights " << type_name(w) << ", n " << n << ", rows " << rows
                      << ", batch " << cols);
        const size_t x_stride = row_size(w, n) + 34;  // rows need not be adjacent
        const size_t y_stride = row_size(vt, n) + 96;
        std::vector<uint8_t> x(x_stride * static_cast<size_t>(rows));
        for (int64_t r = 0; r < rows; ++r) {
          const float hi = r % 3 == 2 ? 8.0f : 1.0f;
          std::vector<uint8_t> row =
              quantize_ref(w, random_floats(static_cast<size_t>(n), 90 + static_cast<uint32_t>(r), -0.5f, hi));
          if (w == type::q8_0 && r == 1) row[2] = 0x80;  // a quant of -128 (files may hold one)
          std::memcpy(x.data() + x_stride * static_cast<size_t>(r), row.data(), row.size());
        }
        std::vector<uint8_t> y(y_stride * static_cast<size_t>(cols));
        for (int64_t c = 0; c < cols; ++c) {
          const std::vector<uint8_t> col =
              quantize_ref(vt, random_floats(static_cast<size_t>(n), 110 + static_cast<uint32_t>(c)));
          std::memcpy(y.data() + y_stride * static_cast<size_t>(c), col.data(), col.size());
        }
        const size_t s_stride = static_cast<size_t>(rows) + 3;  // gaps between dst columns stay untouched
        std::vector<float> want(s_stride * static_cast<size_t>(cols), -7.0f);
        float worst = 0;
        for (int64_t c = 0; c < cols; ++c) {
          for (int64_t r = 0; r < rows; ++r) {
            const void* xr = x.data() + x_stride * static_cast<size_t>(r);
            const void* yc = y.data() + y_stride * static_cast<size_t>(c);
            float& e = want[static_cast<size_t>(c) * s_stride + static_cast<size_t>(r)];
            kt.dot(w)(n, &e, xr, yc);
            float ref = 0;  // within float-accumulation error of the reference dot product
            traits(w).vec_dot(n, &ref, xr, yc);
            worst = std::max(worst, std::fabs(e - ref) / std::max(1.0f, std::fabs(ref)));
          }
        }
        CHECK(worst < 1e-4f);
        // The tiles are the dot product's elements (the other tests check that for every type); the elements
        // are the same on every level.
        std::vector<float> tile(want.size(), -7.0f);
        kt.dot_tile(w)(n, rows, cols, tile.data(), s_stride, x.data(), x_stride, y.data(), y_stride);
        CHECK(std::memcmp(tile.data(), want.data(), sizeof(float) * want.size()) == 0);
        const auto [it, added] = first_level.emplace(std::make_pair(w, shape), want);
        if (!added) CHECK(std::memcmp(it->second.data(), want.data(), sizeof(float) * want.size()) == 0);
        REQUIRE(kt.gemm_of(w) != nullptr);
        // The GEMM reads exactly gemm_prepared_size bytes per prepared row (the bytes between rows are garbage).
        const size_t p_stride = kt.gemm_size(w)(n) + 40;
        std::vector<uint8_t> prepared(p_stride * static_cast<size_t>(cols), 0xAB);
        for (int64_t c = 0; c < cols; ++c) {
          kt.prepare_gemm(w)(n, y.data() + y_stride * static_cast<size_t>(c), prepared.data() + p_stride * static_cast<size_t>(c));
        }
        std::vector<float> got(want.size(), -7.0f);
        kt.gemm_of(w)(n, rows, cols, got.data(), s_stride, x.data(), x_stride, prepared.data(), p_stride);
        CHECK(std::memcmp(got.data(), want.data(), sizeof(float) * got.size()) == 0);
        ++gemms;
      }
    }
  }
  CHECK(gemms >= 7);  // q8_0 at least at one level
  CHECK(gemms == static_cast<int>(std::size(gemm_types)) * 7 * static_cast<int>(levels.size()));  // every level
}
