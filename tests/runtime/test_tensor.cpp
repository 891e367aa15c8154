// Tensors, views, permutes, contexts and their capacity errors.
#include <catch2/catch.hpp>

#include <cstring>

#include "runtime/context.h"
#include "runtime/error.h"
#include "runtime/ops.h"

using namespace troupe;

TEST_CASE("dense tensors have block strides", "[tensor]") {
  context ctx({.max_tensors = 8, .no_alloc = true});
  tensor* f = ctx.new_tensor_3d(type::f32, 10, 4, 3);
  CHECK(f->nb[0] == 4);
  CHECK(f->nb[1] == 40);
  CHECK(f->nb[2] == 160);
  CHECK(f->nb[3] == 480);
  CHECK(nbytes(*f) == 480);
  CHECK(nelements(*f) == 120);
  CHECK(nrows(*f) == 12);
  CHECK(n_dims(*f) == 3);
  CHECK(is_contiguous(*f));

  tensor* q = ctx.new_tensor_2d(type::q4_0, 64, 3);  // 2 blocks of 18 bytes per row
  CHECK(q->nb[0] == 18);
  CHECK(q->nb[1] == 36);
  CHECK(nbytes(*q) == 108);

  tensor* k = ctx.new_tensor_2d(type::q6_K, 512, 2);  // 2 super-blocks of 210 bytes per row
  CHECK(nbytes(*k) == 840);
}

TEST_CASE("a row length that is not a multiple of the block size is refused", "[tensor]") {
  context ctx({.max_tensors = 8, .no_alloc = true});
  CHECK_THROWS_WITH(ctx.new_tensor_1d(type::q4_K, 100),
                    Catch::Contains("not a multiple of the block size 256") && Catch::Contains("q4_K"));
}

TEST_CASE("transpose and permute move strides, not data", "[tensor][view]") {
  context ctx({.max_tensors = 16, .mem_size = 4096});
  tensor* a = ctx.new_tensor_4d(type::f32, 2, 3, 4, 5);
  tensor* t = transpose(ctx, a);
  CHECK(t->ne == std::array<int64_t, 4>{3, 2, 4, 5});
  CHECK(t->nb[0] == a->nb[1]);
  CHECK(t->nb[1] == a->nb[0]);
  CHECK(t->data == a->data);
  CHECK(t->view_src == a);
  CHECK(is_transposed(*t));
  CHECK_FALSE(is_contiguous(*t));

  tensor* p = permute(ctx, a, 2, 0, 3, 1);  // dim 0 of a -> dim 2, dim 1 -> 0, dim 2 -> 3, dim 3 -> 1
  CHECK(p->ne == std::array<int64_t, 4>{3, 5, 2, 4});
  CHECK(p->nb == std::array<size_t, 4>{a->nb[1], a->nb[3], a->nb[0], a->nb[2]});
  CHECK(is_permuted(*p));
  CHECK(p->param<int32_t>(0) == 2);

  CHECK_THROWS_WITH(permute(ctx, a, 0, 0, 1, 2), Catch::Contains("not a permutation"));
}

TEST_CASE("views of views point at the root with summed offsets", "[tensor][view]") {
  context ctx({.max_tensors = 16, .mem_size = 4096});
  tensor* a = ctx.new_tensor_2d(type::f32, 8, 4);  // 128 bytes
  tensor* v = view_2d(ctx, a, 4, 2, a->nb[1], 32);  // rows 1..2, first half
  tensor* w = view_1d(ctx, v, 2, 8);                // elements 2..3 of v's first row
  CHECK(v->view_src == a);
  CHECK(w->view_src == a);
  CHECK(w->view_offs == 40);
  CHECK(static_cast<char*>(w->data) == static_cast<char*>(a->data) + 40);
  CHECK(nbytes(*v) == 32 + 16);

  auto* d = static_cast<float*>(a->data);
  for (int i = 0; i < 32; ++i) d[i] = static_cast<float>(i);
  CHECK(static_cast<float*>(w->data)[0] == 10.0f);

  CHECK_THROWS_WITH(view_1d(ctx, a, 8, 120), Catch::Contains("view") && Catch::Contains("past the source"));
  tensor* r = reshape(ctx, a, 4, 8);
  CHECK(r->ne[1] == 8);
  CHECK(r->data == a->data);
  CHECK_THROWS_WITH(reshape(ctx, transpose(ctx, a), 32), Catch::Contains("must be contiguous"));
  CHECK_THROWS_WITH(reshape(ctx, a, 5, 7), Catch::Contains("element count"));
}

TEST_CASE("a context refuses tensors past its capacity", "[tensor][context]") {
  context ctx({.max_tensors = 2, .no_alloc = true});
  ctx.new_tensor_1d(type::f32, 4);
  ctx.new_tensor_1d(type::f32, 4);
  CHECK_THROWS_AS(ctx.new_tensor_1d(type::f32, 4), capacity_error);
  CHECK(ctx.n_tensors() == 2);

  context data({.max_tensors = 8, .mem_size = 256});
  tensor* t = data.new_tensor_1d(type::f32, 32);  // 128 bytes
  CHECK(t->data != nullptr);
  CHECK(reinterpret_cast<uintptr_t>(t->data) % context::data_alignment == 0);
  CHECK_THROWS_WITH(data.new_tensor_1d(type::f32, 64), Catch::Contains("does not fit the data arena"));
  CHECK(data.n_tensors() == 1);  // the failed tensor left no slot behind
}

TEST_CASE("tensors are found by name, and names are truncated, never overflow", "[tensor]") {
  context ctx({.max_tensors = 4, .no_alloc = true});
  tensor* t = ctx.new_tensor_1d(type::f32, 4);
  t->set_name("blk.0.attn_q.weight");
  CHECK(ctx.find("blk.0.attn_q.weight") == t);
  CHECK(ctx.find("nope") == nullptr);
  tensor* u = ctx.new_tensor_1d(type::f32, 4);
  u->set_name(std::string(200, 'x'));
  CHECK(std::strlen(u->name) == max_name - 1);
  CHECK(describe(*t) == "blk.0.attn_q.weight [4, 1, 1, 1] f32");
}
