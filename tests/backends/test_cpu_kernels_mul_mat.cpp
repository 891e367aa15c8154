// The CPU mul_mat kernels against a double-precision product over the weights' dequantized rows: every
// supported weight type on 1 and 3 threads, batched decode rows bit for bit, strided and transposed sources,
// work sizes and the BLAS path, and the BLAS crossover table.
#include <catch2/catch.hpp>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <random>
#include <vector>

#include "backends/cpu/cpu_features.h"
#include "backends/cpu/simd/simd.h"
#include "backends/cpu/kernels.h"
#include "runtime/context.h"
#include "runtime/error.h"
#include "runtime/ops.h"
#include "tests/backends/kernel_fixture.h"
#include "tests/support/random_blocks.h"

using namespace troupe;
using namespace troupe::test::kernel_fixture;

namespace {

// mul_mat in double over a's dequantized rows, and a per-element bound on the error that converting b to
// a's vec_dot_type (and float accumulation) may add.
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

TEST_CASE("kernels: mul_mat of several rows of b (batched decode, a prompt) equals each row alone, bit for bit",
          "[cpu][kernels][mul_mat]") {
  // Several sequences decoding at once multiply the weights by 2..8 activation rows; the quantized types
  // have tile kernels for that (each weight block decoded once for several rows). Each column must be
  // within the reference's bound and identical to the product of its row alone, whatever the batch and
  // the thread count, so that a sequence's tokens do not depend on the others in its batch.
  // 17 and 40 rows: a prompt's batch, through the GEMM where a type has one (q8_0, q4_K, q6_K), still each
  // row's product alone. k = 512: the activation rows prepared for the tile kernels where a type has that
  // (AVX-512 q4_0, q4_1, q5_0, q5_1, and f16 against rows converted to f32); k = 4096 with 4 or more rows: too
  // big to prepare, the tiles read the converted rows.
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
    for (int64_t n : {2, 3, 4, 5, 8, 17, 40}) {
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

TEST_CASE("kernels: mul_mat's kernel family by weight type and batch, as troupe bench reports it", "[cpu][kernels][mul_mat]") {
  const cpu::simd::kernel_table& kt = cpu::simd::active_table();
  cpu::set_blas_min_batch(-1);  // BLAS off, whatever TROUPE_CPU_BLAS says
  if (kt.level == cpu::isa::scalar) {
    const std::string family = cpu::mul_mat_kernel_family(type::q8_0, 64);
    CHECK((family == "rows" || family == "dot"));
  } else {
    // q8_0, q4_K, q6_K: the GEMM from a prompt-sized batch (16 rows), tiles below; q4_1 has no GEMM.
    for (type t : {type::q8_0, type::q4_K, type::q6_K}) {
      INFO(type_name(t));
      CHECK(std::string(cpu::mul_mat_kernel_family(t, 64)) == "gemm");
      CHECK(std::string(cpu::mul_mat_kernel_family(t, 16)) == "gemm");
      CHECK(std::string(cpu::mul_mat_kernel_family(t, 15)) == "tile");
      CHECK(std::string(cpu::mul_mat_kernel_family(t, 1)) == "tile");
    }
    CHECK(std::string(cpu::mul_mat_kernel_family(type::q4_1, 64)) == "tile");
  }
#ifdef TROUPE_HAVE_BLAS
  cpu::set_blas_min_batch(32);
  CHECK(std::string(cpu::mul_mat_kernel_family(type::q8_0, 32)) == "blas");
  CHECK(std::string(cpu::mul_mat_kernel_family(type::q8_0, 31)) != "blas");
#endif
  cpu::set_blas_min_batch(0);
}
