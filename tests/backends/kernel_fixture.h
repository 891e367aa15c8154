// Helpers the CPU kernel tests share (test_cpu_kernels, test_cpu_kernels_copy, test_cpu_kernels_mul_mat,
// test_cpu_kernels_attention): an arena, running a node on n threads, reading and writing elements of any
// layout in double, seeded fills, quantized rows, and checking a result against expected values and bounds.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <random>
#include <thread>
#include <vector>

#include "backends/cpu/kernels.h"
#include "runtime/context.h"
#include "runtime/fp16.h"
#include "runtime/ops.h"

namespace troupe::test::kernel_fixture {

inline context_params arena(size_t mb = 16) { return {.max_tensors = 256, .mem_size = mb << 20, .no_alloc = false}; }

// Runs node on nth threads (std::barrier for syncs) with a fresh, 64-byte aligned work buffer.
inline void compute(tensor& node, int nth = 1, bool reference = true) {
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

inline char* at(const tensor& t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
  return static_cast<char*>(t.data) + i0 * static_cast<int64_t>(t.nb[0]) + i1 * static_cast<int64_t>(t.nb[1]) +
         i2 * static_cast<int64_t>(t.nb[2]) + i3 * static_cast<int64_t>(t.nb[3]);
}

inline double get(const tensor& t, int64_t i0, int64_t i1 = 0, int64_t i2 = 0, int64_t i3 = 0) {
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

inline void set(const tensor& t, double v, int64_t i0, int64_t i1 = 0, int64_t i2 = 0, int64_t i3 = 0) {
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
inline void for_each(const tensor& t, const std::function<void(int64_t, int64_t, int64_t, int64_t)>& f) {
  for (int64_t i3 = 0; i3 < t.ne[3]; ++i3)
    for (int64_t i2 = 0; i2 < t.ne[2]; ++i2)
      for (int64_t i1 = 0; i1 < t.ne[1]; ++i1)
        for (int64_t i0 = 0; i0 < t.ne[0]; ++i0) f(i0, i1, i2, i3);
}

// The tensor's elements in row-major order, as doubles.
inline std::vector<double> values(const tensor& t) {
  std::vector<double> v;
  for_each(t, [&](int64_t i0, int64_t i1, int64_t i2, int64_t i3) { v.push_back(get(t, i0, i1, i2, i3)); });
  return v;
}

inline void fill(const tensor& t, const std::vector<double>& v) {
  size_t k = 0;
  for_each(t, [&](int64_t i0, int64_t i1, int64_t i2, int64_t i3) { set(t, v[k++], i0, i1, i2, i3); });
}

inline std::vector<double> random_values(size_t n, uint32_t seed, double lo = -1.0, double hi = 1.0) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v(n);
  for (auto& x : v) x = static_cast<float>(dist(rng));  // representable in f32
  return v;
}

inline void fill_random(const tensor& t, uint32_t seed, double lo = -1.0, double hi = 1.0) {
  fill(t, random_values(static_cast<size_t>(nelements(t)), seed, lo, hi));
}

// Largest |got - expected| over the tensor's elements in row-major order (infinite for a NaN or a size
// mismatch; equal infinities count as equal).
inline double max_diff(const tensor& got, const std::vector<double>& expected) {
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
inline void quantize_into(const tensor& t, const std::vector<double>& v) {
  const int64_t ne0 = t.ne[0];
  std::vector<float> row(static_cast<size_t>(ne0));
  for (int64_t r = 0; r < nrows(t); ++r) {
    for (int64_t i = 0; i < ne0; ++i)
      row[static_cast<size_t>(i)] = static_cast<float>(v[static_cast<size_t>(r * ne0 + i)]);
    traits(t.type).from_float_ref(row.data(),
                                  at(t, 0, r % t.ne[1], (r / t.ne[1]) % t.ne[2], r / (t.ne[1] * t.ne[2])), ne0);
  }
}

inline std::vector<float> dequantize_row(const tensor& t, int64_t i1, int64_t i2 = 0, int64_t i3 = 0) {
  std::vector<float> row(static_cast<size_t>(t.ne[0]));
  traits(t.type).to_float(at(t, 0, i1, i2, i3), row.data(), t.ne[0]);
  return row;
}

// Expected values of a result, and a per-element bound on the error of each (within() checks a result).
struct mm_expect {
  std::vector<double> value;
  std::vector<double> bound;
};

inline bool within(const tensor& got, const mm_expect& e) {
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

inline std::vector<uint8_t> bytes_of(const tensor& t) {
  const char* p = static_cast<const char*>(t.data);
  return {p, p + nbytes(t)};
}

}  // namespace troupe::test::kernel_fixture
