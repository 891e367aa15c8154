// troupe-demo: builds a transformer feed-forward block with quantized weights and runs it on every
// registered device, checking each against the CPU reference path.
//
//   ./build/examples/demo/troupe-demo [n_threads]
//
// Shows the core API end to end: a metadata-only context, ops, a graph, placing the tensors in a device
// buffer, uploading inputs, computing, reading the result. (The chat example replaces this as the main job
// once models load.)
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/registry.h"
#include "runtime/backend.h"
#include "runtime/error.h"
#include "runtime/ops.h"

using namespace troupe;

namespace {

constexpr int64_t n_embd = 512;   // model width
constexpr int64_t n_ff = 1536;    // feed-forward width
constexpr int64_t n_tokens = 16;  // tokens in the batch

struct block {
  tensor* x;       // [n_embd, n_tokens] input activations
  tensor* norm_w;  // [n_embd] rms-norm weight
  tensor* gate;    // [n_embd, n_ff] q4_K
  tensor* up;      // [n_embd, n_ff] q4_K
  tensor* down;    // [n_ff, n_embd] q6_K
  tensor* out;     // [n_embd, n_tokens]
};

block build(context& ctx) {
  block b;
  b.x = ctx.new_tensor_2d(type::f32, n_embd, n_tokens);
  b.norm_w = ctx.new_tensor_1d(type::f32, n_embd);
  b.gate = ctx.new_tensor_2d(type::q4_K, n_embd, n_ff);
  b.up = ctx.new_tensor_2d(type::q4_K, n_embd, n_ff);
  b.down = ctx.new_tensor_2d(type::q6_K, n_ff, n_embd);
  tensor* h = mul(ctx, rms_norm(ctx, b.x, 1e-5f), b.norm_w);
  tensor* ff = swiglu(ctx, mul_mat(ctx, b.gate, h), mul_mat(ctx, b.up, h));  // [n_ff, n_tokens]
  b.out = add(ctx, b.x, mul_mat(ctx, b.down, ff));                           // residual
  b.out->flags |= flag_output;
  return b;
}

void upload(tensor* t, std::mt19937& rng, float scale_by) {
  std::normal_distribution<float> d(0.0f, scale_by);
  std::vector<float> f(static_cast<size_t>(nelements(*t)));
  for (auto& v : f) v = d(rng);
  std::vector<uint8_t> bytes(nbytes(*t));
  const size_t rs = row_size(t->type, t->ne[0]);
  for (int64_t r = 0; r < nrows(*t); ++r) {
    traits(t->type).from_float_ref(f.data() + r * t->ne[0], bytes.data() + static_cast<size_t>(r) * rs, t->ne[0]);
  }
  tensor_set(*t, bytes.data(), 0, bytes.size());
}

std::vector<float> run(backend_i& be, double* ms) {
  context ctx({.max_tensors = 32, .no_alloc = true});
  block b = build(ctx);
  graph g;
  g.build_forward_expand(b.out);
  buffer_ptr buf = alloc_ctx_tensors(ctx, be.device().buffer_type());
  std::mt19937 rng(42);
  upload(b.x, rng, 1.0f);
  upload(b.norm_w, rng, 1.0f);
  upload(b.gate, rng, 0.05f);
  upload(b.up, rng, 0.05f);
  upload(b.down, rng, 0.05f);
  be.graph_compute(g);  // warm-up (work buffers, page faults)
  const auto t0 = std::chrono::steady_clock::now();
  be.graph_compute(g);
  *ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::vector<float> out(static_cast<size_t>(nelements(*b.out)));
  tensor_get(*b.out, out.data(), 0, out.size() * sizeof(float));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const int n_threads = argc > 1 ? std::atoi(argv[1]) : 0;
    register_builtin_backends();
    std::printf("troupe demo: feed-forward block, n_embd %lld, n_ff %lld, %lld tokens, q4_K/q6_K weights\n",
                static_cast<long long>(n_embd), static_cast<long long>(n_ff), static_cast<long long>(n_tokens));

    auto ref_backend = cpu::make_cpu_backend({.reference = true});
    double ref_ms = 0;
    const auto ref = run(*ref_backend, &ref_ms);
    std::printf("  %-28s %8.2f ms\n", "CPU reference (1 thread)", ref_ms);

    for (device_i* dev : registry::instance().devices()) {
      backend_ptr be = dev->init_backend();
      if (auto* cpu_be = dynamic_cast<cpu::cpu_backend*>(be.get()); cpu_be && n_threads > 0) cpu_be->set_n_threads(n_threads);
      double ms = 0;
      const auto out = run(*be, &ms);
      double err = 0, norm = 0;
      for (size_t i = 0; i < out.size(); ++i) {
        err += (out[i] - ref[i]) * static_cast<double>(out[i] - ref[i]);
        norm += ref[i] * static_cast<double>(ref[i]);
      }
      std::printf("  %-28s %8.2f ms   nmse vs reference %.2e   (%s)\n", std::string(dev->name()).c_str(), ms,
                  err / norm, dev->description().c_str());
    }
    std::printf("  out[0..3] = %.5f %.5f %.5f %.5f\n", ref[0], ref[1], ref[2], ref[3]);
    return 0;
  } catch (const error& e) {
    std::fprintf(stderr, "troupe-demo: %s\n", e.what());
    return 1;
  }
}
