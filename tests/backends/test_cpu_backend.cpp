// The CPU device, its buffers and backend: registry, buffer limits, host-pointer buffers, bounds-checked
// transfers, and errors for nodes it cannot compute.
#include <catch2/catch.hpp>

#include <cstring>
#include <numeric>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/registry.h"
#include "runtime/error.h"
#include "runtime/ops.h"

using namespace troupe;

TEST_CASE("the CPU device registers once and answers its capabilities", "[cpu]") {
  register_builtin_backends();
  register_builtin_backends();
  device_i* dev = registry::instance().find("CPU");
  REQUIRE(dev != nullptr);
  CHECK(registry::instance().first_of(device_type::cpu) == dev);
  size_t cpus = 0;
  for (device_i* d : registry::instance().devices()) cpus += d->name() == "CPU";
  CHECK(cpus == 1);
  CHECK(dev->caps().buffer_from_host_ptr);
  CHECK(dev->buffer_type().is_host());
  CHECK(dev->buffer_type().alignment() >= 32);
  const device_memory m = dev->memory();
  CHECK(m.total > 0);
  CHECK(m.free <= m.total);
  CHECK(dev->supports_buft(dev->buffer_type()));
}

TEST_CASE("a host buffer type with a max size refuses larger buffers", "[cpu][buffer]") {
  auto bt = cpu::make_host_buffer_type("CPU-small", 1024);
  CHECK(bt->max_size() == 1024);
  CHECK(bt->alloc_buffer(1024)->size() == 1024);
  CHECK_THROWS_WITH(bt->alloc_buffer(1025), Catch::Contains("CPU-small") && Catch::Contains("1025 bytes exceed"));
}

TEST_CASE("tensors in a buffer: set, get, memset, copy, and out-of-range errors", "[cpu][buffer]") {
  context ctx({.max_tensors = 8, .no_alloc = true});
  tensor* a = ctx.new_tensor_1d(type::f32, 16);
  a->set_name("a");
  tensor* b = ctx.new_tensor_1d(type::f32, 16);
  tensor* v = view_1d(ctx, a, 4, 8);  // elements 2..5 of a
  buffer_ptr buf = alloc_ctx_tensors(ctx, cpu::cpu_device().buffer_type());
  REQUIRE(buf != nullptr);
  CHECK(a->buffer == buf.get());
  CHECK(v->buffer == buf.get());
  CHECK(static_cast<char*>(v->data) == static_cast<char*>(a->data) + 8);

  std::vector<float> in(16);
  std::iota(in.begin(), in.end(), 0.0f);
  tensor_set(*a, in.data(), 0, 64);
  float got[4];
  tensor_get(*v, got, 0, sizeof got);
  CHECK(got[0] == 2.0f);
  CHECK(got[3] == 5.0f);
  tensor_copy(*a, *b);
  CHECK(static_cast<float*>(b->data)[15] == 15.0f);
  tensor_memset(*b, 0, 0, 64);
  CHECK(static_cast<float*>(b->data)[15] == 0.0f);

  CHECK_THROWS_WITH(tensor_set(*a, in.data(), 8, 64), Catch::Contains("bytes [8, 72) are outside tensor a"));
  context loose({.max_tensors = 1, .no_alloc = true});
  tensor* unplaced = loose.new_tensor_1d(type::f32, 4);
  CHECK_THROWS_WITH(tensor_get(*unplaced, got, 0, 4), Catch::Contains("has no buffer"));
}

TEST_CASE("a buffer over host memory wraps it without copying", "[cpu][buffer]") {
  std::vector<float> host(64, 3.0f);
  buffer_ptr buf = cpu::cpu_device().buffer_from_host_ptr(host.data(), host.size() * 4, 64 * 4);
  CHECK(buf->base() == host.data());
  context ctx({.max_tensors = 2, .no_alloc = true});
  tensor* t = ctx.new_tensor_1d(type::f32, 64);
  tensor_alloc(*buf, *t, host.data());
  CHECK(static_cast<float*>(t->data)[63] == 3.0f);
  host[63] = 7.0f;
  float x;
  tensor_get(*t, &x, 63 * 4, 4);
  CHECK(x == 7.0f);
  tensor* too_big = ctx.new_tensor_1d(type::f32, 65);
  CHECK_THROWS_WITH(tensor_alloc(*buf, *too_big, host.data()), Catch::Contains("does not fit its buffer"));
}

TEST_CASE("computing a node the CPU cannot do is an error naming the node", "[cpu]") {
  context ctx({.max_tensors = 8, .no_alloc = true});
  tensor* a = ctx.new_tensor_1d(type::f32, 8);
  tensor* r = silu(ctx, a);
  r->set_name("bad");
  r->src[0]->type = type::iq2_xxs;  // corrupt the source after construction, as a hostile peer might
  r->src[0]->ne[0] = 256;
  graph g;
  g.build_forward_expand(r);
  auto be = cpu::make_cpu_backend({.n_threads = 2});
  CHECK_FALSE(be->supports_op(*r));
  CHECK_THROWS_AS(be->graph_compute(g), backend_error);
  CHECK_THROWS_WITH(be->graph_compute(g), Catch::Contains("bad") && Catch::Contains("silu"));
}

TEST_CASE("an unallocated graph is an error, not a crash", "[cpu]") {
  context ctx({.max_tensors = 8, .no_alloc = true});
  tensor* r = scale(ctx, ctx.new_tensor_1d(type::f32, 8), 2.0f);
  graph g;
  g.build_forward_expand(r);
  auto be = cpu::make_cpu_backend({.n_threads = 1});
  CHECK_THROWS_WITH(be->graph_compute(g), Catch::Contains("has no memory"));
}

TEST_CASE("a graph computes the same on 1 and 4 threads, and the thread count can change", "[cpu]") {
  context ctx({.max_tensors = 16, .no_alloc = true});
  tensor* w = ctx.new_tensor_2d(type::q4_0, 128, 64);
  tensor* x = ctx.new_tensor_2d(type::f32, 128, 3);
  tensor* y = soft_max(ctx, mul_mat(ctx, w, x), nullptr, 1.0f);
  graph g;
  g.build_forward_expand(y);
  buffer_ptr buf = alloc_ctx_tensors(ctx, cpu::cpu_device().buffer_type());
  std::vector<float> wf(128 * 64), xf(128 * 3);
  for (size_t i = 0; i < wf.size(); ++i) wf[i] = static_cast<float>((i * 37) % 17) / 8.0f - 1.0f;
  for (size_t i = 0; i < xf.size(); ++i) xf[i] = static_cast<float>((i * 11) % 13) / 6.0f - 1.0f;
  std::vector<uint8_t> wq(nbytes(*w));
  for (int r = 0; r < 64; ++r) traits(type::q4_0).from_float_ref(wf.data() + r * 128, wq.data() + r * row_size(type::q4_0, 128), 128);
  tensor_set(*w, wq.data(), 0, wq.size());
  tensor_set(*x, xf.data(), 0, xf.size() * 4);

  auto be = cpu::make_cpu_backend({.n_threads = 1});
  be->graph_compute(g);
  std::vector<float> one(64 * 3), four(64 * 3);
  tensor_get(*y, one.data(), 0, one.size() * 4);
  be->set_n_threads(4);
  CHECK(be->n_threads() == 4);
  be->graph_compute(g);
  tensor_get(*y, four.data(), 0, four.size() * 4);
  CHECK(one == four);
  float row_sum = 0;
  for (int i = 0; i < 64; ++i) row_sum += one[static_cast<size_t>(i)];
  CHECK(row_sum == Approx(1.0f).epsilon(1e-5));
}
