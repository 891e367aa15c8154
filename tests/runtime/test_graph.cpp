// Graph construction: topological order, leafs vs nodes, shared subexpressions, capacity.
#include <catch2/catch.hpp>

#include <algorithm>

#include "runtime/error.h"
#include "runtime/graph.h"
#include "runtime/ops.h"

using namespace troupe;

namespace {

size_t index_of(std::span<tensor* const> list, const tensor* t) {
  return static_cast<size_t>(std::find(list.begin(), list.end(), t) - list.begin());
}

}  // namespace

TEST_CASE("every node comes after its sources, and shared nodes appear once", "[graph]") {
  context ctx({.max_tensors = 64, .no_alloc = true});
  tensor* x = ctx.new_tensor_2d(type::f32, 8, 2);
  tensor* w1 = ctx.new_tensor_2d(type::f32, 8, 8);
  tensor* w2 = ctx.new_tensor_2d(type::f32, 8, 8);
  tensor* h = rms_norm(ctx, x, 1e-5f);
  tensor* a = mul_mat(ctx, w1, h);
  tensor* b = mul_mat(ctx, w2, h);  // h shared by a and b
  tensor* y = add(ctx, silu(ctx, a), b);

  graph g;
  g.build_forward_expand(y);
  CHECK(g.n_leafs() == 3);
  CHECK(g.n_nodes() == 5);
  for (size_t i = 0; i < g.n_nodes(); ++i) {
    const tensor* n = g.node(i);
    for (const tensor* s : n->src) {
      if (s == nullptr || s->op == op::none) continue;
      CHECK(index_of(g.nodes(), s) < i);
    }
  }
  CHECK(g.node(g.n_nodes() - 1) == y);
  CHECK(std::count(g.nodes().begin(), g.nodes().end(), h) == 1);

  // Expanding again with a node already present adds nothing; a new output adds only what is new.
  g.build_forward_expand(a);
  CHECK(g.n_nodes() == 5);
  g.build_forward_expand(scale(ctx, y, 2.0f));
  CHECK(g.n_nodes() == 6);
}

TEST_CASE("a view's source is ordered before the view", "[graph]") {
  context ctx({.max_tensors = 16, .no_alloc = true});
  tensor* cache = ctx.new_tensor_2d(type::f32, 4, 8);
  tensor* src = ctx.new_tensor_2d(type::f32, 4, 2);
  tensor* idx = ctx.new_tensor_1d(type::i32, 2);
  tensor* stored = set_rows(ctx, cache, src, idx);
  tensor* v = view_2d(ctx, stored, 4, 3, cache->nb[1], 0);
  tensor* out = scale(ctx, v, 1.0f);
  graph g;
  g.build_forward_expand(out);
  CHECK(index_of(g.nodes(), stored) < index_of(g.nodes(), v));
  CHECK(index_of(g.nodes(), v) < index_of(g.nodes(), out));
  CHECK(index_of(g.leafs(), cache) < g.n_leafs());
}

TEST_CASE("deep graphs do not overflow the stack", "[graph]") {
  constexpr int depth = 20000;
  context ctx({.max_tensors = depth + 8, .no_alloc = true});
  tensor* t = ctx.new_tensor_1d(type::f32, 4);
  for (int i = 0; i < depth; ++i) t = scale(ctx, t, 1.0f);
  graph g(depth + 8);
  g.build_forward_expand(t);
  CHECK(g.n_nodes() == depth);
}

TEST_CASE("a graph refuses more tensors than its capacity", "[graph]") {
  context ctx({.max_tensors = 64, .no_alloc = true});
  tensor* t = ctx.new_tensor_1d(type::f32, 4);
  for (int i = 0; i < 10; ++i) t = scale(ctx, t, 1.0f);
  graph g(8);
  CHECK_THROWS_AS(g.build_forward_expand(t), capacity_error);
  CHECK_THROWS_WITH(g.build_forward_expand(t), Catch::Contains("more than 8 tensors"));
}
