// Random graphs of small f32 ops (scale, silu, pad, mean, add/concat, views), for allocator tests and
// benchmarks. Inputs are flagged input, the last tensor output.
#pragma once

#include <random>
#include <vector>

#include "runtime/context.h"
#include "runtime/ops.h"

namespace troupe::testing {

// Builds a random graph of about n_ops ops in ctx; returns the output tensor.
inline tensor* random_graph(context& ctx, std::mt19937& rng, int n_ops) {
  std::vector<tensor*> pool;
  const int n_inputs = 1 + static_cast<int>(rng() % 4);
  for (int i = 0; i < n_inputs; ++i) {
    tensor* t = ctx.new_tensor_1d(type::f32, 1 + static_cast<int64_t>(rng() % 16));
    t->flags |= flag_input;
    pool.push_back(t);
  }
  for (int i = 0; i < n_ops; ++i) {
    tensor* a = pool[rng() % pool.size()];
    tensor* r = nullptr;
    switch (rng() % 6) {
      case 0: r = scale(ctx, a, 0.5f); break;
      case 1: r = silu(ctx, a); break;
      case 2: r = pad(ctx, a, static_cast<int>(rng() % 5), 0); break;
      case 3: r = mean(ctx, a); break;
      case 4: {
        tensor* b = pool[rng() % pool.size()];
        r = a->ne[0] == b->ne[0] ? add(ctx, a, b) : concat(ctx, a, b, 0);
        break;
      }
      default:
        r = a->ne[0] >= 2 ? view_1d(ctx, a, a->ne[0] / 2, static_cast<size_t>(a->ne[0] / 2) * 4) : scale(ctx, a, 2.0f);
        break;
    }
    pool.push_back(r);
  }
  // Join a few late tensors into the output so that much of the graph is reachable.
  tensor* out = pool.back();
  for (int k = 0; k < 3; ++k) out = concat(ctx, out, pool[pool.size() / 2 + rng() % (pool.size() / 2)], 0);
  out->flags |= flag_output;
  return out;
}

}  // namespace troupe::testing
