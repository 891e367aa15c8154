// Helpers the quantized-format tests share (test_quants, test_quants_golden, test_quants_ggml): seeded input
// distributions, quantize / dequantize through the type table, and zero-filled blocks.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "runtime/quants.h"
#include "runtime/types.h"

namespace troupe::test::quant_fixture {

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

inline const std::vector<distribution>& distributions() {
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

inline std::vector<float> make_data(const distribution& d, int n, uint32_t seed) {
  rng r(seed);
  std::vector<float> x(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) x[static_cast<size_t>(i)] = d.gen(r, i);
  return x;
}

inline std::vector<uint8_t> quantize(type t, const std::vector<float>& x) {
  std::vector<uint8_t> q(row_size(t, static_cast<int64_t>(x.size())));
  traits(t).from_float_ref(x.data(), q.data(), static_cast<int64_t>(x.size()));
  return q;
}

inline std::vector<float> dequantize(type t, const std::vector<uint8_t>& q, int64_t n) {
  std::vector<float> y(static_cast<size_t>(n));
  traits(t).to_float(q.data(), y.data(), n);
  return y;
}

template <class block>
inline block zeroed() {
  block b;
  std::memset(&b, 0, sizeof b);
  return b;
}

}  // namespace troupe::test::quant_fixture
