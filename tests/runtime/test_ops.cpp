// Op construction: result shapes, parameters, and errors that name the op, the shapes and the types.
#include <catch2/catch.hpp>

#include "runtime/context.h"
#include "runtime/error.h"
#include "runtime/ops.h"

using namespace troupe;

namespace {
using shape = std::array<int64_t, 4>;
}

TEST_CASE("result shapes of ops", "[ops]") {
  context ctx({.max_tensors = 64, .no_alloc = true});
  tensor* w = ctx.new_tensor_2d(type::q4_K, 256, 96);
  tensor* x = ctx.new_tensor_3d(type::f32, 256, 7, 2);
  CHECK(mul_mat(ctx, w, x)->ne == shape{96, 7, 2, 1});

  tensor* emb = ctx.new_tensor_2d(type::q8_0, 64, 100);
  tensor* ids = ctx.new_tensor_1d(type::i32, 5);
  tensor* rows = get_rows(ctx, emb, ids);
  CHECK(rows->ne == shape{64, 5, 1, 1});
  CHECK(rows->type == type::f32);

  tensor* a = ctx.new_tensor_3d(type::f32, 10, 4, 3);
  CHECK(glu(ctx, a, nullptr, glu_kind::swiglu)->ne == shape{5, 4, 3, 1});
  CHECK(concat(ctx, a, a, 1)->ne == shape{10, 8, 3, 1});
  CHECK(pad(ctx, a, 2, 0, 1)->ne == shape{12, 4, 4, 1});
  CHECK(sum_rows(ctx, a)->ne == shape{1, 4, 3, 1});
  tensor* am = argmax(ctx, ctx.new_tensor_2d(type::f32, 50, 3));
  CHECK(am->ne == shape{3, 1, 1, 1});
  CHECK(am->type == type::i32);

  tensor* s = scale(ctx, a, 0.5f, 1.0f);
  CHECK(s->param<float>(0) == 0.5f);
  CHECK(s->param<float>(1) == 1.0f);

  tensor* cache = ctx.new_tensor_2d(type::f16, 64, 32);
  tensor* src = ctx.new_tensor_2d(type::f32, 64, 3);
  tensor* idx = ctx.new_tensor_1d(type::i64, 3);
  tensor* sr = set_rows(ctx, cache, src, idx);
  CHECK(sr->view_src == cache);
  CHECK(sr->op == op::set_rows);

  tensor* c = cpy(ctx, src, ctx.new_tensor_2d(type::q8_0, 64, 3));
  CHECK(c->type == type::q8_0);
  CHECK(c->op == op::cpy);
}

TEST_CASE("rope parameters round-trip through the node", "[ops][rope]") {
  context ctx({.max_tensors = 8, .no_alloc = true});
  tensor* q = ctx.new_tensor_3d(type::f32, 64, 4, 9);
  tensor* pos = ctx.new_tensor_1d(type::i32, 9);
  rope_params p;
  p.n_dims = 32;
  p.mode = rope_mode::neox;
  p.freq_base = 1e6f;
  p.freq_scale = 0.25f;
  p.ext_factor = 1.0f;
  p.n_ctx_orig = 4096;
  tensor* r = rope(ctx, q, pos, nullptr, p);
  const rope_params back = rope_params_of(*r);
  CHECK(back.n_dims == 32);
  CHECK(back.mode == rope_mode::neox);
  CHECK(back.freq_base == 1e6f);
  CHECK(back.freq_scale == 0.25f);
  CHECK(back.ext_factor == 1.0f);
  CHECK(back.n_ctx_orig == 4096);

  p.n_dims = 65;
  CHECK_THROWS_WITH(rope(ctx, q, pos, nullptr, p), Catch::Contains("rope") && Catch::Contains("n_dims"));
  p.n_dims = 64;
  tensor* wrong_pos = ctx.new_tensor_1d(type::i32, 8);
  CHECK_THROWS_WITH(rope(ctx, q, wrong_pos, nullptr, p), Catch::Contains("pos must be 1-D with a.ne[2]"));
}

TEST_CASE("building an op with incompatible sources names the op, the shapes and the types", "[ops][errors]") {
  context ctx({.max_tensors = 32, .no_alloc = true});
  tensor* w = ctx.new_tensor_2d(type::q4_0, 64, 16);
  w->set_name("wq");
  tensor* x = ctx.new_tensor_2d(type::f32, 32, 3);
  x->set_name("x");

  CHECK_THROWS_AS(mul_mat(ctx, w, x), op_error);
  CHECK_THROWS_WITH(mul_mat(ctx, w, x), "mul_mat: a.ne[0] != b.ne[0]: a = wq [64, 16, 1, 1] q4_0, b = x [32, 3, 1, 1] f32");

  tensor* xf16 = ctx.new_tensor_2d(type::f16, 64, 3);
  CHECK_THROWS_WITH(mul_mat(ctx, w, xf16), Catch::Contains("b must be f32") && Catch::Contains("f16"));

  tensor* y = ctx.new_tensor_2d(type::f32, 3, 32);
  CHECK_THROWS_WITH(add(ctx, x, y), Catch::StartsWith("add: b cannot be broadcast") && Catch::Contains("[3, 32, 1, 1]"));
  CHECK_THROWS_WITH(concat(ctx, x, y, 0), Catch::Contains("concat: a and b differ in dimension 1"));
  CHECK_THROWS_WITH(get_rows(ctx, w, x), Catch::Contains("get_rows: idx must be i32 or i64"));
  CHECK_THROWS_WITH(soft_max(ctx, x, y, 1.0f), Catch::Contains("soft_max: mask must be"));
  CHECK_THROWS_WITH(glu(ctx, ctx.new_tensor_1d(type::f32, 5), nullptr, glu_kind::geglu),
                    Catch::Contains("glu: a.ne[0] must be even"));
  CHECK_THROWS_WITH(cpy(ctx, x, ctx.new_tensor_1d(type::f32, 95)), Catch::Contains("cpy: a and b must have the same number"));
  CHECK_THROWS_WITH(add(ctx, nullptr, x), "add: a is null");

  tensor* wide = ctx.new_tensor_2d(type::f64, 256, 4);
  wide->set_name("blk.0.ffn_up.weight");
  CHECK_THROWS_WITH(mul_mat(ctx, wide, ctx.new_tensor_2d(type::f32, 256, 1)),
                    Catch::Contains("mul_mat: a's type cannot be multiplied") && Catch::Contains("f64"));
}
