// What of the CUDA backend can be checked without a GPU (CI has none): the weights its kernels read are the
// CPU's blocks, value for value; the 8-bit dot products against the exact sums; launch geometry for every
// shape class; the dispatch between cuBLAS and its own kernels; cuBLAS's products over plan()'s arguments
// against the CPU backend's; and the whole op table through the backend's own plan and kernels, every thread
// of them run on the host (host_run.h), against the CPU reference.
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cuda/kernels/bodies.h"
#include "backends/cuda/plan.h"
#include "runtime/ops.h"
#include "runtime/quants.h"
#include "tests/backends/conformance_cases.h"
#include "tests/backends/conformance_runner.h"
#include "tests/backends/cuda/host_run.h"

using namespace troupe;
using namespace troupe::cuda::kern;

namespace {

const std::vector<type> weight_types = {type::f32,  type::f16,  type::bf16, type::q4_0, type::q4_1, type::q5_0, type::q5_1,
                                        type::q8_0, type::q2_K, type::q3_K, type::q4_K, type::q5_K, type::q6_K};


std::vector<float> random_values(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// A row of n values in type t, as the CPU's reference quantizer writes it.
std::vector<uint8_t> quantized_row(type t, const std::vector<float>& x) {
  std::vector<uint8_t> row(row_size(t, static_cast<int64_t>(x.size())));
  traits(t).from_float_ref(x.data(), row.data(), static_cast<int64_t>(x.size()));
  return row;
}

}  // namespace

TEST_CASE("the CUDA kernels read every weight type value for value as the CPU dequantizes it", "[cuda]") {
  const int64_t n = 1024;
  for (type t : weight_types) {
    INFO("type " << type_name(t));
    const auto x = random_values(n, 7);
    const auto row = quantized_row(t, x);
    std::vector<float> ref(n);
    traits(t).to_float(row.data(), ref.data(), n);
    int64_t differ = 0;
    with_weight_type(t, [&](auto tc) {
      for (int64_t i = 0; i < n; ++i) differ += load_weight<decltype(tc)::value>(row.data(), i) != ref[static_cast<size_t>(i)] ? 1 : 0;
    });
    CHECK(differ == 0);
  }
}

TEST_CASE("the CUDA kernels' packed-scale readers are the CPU's", "[cuda]") {
  std::mt19937 rng(3);
  for (int rep = 0; rep < 200; ++rep) {
    uint8_t q[12];
    for (uint8_t& b : q) b = static_cast<uint8_t>(rng());
    for (int j = 0; j < 8; ++j) {
      uint8_t sc = 0, m = 0;
      get_scale_min_k4(j, q, &sc, &m);
      int sc2 = 0, m2 = 0;
      scale_min_k4(j, q, sc2, m2);
      CHECK(sc2 == sc);
      CHECK(m2 == m);
    }
    for (int j = 0; j < 16; ++j) CHECK(scale_q3_K(q, j) == q3_K_scale(q, j) - 32);
  }
}

TEST_CASE("dp4a and vsub4 as the device computes them: signed bytes, no carries between bytes", "[cuda]") {
  CHECK(dp4a(0x01020304, 0x01010101, 5) == 1 + 2 + 3 + 4 + 5);
  CHECK(dp4a(static_cast<int>(0xFF80017Fu), 0x02020202, 0) == 2 * (-1 - 128 + 1 + 127));
  CHECK(vsub4(0x00010203, 0x01010101) == static_cast<int>(0xFF000102u));
  CHECK(vsub4(0x3F200000, 0x20202020) == static_cast<int>(0x1F00E0E0u));
}

TEST_CASE("activations quantized to 8 bits and each quantized type's dot32 give the exact sum of their products", "[cuda]") {
  const int64_t k = 512;
  const auto act = random_values(static_cast<size_t>(k), 11);
  // quantize_block over a [k, 1] f32 tensor: d = max |x| / 127, round half away from zero.
  std::vector<act_block> blocks(static_cast<size_t>(k / 32));
  quantize_args qa{};
  qa.b.p = reinterpret_cast<uint8_t*>(const_cast<float*>(act.data()));
  qa.b.nb[0] = 4;
  qa.b.nb[1] = qa.b.nb[2] = qa.b.nb[3] = 4 * k;
  qa.k = k;
  qa.n = qa.ne2 = qa.ne3 = 1;
  qa.q = blocks.data();
  test::run_on_host(cuda::quantize_step{qa});  // the kernel, a warp per 32 values, every thread of it
  std::vector<float> act_q(static_cast<size_t>(k));  // the activations as the blocks hold them
  for (int64_t i = 0; i < k; ++i) {
    const act_block& b = blocks[static_cast<size_t>(i / 32)];
    const int q = reinterpret_cast<const int8_t*>(b.q)[i % 32];
    act_q[static_cast<size_t>(i)] = b.d * static_cast<float>(q);
    CHECK(std::abs(act_q[static_cast<size_t>(i)] - act[static_cast<size_t>(i)]) <= b.d / 2 * 1.0001f);
  }
  for (const act_block& b : blocks) {
    int qs = 0;
    for (int t = 0; t < 32; ++t) qs += reinterpret_cast<const int8_t*>(b.q)[t];
    CHECK(b.sum == Approx(b.d * static_cast<float>(qs)));
  }
  for (type t : weight_types) {
    if (is_float_type(t)) continue;
    INFO("type " << type_name(t));
    const auto w = random_values(static_cast<size_t>(k), 5);
    const auto row = quantized_row(t, w);
    std::vector<float> wd(static_cast<size_t>(k));
    traits(t).to_float(row.data(), wd.data(), k);
    double exact = 0, mag = 0;
    for (size_t i = 0; i < wd.size(); ++i) {
      exact += static_cast<double>(wd[i]) * act_q[i];
      mag += std::abs(static_cast<double>(wd[i]) * act_q[i]);
    }
    double got = 0;
    with_weight_type(t, [&](auto tc) {
      constexpr type T = decltype(tc)::value;
      if constexpr (!is_float_type(T)) {
        for (int64_t j = 0; j < k / 32; ++j) got += dot32<T>(row.data(), j, blocks[static_cast<size_t>(j)]);
      }
    });
    CHECK(std::abs(got - exact) <= 1e-5 * mag);
  }
}

TEST_CASE("CUDA launch geometry: element-wise grids stride over every unit once, rows and matrix rows fit the limits", "[cuda]") {
  using namespace troupe::cuda;
  // Element-wise: one unit, a tail, exact multiples, and more units than the grid holds.
  for (int64_t n : {int64_t{1}, int64_t{255}, int64_t{256}, int64_t{257}, int64_t{100000}, int64_t{1} << 40}) {
    INFO("units " << n);
    unary_args a{};
    a.ne[0] = n;
    a.ne[1] = a.ne[2] = a.ne[3] = 1;
    const step s = unary_step{a};
    REQUIRE(units_of(s) == n);
    const launch_dims d = dims_of(s);
    CHECK(d.block == elementwise_block);
    CHECK(d.grid_x >= 1);
    CHECK(d.grid_x <= max_grid_x);
    CHECK(d.grid_y == 1);
    if (n <= int64_t{max_grid_x} * elementwise_block) CHECK(int64_t{d.grid_x} * d.block >= n);
    if (n <= 100000) {  // the kernel's grid-stride loop, thread by thread: every unit exactly once
      std::vector<int> hits(static_cast<size_t>(n));
      const int64_t stride = int64_t{d.grid_x} * d.block;
      for (uint32_t b = 0; b < d.grid_x; ++b) {
        for (uint32_t t = 0; t < d.block; ++t) {
          for (int64_t i = int64_t{b} * d.block + t; i < n; i += stride) ++hits[static_cast<size_t>(i)];
        }
      }
      CHECK(std::all_of(hits.begin(), hits.end(), [](int h) { return h == 1; }));
    }
  }
  // Rows: a warp for short rows, whole warps up to 256 threads for longer ones; a block per row.
  CHECK(row_block(1) == 32);
  CHECK(row_block(32) == 32);
  CHECK(row_block(33) == 64);
  CHECK(row_block(200) == 224);
  CHECK(row_block(4096) == 256);
  rows_args r{};
  r.ne[0] = 576;
  r.ne[1] = 7;
  r.ne[2] = 3;
  r.ne[3] = 1;
  r.op = 4;
  CHECK(dims_of(rows_step{r}).grid_x == 21);
  CHECK(dims_of(rows_step{r}).block == 256);
  r.op = 3;  // argmax: one thread walks the row
  CHECK(dims_of(rows_step{r}).block == 32);
  // Matrix-vector: a warp per output row, 4 per block; planes in y up to the hardware limit.
  mat_vec_args mv{};
  mv.m = 4097;
  mv.n = 1;
  mv.ne2 = 32;
  mv.ne3 = 1;
  launch_dims d = dims_of(mat_vec_step{mv});
  CHECK(d.block == 128);
  CHECK(d.grid_x == 1025);
  CHECK(d.grid_y == 32);
  mv.ne2 = 70000;
  CHECK(dims_of(mat_vec_step{mv}).grid_y == max_grid_y);
  // Activation quantization: a warp per 32 values, 8 per block.
  quantize_args q{};
  q.k = 4096;
  q.n = 3;
  q.ne2 = q.ne3 = 1;
  CHECK(units_of(quantize_step{q}) == 384);
  CHECK(dims_of(quantize_step{q}).grid_x == 48);
}

TEST_CASE("CUDA matrix products: own kernels up to 8 columns, cuBLAS beyond, quantized activations for quantized weights", "[cuda]") {
  using cuda::matmul_path;
  for (type t : weight_types) {
    INFO("type " << type_name(t));
    const bool fl = is_float_type(t);
    CHECK(cuda::choose_matmul(t, 1) == (fl ? matmul_path::mat_vec_float : matmul_path::mat_vec_q));
    CHECK(cuda::choose_matmul(t, 8) == (fl ? matmul_path::mat_vec_float : matmul_path::mat_vec_q));
    CHECK(cuda::choose_matmul(t, 9) == (fl ? matmul_path::cublas : matmul_path::cublas_dequant));
    CHECK(cuda::choose_matmul(t, 512) == (fl ? matmul_path::cublas : matmul_path::cublas_dequant));
  }
  // The steps plan() makes, and the scratch memory they ask for.
  const auto steps_of = [](type wt, int64_t n, test::host_scratch& s) {
    context ctx({.max_tensors = 8, .no_alloc = true});
    tensor* w = ctx.new_tensor_2d(wt, 256, 64);
    tensor* x = ctx.new_tensor_2d(type::f32, 256, n);
    tensor* y = mul_mat(ctx, w, x);
    std::vector<std::string> names;
    std::vector<int64_t> cols;
    for (const cuda::step& st : cuda::plan(*y, s)) {
      names.emplace_back(cuda::step_name(st));
      if (const auto* mv = std::get_if<cuda::mat_vec_step>(&st)) cols.push_back(mv->a.c0 * 100 + mv->a.n);
    }
    return std::pair{names, cols};
  };
  test::host_scratch s;
  auto [names, cols] = steps_of(type::q4_K, 1, s);
  CHECK(names == std::vector<std::string>{"quantize", "mat_vec"});
  CHECK(s.requested(0) == 8 * sizeof(act_block));
  std::tie(names, cols) = steps_of(type::q4_K, 7, s);
  CHECK(names == std::vector<std::string>{"quantize", "mat_vec", "mat_vec", "mat_vec"});
  CHECK(cols == std::vector<int64_t>{4, 402, 601});  // columns 0..3, 4..5, 6
  std::tie(names, cols) = steps_of(type::f16, 3, s);
  CHECK(names == std::vector<std::string>{"mat_vec", "mat_vec"});
  std::tie(names, cols) = steps_of(type::f16, 64, s);
  CHECK(names == std::vector<std::string>{"cpy", "gemm"});
  CHECK(s.requested(0) == 256 * 64 * 2);  // the activations as f16
  std::tie(names, cols) = steps_of(type::q8_0, 64, s);
  CHECK(names == std::vector<std::string>{"cpy", "dequant", "gemm"});
  CHECK(s.requested(1) == 256 * 64 * 2);  // the weights as f16
}

TEST_CASE("CUDA's cuBLAS products, over plan()'s arguments, give the CPU backend's products", "[cuda]") {
  // Beyond 8 activation columns: broadcast weights over both batch dimensions, a permuted b, weights read
  // through a view whose rows are longer than k; each compared with what backends/cpu computes for the node.
  struct product {
    const char* name;
    double max_nmse;  // against the CPU backend: f16 / bf16 activations round the same way; quantized
                      // weights meet 8-bit activations on the CPU, f16 ones here
    std::function<tensor*(testing::case_builder&)> build;
  };
  const auto broadcast = [](type wt, int64_t k) {
    return [wt, k](testing::case_builder& b) {
      return mul_mat(b.ctx(), b.input(wt, {k, 20, 2, 1}), b.input(type::f32, {k, 12, 4, 3}));  // r2 = 2, r3 = 3
    };
  };
  const std::vector<product> products = {
      {"f32 broadcast", 1e-9, broadcast(type::f32, 96)},
      {"f16 broadcast", 1e-5, broadcast(type::f16, 96)},
      {"bf16 broadcast", 1e-5, broadcast(type::bf16, 96)},
      {"q8_0 broadcast", 5e-4, broadcast(type::q8_0, 96)},
      {"q4_K broadcast", 5e-4, broadcast(type::q4_K, 256)},
      {"f16 permuted b", 1e-5,
       [](testing::case_builder& b) {
         tensor* bt = b.input(type::f32, {64, 4, 16, 1});  // [k, heads, tokens] read as [k, tokens, heads]
         return mul_mat(b.ctx(), b.input(type::f16, {64, 20, 2, 1}), permute(b.ctx(), bt, 0, 2, 1, 3));
       }},
      {"f32 weights view", 1e-9,
       [](testing::case_builder& b) {
         tensor* w = b.input(type::f32, {96, 30, 1, 1});
         return mul_mat(b.ctx(), view_2d(b.ctx(), w, 64, 30, w->nb[1], 16 * sizeof(float)), b.input(type::f32, {64, 10, 1, 1}));
       }},
  };
  auto dev = test::make_emulated_cuda_device();
  backend_ptr cuda_be = dev->init_backend();
  auto cpu_be = cpu::make_cpu_backend();
  for (size_t i = 0; i < products.size(); ++i) {
    const product& p = products[i];
    INFO("product " << p.name);
    const testing::op_case c{p.name, p.max_nmse, p.build};
    const int gemms = test::host_steps_run()["gemm"];
    std::string unsupported;
    const auto got = testing::run_case(c, 1000 + i, *cuda_be, &unsupported);
    INFO("unsupported: " << unsupported);
    REQUIRE(got.has_value());
    CHECK(test::host_steps_run()["gemm"] > gemms);  // cuBLAS's path, not the matrix-vector kernels
    const auto ref = testing::run_case(c, 1000 + i, *cpu_be, nullptr);
    REQUIRE(ref.has_value());
    // The NMSE bound, and every element within the bound the conformance runner derives for a product.
    testing::check_result(c, *got, *ref, testing::element_bounds(c, 1000 + i, *ref));
  }
}

TEST_CASE("the CUDA device says which ops it does not compute, and plan refuses them", "[cuda]") {
  context ctx({.max_tensors = 64, .no_alloc = true});
  tensor* x = ctx.new_tensor_2d(type::f32, 64, 4);
  tensor* q = cpy(ctx, x, ctx.new_tensor_2d(type::q4_0, 64, 4));
  CHECK_FALSE(cuda::supports(*q));  // quantizing copies: not written (set_rows into the KV cache's types is)
  CHECK(cuda::supports(*soft_max(ctx, x, nullptr, 0.5f)));
  tensor* w = ctx.new_tensor_2d(type::f32, 64, 64);
  CHECK(cuda::supports(*mul_mat(ctx, w, x)));
  tensor* idx = ctx.new_tensor_1d(type::i32, 4);
  for (type kv : {type::q8_0, type::q4_0, type::q4_1, type::q5_0, type::q5_1, type::iq4_nl}) {  // the KV cache's types
    CHECK(cuda::supports(*set_rows(ctx, ctx.new_tensor_2d(kv, 64, 8), x, idx)));
  }
  tensor* x256 = ctx.new_tensor_2d(type::f32, 256, 4);
  CHECK_FALSE(cuda::supports(*set_rows(ctx, ctx.new_tensor_2d(type::q4_K, 256, 8), x256, idx)));  // not a KV cache type
  test::host_scratch s;
  CHECK_THROWS_WITH(cuda::plan(*q, s), Catch::Contains("CUDA") && Catch::Contains("not supported"));
}

TEST_CASE("every conformance case the CUDA backend claims matches the CPU reference through its plan and kernel bodies", "[cuda][conformance]") {
  auto dev = test::make_emulated_cuda_device();
  backend_ptr be = dev->init_backend();
  auto compared = testing::compare_supported_cases(*be);
  // Every op and case the GPU backends claim, every matrix product (so both own kernels and both cuBLAS
  // paths).
  testing::check_gpu_coverage(compared);
  for (const char* s : {"quantize", "mat_vec", "dequant", "gemm"}) {
    INFO("step " << s);
    CHECK(test::host_steps_run()[s] > 0);
  }
}
