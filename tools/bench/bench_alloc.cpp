// Graph allocator benchmarks: planning time for a 5,000-node transformer-shaped graph, and how close plans
// of random graphs come to the lower bound (the peak of simultaneously live bytes).
//
//   ./build/tools/bench/bench_alloc
//
// Counters: nodes/s for planning; ratio_mean / ratio_worst = allocated bytes / live-peak bytes.
#include <benchmark/benchmark.h>

#include <random>

#include "backends/cpu/cpu_backend.h"
#include "runtime/alloc_check.h"
#include "runtime/graph_allocator.h"
#include "runtime/ops.h"
#include "tools/bench/counting_buffer_type.h"
#include "tools/bench/random_graph.h"

using namespace troupe;

namespace {

// A llama-like stack: per layer norm, q/k/v/o products, rope, attention, ffn with swiglu; about 24 nodes
// a layer, so 220 layers make a bit over 5,000 nodes. Weights live in their own (external) buffer.
struct transformer {
  context weights{context_params{.max_tensors = 4096, .no_alloc = true}};
  context graph_ctx{context_params{.max_tensors = 16384, .no_alloc = true}};
  buffer_ptr weight_buf;
  std::unique_ptr<buffer_type_i> host = cpu::make_host_buffer_type("host");
  graph g{16384};

  explicit transformer(int n_layers, int64_t n_embd = 64, int64_t n_tokens = 32) {
    std::vector<std::array<tensor*, 7>> w(static_cast<size_t>(n_layers));
    for (auto& lw : w) {
      for (auto& t : lw) {
        t = weights.new_tensor_2d(type::f32, n_embd, n_embd);
        t->flags |= flag_weight;
      }
    }
    weight_buf = alloc_ctx_tensors(weights, *host);
    context& c = graph_ctx;
    tensor* x = c.new_tensor_2d(type::f32, n_embd, n_tokens);
    x->flags |= flag_input;
    tensor* pos = c.new_tensor_1d(type::i32, n_tokens);
    pos->flags |= flag_input;
    rope_params rp;
    rp.n_dims = 16;
    for (const auto& lw : w) {
      tensor* h = rms_norm(c, x, 1e-5f);
      tensor* q = reshape(c, rope(c, reshape(c, mul_mat(c, lw[0], h), 16, n_embd / 16, n_tokens), pos, nullptr, rp),
                          n_embd, n_tokens);                                   // [n_embd, T]
      tensor* k = reshape(c, rope(c, reshape(c, mul_mat(c, lw[1], h), 16, n_embd / 16, n_tokens), pos, nullptr, rp),
                          n_embd, n_tokens);                                   // [n_embd, T]
      tensor* vt = cont(c, transpose(c, mul_mat(c, lw[2], h)));              // [T, n_embd]
      tensor* kq = soft_max(c, mul_mat(c, k, q), nullptr, 0.125f);           // [T, T]
      tensor* att = mul_mat(c, vt, kq);                                      // [n_embd, T]
      x = add(c, x, mul_mat(c, lw[3], att));
      tensor* f = rms_norm(c, x, 1e-5f);
      x = add(c, x, mul_mat(c, lw[6], swiglu(c, mul_mat(c, lw[4], f), mul_mat(c, lw[5], f))));
    }
    x->flags |= flag_output;
    g.build_forward_expand(x);
  }
};

void bm_plan_transformer(benchmark::State& state) {
  transformer t(static_cast<int>(state.range(0)));
  graph_allocator galloc({t.host.get()});
  galloc.alloc_graph(t.g);  // buffers sized once
  for (auto _ : state) {
    galloc.alloc_graph(t.g);
    benchmark::DoNotOptimize(t.g.node(0)->data);
  }
  state.counters["nodes"] = static_cast<double>(t.g.n_nodes());
  state.counters["nodes/s"] = benchmark::Counter(static_cast<double>(t.g.n_nodes()), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["ratio"] = static_cast<double>(galloc.buffer_size(0)) / static_cast<double>(live_peak(t.g, galloc)[0]);
}
BENCHMARK(bm_plan_transformer)->Arg(220)->Unit(benchmark::kMillisecond);

void bm_random_graph_ratio(benchmark::State& state) {
  const size_t max_size = state.range(0) == 0 ? SIZE_MAX : static_cast<size_t>(state.range(0));
  double sum = 0, worst = 0;
  int n = 0;
  for (auto _ : state) {
    std::mt19937 rng(1234);
    sum = 0;
    worst = 0;
    n = 0;
    for (int i = 0; i < 200; ++i) {
      testing::counting_buffer_type bt("rand", max_size, 32);
      context ctx(context_params{.max_tensors = 512, .no_alloc = true});
      tensor* out = testing::random_graph(ctx, rng, 5 + static_cast<int>(rng() % 60));
      graph g;
      g.build_forward_expand(out);
      graph_allocator galloc({&bt});
      galloc.alloc_graph(g);
      const double r = static_cast<double>(galloc.buffer_size(0)) / static_cast<double>(live_peak(g, galloc)[0]);
      sum += r;
      worst = std::max(worst, r);
      ++n;
    }
  }
  state.counters["ratio_mean"] = sum / n;
  state.counters["ratio_worst"] = worst;
}
BENCHMARK(bm_random_graph_ratio)->Arg(0)->Arg(256)->Arg(64)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
