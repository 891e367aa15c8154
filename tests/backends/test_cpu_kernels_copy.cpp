// The CPU kernels that move data, each against a naive implementation written here: cpy between f32, f16,
// bf16 and block types into strided and reshaped destinations, get_rows and set_rows (out-of-range indices
// included), concat along every dim, and pad.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <vector>

#include "backends/cpu/kernels.h"
#include "runtime/context.h"
#include "runtime/error.h"
#include "runtime/ops.h"
#include "tests/backends/kernel_fixture.h"

using namespace troupe;
using namespace troupe::test::kernel_fixture;

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
