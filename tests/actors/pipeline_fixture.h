// A two-device pipeline job for tests and the peer process: micro-batches of x -> (mul_mat(w1) -> rms_norm)
// x depth (on device A, whose memory holds w1) -> (mul_mat(w2) -> rms_norm) x depth -> scale (on the host
// CPU, which holds w2). Batches of at most 8 tokens stay on troupe's own kernels (OpenBLAS, which larger
// products use, may serialize calls from several threads, which would hide the overlap). Each
// micro-batch has its own synchronous scheduler (its own compute memory), so the scheduler actor may have
// several in flight: micro-batch 1's first split on A while micro-batch 0's second split runs on the host.
#pragma once

#include <memory>
#include <random>
#include <vector>

#include "actors/runtime_env.h"
#include "backends/cpu/cpu_backend.h"
#include "runtime/ops.h"
#include "runtime/sched.h"

namespace troupe::test {

class pipeline_fixture {
 public:
  // a: the device actor backend of a device with its own buffer type (a CPU instance); host: the CPU's.
  pipeline_fixture(backend_i& a, backend_i& host, int n_micro, int64_t n, int64_t tokens, int depth = 1)
      : n_(n), tokens_(tokens), depth_(depth), weights_(context_params{.max_tensors = 4, .no_alloc = true}) {
    w1_ = weights_.new_tensor_2d(type::f32, n, n);
    w2_ = weights_.new_tensor_2d(type::f32, n, n);
    w1_->flags |= flag_weight;
    w2_->flags |= flag_weight;
    buf1_ = a.device().buffer_type().alloc_buffer(nbytes(*w1_));
    tensor_alloc(*buf1_, *w1_, buf1_->base());
    buf1_->set_usage(buffer_usage::weights);
    buf2_ = host.device().buffer_type().alloc_buffer(nbytes(*w2_));
    tensor_alloc(*buf2_, *w2_, buf2_->base());
    buf2_->set_usage(buffer_usage::weights);
    fill(w1_, 1, 1.0f / static_cast<float>(n));
    fill(w2_, 2, 1.0f / static_cast<float>(n));
    job = std::make_shared<actors::pipeline_job>();
    for (int m = 0; m < n_micro; ++m) {
      auto mb = std::make_unique<micro>();
      mb->ctx = std::make_unique<context>(context_params{.max_tensors = 64, .no_alloc = true});
      mb->x = mb->ctx->new_tensor_2d(type::f32, n, tokens);
      mb->x->flags |= flag_input;
      mb->y = build(*mb->ctx, w1_, w2_, mb->x);
      mb->y->flags |= flag_output;
      mb->g = std::make_unique<graph>();
      mb->g->build_forward_expand(mb->y);
      mb->sched = std::make_unique<scheduler>(std::vector<sched_backend>{{&a, nullptr}, {&host, nullptr}});
      mb->sched->alloc_graph(*mb->g);
      fill(mb->x, 100 + static_cast<uint32_t>(m), 1.0f);
      job->microbatches.push_back({mb->sched.get(), mb->g.get()});
      micro_.push_back(std::move(mb));
    }
  }

  std::vector<float> output(int m) const {
    std::vector<float> out(static_cast<size_t>(n_ * tokens_));
    tensor_get(*micro_[static_cast<size_t>(m)]->y, out.data(), 0, out.size() * 4);
    return out;
  }

  // The same micro-batch computed on one CPU backend.
  std::vector<float> reference(int m) const {
    context ctx({.max_tensors = 64, .no_alloc = true});
    tensor* x = ctx.new_tensor_2d(type::f32, n_, tokens_);
    tensor* w1 = ctx.new_tensor_2d(type::f32, n_, n_);
    tensor* w2 = ctx.new_tensor_2d(type::f32, n_, n_);
    tensor* y = build(ctx, w1, w2, x);
    buffer_ptr buf = alloc_ctx_tensors(ctx, cpu::cpu_device().buffer_type());
    std::vector<float> v(static_cast<size_t>(n_ * n_));
    tensor_get(*w1_, v.data(), 0, v.size() * 4);
    tensor_set(*w1, v.data(), 0, v.size() * 4);
    tensor_get(*w2_, v.data(), 0, v.size() * 4);
    tensor_set(*w2, v.data(), 0, v.size() * 4);
    fill(x, 100 + static_cast<uint32_t>(m), 1.0f);
    graph g;
    g.build_forward_expand(y);
    cpu::make_cpu_backend({.n_threads = 1})->graph_compute(g);
    std::vector<float> out(static_cast<size_t>(n_ * tokens_));
    tensor_get(*y, out.data(), 0, out.size() * 4);
    return out;
  }

  // Every micro-batch's compute memory, per buffer type name.
  std::map<std::string, uint64_t> compute_bytes() const {
    std::map<std::string, uint64_t> out;
    for (const auto& mb : micro_) {
      for (int b = 0; b < mb->sched->n_backends(); ++b) {
        out[std::string(mb->sched->buffer_type(b).name())] += mb->sched->compute_buffer_size(b);
      }
    }
    return out;
  }

  std::shared_ptr<actors::pipeline_job> job;

 private:
  struct micro {
    std::unique_ptr<context> ctx;
    std::unique_ptr<graph> g;
    std::unique_ptr<scheduler> sched;
    tensor* x = nullptr;
    tensor* y = nullptr;
  };

  tensor* build(context& ctx, tensor* w1, tensor* w2, tensor* x) const {
    tensor* h = x;
    for (int i = 0; i < depth_; ++i) h = rms_norm(ctx, mul_mat(ctx, w1, h), 1e-5f);
    for (int i = 0; i < depth_; ++i) h = rms_norm(ctx, mul_mat(ctx, w2, h), 1e-5f);
    return scale(ctx, h, 2.0f);
  }

  static void fill(tensor* t, uint32_t seed, float range) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> d(-range, range);
    std::vector<float> v(static_cast<size_t>(nelements(*t)));
    for (auto& x : v) x = d(rng);
    tensor_set(*t, v.data(), 0, v.size() * 4);
  }

  int64_t n_, tokens_;
  int depth_;
  context weights_;
  tensor* w1_ = nullptr;
  tensor* w2_ = nullptr;
  buffer_ptr buf1_, buf2_;
  std::vector<std::unique_ptr<micro>> micro_;
};

}  // namespace troupe::test
