// The scheduler over two CPU devices: the host CPU and a second CPU device whose buffer type is separate
// and small (so its compute memory is chunked) and which cannot compute soft_max. Results must be
// bit-exact against one backend, with the expected splits and copies. And over the host and a CPU
// instance (CPU1), a layer stack whose weights are split between the two: each device computes the layers
// of its weights, one split each, run in order through a split runner.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu_instance.h"
#include "runtime/error.h"
#include "runtime/ops.h"
#include "runtime/sched.h"

using namespace troupe;

namespace {

// A device backed by the CPU but with its own buffer type (max 1 KiB per buffer) and no soft_max.
class small_device final : public device_i {
 public:
  small_device()
      : buft_(cpu::make_host_buffer_type("Small", 1024)), weights_buft_(cpu::make_host_buffer_type("Small_weights")) {}
  std::string_view name() const override { return "Small"; }
  std::string description() const override { return "test device"; }
  device_type type() const override { return device_type::accel; }
  device_memory memory() const override { return {1 << 20, 1 << 20}; }
  device_caps caps() const override { return {}; }
  backend_ptr init_backend() override;
  buffer_type_i& buffer_type() override { return *buft_; }
  bool supports_op(const tensor& t) const override { return t.op != op::soft_max && cpu::cpu_device().supports_op(t); }
  bool supports_buft(const buffer_type_i& b) const override { return &b == buft_.get() || &b == weights_buft_.get(); }
  buffer_type_i& weights_buffer_type() { return *weights_buft_; }

 private:
  std::unique_ptr<buffer_type_i> buft_;          // compute memory: at most 1 KiB per buffer
  std::unique_ptr<buffer_type_i> weights_buft_;  // weights: unbounded
};

class small_backend final : public backend_i {
 public:
  explicit small_backend(small_device& dev) : dev_(dev), inner_(cpu::make_cpu_backend({.n_threads = 2})) {}
  std::string_view name() const override { return "Small"; }
  device_i& device() const override { return dev_; }
  void graph_compute(graph& g) override {
    ++computes;
    if (fail) throw backend_error("Small: failing on purpose");
    inner_->graph_compute(g);
  }
  int computes = 0;
  bool fail = false;  // throw from graph_compute (a device that went away)

 private:
  small_device& dev_;
  std::unique_ptr<cpu::cpu_backend> inner_;
};

backend_ptr small_device::init_backend() { return std::make_unique<small_backend>(*this); }

struct model {
  tensor* w1 = nullptr;  // [64, 48] on the small device
  tensor* w2 = nullptr;  // [48, 32] on the CPU
  buffer_ptr buf1, buf2;
};

void fill(tensor* t, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(nelements(*t)));
  for (auto& x : v) x = d(rng);
  tensor_set(*t, v.data(), 0, v.size() * 4);
}

// The two weights in `weights` (no_alloc), w1 in the small device's memory, w2 in host memory, filled.
model place_model(small_device& dev, context& weights) {
  model m;
  m.w1 = weights.new_tensor_2d(type::f32, 64, 48);
  m.w2 = weights.new_tensor_2d(type::f32, 48, 32);
  m.w1->flags |= flag_weight;
  m.w2->flags |= flag_weight;
  m.buf1 = dev.weights_buffer_type().alloc_buffer(nbytes(*m.w1));
  tensor_alloc(*m.buf1, *m.w1, m.buf1->base());
  m.buf1->set_usage(buffer_usage::weights);
  m.buf2 = cpu::cpu_device().buffer_type().alloc_buffer(nbytes(*m.w2));
  tensor_alloc(*m.buf2, *m.w2, m.buf2->base());
  m.buf2->set_usage(buffer_usage::weights);
  fill(m.w1, 1);
  fill(m.w2, 2);
  return m;
}

// x -> mul_mat(w1) -> rms_norm -> mul_mat(w2) -> soft_max -> scale
tensor* build(context& ctx, model& m, tensor** x_out) {
  tensor* x = ctx.new_tensor_2d(type::f32, 64, 3);
  x->flags |= flag_input;
  x->set_name("x");
  tensor* h = mul_mat(ctx, m.w1, x);  // [48, 3]
  h->set_name("h");
  tensor* n = rms_norm(ctx, h, 1e-5f);
  n->set_name("n");
  tensor* o = mul_mat(ctx, m.w2, n);  // [32, 3]
  o->set_name("o");
  tensor* p = soft_max(ctx, o, nullptr, 0.5f);
  tensor* y = scale(ctx, p, 3.0f);
  y->set_name("y");
  y->flags |= flag_output;
  *x_out = x;
  return y;
}

}  // namespace

TEST_CASE("two devices: weights pull nodes, unsupported ops move, inputs are copied, results bit-exact", "[sched]") {
  small_device dev;
  backend_ptr small = dev.init_backend();
  auto cpu_be = cpu::make_cpu_backend({.n_threads = 2});

  context weights(context_params{.max_tensors = 8, .no_alloc = true});
  model m = place_model(dev, weights);

  // Two backends.
  context ctx({.max_tensors = 32, .no_alloc = true});
  tensor* x;
  tensor* y = build(ctx, m, &x);
  graph g;
  g.build_forward_expand(y);
  scheduler sched({{small.get(), nullptr}, {cpu_be.get(), nullptr}});
  sched.reserve(g);
  const size_t reserved_small = sched.compute_buffer_size(0);
  CHECK(reserved_small > 0);
  sched.alloc_graph(g);
  CHECK(sched.compute_buffer_size(0) == reserved_small);  // the reservation was enough

  CHECK(sched.n_splits() == 2);
  REQUIRE(sched.splits().size() == 2);
  CHECK(sched.splits()[0].backend == 0);  // mul_mat(w1), rms_norm on the small device
  CHECK(sched.splits()[0].nodes.size() == 2);
  CHECK(sched.splits()[1].backend == 1);  // mul_mat(w2), soft_max, scale on the CPU
  CHECK(sched.n_copies() == 2);           // x (an input, on the host) into Small; n back to the CPU
  CHECK(sched.splits()[0].inputs.at(0).first == x);
  CHECK(std::string(sched.splits()[1].inputs.at(0).first->get_name()) == "n");
  CHECK(sched.tensor_backend(ctx.find("h")) == 0);
  CHECK(sched.tensor_backend(ctx.find("o")) == 1);
  CHECK(&sched.buffer_type(0) == &dev.buffer_type());
  // Small's compute memory is chunked: more than one chunk, none larger than 1 KiB.
  CHECK(sched.allocator().n_chunks(0) >= 2);
  for (int c = 0; c < sched.allocator().n_chunks(0); ++c) CHECK(sched.allocator().chunk_buffer(0, c)->size() <= 1024);

  fill(x, 3);
  sched.graph_compute(g);
  auto* sb = static_cast<small_backend*>(small.get());
  CHECK(sb->computes == 1);
  std::vector<float> two(32 * 3);
  tensor_get(*y, two.data(), 0, two.size() * 4);

  // One backend: the same graph shape, everything on the CPU.
  context ctx1({.max_tensors = 32, .no_alloc = true});
  tensor* x1;
  model m1;
  m1.w1 = m.w1;  // the CPU can read host memory of the Small buffer type (it is host memory)
  m1.w2 = m.w2;
  tensor* y1 = build(ctx1, m1, &x1);
  graph g1;
  g1.build_forward_expand(y1);
  auto cpu_only = cpu::make_cpu_backend({.n_threads = 2});
  scheduler one({{cpu_only.get(), nullptr}});
  one.alloc_graph(g1);
  CHECK(one.n_splits() == 1);
  CHECK(one.n_copies() == 0);
  fill(x1, 3);
  one.graph_compute(g1);
  std::vector<float> single(32 * 3);
  tensor_get(*y1, single.data(), 0, single.size() * 4);
  CHECK(std::memcmp(two.data(), single.data(), two.size() * 4) == 0);

  // Allocating the same graph again restores and redoes the copies, with the same results.
  sched.alloc_graph(g);
  CHECK(sched.n_copies() == 2);
  fill(x, 3);
  sched.graph_compute(g);
  std::vector<float> again(32 * 3);
  tensor_get(*y, again.data(), 0, again.size() * 4);
  CHECK(again == two);
  sched.reset();
  CHECK(g.node(0)->src[1] == x);  // sources restored
}

TEST_CASE("pins move nodes, and a pin to a backend that cannot compute the node is an error", "[sched]") {
  small_device dev;
  backend_ptr small = dev.init_backend();
  auto cpu_be = cpu::make_cpu_backend({.n_threads = 1});
  context ctx({.max_tensors = 16, .no_alloc = true});
  tensor* a = ctx.new_tensor_1d(type::f32, 16);
  a->flags |= flag_input;
  tensor* b = silu(ctx, a);
  tensor* c = soft_max(ctx, b, nullptr, 1.0f);
  c->flags |= flag_output;
  graph g;
  g.build_forward_expand(c);

  scheduler sched({{small.get(), nullptr}, {cpu_be.get(), nullptr}});
  sched.set_tensor_backend(b, 0);
  sched.alloc_graph(g);
  CHECK(sched.tensor_backend(b) == 0);
  CHECK(sched.tensor_backend(c) == 1);
  CHECK(sched.n_splits() == 2);

  sched.reset();
  sched.set_tensor_backend(c, 0);
  CHECK_THROWS_WITH(sched.alloc_graph(g), Catch::Contains("pinned to Small, which cannot compute it"));
}

TEST_CASE("a backend that throws mid-graph: sources restored at once, the graph can go, computing again works", "[sched]") {
  small_device dev;
  backend_ptr small = dev.init_backend();
  auto* sb = static_cast<small_backend*>(small.get());
  auto cpu_be = cpu::make_cpu_backend({.n_threads = 1});
  context weights(context_params{.max_tensors = 8, .no_alloc = true});
  model m = place_model(dev, weights);
  scheduler sched({{small.get(), nullptr}, {cpu_be.get(), nullptr}});

  std::vector<float> first(32 * 3), again(32 * 3);
  {
    auto ctx = std::make_unique<context>(context_params{.max_tensors = 32, .no_alloc = true});
    tensor* x;
    tensor* y = build(*ctx, m, &x);
    graph g;
    g.build_forward_expand(y);
    tensor* h = ctx->find("h");
    sched.reserve(g);
    sched.alloc_graph(g);
    CHECK(h->src[1] != x);  // reads x's copy on the small device
    fill(x, 3);
    sb->fail = true;
    CHECK_THROWS_WITH(sched.graph_compute(g), Catch::Contains("failing on purpose"));
    CHECK(h->src[1] == x);  // the caller's graph again, before anything is destroyed
    sb->fail = false;
    sched.graph_compute(g);  // allocated anew
    tensor_get(*y, first.data(), 0, first.size() * 4);
    sched.reset();
  }
  {
    // As llm_context does: a fresh graph per run, whose context goes while the exception unwinds; reset()
    // comes later.
    auto ctx = std::make_unique<context>(context_params{.max_tensors = 32, .no_alloc = true});
    tensor* x;
    tensor* y = build(*ctx, m, &x);
    graph g;
    g.build_forward_expand(y);
    sched.reserve(g);
    sched.alloc_graph(g);
    fill(x, 3);
    sb->fail = true;
    bool threw = false;
    try {
      sched.graph_compute(g);
    } catch (const backend_error&) {
      threw = true;
      ctx.reset();
    }
    CHECK(threw);
    sb->fail = false;
  }
  sched.reset();  // must not touch the destroyed graph (ASan)

  context ctx2({.max_tensors = 32, .no_alloc = true});
  tensor* x2;
  tensor* y2 = build(ctx2, m, &x2);
  graph g2;
  g2.build_forward_expand(y2);
  sched.reserve(g2);
  sched.alloc_graph(g2);
  fill(x2, 3);
  sched.graph_compute(g2);
  tensor_get(*y2, again.data(), 0, again.size() * 4);
  CHECK(again == first);
  sched.reset();  // g2 goes before the scheduler
}

namespace {

// x -> (mul_mat(w1) -> rms_norm) x depth -> (mul_mat(w2) -> rms_norm) x depth -> scale
tensor* layer_stack(context& ctx, tensor* w1, tensor* w2, tensor* x, int depth) {
  tensor* h = x;
  for (int i = 0; i < depth; ++i) h = rms_norm(ctx, mul_mat(ctx, w1, h), 1e-5f);
  for (int i = 0; i < depth; ++i) h = rms_norm(ctx, mul_mat(ctx, w2, h), 1e-5f);
  return scale(ctx, h, 2.0f);
}

}  // namespace

TEST_CASE("a CPU instance and the host: each weight pulls its layers into one split on its device, run in order through a split runner", "[sched]") {
  constexpr int64_t n = 256;
  constexpr int64_t tokens = 8;
  constexpr int depth = 6;
  device_i& cpu1 = add_cpu_instance({.index = 1, .n_threads = 1});
  backend_ptr inst = cpu1.init_backend();
  auto host = cpu::make_cpu_backend({.n_threads = 1});

  // w1 in CPU1's memory, w2 in the host's.
  context weights(context_params{.max_tensors = 4, .no_alloc = true});
  tensor* w1 = weights.new_tensor_2d(type::f32, n, n);
  tensor* w2 = weights.new_tensor_2d(type::f32, n, n);
  w1->flags |= flag_weight;
  w2->flags |= flag_weight;
  buffer_ptr buf1 = cpu1.buffer_type().alloc_buffer(nbytes(*w1));
  tensor_alloc(*buf1, *w1, buf1->base());
  buf1->set_usage(buffer_usage::weights);
  buffer_ptr buf2 = cpu::cpu_device().buffer_type().alloc_buffer(nbytes(*w2));
  tensor_alloc(*buf2, *w2, buf2->base());
  buf2->set_usage(buffer_usage::weights);
  fill(w1, 1);
  fill(w2, 2);

  context ctx({.max_tensors = 64, .no_alloc = true});
  tensor* x = ctx.new_tensor_2d(type::f32, n, tokens);
  x->flags |= flag_input;
  tensor* y = layer_stack(ctx, w1, w2, x, depth);
  y->flags |= flag_output;
  graph g;
  g.build_forward_expand(y);
  scheduler sched({{inst.get(), nullptr}, {host.get(), nullptr}});
  sched.alloc_graph(g);
  REQUIRE(sched.n_splits() == 2);
  CHECK(sched.splits()[0].nodes.size() == 2 * depth);      // depth x (mul_mat w1, rms_norm) on CPU1, where w1 lives
  CHECK(sched.splits()[1].nodes.size() == 2 * depth + 1);  // depth x (mul_mat w2, rms_norm) and scale on the CPU
  CHECK(&sched.backend(sched.splits()[0].backend).device() == &cpu1);
  CHECK(&sched.backend(sched.splits()[1].backend).device() == &cpu::cpu_device());

  // The split runner (the hook the actor layer hands each split to its device's actor through) gets every
  // split, in order, each with its own device.
  std::vector<std::string> ran;
  sched.set_split_runner([&](int index, const scheduler::split& sp, const std::function<void()>& work) {
    ran.push_back(std::string(sched.backend(sp.backend).device().name()) + "#" + std::to_string(index));
    work();
  });
  fill(x, 3);
  sched.graph_compute(g);
  CHECK(ran == std::vector<std::string>{"CPU1#0", "CPU#1"});
  std::vector<float> got(static_cast<size_t>(n * tokens));
  tensor_get(*y, got.data(), 0, got.size() * 4);
  sched.reset();

  // The same stack on one CPU backend, over copies of the weights in host memory.
  context one({.max_tensors = 64, .no_alloc = true});
  tensor* x1 = one.new_tensor_2d(type::f32, n, tokens);
  tensor* v1 = one.new_tensor_2d(type::f32, n, n);
  tensor* v2 = one.new_tensor_2d(type::f32, n, n);
  tensor* y1 = layer_stack(one, v1, v2, x1, depth);
  buffer_ptr all = alloc_ctx_tensors(one, cpu::cpu_device().buffer_type());
  std::vector<float> bytes(static_cast<size_t>(n * n));
  tensor_get(*w1, bytes.data(), 0, bytes.size() * 4);
  tensor_set(*v1, bytes.data(), 0, bytes.size() * 4);
  tensor_get(*w2, bytes.data(), 0, bytes.size() * 4);
  tensor_set(*v2, bytes.data(), 0, bytes.size() * 4);
  fill(x1, 3);
  graph g1;
  g1.build_forward_expand(y1);
  cpu::make_cpu_backend({.n_threads = 1})->graph_compute(g1);
  std::vector<float> want(got.size());
  tensor_get(*y1, want.data(), 0, want.size() * 4);
  double err = 0;
  for (size_t i = 0; i < got.size(); ++i) err = std::max(err, static_cast<double>(std::abs(got[i] - want[i])));
  CHECK(err < 1e-4);
}
